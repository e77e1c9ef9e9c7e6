"""The train section's memory settings through train(): activation checkpointing leaves the run's
numbers bit for bit, the chunked loss within float rounding; FSDP's sharding reaches Fabric's
strategy."""

from __future__ import annotations

import datetime

import pytest
import torch

from stateloop.config.train import TrainConfig
from stateloop.train import loop
from support.training import assert_bitwise_equal, resolved, weights

STEP = loop.Progress.step
STEPS = ["train.max_steps=6", "train.val_every=0", "train.val_tokens=0", "train.checkpoint_every=0",
         "train.mlflow_tracking=false"]


def loss_curve(cfg_path, data, run_dir, run: str, overrides: list[str], monkeypatch) -> list[float]:
    """Each step's training loss of a tiny run (the mean over its micro-batches, as logged)."""
    losses = []
    step = STEP  # Progress.step itself, not a recording patched in by an earlier call

    def recording(self, s, loss, lr, grad_norm):
        losses.append(loss)
        return step(self, s, loss, lr, grad_norm)

    monkeypatch.setattr(loop.Progress, "step", recording)
    result = loop.train(resolved(cfg_path, data, run, STEPS + overrides), run_dir, progress=False)
    assert result.status == "finished"
    return losses


@pytest.mark.parametrize("run", ["t/stateloop/K2_ds32_seed1234", "t/vanilla_looped/K3_ds0_seed7"])
def test_checkpointing_trains_the_same_run_bit_for_bit(tiny_setup, tmp_path, run, monkeypatch):
    cfg_path, data = tiny_setup
    reference = loss_curve(cfg_path, data, tmp_path / "none", run, [], monkeypatch)
    for level in ("layer", "iteration"):
        curve = loss_curve(cfg_path, data, tmp_path / level, run, [f"train.activation_checkpointing={level}"], monkeypatch)
        assert curve == reference, level
        assert_bitwise_equal(weights(tmp_path / level), weights(tmp_path / "none"))
    assert reference[-1] < reference[0] - 0.1  # it learns (4.57 -> 4.31): the curve compared is not a flat one


def test_the_chunked_loss_trains_the_same_curve_within_rounding(tiny_setup, tmp_path, monkeypatch):
    """128 tokens per micro-batch in chunks of 48 (the last one 32), together with checkpointing."""
    cfg_path, data = tiny_setup
    run = "t/stateloop/K2_ds32_seed1234"
    reference = loss_curve(cfg_path, data, tmp_path / "ref", run, [], monkeypatch)
    curve = loss_curve(cfg_path, data, tmp_path / "chunked", run,
                       ["train.loss_chunk_tokens=48", "train.activation_checkpointing=iteration"], monkeypatch)
    torch.testing.assert_close(torch.tensor(curve), torch.tensor(reference), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sharding, mesh, reshard", [("full", (1, 16), True), ("hybrid", (2, 8), True),
                                                   ("grad_op", (1, 16), False), ("hybrid_grad_op", (2, 8), False)])
def test_fsdp_sharding_reaches_fabrics_strategy(sharding, mesh, reshard):
    """The strategy build_fabric makes for train.strategy fsdp on 2 nodes x 8 GPUs: Fabric's
    ModelParallelStrategy over a (replicas x shard group) mesh as train.fsdp_sharding says (hybrid:
    replicated across the 2 nodes, sharded over each node's 8), resharding after the forward or
    not, with one-file checkpoints. (The sharding itself runs in tests/train/test_fsdp*.py.)"""
    from lightning_fabric.plugins.environments import LightningEnvironment
    from lightning_fabric.strategies import ModelParallelStrategy

    from stateloop.train import parallel

    tcfg = TrainConfig(strategy="fsdp", devices=8, num_nodes=2, global_batch=256, micro_batch=8,
                       fsdp_sharding=sharding, activation_checkpointing="layer")
    strategy = parallel.fsdp_strategy(tcfg, LightningEnvironment(), datetime.timedelta(seconds=600))
    assert isinstance(strategy, ModelParallelStrategy) and not strategy._save_distributed_checkpoint
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == mesh
    assert strategy._parallelize_fn.keywords == {"sharding": sharding}
    assert parallel.RESHARD_AFTER_FORWARD[sharding] is reshard


def test_every_sharding_of_the_config_has_a_strategy():
    import typing

    from stateloop.config.train import FsdpSharding
    from stateloop.train.parallel import RESHARD_AFTER_FORWARD

    assert set(RESHARD_AFTER_FORWARD) == set(typing.get_args(FsdpSharding))
