"""The training steps: eager against compiled tokens/s and MFU, the peak memory beside the plan's
figure, and FSDP2 on a 1 x 1 mesh. Each model trains as train/loop.py trains it (eq. 12's loss under
bf16 autocast, clip 1.0, AdamW fused on CUDA); one model is alive at a time, its peak read after
``reset_peak_memory_stats``."""

from __future__ import annotations

import datetime
import os
import statistics

import torch

from gpu_steps.common import (
    BLOCK_S,
    COMPILE_S,
    TRAIN_RATE,
    Context,
    Skip,
    Step,
    autocast,
    batch,
    build,
    dynamo_reset,
    experiment,
    fitting_micro,
    free,
    measured_peak,
    mfu_entry,
    optimizer,
    plan_figure,
    reset_peak,
    run_config,
    seq_len,
    sync,
    throughput,
    timed_steps,
    train_flops_per_token,
)

FLOPS_410M, FLOPS_1_4B = 17.42e9, 34.90e9  # StateLoop's training FLOPs a token at 2048 (models/flops.py)


# ----------------------------------------------------------------------------------------------
# compile_410m, compile_1.4b


def same_weights_loss(ctx: Context, model, x, y) -> float:
    """Eq. (12)'s loss of one training forward under bf16 autocast, with no step taken."""
    from stateloop.train.loss import lm_loss

    with autocast(ctx):
        return float(lm_loss(model, x, y).detach())


def compile_vs_eager(ctx: Context, out: dict, exp_name: str, micro_choices: tuple[int, ...]) -> dict:
    """StateLoop at the experiment's shape: eager steps, then the same model compiled; tokens/s,
    MFU and the peak beside the plan's figure for each."""
    from stateloop.train.compiling import compile_units

    scale, K, d_s = experiment(ctx, exp_name)
    cfg = run_config(ctx, scale, "stateloop", K, d_s)
    seq = seq_len(ctx, scale)
    micro, why = fitting_micro(ctx, [cfg], seq, micro_choices)
    flops = train_flops_per_token(cfg, seq)
    plan = plan_figure(cfg, seq, micro)
    out.update(model="stateloop", scale=scale, K=K, d_s=d_s, micro_batch=micro, micro_batch_why=why, seq_len=seq,
               plan=plan)
    setting = dict(K=K, micro_batch=micro, seq_len=seq, activation_checkpointing="none", strategy="1 GPU")
    model = build(ctx, cfg)
    opt = optimizer(ctx, model)
    x, y = batch(ctx, cfg.vocab_size, micro, seq)
    steps = ctx.args.train_steps
    for form in ("eager", "compiled"):
        row = out.setdefault(form, {})
        reset_peak(ctx)
        if form == "compiled":
            # the same weights and batch, eager then compiled: the loss difference the configs' switch
            # to train.compile: true is judged by (docs/cluster.md, "Eager until a GPU says otherwise")
            out["loss_eager_same_weights"] = same_weights_loss(ctx, model, x, y)
            model = compile_units(model)  # exactly what train.compile: true does (train/compiling.py)
            out["loss_compiled_same_weights"] = same_weights_loss(ctx, model, x, y)
            out["loss_rel_diff"] = abs(out["loss_compiled_same_weights"] / out["loss_eager_same_weights"] - 1)
        timed_steps(ctx, model, opt, x, y, 2, steps, row)
        if form == "compiled":
            row["compile_s"] = row["first_step_s"]  # the first compiled step: tracing, compiling, running
        throughput(ctx, row, flops, micro * seq)
        row.update({k: v for k, v in measured_peak(ctx, plan).items() if k != "plan"})  # the plan: out["plan"]
        mfu_entry(ctx, ctx.step, scale, "stateloop", form == "compiled", row, **setting)
    if out["eager"].get("tokens_per_s") and out["compiled"].get("tokens_per_s"):
        out["compiled_over_eager_tokens_per_s"] = out["compiled"]["tokens_per_s"] / out["eager"]["tokens_per_s"]
    del model, opt
    dynamo_reset()
    free(ctx.device)
    return out


def _headline_compile(out: dict) -> str:
    parts = []
    for form in ("eager", "compiled"):
        row = out.get(form, {})
        if row.get("tokens_per_s"):
            mfu = f", MFU {row['mfu']:.3f}" if row.get("mfu") else ""
            peak = f", peak {row['peak_gib']:.1f} GiB" if row.get("peak_gib") else ""
            parts.append(f"{form} {row['tokens_per_s']:,.0f} tok/s{mfu}{peak}")
    plan = out.get("plan", {}).get("allocated_gib")
    diff = f"; loss compiled/eager - 1 at the same weights {out['loss_rel_diff']:.1e}" if "loss_rel_diff" in out else ""
    return "; ".join(parts) + (f" (plan {plan:.1f} GiB)" if plan and parts else "") + diff


