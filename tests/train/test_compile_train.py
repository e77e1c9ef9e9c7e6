"""``train.compile: true`` on the paper's path (train/compiling.py): inductor-compiled units in
bf16-mixed, in one process and under DDP and FSDP2 on two CPU processes over gloo, with each
activation checkpointing level; killed after a checkpoint and resumed.

Each strategy trains one uninterrupted compiled run, its reference, at one checkpointing level,
and two runs at the other two levels that are SIGKILLed right after their step-2 checkpoint
(tests/support/killer.py), then resumed by the same command; the levels rotate over the strategies
(ROTATION), so every strategy trains at every level and every level is killed and resumed under
two strategies. All must end on their reference's weights bit for bit: a checkpoint unit
recomputes the same compiled graph, and every shape has its own static graph (``dynamic=False``),
so a resumed process runs the kernels the uninterrupted one ran. The model is StateLoop at K = 3
over two decoder layers, so one Layer graph serves six applications a step. Every process shares
one inductor cache (TORCHINDUCTOR_CACHE_DIR, this module's): the first process compiles (about
40 s here), the others load the kernels (Dynamo still traces in each: 3 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.training import ROOT, SUBPROCESS_WAIT_S, assert_bitwise_equal, weights, write_config, write_shards

RUN = "t/stateloop/K3_ds32_seed1234"
STRATEGIES = {"one process": ["train.devices=1"], "ddp": ["train.devices=2", "train.strategy=ddp"],
              "fsdp": ["train.devices=2", "train.strategy=fsdp"]}
LEVELS = ("none", "layer", "iteration")
# strategy -> (the reference's level, the levels killed and resumed)
ROTATION = {"one process": ("iteration", ("none", "layer")), "ddp": ("none", ("layer", "iteration")),
            "fsdp": ("layer", ("iteration", "none"))}
# 4 steps, a checkpoint after step 2 (the kill) and at the end; validations after steps 2 and 4 over
# 18 windows of 32 tokens: micro-batches of 4, 4, 4, 4, 2 in one process, 4, 4, 1 per rank in two.
BASE = ["train.precision=bf16-mixed", "train.max_steps=4", "train.checkpoint_every=2", "train.val_every=2",
        "train.val_tokens=576", "train.micro_batch=4", "train.global_batch=8", "train.mlflow_tracking=false"]
COMPILED = ["train.compile=true"]
# Graphs a process compiles (train/compiling.py): the Layer 1, StateLoop's state branch 2 (S^0 = 0
# and S^k), once for training and once each for validation's full and its short last micro-batch.
# A K loop that recompiled per iteration would add graphs with K; so would a second validation pass.
GRAPHS = (1 + 2) * 3
# Compiled against eager, bf16-mixed, 4 steps: inductor fuses chains of operations and keeps their
# bf16 intermediates in float32 where eager rounds each one, so the losses differ by roundings
# carried through the steps. Measured on 2026-12-07 (this module's runs): 4.5e-6 relative on the
# final training loss, 5.0e-6 and 1.6e-7 on the two validations. The bound is 10 times the largest,
# and far below what a real change moves: the lr 10% lower moves the same losses by 2.3e-3,
# 1.9e-3 and 3.5e-3 (460 times the bound), a lost or repeated batch by more.
LOSS_RTOL = 5e-5


def _env(cache: str) -> dict:
    """The test's environment less a process group's address (each training picks a free port)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1",
            "TORCHINDUCTOR_CACHE_DIR": cache}


def _train(cfg, data, out, overrides, cache, kill_at: int | None = None) -> subprocess.CompletedProcess:
    args = ["train", "--config", str(cfg), RUN, "--data-dir", str(data), "--out", str(out), "--no-progress",
            "--set", *BASE, *overrides]
    head = [sys.executable, str(ROOT / "tests" / "support" / "killer.py"), "after-save", str(kill_at)] if kill_at else \
        [sys.executable, "-m", "stateloop.cli"]
    return subprocess.run([*head, *args], cwd=out.parent, env=_env(cache), capture_output=True, text=True,
                          timeout=SUBPROCESS_WAIT_S)


