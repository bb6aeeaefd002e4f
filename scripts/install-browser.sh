#!/usr/bin/env bash
# Make the browser check (tests/test_browser.py) runnable: Debian's chromium and Playwright.
# It installs only when asked (COURSE_BROWSER=1, as .ci/run sets) and never with sudo: on a
# learner's or contributor's laptop the test command asks for no password and installs no
# system package; without chromium the browser check is skipped with a one-line reason.
# Playwright's own browser download ("playwright install") is never used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

if ! command -v chromium >/dev/null 2>&1; then
    if [ "${COURSE_BROWSER:-0}" != 1 ]; then
        echo "browser check skipped: no chromium here (COURSE_BROWSER=1 installs it with apt, as root)"
        exit 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "browser check skipped: installing chromium needs apt-get as root" \
             "(or install chromium yourself)"
        exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
fi
if ! "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet playwright
fi
echo "chromium: $(command -v chromium)  playwright: $("$PYTHON" -m pip show playwright | sed -n 's/^Version: //p')"