# ----------------------------------------------------------------------------------------------
# memory_vs_plan_1.4b, memory_vs_plan_410m


def memory_vs_plan_1_4b(ctx: Context, out: dict) -> dict:
    """The 1.4B StateLoop and Vanilla Looped at K = 4, micro-batch 2 x 2048, one GPU, checkpointing
    none and layer: each model's peak after a reset, beside the plan's figure for the setting."""
    from stateloop.train.checkpointing import checkpointed

    scale, K, d_s = experiment(ctx, "table1")
    seq = seq_len(ctx, scale)
    micro = ctx.args.micro_1_4b
    out.update(scale=scale, K=K, d_s=d_s, micro_batch=micro, seq_len=seq, rows={})
    for name in ("stateloop", "vanilla_looped"):
        cfg = run_config(ctx, scale, name, K, d_s)
        flops = train_flops_per_token(cfg, seq)
        model = build(ctx, cfg)
        opt = optimizer(ctx, model)
        x, y = batch(ctx, cfg.vocab_size, micro, seq)
        for level in ("none", "layer"):
            row = out["rows"].setdefault(f"{name}/{level}", {})
            row["plan"] = plan_figure(cfg, seq, micro, level)
            reset_peak(ctx)
            with checkpointed(model, level):
                timed_steps(ctx, model, opt, x, y, 1, 2, row)
            throughput(ctx, row, flops, micro * seq)
            row.update(measured_peak(ctx, row["plan"]))
            mfu_entry(ctx, ctx.step, scale, name, False, row, K=K, micro_batch=micro, seq_len=seq,
                      activation_checkpointing=level, strategy="1 GPU")
        del model, opt
        free(ctx.device)
    return out


def _headline_memory(out: dict) -> str:
    parts = []
    for key, row in out.get("rows", {}).items():
        plan = row.get("plan", {}).get("allocated_gib")
        if row.get("peak_gib") is not None:
            parts.append(f"{key} {row['peak_gib']:.1f}/{plan:.1f} GiB")
        elif plan is not None and row.get("step_s"):
            parts.append(f"{key} plan {plan:.2f} GiB")
    return ("peak/plan: " if any("/" in p.split()[-2] for p in parts) else "") + "; ".join(parts)


BRANCH_MODELS = ("vanilla_looped", "stateloop", "stateloop_attn", "stateloop_mamba2")


def memory_vs_plan_410m(ctx: Context, out: dict) -> dict:
    """Table 4's 410M shape (K = 7, d_s = 1024): the four models one at a time (Vanilla Looped,
    StateLoop and its attention and Mamba-2 variants), each's peak beside the plan's, tokens/s,
    MFU, and each state branch's step time over Vanilla's beside its FLOP floor (the H200 record's
    ``train_410m_bf16``, one block a model and a peak each)."""

    scale, K, d_s = experiment(ctx, "table4")
    seq = seq_len(ctx, scale)
    models = ctx.args.train_models.split(",")
    cfgs = {m: run_config(ctx, scale, m, K, d_s) for m in models}
    micro, why = fitting_micro(ctx, list(cfgs.values()), seq)
    out.update(scale=scale, K=K, d_s=d_s, micro_batch=micro, micro_batch_why=why, seq_len=seq, models={})
    for name in models:
        row = out["models"].setdefault(name, {})
        row["plan"] = plan_figure(cfgs[name], seq, micro)
        reset_peak(ctx)
        model = build(ctx, cfgs[name])
        opt = optimizer(ctx, model)
        x, y = batch(ctx, cfgs[name].vocab_size, micro, seq)
        timed_steps(ctx, model, opt, x, y, 2, 5, row)
        throughput(ctx, row, train_flops_per_token(cfgs[name], seq), micro * seq)
        row.update(measured_peak(ctx, row["plan"]))
        mfu_entry(ctx, ctx.step, scale, name, False, row, K=K, micro_batch=micro, seq_len=seq,
                  activation_checkpointing="none", strategy="1 GPU")
        del model, opt
        free(ctx.device)
    base = out["models"].get("vanilla_looped", {})
    for name, row in out["models"].items():
        if name == "vanilla_looped" or not (row.get("step_s") and base.get("step_s")):
            continue
        ratio = statistics.median(row["step_s"]) / statistics.median(base["step_s"])
        floor = row["train_flops_per_token"] / base["train_flops_per_token"]
        row.update(step_time_over_vanilla_looped=ratio, flop_floor=floor,
                   x_floor=(ratio - 1) / (floor - 1) if floor != 1 else None)
    return out


