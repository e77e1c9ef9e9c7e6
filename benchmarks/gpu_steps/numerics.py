"""The numerical steps: one training step's gradients through each fused kernel against its
pure-PyTorch twin, fused AdamW against foreach, the precision policy's dtypes under autocast,
mamba_ssm's chunk 256 against 64, and ``pytest -m gpu``."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time

import torch

from gpu_steps.common import (
    BLOCK_S,
    ROOT,
    TRAIN_RATE,
    Context,
    Skip,
    Step,
    autocast,
    batch,
    build,
    experiment,
    fitting_micro,
    free,
    last_lines,
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

# models/kernels.py's switches: the kernel runs where its flag is set (impl "auto", on CUDA)
FLAGS = {"flash_attn": "HAS_FLASH_ATTN", "ssd": "HAS_MAMBA_SSM", "causal_conv1d": "HAS_CAUSAL_CONV1D",
         "gated_rmsnorm": "HAS_MAMBA_DECODE"}
PACKAGES = {"flash_attn": "flash_attn", "ssd": "mamba_ssm", "causal_conv1d": "causal_conv1d"}
MODELS = {"flash_attn": "stateloop_attn", "ssd": "stateloop_mamba2", "causal_conv1d": "stateloop_mamba2"}


@contextlib.contextmanager
def kernels_on(which: set[str]):
    """Only the kernels in ``which`` (keys of :data:`FLAGS`) used; each where it imported."""
    from stateloop.models import kernels

    found = {flag: getattr(kernels, flag) for flag in FLAGS.values()}
    try:
        for key, flag in FLAGS.items():
            setattr(kernels, flag, found[flag] and key in which)
        yield
    finally:
        for flag, value in found.items():
            setattr(kernels, flag, value)


def _grads(ctx: Context, model, x, y, bf16: bool) -> tuple[float, dict[str, torch.Tensor]]:
    from stateloop.train.loss import lm_loss

    model.zero_grad(set_to_none=True)
    with autocast(ctx) if bf16 else contextlib.nullcontext():
        loss = lm_loss(model, x, y)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict:
    """Largest |a - b| over b's largest entry, per parameter: the worst one and the median."""
    rel = {n: float((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-30)) for n in b}
    worst = max(rel, key=rel.get)
    return {"max_rel": rel[worst], "worst_param": worst, "median_rel": statistics.median(rel.values()), "params": len(rel)}


def kernel_backward(ctx: Context, out: dict, which: str) -> dict:
    """One training step's gradients (eq. 12's loss, bf16 autocast) of a model at Table 4's 410M
    widths, two decoder layers, with the ``which`` kernel against its twin (every other kernel off),
    each beside the twin's float32 gradients. Without the kernel the twin's own bf16-vs-float32
    difference is still recorded (the floor to judge the kernel by), and the step is skipped."""
    from stateloop.models import kernels

    scale, K, d_s = experiment(ctx, "table4")
    seq = min(seq_len(ctx, scale), 1024)
    cfg = run_config(ctx, scale, MODELS[which], K, d_s, n_layers=2)
    out.update(model=cfg.name, scale=scale, K=K, d_s=d_s, n_layers=2, micro_batch=1, seq_len=seq,
               kernel=PACKAGES[which] + (" (SSD scan)" if which == "ssd" else ""))
    model = build(ctx, cfg)
    x, y = batch(ctx, cfg.vocab_size, 1, seq)
    with kernels_on(set()):
        loss32, ref = _grads(ctx, model, x, y, bf16=False)
        ctx.check()
        loss_twin, twin = _grads(ctx, model, x, y, bf16=True)
    out["twin_bf16_vs_fp32"] = {"loss_diff": abs(loss_twin - loss32), **_diff(twin, ref)}
    present = getattr(kernels, FLAGS[which])
    if not present:
        raise Skip(f"{PACKAGES[which]} not importable")
    if not ctx.cuda:
        raise Skip(f"{PACKAGES[which]} imports, but its kernel runs on CUDA only")
    ctx.check()
    with kernels_on({which}):
        loss_k, kern = _grads(ctx, model, x, y, bf16=True)
    out["kernel_bf16_vs_fp32"] = {"loss_diff": abs(loss_k - loss32), **_diff(kern, ref)}
    out["kernel_vs_twin_bf16"] = {"loss_diff": abs(loss_k - loss_twin), **_diff(kern, twin)}
    out["kernel_over_twin_error"] = out["kernel_bf16_vs_fp32"]["max_rel"] / max(out["twin_bf16_vs_fp32"]["max_rel"], 1e-30)
    del model
    free(ctx.device)
    return out


