"""``stateloop train`` with probes that record the dtypes the precision policy governs
(docs/choices.md, "Precision"), for tests/train/test_fsdp.py.

    python precision_probe.py OUT.json [--misread | --no-autocast] -- TRAIN-ARGS...

runs ``stateloop.cli.main(["train", *TRAIN-ARGS])`` in every rank (Fabric starts the other ranks by
running this same command line again) after wrapping ``stateloop.train.loop.setup``: once the model
is set up under its strategy, forward pre-hooks record what each forward sees, and the gradient
reduction records the dtype it communicates. Each rank writes OUT.json.rank<R>:

    residual     dtypes of the hidden state entering a decoder layer (the residual stream)
    state        dtypes of S^k entering the state cell
    cell_params  dtypes of the state cell's parameters (A_log, W_u, W_Delta, b_Delta, norm_h) in its forward
    norm_params  dtypes of every RMSNorm's weight in its forward
    matmul       dtypes of every nn.Linear's output in a training forward (autocast's bf16 products)
    reduced      dtypes of the gradients the strategy reduces across ranks (FSDP2's reduce-scatter,
                 which HSDP's all-reduce across replicas follows in the same dtype; DDP's bucket
                 all-reduce; none with one process)

``--misread`` runs FSDP as Fabric's FSDP1 ``bf16-mixed`` does (parameters cast to bf16 for the
forward, gradients reduced in bf16): the probe must see it, or the test could not fail.
``--no-autocast`` drops the precision plugin's autocast (its forward context does nothing), the
misreading under which every run would silently train in float32.
"""

from __future__ import annotations

import json
import sys


def install(out: str, misread: bool, no_autocast: bool) -> None:
    import contextlib

    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp

    from stateloop.models.backbone import Layer, RMSNorm
    from stateloop.models.state import CELLS
    from stateloop.train import loop

    seen = {key: set() for key in ("residual", "state", "cell_params", "norm_params", "reduced", "matmul")}

    def note(key, *dtypes):
        seen[key].update(str(d).removeprefix("torch.") for d in dtypes)

    if misread:  # shard() imports the policy when it runs: it gets this one
        real = fsdp.MixedPrecisionPolicy

        def bf16_policy(**kwargs):
            return real(**{**kwargs, "param_dtype": torch.bfloat16, "reduce_dtype": torch.bfloat16})

        fsdp.MixedPrecisionPolicy = bf16_policy

    if no_autocast:
        from lightning_fabric.plugins.precision.amp import MixedPrecision

        MixedPrecision.forward_context = lambda self: contextlib.nullcontext()

    def recording(collective):  # FSDP2's reduce-scatter of the gradients (the name depends on torch's version)
        def call(output, input, *args, **kwargs):
            note("reduced", input.dtype)
            return collective(output, input, *args, **kwargs)
        return call

    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, recording(getattr(dist, name)))
    setup = loop.setup

    rank = [0]

    def probed_setup(*args, **kwargs):
        pieces = setup(*args, **kwargs)
        run = pieces[0]  # the Trainee: the model on the Fabric
        rank[0] = run.fabric.global_rank
        for module in run.raw_model.modules():
            if isinstance(module, Layer):
                module.register_forward_pre_hook(lambda m, a: note("residual", a[0].dtype))
            elif isinstance(module, tuple(CELLS.values())):
                def cell_hook(m, a):
                    note("cell_params", *(p.dtype for p in m.parameters()))
                    if a[0] is not None:
                        note("state", a[0].dtype)
                module.register_forward_pre_hook(cell_hook)
            if isinstance(module, RMSNorm):
                module.register_forward_pre_hook(lambda m, a: note("norm_params", m.weight.dtype))
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(lambda m, a, y: note("matmul", y.dtype) if m.training else None)
        ddp = getattr(run.model, "_forward_module", None)
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                note("reduced", bucket.buffer().dtype)
                return allreduce_hook(state, bucket)

            ddp.register_comm_hook(None, hook)
        return pieces

    loop.setup = probed_setup

    import atexit

    def write():
        with open(f"{out}.rank{rank[0]}", "w") as fh:
            json.dump({k: sorted(v) for k, v in seen.items()}, fh)

    atexit.register(write)


def main(argv: list[str]) -> int:
    split = argv.index("--")
    own, train_args = argv[:split], argv[split + 1:]
    install(own[0], "--misread" in own, "--no-autocast" in own)
    from stateloop.cli import main as cli

    return cli(["train", *train_args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