def _headline_410m(out: dict) -> str:
    parts = []
    for name, row in out.get("models", {}).items():
        if not row.get("tokens_per_s"):
            continue
        mem = f" {row['peak_gib']:.1f}/{row['plan']['allocated_gib']:.1f} GiB" if row.get("peak_gib") else ""
        mfu = f" MFU {row['mfu']:.3f}" if row.get("mfu") else ""
        floor = f" x{row['x_floor']:.2f} floor" if row.get("x_floor") is not None else ""
        parts.append(f"{name}{mfu}{mem}{floor}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# fsdp2_1x1


RANK_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE")


def fsdp2_1x1(ctx: Context, out: dict) -> dict:
    """The 1.4B StateLoop at K = 4, micro-batch 2 x 2048 under ``train.strategy: fsdp`` forced onto
    one device: Fabric's ModelParallelStrategy with train/parallel.py's ``shard`` on a 1 x 1 mesh
    (every hook, DTensor and all-gather of the sharded path runs; nothing is split), set up and
    stepped as train/loop.py does (Fabric's bf16-mixed autocast, fabric.backward, clip, AdamW)."""
    import types

    import lightning_fabric as L
    from lightning_fabric.plugins.environments import LightningEnvironment

    from stateloop.models.registry import build_model
    from stateloop.train.loop import configure_optimizer
    from stateloop.train.loss import lm_loss
    from stateloop.train.parallel import fsdp_strategy, is_sharded

    scale, K, d_s = experiment(ctx, "table1")
    seq = seq_len(ctx, scale)
    micro = ctx.args.micro_1_4b
    cfg = run_config(ctx, scale, "stateloop", K, d_s)
    tcfg = types.SimpleNamespace(fsdp_sharding="full", devices=1, num_nodes=1, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                 weight_decay=0.1)
    plan = plan_figure(cfg, seq, micro)
    out.update(model="stateloop", scale=scale, K=K, d_s=d_s, micro_batch=micro, seq_len=seq, sharding="full",
               plan=plan, plan_note="the plan of one device without a wrapper (ops/memory.py plans FSDP only "
                                    "for several ranks); FSDP2's gathered copies come on top")
    env_before = {k: os.environ.get(k) for k in RANK_VARIABLES}  # Fabric's launch sets them: restored below
    strategy = fsdp_strategy(tcfg, LightningEnvironment(), datetime.timedelta(seconds=300))
    fabric = L.Fabric(accelerator=ctx.device.type, devices=1, strategy=strategy, precision="bf16-mixed")
    fabric.launch()
    try:
        reset_peak(ctx)
        torch.manual_seed(0)
        with fabric.init_module():  # on the device at once (train/loop.py builds on the CPU, and
            raw = build_model(cfg, device=ctx.device)  # fully_shard moves it: 1.4B on a CPU is seconds of the cap)
        model = fabric.setup_module(raw)
        opt = fabric.setup_optimizers(configure_optimizer(raw, tcfg, fused=ctx.cuda))
        out["sharded"] = is_sharded(fabric)
        out["dtensor_params"] = sum(type(p).__name__ == "DTensor" for p in raw.parameters())
        x, y = batch(ctx, cfg.vocab_size, micro, seq)
        x, y = x.to(fabric.device), y.to(fabric.device)
        times = out.setdefault("step_s", [])
        import time

        for i in range(1 + (1 if ctx.smoke else 3)):
            ctx.check()
            sync(ctx.device)
            t0 = time.perf_counter()
            loss = lm_loss(model, x, y)
            fabric.backward(loss)
            fabric.clip_gradients(model, opt, max_norm=1.0, error_if_nonfinite=False)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(ctx.device)
            if i:
                times.append(time.perf_counter() - t0)
            out.setdefault("losses", []).append(float(loss.detach()))
        throughput(ctx, out, train_flops_per_token(cfg, seq), micro * seq)
        out.update(measured_peak(ctx, plan))
        mfu_entry(ctx, ctx.step, scale, "stateloop", False, out, K=K, micro_batch=micro, seq_len=seq,
                  activation_checkpointing="none", strategy="fsdp2 1x1")
        one = ctx.report["steps"].get("compile_1.4b", {})
        if one.get("eager", {}).get("tokens_per_s") and out.get("tokens_per_s") and one.get("micro_batch") == micro:
            out["tokens_per_s_over_one_device"] = out["tokens_per_s"] / one["eager"]["tokens_per_s"]
        del model, raw, opt
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        # else every process this one starts later (the test suite's trainings) inherits its MASTER_PORT
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        free(ctx.device)
    return out


def _headline_fsdp(out: dict) -> str:
    if not out.get("tokens_per_s"):
        return ""
    mfu = f", MFU {out['mfu']:.3f}" if out.get("mfu") else ""
    peak = f", peak {out['peak_gib']:.1f} GiB (plan {out['plan']['allocated_gib']:.1f})" if out.get("peak_gib") else ""
    return f"{out['tokens_per_s']:,.0f} tok/s{mfu}{peak}, losses {', '.join(f'{v:.3f}' for v in out.get('losses', []))}"


def _needs_fabric(ctx: Context) -> None:
    try:
        import lightning_fabric  # noqa: F401
    except ImportError as err:
        raise Skip(f"lightning_fabric not importable: {err}") from None


def _fsdp(ctx: Context, out: dict) -> dict:
    _needs_fabric(ctx)
    return fsdp2_1x1(ctx, out)


# ----------------------------------------------------------------------------------------------
# Declarations with their estimates (common.py's rates)

# 410M StateLoop, K = 7: 17.42 GFLOP a token. On an H100 the plan fits micro-batch 2 (4 x 2048 needs
# 80 GiB), so a step is 17.42e9 x 4096 / 2.95e14 = 0.24 s (0.48 s at 4 x 2048 on an H200).
T410 = FLOPS_410M * 2 * 2048 / TRAIN_RATE
# 1.4B StateLoop, K = 4, micro-batch 2 x 2048: 34.90e9 x 4096 / 2.95e14 = 0.48 s; under "layer"
# checkpointing the forward runs twice: x 4/3 = 0.65 s.
T14 = FLOPS_1_4B * 2 * 2048 / TRAIN_RATE

MATMUL_N = 8192  # 2 x 8192^3 = 1.1e12 FLOP a product; 13 products at the H200's 8.06e14 FLOP/s: 0.02 s


def matmul_peak(ctx: Context, out: dict) -> dict:
    """Dense n x n x n products (bf16 on CUDA, float32 on a CPU): the ceiling actually reached here,
    which the MFU figures are also given against."""
    import time

    n = 512 if ctx.smoke else MATMUL_N
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    a, b = (torch.randn(n, n, device=ctx.device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(ctx.device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(ctx.device)
    seconds = (time.perf_counter() - t0) / 10
    out.update(n=n, dtype=str(dtype).removeprefix("torch."), seconds=seconds, flops_per_s=2 * n**3 / seconds)
    return out


STEPS = [
    Step("matmul_peak", matmul_peak, estimate_s=2,
         arithmetic="13 products of 2 x 8192^3 = 1.1e12 FLOP at 8.06e14 FLOP/s (0.02 s) + cuBLAS's start ~1 s",
         cap_s=5, headline=lambda out: f"{out['flops_per_s'] / 1e12:.1f} TFLOP/s ({out['dtype']})" if "flops_per_s" in out else ""),
    Step("compile_410m", lambda c, o: compile_vs_eager(c, o, "table4", (4, 2, 1)),
         estimate_s=BLOCK_S + 8 * T410 + COMPILE_S["410m"] + 8 * T410,
         arithmetic=f"build + first steps {BLOCK_S:.0f} s + eager 8 steps x {T410:.2f} s + first compiled step "
                    f"{COMPILE_S['410m']:.0f} s + compiled 8 x {T410:.2f} s",
         cap_s=50, headline=_headline_compile),
    Step("compile_1.4b", lambda c, o: compile_vs_eager(c, o, "table1", (2, 1)),
         estimate_s=BLOCK_S + 8 * T14 + COMPILE_S["1.4b"] + 8 * T14,
         arithmetic=f"build + first steps {BLOCK_S:.0f} s + eager 8 steps x {T14:.2f} s + first compiled step "
                    f"{COMPILE_S['1.4b']:.0f} s + compiled 8 x {T14:.2f} s",
         cap_s=50, headline=_headline_compile),
    Step("memory_vs_plan_1.4b", memory_vs_plan_1_4b,
         estimate_s=2 * (BLOCK_S + 3 * T14 + 3 * T14 * 4 / 3),
         arithmetic=f"2 models x (build {BLOCK_S:.0f} s + 3 steps x {T14:.2f} s under none + 3 x {T14 * 4 / 3:.2f} s "
                    "under layer)",
         cap_s=30, headline=_headline_memory),
    Step("memory_vs_plan_410m", memory_vs_plan_410m,
         estimate_s=3 * (BLOCK_S + 7 * T410),
         arithmetic=f"3 models (Mamba-2's peak: mamba_chunk_256_vs_64) x (build + first steps {BLOCK_S:.0f} s "
                    f"+ 7 steps x {T410:.2f} s at 2 x 2048)",
         cap_s=30, headline=_headline_410m),
    Step("fsdp2_1x1", _fsdp,
         estimate_s=BLOCK_S + 5 + 4 * T14,
         arithmetic=f"build {BLOCK_S:.0f} s + Fabric and a 1-rank process group 5 s + 4 steps x {T14:.2f} s",
         cap_s=20, headline=_headline_fsdp),
]
