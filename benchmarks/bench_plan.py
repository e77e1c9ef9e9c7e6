"""How long `stateloop plan` and a dry run take on a config, cold and warm.

Each command runs in its own process, with ``STATELOOP_CACHE`` set to a fresh folder for the cold
run (no memory measurement or FLOP count kept) and the same folder again for the warm runs. It
prints wall seconds and CPU seconds (user + system of the child, from its rusage; CPU seconds move
less than wall time with other load on the machine):

- ``plan``: ``stateloop plan --config CONFIG`` (every run's memory, FLOPs, time and the plan's
  choice of strategy);
- ``snakemake -n``: ``snakemake -n all --configfile CONFIG`` in the repository (the DAG's build,
  the config check and its memory gate), with the plan's cache warm.

``--before SRC`` runs the same commands with ``PYTHONPATH=SRC`` too (another checkout's
``src``), each in its own fresh cache, for a before/after on the same machine.

    python benchmarks/bench_plan.py [--config configs/paper.yaml] [--warm 2] [--before ../main/src] [--no-snakemake]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s) of ``cmd`` run to completion in ROOT; its failure stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"bench_plan: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(src: Path, config: str, warm: int, snakemake: bool) -> list[tuple[str, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(src), "STATELOOP_CACHE": cache,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        plan = [sys.executable, "-m", "stateloop.cli", "plan", "--config", config]
        rows.append(("plan, cold", *timed(plan, env)))
        runs = [timed(plan, env) for _ in range(warm)]
        rows.append((f"plan, warm (median of {warm})", statistics.median(w for w, _ in runs),
                     statistics.median(c for _, c in runs)))
        if snakemake:
            dry = [sys.executable, "-m", "snakemake", "-n", "all", "--configfile", config]
            runs = [timed(dry, env) for _ in range(warm)]
            rows.append((f"snakemake -n, warm (median of {warm})", statistics.median(w for w, _ in runs),
                         statistics.median(c for _, c in runs)))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/paper.yaml")
    p.add_argument("--warm", type=int, default=2, help="warm runs of each command (median printed)")
    p.add_argument("--before", type=Path, help="another checkout's src/ to time the same way")
    p.add_argument("--no-snakemake", action="store_true", help="skip the dry run")
    args = p.parse_args()
    trees = [("after", ROOT / "src")] + ([("before", args.before.resolve())] if args.before else [])
    print(f"{args.config}, {os.cpu_count()} CPUs; wall s and CPU s (user + system)")
    print(f"{'code':<8}{'command':<36}{'wall s':>9}{'CPU s':>9}")
    for name, src in trees:
        for what, wall, cpu in measure(src, args.config, args.warm, not args.no_snakemake):
            print(f"{name:<8}{what:<36}{wall:>9.1f}{cpu:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