def _headline_kernel(out: dict) -> str:
    if "kernel_vs_twin_bf16" in out:
        k, t = out["kernel_bf16_vs_fp32"], out["twin_bf16_vs_fp32"]
        return f"grads vs fp32 twin: kernel {k['max_rel']:.1e}, bf16 twin {t['max_rel']:.1e} (worst {k['worst_param']})"
    if "twin_bf16_vs_fp32" in out:
        return f"bf16 twin's grads vs fp32: {out['twin_bf16_vs_fp32']['max_rel']:.1e}"
    return ""


# ----------------------------------------------------------------------------------------------
# fused_adamw


def fused_adamw(ctx: Context, out: dict) -> dict:
    """One AdamW step, ``fused=True`` against ``foreach=True``, from the same float32 parameters,
    gradients and moments (after one step each, so the moments are not zero): the largest
    difference of the parameters over their largest change, and each step's time."""
    scale, K, d_s = experiment(ctx, "table4")
    cfg = run_config(ctx, scale, "stateloop", K, d_s)
    model = build(ctx, cfg)
    params = [p.detach() for p in model.parameters()]
    out.update(model="stateloop", scale=scale, params=sum(p.numel() for p in params))
    g = torch.Generator(device=ctx.device).manual_seed(0)
    grads = [[torch.randn(p.shape, device=ctx.device, generator=g) * 1e-3 for p in params] for _ in range(2)]
    runs = {}
    for kind in ("foreach", "fused"):
        ctx.check()
        ps = [p.clone().requires_grad_() for p in params]
        opt = torch.optim.AdamW(ps, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **{kind: True})
        times = []
        for gs in grads:
            for p, gr in zip(ps, gs):
                p.grad = gr.clone()
            sync(ctx.device)
            t0 = time.perf_counter()
            opt.step()
            sync(ctx.device)
            times.append(time.perf_counter() - t0)
        runs[kind] = ([p.detach() for p in ps], opt)
        out[kind] = {"step_s": times}
    (pf, opt_f), (pe, opt_e) = runs["fused"], runs["foreach"]
    diff = max(float((a - b).abs().max()) for a, b in zip(pf, pe))
    change = max(float((a - b).abs().max()) for a, b in zip(pe, params))
    moments = max(float((opt_f.state[a]["exp_avg_sq"] - opt_e.state[b]["exp_avg_sq"]).abs().max()
                        / opt_e.state[b]["exp_avg_sq"].abs().max().clamp_min(1e-30)) for a, b in zip(opt_f.state, opt_e.state))
    out.update(max_param_diff=diff, max_param_change=change, diff_over_change=diff / change if change else None,
               max_rel_diff_exp_avg_sq=moments, fused_over_foreach_s=out["fused"]["step_s"][-1] / out["foreach"]["step_s"][-1])
    del model, runs, opt_f, opt_e, pf, pe, params, grads
    free(ctx.device)
    return out


def _headline_adamw(out: dict) -> str:
    if out.get("diff_over_change") is None:
        return ""
    return (f"param diff {out['max_param_diff']:.1e} of a change {out['max_param_change']:.1e}; "
            f"fused/foreach time {out['fused_over_foreach_s']:.2f}")


# ----------------------------------------------------------------------------------------------
# precision_policy


EXPECTED = {  # docs/choices.md, "Precision": under bf16-mixed
    "linear_out": {"bfloat16"}, "attention_out": {"bfloat16"}, "residual": {"float32"}, "norm_out": {"float32"},
    "norm_params": {"float32"}, "state": {"float32"}, "cell_params": {"float32"}, "loss": {"float32"},
    "grads": {"float32"}, "weights": {"float32"}, "adamw_state": {"float32"},
}


