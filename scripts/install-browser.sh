#!/usr/bin/env bash
# Installs Debian's Chromium for the UI browser test (tests/e2e/test_federation_ui.py), unless present.
# Playwright drives this browser; it never downloads one of its own. Needs root (or sudo): CI runs it.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi
echo "install-browser: installing Debian's chromium" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium fonts-liberation >/dev/null
chromium --version >&2
