#!/usr/bin/env bash
# The test command: set up the environment if needed, then run the whole suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
[ -x "$VENV/bin/stateloop" ] || bash scripts/setup.sh
PY="$VENV/bin/python"
# With no test paths given: two pytest processes side by side (the machines here have two cores),
# one for the tests that share the tiny and paper rehearsals (marker shared_dag, set in
# tests/conftest.py), one for all the others; the first one's output follows the second's.
# Each has its own --basetemp (pytest prunes all but the newest three numbered temp folders).
# STATELOOP_TEST_SPLIT=0, naming tests/..., or a -m / --basetemp of your own runs one process.
if [ "${STATELOOP_TEST_SPLIT:-1}" = 1 ] && ! printf '%s\n' "$@" | grep -qE '^(tests|-m$|--basetemp)'; then
  # Each process gets half the cores for torch's threads: two processes whose thread pools both
  # span every core spin against each other (a small matmul measured 7.5x slower that way here).
  cores=$(nproc 2>/dev/null || echo 2)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / 2 > 0 ? cores / 2 : 1 ))}
  tmp=$(mktemp -d)
  shared_log="$tmp/shared.log"
  "$PY" -m pytest -m shared_dag --basetemp "$tmp/shared" "$@" >"$shared_log" 2>&1 &
  shared_pid=$!
  set +e
  "$PY" -m pytest -m "not shared_dag" --basetemp "$tmp/rest" "$@"
  rest=$?
  wait $shared_pid
  shared=$?
  set -e
  echo "---------------- tests sharing the tiny and paper rehearsals ----------------"
  cat "$shared_log"
  rm -rf "$tmp"
  # 5: a half collected no test (a -k or -m that selects only the other half)
  [ $rest = 5 ] && [ $shared != 5 ] && rest=0
  [ $shared = 5 ] && [ $rest = 0 ] && shared=0
  [ $rest != 0 ] && exit $rest
  exit $shared
fi
exec "$PY" -m pytest "$@"
