#!/usr/bin/env bash
# Make the browser check (tests/test_browser.py) runnable: Debian's chromium, a colour emoji
# font and Playwright. It installs only when asked (COURSE_BROWSER=1, as .ci/run sets) and
# never with sudo: on a learner's or contributor's laptop the test command asks for no
# password and installs no system package; without chromium the browser check is skipped with
# a one-line reason. Playwright's own browser download ("playwright install") is never used.
# The font: chromium installed with --no-install-recommends has none for emoji, and draws the
# lessons' 🔴 and ✅ markers as empty boxes; the browser check fails on any character drawn as
# a missing glyph.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
EMOJI_FONT="Noto Color Emoji"

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
fc-list 2>/dev/null | grep -q "$EMOJI_FONT" || missing+=(fonts-noto-color-emoji)
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "${COURSE_BROWSER:-0}" != 1 ]; then
        echo "browser check: ${missing[*]} not installed here (COURSE_BROWSER=1 installs it with" \
             "apt, as root); without chromium the check is skipped, without the font it fails"
        exit 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "browser check: installing ${missing[*]} needs apt-get as root" \
             "(or install it yourself)"
        exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet playwright
fi
echo "chromium: $(command -v chromium)  font: $(fc-list : family | grep -m1 "$EMOJI_FONT")" \
     " playwright: $("$PYTHON" -m pip show playwright | sed -n 's/^Version: //p')"