def _summary(run_dir) -> dict:
    return json.loads((run_dir / "train.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(strategy, level): run folder}, and ("one process", "eager"); killed runs resumed."""
    root = tmp_path_factory.mktemp("compile")
    cache = str(root / "inductor")
    cfg = write_config(root / "cfg.yaml", model={"n_layers": 2})
    data = write_shards(root / "data")
    out = {}
    for strategy, (ref_level, killed_levels) in ROTATION.items():
        setting = [*STRATEGIES[strategy], *COMPILED]
        for level in (ref_level, *killed_levels):
            run_dir = root / f"{strategy.replace(' ', '_')}_{level}"
            overrides = [*setting, f"train.activation_checkpointing={level}"]
            if level != ref_level:
                killed = _train(cfg, data, run_dir, overrides, cache, kill_at=2)
                assert killed.returncode != 0 and not (run_dir / "model.safetensors").exists(), killed.stderr[-3000:]
            proc = _train(cfg, data, run_dir, overrides, cache)
            assert proc.returncode == 0, proc.stderr[-3000:]
            out[strategy, level] = run_dir
    eager = root / "one_process_eager"
    proc = _train(cfg, data, eager, STRATEGIES["one process"], cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["one process", "eager"] = eager
    return out


@pytest.mark.slow
@pytest.mark.parametrize("strategy,level", [(s, lv) for s, (_, killed) in ROTATION.items() for lv in killed])
def test_compiled_training_killed_after_a_checkpoint_resumes_bitwise(runs, strategy, level):
    """A compiled run SIGKILLed after its step-2 checkpoint, resumed by the same command, ends on the
    weights and validation curve of the strategy's uninterrupted compiled run (at another
    checkpointing level) to the bit."""
    run_dir, reference = runs[strategy, level], runs[strategy, ROTATION[strategy][0]]
    summary, ref = _summary(run_dir), _summary(reference)
    assert summary["resumed_from_step"] == 2 and summary["inexact_resume"] is None
    assert ref["resumed_from_step"] is None
    assert summary["world_size"] == (1 if strategy == "one process" else 2) and summary["precision"] == "bf16-mixed"
    assert summary["val_curve"] == ref["val_curve"]
    assert_bitwise_equal(weights(run_dir), weights(reference))


def test_the_rotation_covers_every_strategy_and_level():
    for ref_level, killed in ROTATION.values():
        assert sorted((ref_level, *killed)) == sorted(LEVELS)
    for level in LEVELS:
        assert sum(level in killed for _, killed in ROTATION.values()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_loop_and_validation_compile_a_stated_number_of_graphs(runs, strategy):
    """Each process compiles GRAPHS graphs whatever K, the number of steps and of validations, and
    Dynamo meets no graph break in a unit. A resumed process compiles the same graphs anew."""
    for level in LEVELS:
        counts = _summary(runs[strategy, level])["compile"]
        assert counts["graphs"] == GRAPHS and counts["graph_breaks"] == 0, (level, counts)
    assert _summary(runs["one process", "eager"])["compile"] is None


@pytest.mark.slow
def test_compiled_losses_equal_eager(runs):
    """Compiled against eager, one process, bf16-mixed, the same 4 steps: the training loss and
    each validation loss within LOSS_RTOL relative, and not all equal (or nothing was compiled)."""
    compiled, eager = _summary(runs["one process", "iteration"]), _summary(runs["one process", "eager"])
    pairs = [(compiled["final_train_loss"], eager["final_train_loss"])]
    pairs += [(a["loss"], b["loss"]) for a, b in zip(compiled["val_curve"], eager["val_curve"], strict=True)]
    for a, b in pairs:
        assert a == pytest.approx(b, rel=LOSS_RTOL)
    assert any(a != b for a, b in pairs)
