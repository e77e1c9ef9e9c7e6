#!/usr/bin/env bash
# Create .venv (or $STATELOOP_VENV) and install the package with its test extras, from scratch.
# torch is installed first and pinned: on CPU machines pip finds the local 2.13.0 CPU wheel, and an
# unpinned torch would pull a multi-GB CUDA build. On a GPU machine set STATELOOP_TORCH to the
# torch requirement you want (e.g. "torch==2.13.0" from the CUDA index) and add the gpu extra.
# Byte-compiling: pip compiles every installed file one by one (178 s for this whole script on a 2-core
# machine against 74 without); compileall does it after, on every core. The .pyc files matter where
# PYTHONDONTWRITEBYTECODE is set: a module without one is compiled again by every process importing it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q --no-compile "${STATELOOP_TORCH:-torch==2.13.0}"
"$VENV/bin/python" -m pip install -q --no-compile -e ".[test${STATELOOP_EXTRAS:+,$STATELOOP_EXTRAS}]"
# Files written for newer Pythons (torch ships a few) do not compile here, as under pip: not an error.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" src \
  >/dev/null 2>&1 || true
echo "environment ready: $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
