#!/usr/bin/env bash
# The test command: set up the environment if needed, then run the whole suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
[ -x "$VENV/bin/stateloop" ] || bash scripts/setup.sh
# Two workers (the machines here have two cores); the tests that share a rehearsal run on one of
# them (tests/conftest.py). Pass -n 0 to run in one process.
exec "$VENV/bin/python" -m pytest -n 2 --dist loadgroup "$@"
