#!/usr/bin/env bash
# Install what tests/test_browser.py needs: Debian's chromium and Playwright for Python.
# Idempotent: apt runs only when chromium is missing, pip only when playwright is missing.
# Playwright's own browser download ("playwright install") is never used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if ! command -v chromium >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "no apt-get here (not Debian/Ubuntu): the browser check will be skipped"
        exit 0
    fi
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
if ! "$PYTHON" -c "import playwright" >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet playwright
fi
echo "chromium: $(command -v chromium)  playwright: $("$PYTHON" -m pip show playwright | sed -n 's/^Version: //p')"