def precision_policy(ctx: Context, out: dict) -> dict:
    """The dtypes of one training step of StateLoop (Table 1's 1.4B widths, two decoder layers)
    under the device's bf16 autocast, recorded by hooks as tests/support/precision_probe.py does,
    against docs/choices.md's policy (:data:`EXPECTED`)."""
    from stateloop.models.backbone import Attention, Layer, RMSNorm
    from stateloop.models.state import CELLS
    from stateloop.train.loss import lm_loss

    scale, K, d_s = experiment(ctx, "table1")
    cfg = run_config(ctx, scale, "stateloop", K, d_s, n_layers=2)
    model = build(ctx, cfg)
    seen: dict[str, set] = {key: set() for key in EXPECTED}

    def note(key, *tensors):
        seen[key].update(str(t.dtype).removeprefix("torch.") for t in tensors if isinstance(t, torch.Tensor))

    hooks = []
    for module in model.modules():
        if isinstance(module, Layer):
            hooks.append(module.register_forward_pre_hook(lambda m, a: note("residual", a[0])))
        if isinstance(module, tuple(CELLS.values())):
            def cell(m, a):
                note("cell_params", *m.parameters())
                note("state", a[0])
            hooks.append(module.register_forward_pre_hook(cell))
        if isinstance(module, RMSNorm):
            def norm(m, a, o):  # a forward hook returns None: anything else would replace the output
                note("norm_out", o)
                note("norm_params", m.weight)
            hooks.append(module.register_forward_hook(norm))
        for kind, key in ((torch.nn.Linear, "linear_out"), (Attention, "attention_out")):
            if isinstance(module, kind):
                def output(m, a, o, key=key):
                    note(key, o)
                hooks.append(module.register_forward_hook(output))
    opt = optimizer(ctx, model)
    x, y = batch(ctx, cfg.vocab_size, 1, min(seq_len(ctx, scale), 512))
    with autocast(ctx):
        loss = lm_loss(model, x, y)
    note("loss", loss)
    loss.backward()
    note("grads", *(p.grad for p in model.parameters()))
    opt.step()
    note("weights", *model.parameters())
    note("adamw_state", *(v for s in opt.state.values() for v in s.values() if v.dim() > 0))
    for h in hooks:
        h.remove()
    out["autocast"] = f"{ctx.device.type} bfloat16"
    out["seen"] = {k: sorted(v) for k, v in seen.items()}
    out["violations"] = {k: sorted(v) for k, v in seen.items() if v != EXPECTED[k]}
    out["agrees"] = not out["violations"]
    del model, opt
    free(ctx.device)
    return out


def _headline_precision(out: dict) -> str:
    if "agrees" not in out:
        return ""
    return "policy holds" if out["agrees"] else f"differs: {out['violations']}"


# ----------------------------------------------------------------------------------------------
# mamba_chunk_256_vs_64


def mamba_chunk(ctx: Context, out: dict) -> dict:
    """``model.mamba_chunk_size`` 256 (mamba_ssm's default, its kernels' tuning) against 64 (this
    project's): training steps of Table 4's 410M StateLoop + Mamba-2 (K = 7) at each, tokens/s,
    MFU and the peak beside the plan's; then the SSD scan alone at the 1.4B mixer's shape, forward
    + backward, the kernel (where it imports) and the twin at each chunk, against the float32 twin."""
    chunks = [int(c) for c in ctx.args.chunks.split(",")]
    scale, K, d_s = experiment(ctx, "table4")
    seq = seq_len(ctx, scale)
    cfgs = {c: run_config(ctx, scale, "stateloop_mamba2", K, d_s, mamba_chunk_size=c) for c in chunks}
    micro, why = fitting_micro(ctx, list(cfgs.values()), seq)
    out.update(model="stateloop_mamba2", scale=scale, K=K, d_s=d_s, micro_batch=micro, micro_batch_why=why, seq_len=seq,
               chunks=chunks, train={}, scan={})
    for c, cfg in cfgs.items():
        row = out["train"].setdefault(str(c), {})
        row["plan"] = plan_figure(cfg, seq, micro)
        reset_peak(ctx)
        model = build(ctx, cfg)
        opt = optimizer(ctx, model)
        x, y = batch(ctx, cfg.vocab_size, micro, seq)
        timed_steps(ctx, model, opt, x, y, 2, 4, row)
        throughput(ctx, row, train_flops_per_token(cfg, seq), micro * seq)
        row.update(measured_peak(ctx, row["plan"]))
        mfu_entry(ctx, ctx.step, scale, "stateloop_mamba2", False, row, K=K, micro_batch=micro, seq_len=seq,
                  activation_checkpointing="none", strategy="1 GPU", mamba_chunk_size=c)
        del model, opt
        free(ctx.device)
    rows = [out["train"][str(c)] for c in chunks]
    if len(rows) == 2 and all(r.get("tokens_per_s") for r in rows):
        out["train_tokens_per_s_ratio"] = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    for c in chunks:
        out["scan"][str(c)] = ssd_scan(ctx, c)
    return out


