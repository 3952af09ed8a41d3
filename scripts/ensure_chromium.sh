#!/usr/bin/env bash
# The browser tests drive Debian's Chromium, never a downloaded browser build.
# Installs it with apt when /usr/bin/chromium is missing; fails with a plain message when it cannot.
set -u
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}

if [ -x "$CHROMIUM" ]; then
  echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "MISSING: $CHROMIUM, and apt-get is not available to install it." >&2
  echo "  Install Chromium with your system's package manager (the tests never download a browser)." >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "MISSING: $CHROMIUM; installing it needs root (run: apt-get update && apt-get install -y chromium)." >&2
    exit 1
  fi
fi

echo "chromium is missing: installing Debian's package"
if ! $SUDO apt-get update; then
  echo "FAILED: apt-get update (is a Debian mirror reachable?). Install chromium by hand: apt-get install -y chromium" >&2
  exit 1
fi
if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium; then
  echo "FAILED: apt-get install chromium. Install it by hand, or set CHROMIUM to an existing binary." >&2
  exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
  echo "FAILED: the chromium package installed, but $CHROMIUM is still missing." >&2
  exit 1
fi
echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
