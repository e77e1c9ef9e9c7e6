#!/usr/bin/env bash
# Create .venv (or $STATELOOP_VENV) and install the package with its test extras, from scratch.
# torch is installed first and pinned: on CPU machines pip finds the local 2.13.0 CPU wheel, and an
# unpinned torch would pull a multi-GB CUDA build. On a GPU machine set STATELOOP_TORCH to the
# torch requirement you want (e.g. "torch==2.13.0" from the CUDA index) and add the gpu extra.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "${STATELOOP_TORCH:-torch==2.13.0}"
"$VENV/bin/python" -m pip install -q -e ".[test${STATELOOP_EXTRAS:+,$STATELOOP_EXTRAS}]"
echo "environment ready: $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
