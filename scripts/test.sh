#!/usr/bin/env bash
# The test command: set up the environment if needed, then run the whole suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
[ -x "$VENV/bin/stateloop" ] || bash scripts/setup.sh
exec "$VENV/bin/python" -m pytest "$@"
