"""Sharded data parallelism (``train.strategy: fsdp``): PyTorch's FSDP2, applied to the model from outside.

The model files know nothing of sharding: :func:`shard` applies ``fully_shard`` to every decoder
:class:`~stateloop.models.backbone.Layer`, then to the whole model (the rest as one more unit).
[choice] FSDP2 (torchtitan's
choice) rather than Fabric's ``FSDPStrategy`` (FSDP1): it runs on CPU processes over gloo, so the
test suite trains through the same code a GPU run takes (tests/train/test_fsdp.py), and its
per-unit precision is explicit.

``train.fsdp_sharding`` -> the device mesh and ``reshard_after_forward``. Fabric builds a
(num_nodes x devices) mesh; its dimension names ("data_parallel", "tensor_parallel") are
Fabric's, and here mean "replicate" and "shard":

    full            1 x world mesh: shard over every rank; each unit resharded after its forward
    hybrid          nodes x devices: replicated across nodes, sharded within a node (HSDP)
    grad_op         as full, but a unit's gathered parameters stay until its backward (ZeRO-2):
                    a looped layer is gathered once per micro-batch instead of at each of its K
                    applications and again in backward
    hybrid_grad_op  as hybrid, with grad_op's resharding

Precision (docs/choices.md, "Precision"): the same policy under every strategy. Parameters,
gradients and optimizer state are float32; FSDP casts nothing (``MixedPrecisionPolicy`` with
``param_dtype`` and ``reduce_dtype`` None); the matmuls run in bf16 under Fabric's ``bf16-mixed``
autocast, exactly as on one GPU and under DDP. (Fabric's
FSDP1 ``bf16-mixed`` casts every parameter to bf16 and reduces in bf16: the state cell's
``A_log``, the norms and the residual stream then compute in bf16, which no other strategy does.)
The price: all-gathers move 4 bytes a parameter rather than 2 (the plan's time counts it).

Checkpoints are one file, the full state dict gathered to rank 0, as for DDP (train/checkpoint.py).
"""

from __future__ import annotations

import functools

import torch

from stateloop.models.backbone import Layer

# The unit of sharding: one decoder layer (every Layer of the model, looped or unique).
RESHARD_AFTER_FORWARD = {"full": True, "hybrid": True, "grad_op": False, "hybrid_grad_op": False}


def mesh_shape(sharding: str, devices: int, num_nodes: int) -> tuple[int, int]:
    """(replicas, shard group size) of ``train.fsdp_sharding`` on ``num_nodes`` x ``devices`` ranks."""
    world = devices * num_nodes
    return (num_nodes, devices) if sharding.startswith("hybrid") else (1, world)


def shard(model: torch.nn.Module, mesh, sharding: str) -> torch.nn.Module:
    """``fully_shard`` every decoder layer of ``model``, then ``model`` itself, over ``mesh``
    (2-D: replicate x shard; a 1 x N mesh shards over all N ranks). In place; returns ``model``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = mesh if mesh.size(0) > 1 else mesh[mesh.mesh_dim_names[1]]  # one replica: a 1-D mesh
    # No cast: parameters gathered, and gradients reduced, in the parameters' own dtype (float32;
    # float64 in a float64 run). The module docstring says why.
    kwargs = dict(mesh=mesh, reshard_after_forward=RESHARD_AFTER_FORWARD[sharding],
                  mp_policy=MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None))
    for layer in [m for m in model.modules() if isinstance(m, Layer)]:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def fsdp_strategy(tcfg, env, timeout):
    """Fabric's ModelParallelStrategy running :func:`shard` for ``train.strategy: fsdp``."""
    from lightning_fabric.strategies import ModelParallelStrategy

    replicas, group = mesh_shape(tcfg.fsdp_sharding, tcfg.devices, tcfg.num_nodes)
    strategy = ModelParallelStrategy(parallelize_fn=functools.partial(shard, sharding=tcfg.fsdp_sharding),
                                     data_parallel_size=replicas, tensor_parallel_size=group,
                                     save_distributed_checkpoint=False, timeout=timeout)
    strategy.cluster_environment = env
    return strategy


def is_sharded(fabric) -> bool:
    from lightning_fabric.strategies import ModelParallelStrategy

    return isinstance(fabric.strategy, ModelParallelStrategy)


def full_state_dict(fabric, model: torch.nn.Module) -> dict:
    """The model's unsharded weights: under FSDP gathered to rank 0 (on CPU; an empty dict on the
    other ranks, and every rank must call it), else its own state dict."""
    if not is_sharded(fabric):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value as a plain tensor (a replicated scalar such as the clipped norm)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
