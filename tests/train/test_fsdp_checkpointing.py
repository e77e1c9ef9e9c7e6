"""FSDP with the model's own checkpoint units and the chunked loss, on two CPU processes.

The model sharded by :func:`stateloop.train.parallel.shard` (what train.strategy fsdp's Fabric
strategy runs: one FSDP2 unit per decoder layer, then the root) over a two-rank gloo process
group, as a 2 x 1 mesh for the hybrid shardings (replicated) and 1 x 2 for the others. Under every
sharding of train.fsdp_sharding, a training step's loss and every gradient (gathered whole) with
"layer" and with "iteration" checkpointing are those without, bit for bit: a unit's recomputation
in backward gathers the sharded layer parameters again and remakes exactly what the forward saved.
(The whole training loop under FSDP: tests/train/test_fsdp.py.)
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

SHARDINGS = ("full", "grad_op", "hybrid", "hybrid_grad_op")
LEVELS = ("none", "layer", "iteration")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from stateloop.models.registry import build_model
    from stateloop.train.checkpointing import apply_checkpointing
    from stateloop.train.loss import lm_loss
    from stateloop.train.parallel import mesh_shape, shard
    from support.models import tiny_config

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for sharding in SHARDINGS:
        shape = mesh_shape(sharding, devices=1, num_nodes=world) if sharding.startswith("hybrid") else (1, world)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data_parallel", "tensor_parallel"))
        for level in LEVELS:
            torch.manual_seed(0)
            model = apply_checkpointing(build_model(tiny_config("stateloop_mamba2")), level)  # before sharding
            shard(model, mesh, sharding)
            idx = torch.randint(0, model.cfg.vocab_size, (2, 21), generator=torch.Generator().manual_seed(rank))
            loss = lm_loss(model, idx[:, :-1], idx[:, 1:], 16)
            loss.backward()
            grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
                     for n, p in model.named_parameters()}
            results[sharding, level] = (loss.detach(), grads)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fsdp_composes_with_the_models_checkpoint_units(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "results.pt"
    mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2)
    results = torch.load(out)
    for sharding in SHARDINGS:
        loss, grads = results[sharding, "none"]
        assert grads and all(g is not None for g in grads.values()), sharding
        for level in ("layer", "iteration"):
            loss_c, grads_c = results[sharding, level]
            assert torch.equal(loss_c, loss), (sharding, level)
            assert grads_c.keys() == grads.keys()
            for key in grads:
                assert torch.equal(grads_c[key], grads[key]), (sharding, level, key)
