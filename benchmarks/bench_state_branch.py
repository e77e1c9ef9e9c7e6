"""The state branch's own pieces, this checkout's against another's, side by side in one process.

Two pieces, each timed interleaved (before, after, before, ...) with the same inputs and weights,
on one torch thread, so machine load hits both alike:

- decode: one iteration of StateLoop's cell (eqs. 2, 5, 6) for one token (batch 1, T = 1) in
  inference mode, the shape of a decoded token;
- train: forward + backward of the chunked SSD scan (models/ssd.py) at a training shape, and of
  Mamba-2's depthwise causal convolution + SiLU (``kernels.causal_conv1d_ref``) over its
  d_in + 2GN channels.

The other checkout's ``models/state.py``, ``models/ssd.py`` and ``models/kernels.py`` are loaded
from its source folder (``--before``, e.g. a ``git worktree`` of an older commit); both cells run
on this checkout's backbone and kernels modules. Each backward starts from a fixed random
gradient of the output.

    PYTHONPATH=src python benchmarks/bench_state_branch.py --before ../old/src [--width 512] [--groups 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from stateloop.models import kernels as kernels_after
from stateloop.models import ssd as ssd_after
from stateloop.models import state as state_after


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interleaved(fns: dict, repeats: int, inner: int) -> dict:
    """Median seconds per call of each function, timed in alternating blocks of ``inner`` calls."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[k].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="source folder of the other checkout (holds stateloop/models/)")
    ap.add_argument("--width", type=int, default=512, help="d = d_s")
    ap.add_argument("--groups", type=int, default=1, help="Mamba-2 groups (1.4B: 8 groups of 8 heads)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = Path(args.before) / "stateloop" / "models"
    state_before, ssd_before = load(models / "state.py", "state_before"), load(models / "ssd.py", "ssd_before")
    kernels_before = load(models / "kernels.py", "kernels_before")
    d = args.width
    torch.manual_seed(0)

    cells = {}
    for label, module in (("before", state_before), ("after", state_after)):
        torch.manual_seed(0)
        cell = module.SelectiveStateCell(d, d)
        cell.reset_parameters(0.02)
        with torch.no_grad():
            cell.W_delta.weight.normal_(std=0.02)
        cells[label] = cell.eval()
    H, S = torch.randn(1, 1, d), torch.randn(1, 1, d)
    with torch.inference_mode():
        assert torch.allclose(cells["before"](S, H), cells["after"](S, H), atol=1e-6)
        dec = interleaved({k: (lambda c=c: c(S, H)) for k, c in cells.items()}, args.repeats, 2000)

    heads, P, N, q = 2 * d // 64, 64, 128, 64
    x = torch.randn(1, args.seq, heads, P, requires_grad=True)
    dt = torch.rand(1, args.seq, heads).mul(0.1).requires_grad_()
    A = -torch.rand(heads).add(0.5).requires_grad_()
    B = torch.randn(1, args.seq, args.groups, N, requires_grad=True)
    C = torch.randn(1, args.seq, args.groups, N, requires_grad=True)

    grad = torch.randn(x.shape)

    def train(module):
        module.ssd_chunked(x, dt, A, B, C, q).backward(grad)

    torch.testing.assert_close(ssd_before.ssd_chunked(x, dt, A, B, C, q), ssd_after.ssd_chunked(x, dt, A, B, C, q))
    tr = interleaved({"before": lambda: train(ssd_before), "after": lambda: train(ssd_after)}, args.repeats, 3)

    channels = 2 * d + 2 * args.groups * N  # Mamba-2's conv: x, B and C
    xc = torch.randn(1, args.seq, channels, requires_grad=True)
    wc, bc = torch.randn(channels, 1, 4, requires_grad=True), torch.randn(channels, requires_grad=True)
    gc = torch.randn(xc.shape)

    def conv(module):
        module.causal_conv1d_ref(xc, wc, bc).backward(gc)

    torch.testing.assert_close(kernels_before.causal_conv1d_ref(xc, wc, bc), kernels_after.causal_conv1d_ref(xc, wc, bc))
    cv = interleaved({"before": lambda: conv(kernels_before), "after": lambda: conv(kernels_after)}, args.repeats, 5)

    print(f"torch {torch.__version__}, 1 thread, {args.repeats} interleaved repeats (median)")
    print(f"decode, StateLoop cell, d = d_s = {d}, one token: before {dec['before'] * 1e6:.1f} us, "
          f"after {dec['after'] * 1e6:.1f} us ({dec['after'] / dec['before']:.2f}x)")
    print(f"train, SSD scan fwd+bwd, {args.seq} tokens, {heads} heads of {P}, {args.groups} group(s), N = {N}: before "
          f"{tr['before'] * 1e3:.1f} ms, after {tr['after'] * 1e3:.1f} ms ({tr['after'] / tr['before']:.2f}x)")
    print(f"train, Mamba-2 causal conv + SiLU fwd+bwd, {args.seq} tokens, {channels} channels, 4 taps: before "
          f"{cv['before'] * 1e3:.2f} ms, after {cv['after'] * 1e3:.2f} ms ({cv['after'] / cv['before']:.2f}x)")


if __name__ == "__main__":
    main()
