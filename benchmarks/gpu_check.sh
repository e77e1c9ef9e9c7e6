#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): kernels vs twins, bf16 training of the 410M Vanilla and
# StateLoop variants, Table 3 at 1.4B, the SSD scan; one JSON. On a machine with one CUDA GPU and this repository:
#   bash benchmarks/gpu_check.sh                 # -> benchmarks/results/gpu_check.json
#   OUT=/some/dir bash benchmarks/gpu_check.sh   # -> /some/dir/gpu_check.json (the device tool's $OUT)
# Uses the python3 that holds a CUDA torch (PYTHON to choose another); installs nothing. The
# fused kernels are used when the `gpu` extra is importable there, else the pure-PyTorch paths;
# `--mamba-ssm-src DIR` (an unpacked mamba-ssm sdist) brings mamba_ssm's Triton kernels to a machine
# where nothing can be installed (as on 2026-12-04: benchmarks/records/2026-12-04-gpu-check-h200.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/results}
mkdir -p "$DEST"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
exec timeout 480 "$PY" benchmarks/gpu_check.py --out "$DEST/gpu_check.json" "$@"
