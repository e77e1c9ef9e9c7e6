"""train.dist_timeout_s: the process group's timeout, which bounds how long a collective waits for
a rank that does not come (Fabric's own default is 1,800 s)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap

import pytest

from stateloop.config import ConfigError
from stateloop.config.train import TrainConfig
from stateloop.train.loop import build_fabric
from support.training import ROOT

TWO_RANKS = dict(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", precision="32-true", micro_batch=4,
                 global_batch=8)


def test_the_strategy_carries_the_configs_timeout():
    """DDP's strategy and FSDP's (build_fabric gives both the same argument)."""
    fabric, _ = build_fabric(TrainConfig(**TWO_RANKS, dist_timeout_s=7))
    assert fabric.strategy._timeout == datetime.timedelta(seconds=7)
    fabric, _ = build_fabric(TrainConfig(**{**TWO_RANKS, "strategy": "fsdp"}, dist_timeout_s=8))
    assert fabric.strategy._timeout == datetime.timedelta(seconds=8)
    with pytest.raises(ConfigError, match=r"^train\.dist_timeout_s: must be positive, got 0$"):
        TrainConfig(dist_timeout_s=0)


# Rank 0 waits at a barrier that rank 1 never reaches (rank 1 waits for rank 0 to give up, then ends).
BARRIER = textwrap.dedent("""
    import os, sys, time
    from stateloop.config.train import TrainConfig
    from stateloop.train.loop import build_fabric

    released = sys.argv[2]
    fabric, _ = build_fabric(TrainConfig(**{json}, dist_timeout_s=int(sys.argv[1])))
    fabric.launch()
    if fabric.global_rank == 0:
        try:
            fabric.barrier()
            print("rank 0: the barrier passed", flush=True)
        except RuntimeError as err:
            print(f"rank 0: the barrier failed: {err}", flush=True)
        finally:
            open(released, "w").close()
    else:
        while not os.path.exists(released):
            time.sleep(0.05)
""")


@pytest.mark.slow
def test_a_collective_gives_up_after_the_configs_timeout(tmp_path):
    """Two gloo ranks started as a job step (the rehearsals' srun stand-in): rank 0's barrier fails
    with gloo's timeout at train.dist_timeout_s = 3 s, instead of waiting Fabric's 1,800 s."""
    script = tmp_path / "barrier.py"
    script.write_text(BARRIER.replace("{json}", repr(TWO_RANKS)))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "stateloop.ops.rehearse.srun", "--nodes=2", "--ntasks-per-node=1",
                           sys.executable, str(script), "3", str(tmp_path / "released")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)  # a hang guard only
    assert "rank 0: the barrier failed:" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "Timed out waiting 3000ms" in proc.stdout, proc.stdout
