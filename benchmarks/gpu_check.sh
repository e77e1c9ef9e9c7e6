#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): eager against compiled MFU at 410M and 1.4B, each peak
# beside the memory plan's figure, FSDP2 on a 1 x 1 mesh, the fused kernels' gradients against their
# twins, fused AdamW, the precision policy, mamba_ssm's chunk 256 against 64, Table 3 with the decode
# step in a CUDA graph and eager, `pytest -m gpu`. Every step has its own cap (420 s in all, printed
# with each step's estimate before the first starts); the record is rewritten after every step.
#   bash benchmarks/gpu_check.sh                  # -> benchmarks/records/gpu_check_<device>_<date>.json + <date>-gpu-check-<device>.md
#   OUT=/some/dir bash benchmarks/gpu_check.sh    # -> the record in /some/dir (the device tool's $OUT)
#   bash benchmarks/gpu_check.sh --only compile_1.4b,fsdp2_1x1   # a rerun of some steps
# Uses the python3 that holds a CUDA torch (PYTHON to choose another); installs nothing. The
# fused kernels are used when the `gpu` extra is importable there, else the pure-PyTorch paths;
# `--mamba-ssm-src DIR` (an unpacked mamba-ssm sdist) brings mamba_ssm's Triton kernels to a machine
# where nothing can be installed (as on 2026-12-04: benchmarks/records/2026-12-04-gpu-check-h200.md).
# The whole call stops at 460 s: the caps' 420 s, imports and the record; a 15-minute lease holds
# the machine's start, this call and a rerun of the steps that need one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/records}
mkdir -p "$DEST"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec timeout 460 "$PY" benchmarks/gpu_check.py --out "$DEST" "$@"
