"""The live memory of sharded training steps, measured: the check of ops/memory.py's FSDP terms.

:func:`fsdp_step_memory` runs, in a fresh process, rank 0 of a fake process group of ``world``
ranks (torch's ``FakeStore``: collectives allocate nothing, so every allocation is FSDP2's own and
the run is deterministic), or ``world`` processes over gloo. It shards the model with
train/parallel.py's ``shard`` and trains two optimiser steps as train/loop.py does, under torch's
profiler with ``profile_memory``, so the live bytes at any instant are the running sum of its
allocations. From the second step: ``static``, ``peak`` (and ``at_peak``: what is alive then),
``backward_start``, and the collectives of the last micro-batch (``all_gathers_forward`` /
``all_gathers_backward``) and of the step (``reduce_scatters``). Nothing here reads ops/memory.py.
The CPU cannot show CUDA's streams (a GPU may hold one more gathered unit in the forward), the
caching allocator or the CUDA kernels' activations; gloo's frees land at varying moments, so the
tests use the fake group.

    python -m support.fsdp_probe [--sharding full] [--accumulation 1] [--world 2] [--fake]
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

from stateloop.config.model import ModelConfig
from stateloop.models.registry import build_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, spec: dict, out: str) -> None:
    import contextlib
    import gc

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile, record_function

    from stateloop.train.loss import lm_loss  # torch: only in the probe's child process
    from stateloop.train.parallel import mesh_shape, shard  # torch: only in the child

    torch.set_num_threads(1)
    if spec.get("fake"):
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = ModelConfig(**spec["model"])
        B, T, accum = spec["micro_batch"], spec["seq_len"], spec["accumulation"]
        replicas, group = mesh_shape(spec["sharding"], world // spec["num_nodes"], spec["num_nodes"])
        mesh = init_device_mesh("cpu", (replicas, group), mesh_dim_names=("data_parallel", "tensor_parallel"))
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if spec["precision"] == "bf16-mixed"
                    else contextlib.nullcontext())
        torch.manual_seed(rank)
        tokens = torch.randint(0, cfg.vocab_size, (2, accum, B, T + 1))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            torch.manual_seed(0)
            model = build_model(cfg, device="cpu")
            shard(model, mesh, spec["sharding"])
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for step in range(2):
                gc.collect()
                with record_function(f"probe_step{step}"):
                    for micro in range(accum):
                        model.set_requires_gradient_sync(micro == accum - 1)
                        x, y = tokens[step, micro, :, :-1], tokens[step, micro, :, 1:]
                        with record_function(f"probe_forward{step}_{micro}"), autocast:
                            loss = lm_loss(model, x, y) / accum
                        with record_function(f"probe_backward{step}_{micro}"):
                            loss.backward()
                        del loss
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        found = {"rank": rank, **_read(prof, accum)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def _read(prof, accum: int) -> dict:  # noqa: C901 - one pass over the profile
    """The figures of the module docstring from the profile: allocations and frees in time order (the
    ones made inside a c10d operator left out: gloo's staging copies, which NCCL makes in its own
    memory), the probe's marks, the collectives of the second step by phase."""
    blocks, marks, collectives = [], {}, []
    staged: set[int] = set()

    def walk(nodes, in_c10d, stack=()):
        for n in nodes:
            if n.tag.name == "Allocation":
                ptr, size = n.extra_fields.ptr, n.extra_fields.alloc_size
                if size > 0 and in_c10d:
                    staged.add(ptr)
                elif size < 0 and ptr in staged:
                    staged.discard(ptr)
                else:
                    blocks.append((n.start_time_ns, size, ptr, tuple(stack[-3:])))
            elif n.name.startswith("probe_"):
                marks[n.name] = (n.start_time_ns, n.end_time_ns)
            elif n.name.startswith(("c10d::", "gloo:")) and not in_c10d:
                collectives.append((n.start_time_ns, n.name))
            walk(n.children, in_c10d or n.name.startswith(("c10d::", "gloo:")), (*stack, n.name))

    walk(prof.profiler.kineto_results.experimental_event_tree(), False)
    t0, t_loss = marks["probe_forward1_0"][0], marks[f"probe_forward1_{accum - 1}"][1]
    t_bwd, t1 = marks[f"probe_backward1_{accum - 1}"]
    live = peak = static = at_loss = peak_backward = 0
    alive, at_peak = {}, {}
    for t, nbytes, ptr, where in sorted(blocks, key=lambda b: b[0]):
        live += nbytes
        if nbytes > 0:
            alive[ptr] = (nbytes, where)
        else:
            alive.pop(ptr, None)
        if t0 <= t <= t1 and live > peak:
            at_peak = dict(alive)
        if t < t0:
            static = live
        elif t <= t1:
            peak = max(peak, live)
            if t >= t_bwd:
                peak_backward = max(peak_backward, live)
        if t <= t_loss:
            at_loss = live

    def count(kind, lo, hi):
        return sum(kind in name.replace("allgather", "all_gather") and lo <= t <= hi for t, name in collectives)

    return {"static": static, "peak": max(peak, static), "backward_start": at_loss, "peak_backward": peak_backward,
            "all_gathers_forward": count("all_gather", marks[f"probe_forward1_{accum - 1}"][0], t_loss),
            "all_gathers_backward": count("all_gather", t_bwd, t1),
            "reduce_scatters": count("reduce_scatter", *marks["probe_step1"]),
            "collectives": sorted({name for _, name in collectives}),
            # what is alive at the peak: (bytes, the operators that allocated it, innermost first)
            "at_peak": sorted(((b, " < ".join(reversed(w))) for b, w in at_peak.values()), reverse=True)}


def fsdp_step_memory(model_cfg, *, sharding: str = "full", world: int = 2, num_nodes: int = 1, micro_batch: int = 1,
                     seq_len: int = 16, accumulation: int = 1, precision: str = "bf16-mixed", fake: bool = False) -> list[dict]:
    """Per rank, the live memory of a sharded training step of ``model_cfg`` (module docstring)."""
    import dataclasses

    import torch.multiprocessing as mp

    spec = {"model": dataclasses.asdict(model_cfg), "sharding": sharding, "num_nodes": num_nodes,
            "micro_batch": micro_batch, "seq_len": seq_len, "accumulation": accumulation, "precision": precision}
    with tempfile.TemporaryDirectory() as out:
        if fake:  # one process (a fresh one: the profile must see every allocation), rank 0 of ``world``
            mp.spawn(_worker, args=(world, 0, {**spec, "fake": True}, out), nprocs=1, join=True)
            return [json.loads(Path(out, "rank0.json").read_text())]
        mp.spawn(_worker, args=(world, _free_port(), spec, out), nprocs=world, join=True)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sharding", default="full")
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--name", default="vanilla_looped")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--fake", action="store_true")
    args = p.parse_args(argv)
    cfg = ModelConfig(name=args.name, vocab_size=4096, n_layers=2, d_model=256, d_ff=768, n_heads=4, head_dim=64, K=3,
                      d_s=256 if args.name != "vanilla_looped" else 0, max_seq_len=64, attn_impl="torch", ssd_impl="torch")
    for r in fsdp_step_memory(cfg, sharding=args.sharding, accumulation=args.accumulation, world=args.world,
                              fake=args.fake):
        print(json.dumps(r))


if __name__ == "__main__":
    main()