def ssd_scan(ctx: Context, chunk: int, reps: int = 10) -> dict:
    """The SSD scan alone at the decoding scale's (1.4B) Mamba-2 mixer shape, 1 x seq tokens, in bf16
    on CUDA: forward + backward ms, and the largest difference from the float32 twin over its largest output."""
    import torch.nn.functional as F

    from stateloop.models import kernels

    m = ctx.cfg.scales[ctx.cfg.experiments["decoding"].scale].model
    heads, seq = m.mamba_expand * m.d_model // m.mamba_head_dim, ctx.args.ssd_seq
    g = torch.Generator(device=ctx.device).manual_seed(0)
    dtype = torch.bfloat16 if ctx.cuda else torch.float32

    def rnd(*size):
        return torch.randn(*size, device=ctx.device, generator=g)

    x, dt, A = rnd(1, seq, heads, m.mamba_head_dim), F.softplus(rnd(1, seq, heads) - 2), -torch.exp(rnd(heads) * 0.5)
    B, C = rnd(1, seq, m.mamba_n_groups, m.mamba_d_state), rnd(1, seq, m.mamba_n_groups, m.mamba_d_state)
    grad = rnd(1, seq, heads, m.mamba_head_dim).to(dtype)
    ref = kernels.ssd(x, dt, A, B, C, chunk, impl="torch")
    out = {"shape": {"batch": 1, "seq": seq, "heads": heads, "head_dim": m.mamba_head_dim, "groups": m.mamba_n_groups,
                     "d_state": m.mamba_d_state, "chunk": chunk}, "dtype": str(dtype).removeprefix("torch.")}
    for impl in ["torch"] + (["kernel"] if kernels.HAS_MAMBA_SSM and ctx.cuda else []):
        ins = [t.to(dtype).requires_grad_() for t in (x, dt, B, C)]
        times = []
        for i in range(2 + (1 if ctx.smoke else reps)):
            ctx.check()
            sync(ctx.device)
            t0 = time.perf_counter()
            y = kernels.ssd(ins[0], ins[1], A, ins[2], ins[3], chunk, impl=impl)
            y.backward(grad)
            sync(ctx.device)
            if i >= 2 or (ctx.smoke and i >= 1):
                times.append(time.perf_counter() - t0)
        out[impl] = {"fwd_bwd_ms": statistics.median(times) * 1e3,
                     "max_rel_diff_vs_fp32_twin": float((y.detach().float() - ref).abs().max() / ref.abs().max())}
    if "kernel" in out:
        out["kernel_over_torch"] = out["kernel"]["fwd_bwd_ms"] / out["torch"]["fwd_bwd_ms"]
    return out


def _headline_chunk(out: dict) -> str:
    parts = [f"chunk {c}: {r['tokens_per_s']:,.0f} tok/s" for c, r in out.get("train", {}).items() if r.get("tokens_per_s")]
    for c, s in out.get("scan", {}).items():
        best = s.get("kernel") or s.get("torch")
        if best:
            parts.append(f"scan@{c} {best['fwd_bwd_ms']:.2f} ms ({'kernel' if 'kernel' in s else 'twin'})")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# gpu_tests


