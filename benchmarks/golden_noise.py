"""How far the golden loss curves move when only the machine's arithmetic changes.

tests/train/test_golden.py compares the 13 models' 6-step training losses with a recording: bitwise
on the recording's own machine kind, within a tolerance of float32 ulps elsewhere. This script
measures the noise that tolerance must absorb. Each variant trains the curves in a child process
(the kernel pins are read when torch and MKL load) and prints, per model, the distance of each
step's loss from the recording in ulps:

- ATen's kernels pinned to AVX2 (the test's own setting), left to choose (AVX512 where there is
  one), and forced to the scalar ``default`` path with MKL limited to SSE4.2;
- MKL's conditional-reproducibility mode ``MKL_CBWR=COMPATIBLE``;
- two threads instead of one;
- every float32 nn.Linear computed in float64 and rounded once: a correctly rounded BLAS, which
  differs from MKL's in the last bit of many products, as another BLAS (an ARM machine's) does;
- every initial weight moved one ulp up or down at random (an init computed by other kernels).

    python benchmarks/golden_noise.py                # all variants (about 20 s each on 2 cores)
    python benchmarks/golden_noise.py --variants avx2 f64_linear

It ends with the worst distance over all variants and whether any curve drifted (two or more
steps off in a row), beside the test's TOLERANCE_ULPS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "train"

VARIANTS = {  # name -> (environment, threads, in-process patch)
    "avx2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1, None),
    "native": ({}, 1, None),
    "scalar": ({"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, 1, None),
    "mkl_cbwr": ({"MKL_CBWR": "COMPATIBLE"}, 1, None),
    "two_threads": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 2, None),
    "f64_linear": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1, "f64_linear"),
    "init_ulp": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, 1, "init_ulp"),
}


def _patch(name: str | None) -> None:
    """Apply the in-process change of a variant (in the child, before training)."""
    import torch
    import torch.nn.functional as F

    if name == "f64_linear":
        linear = F.linear

        def linear64(x, w, b=None):
            if x.dtype != torch.float32:
                return linear(x, w, b)
            return linear(x.double(), w.double(), None if b is None else b.double()).float()
        F.linear = linear64
    elif name == "init_ulp":
        import stateloop.train.loop as loop

        build = loop.build_model

        def nudged(*args, **kwargs):
            model = build(*args, **kwargs)
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in model.parameters():
                    up = torch.rand(p.shape, generator=gen) < 0.5
                    inf = torch.full_like(p, float("inf"))
                    p.copy_(torch.where(up, torch.nextafter(p, inf), torch.nextafter(p, -inf)))
            return model
        loop.build_model = nudged


def child(out: Path, threads: int, patch: str | None) -> None:
    import torch

    sys.path[:0] = [str(TESTS), str(TESTS.parent)]  # test_golden, and tests/support that it imports
    import test_golden

    torch.set_num_threads(threads)
    _patch(patch)
    out.write_text(json.dumps(test_golden._curves(out.parent)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--child", nargs=3, metavar=("OUT", "THREADS", "PATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        out, threads, patch = args.child
        child(Path(out), int(threads), None if patch == "-" else patch)
        return 0
    sys.path[:0] = [str(TESTS), str(TESTS.parent)]  # test_golden, and tests/support that it imports
    import test_golden

    golden, _ = test_golden.reference(test_golden._recordings(), test_golden._machine())
    print(f"reference: the recording made on {golden['recorded_on']}")
    worst, drifted = 0, []
    for name in args.variants:
        env_extra, threads, patch = VARIANTS[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "curves.json"
            env = {**os.environ, **env_extra, "OMP_NUM_THREADS": str(threads), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/m.db"}
            proc = subprocess.run([sys.executable, __file__, "--child", str(out), str(threads), patch or "-"],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                print(f"{name}: failed\n{proc.stderr[-2000:]}")
                return 1
            curves = json.loads(out.read_text())
        off = {}
        for run, curve in golden["curves"].items():
            dist = [test_golden._ulps(x, y) for x, y in zip(curves[run], curve, strict=True)]
            if any(dist):
                off[run.split("/")[1]] = dist
            worst = max(worst, *dist)
            if any(a and b for a, b in zip(dist, dist[1:])):
                drifted.append(f"{name}: {run}")
        print(f"{name:<12} {len(off):>2} of {len(golden['curves'])} curves differ; ulps per step: "
              + ("; ".join(f"{m} {d}" for m, d in off.items()) or "-"))
    print(f"worst distance: {worst} ulps (the test allows {test_golden.TOLERANCE_ULPS}); "
          f"curves off at two steps in a row: {', '.join(drifted) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
