#!/usr/bin/env bash
# The headless browser of the MLflow UI check (tests/workflow/test_mlflow_ui.py) and of
# scripts/mlflow-screenshot.py: Debian's chromium + chromedriver, and selenium in the venv.
#   bash scripts/install-browser.sh [VENV]     # VENV: default $STATELOOP_VENV, else .venv
# Idempotent: installs only what is missing. Needs root (or sudo) for apt-get.
# selenium drives /usr/bin/chromedriver directly: it never downloads a driver (no Selenium Manager).
set -euo pipefail
VENV=""
if [ -n "${1:-}" ]; then VENV=$(realpath -m "$1"); fi  # relative to where it is called from
cd "$(dirname "$0")/.."
VENV=${VENV:-${STATELOOP_VENV:-.venv}}                 # these two: relative to the checkout
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; then
    $SUDO apt-get update -qq >/dev/null  # a fresh image without package lists
    $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "no virtual environment at $VENV (run scripts/setup.sh first, or pass its path)" >&2
  exit 1
fi
"$VENV/bin/python" -c 'import selenium' 2>/dev/null || "$VENV/bin/python" -m pip install -q "selenium>=4.11"

echo "browser ready: $(/usr/bin/chromium --version 2>/dev/null | head -1), $(/usr/bin/chromedriver --version | cut -d' ' -f1-2)," \
  "selenium $("$VENV/bin/python" -c 'import selenium; print(selenium.__version__)')"