def gpu_tests(ctx: Context, out: dict) -> dict:
    """``pytest -m gpu`` (tests/models/test_kernels_gpu.py) in a child process stopped at the
    step's deadline; ``--mamba-ssm-src`` reaches it through the same import as here."""
    if not ctx.cuda and not ctx.smoke:
        raise Skip("no CUDA device")
    src = ctx.report.get("mamba_ssm_sources") or {}
    tests = str(ROOT / "tests/models/test_kernels_gpu.py")
    lines = [f"import sys, pathlib; sys.path[:0] = [{str(ROOT / 'benchmarks')!r}, {str(ROOT / 'src')!r}]"]
    if src:
        lines.append(f"import gpu_check; gpu_check.use_mamba_ssm_sources(pathlib.Path({src['source']!r}))")
    lines.append(f"import pytest; sys.exit(pytest.main(['-m', 'gpu', '-q', '-rs', '-p', 'no:cacheprovider', {tests!r}]))")
    code = "\n".join(lines) + "\n"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=max(1.0, ctx.left()))
    except subprocess.TimeoutExpired as err:
        out["output_tail"] = last_lines((err.stdout or b"").decode() if isinstance(err.stdout, bytes) else err.stdout or "", 20)
        from gpu_steps.common import StepTimeout

        raise StepTimeout() from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    out.update(returncode=proc.returncode, summary=lines[-1] if lines else "", seconds=time.perf_counter() - t0,
               output_tail=last_lines(proc.stdout + proc.stderr, 40))
    if proc.returncode not in (0, 5):  # 5: nothing collected (no test is marked gpu to run here)
        raise RuntimeError(f"pytest -m gpu: {out['summary']}")
    return out


# ----------------------------------------------------------------------------------------------
# Declarations with their estimates (common.py's rates)

# A training step of a 2-layer model at 1 x 1024 is milliseconds; the model's build and three
# forward + backward passes (float32 twin, bf16 twin, kernel) are a few seconds; the SSD's first
# use in this process compiles and autotunes mamba_ssm's Triton kernels: [assume] 40 s (the H200
# record's ssd_1.4b step took 84 s of wall for 12 kernel calls of 5 ms, nearly all compilation).
MAMBA_TRITON_S = 40.0
# The 410M Mamba-2 at 2 x 2048: 17.80 GFLOP a token, 17.80e9 x 4096 / 2.95e14 = 0.25 s a step.
T_MAMBA = 17.80e9 * 4096 / TRAIN_RATE

STEPS = [
    Step("kernel_backward_flash_attn", lambda c, o: kernel_backward(c, o, "flash_attn"), estimate_s=5,
         arithmetic="build a 2-layer 410M-width model ~2 s + 3 fwd+bwd at 1 x 1024 (~20 ms each on the GPU) + copies",
         cap_s=10, headline=_headline_kernel),
    Step("kernel_backward_causal_conv1d", lambda c, o: kernel_backward(c, o, "causal_conv1d"), estimate_s=5,
         arithmetic="as kernel_backward_flash_attn (causal-conv1d is a prebuilt CUDA extension: no compile)",
         cap_s=10, headline=_headline_kernel),
    Step("fused_adamw", fused_adamw, estimate_s=4,
         arithmetic="build the 410M StateLoop ~2 s + 2 x 2 AdamW steps, each 7 reads and writes of 0.41e9 "
                    "float32 values (11.5 GB at 3.35 TB/s: 3.4 ms fused, a few times that foreach) + clones",
         cap_s=10, headline=_headline_adamw),
    Step("precision_policy", precision_policy, estimate_s=4,
         arithmetic="build a 2-layer 1.4B-width StateLoop ~2 s + one step at 1 x 512 (< 0.1 s)",
         cap_s=10, headline=_headline_precision),
    Step("kernel_backward_ssd", lambda c, o: kernel_backward(c, o, "ssd"), estimate_s=5 + MAMBA_TRITON_S,
         arithmetic=f"as kernel_backward_flash_attn 5 s + mamba_ssm's first Triton compile and autotune {MAMBA_TRITON_S:.0f} s",
         cap_s=50, headline=_headline_kernel),
    Step("mamba_chunk_256_vs_64", mamba_chunk, estimate_s=2 * (BLOCK_S + 6 * T_MAMBA) + 20 + 2,
         arithmetic=f"2 chunks x (build + first steps {BLOCK_S:.0f} s + 6 steps x {T_MAMBA:.2f} s) + chunk 256's "
                    "Triton variants compiled 20 s + 4 x 12 scans of ~6 ms",
         cap_s=50, headline=_headline_chunk),
]

LAST = Step("gpu_tests", gpu_tests, estimate_s=20,
            arithmetic="a child python + torch 5 s + the kernels' Triton binaries from the disk cache 10 s + 11 tests "
                       "(the H200's in-process run: 51 s, compiling)",
            cap_s=25, headline=lambda out: out.get("summary", ""))
