"""The decoding steps: Table 3 at the 1.4B shapes with the decode step captured in a CUDA graph
(beside the same models' eager tokens), and Table 3 eager in lockstep as the DAG's job runs it."""

from __future__ import annotations

import time
import traceback

import torch

from gpu_steps.common import DECODE_S, Context, Skip, Step, free, kernels_found, sync

# ----------------------------------------------------------------------------------------------
# cuda_graph_decode


def decode_rows(ctx: Context) -> list:
    """Table 3's models (paper.yaml's ``decoding`` experiment: 1.4B, K = 4 and 5, the state
    branches), as ``stateloop bench decode`` builds untrained ones; built one at a time by the caller."""
    from stateloop.experiments import expand_runs

    return [f"{r.model}:{r.K}" + (f":{r.d_s}" if r.d_s else "") for r in expand_runs(ctx.cfg, ["decoding"])]


def host_syncs(model, token: torch.Tensor, cache) -> dict:
    """One decode step under a dispatch mode that counts every operator and those that read a
    device value on the host (``.item()``, ``bool(tensor)``, ``nonzero``) or make a tensor of host
    data (``torch.tensor(...)``: ``lift_fresh``, a host-to-device copy on CUDA): what would break a
    CUDA graph capture, visible on any device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing = {"_local_scalar_dense", "item", "nonzero", "equal", "is_nonzero", "lift_fresh"}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            name = func.__name__.split(".")[0]
            if name in syncing:
                self.syncs[name] = self.syncs.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        model(token, cache=cache)
    return {"ops_per_token": count.ops, "host_syncs": count.syncs}


@torch.inference_mode()
def graph_decode_row(ctx: Context, model, prompt: torch.Tensor, eager_tokens: int, replays: int, row: dict) -> None:
    """One model: prefill, ``eager_tokens`` greedy tokens timed as a whole, the host-sync scan,
    then (CUDA) one greedy decode step (forward, argmax, the token written back to the step's own
    input) captured in a CUDA graph and replayed ``replays`` times. A replay repeats the same
    position: it rewrites the captured KV slot and reads the captured context (P + the eager and
    warm-up tokens + 1), so its latency is a token's at that context, not a continued sequence."""
    from stateloop.models.cache import ModelCache

    cache = ModelCache()
    logits = model(prompt, cache=cache).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(2):  # the first tokens: allocator, cuBLAS and Triton first calls
        token = model(token, cache=cache).logits[:, -1].argmax(-1, keepdim=True)
    sync(ctx.device)
    t0 = time.perf_counter()
    for _ in range(eager_tokens):
        ctx.check()
        token = model(token, cache=cache).logits[:, -1].argmax(-1, keepdim=True)
    sync(ctx.device)
    row["eager_ms_per_token"] = (time.perf_counter() - t0) / eager_tokens * 1e3
    row.update(host_syncs(model, token, cache))
    row["context"] = cache.seq_len + 1
    if not ctx.cuda:
        return
    static = token.clone()

    def step():
        static.copy_(model(static, cache=cache).logits[:, -1].argmax(-1, keepdim=True))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graphs asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with ctx.no_alarm():  # a capture stopped half way would leave the stream capturing
        with torch.cuda.graph(graph):
            step()
    row["context"] = cache.seq_len
    graph.replay()
    sync(ctx.device)
    t0, done = time.perf_counter(), 0
    while done < replays:
        ctx.check()
        for _ in range(16):
            graph.replay()
        done += 16
        sync(ctx.device)
    row["graph_ms_per_token"] = (time.perf_counter() - t0) / done * 1e3
    row["graph_over_eager"] = row["graph_ms_per_token"] / row["eager_ms_per_token"]
    del graph


def cuda_graph_decode(ctx: Context, out: dict) -> dict:
    """Table 3 with each model's decode step captured in a CUDA graph (bf16 weights, batch 1,
    after a ``--decode-prefill``-token prefill), one model at a time, beside its eager tokens;
    each model's change against Vanilla Looped K = 4, eager and graphed."""
    from stateloop.ops.bench_decode import untrained_row

    scale_model = ctx.cfg.scales[ctx.cfg.experiments["decoding"].scale].model
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    prefill = ctx.args.decode_prefill
    out.update(prefill=prefill, dtype=str(dtype).removeprefix("torch."), kernels=kernels_found(), rows={}, errors={})
    vocab = scale_model.vocab_size
    prompt = torch.randint(0, vocab, (1, prefill), generator=torch.Generator().manual_seed(0)).to(ctx.device)
    eager_tokens, replays = (2, 16) if ctx.smoke else (32, 128)
    for spec in decode_rows(ctx):
        row = out["rows"].setdefault(spec, {})
        try:
            bench = untrained_row(scale_model, spec, ctx.device, dtype)
            row["label"] = bench.label
            graph_decode_row(ctx, bench.model, prompt, eager_tokens, replays, row)
        except Exception as err:  # one model's capture failing leaves the others' figures
            out["errors"][spec] = traceback.format_exc(limit=-4)[-1500:]
            row["error"] = f"{type(err).__name__}: {err}"
        finally:
            bench = None
            free(ctx.device)
    ref = out["rows"].get("vanilla_looped:4", {})
    for row in out["rows"].values():
        for key in ("eager_ms_per_token", "graph_ms_per_token"):
            if row.get(key) and ref.get(key):
                row[key.replace("ms_per_token", "change_pct")] = (row[key] / ref[key] - 1) * 100
    syncing = {k: r["host_syncs"] for k, r in out["rows"].items() if r.get("host_syncs")}
    if syncing:
        out["capture_hazards"] = syncing
    if not ctx.cuda:
        raise Skip("CUDA graph capture has no CPU counterpart (the eager tokens and the host-sync scan ran)")
    if out["errors"]:
        raise RuntimeError("capture failed for " + ", ".join(out["errors"]))
    return out


def _headline_graph(out: dict) -> str:
    parts = []
    for row in out.get("rows", {}).values():
        if row.get("graph_ms_per_token"):
            change = f" ({row['graph_change_pct']:+.1f}%)" if "graph_change_pct" in row else ""
            parts.append(f"{row['label']} {row['eager_ms_per_token']:.1f} -> {row['graph_ms_per_token']:.2f} ms{change}")
        elif row.get("eager_ms_per_token"):
            parts.append(f"{row.get('label', '?')} eager {row['eager_ms_per_token']:.1f} ms")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------
# decode_1.4b_bf16


def decode_bench(cfg, prefill: int, tokens: int, runs: int, device: torch.device, interleave: str) -> dict:
    """Table 3 as ``stateloop bench decode`` times it (every model built, then timed side by side);
    a fused kernel failing times the pure-PyTorch paths instead, and says so."""
    from stateloop.experiments import expand_runs
    from stateloop.models import kernels
    from stateloop.ops.bench_decode import bench_decode, untrained_row

    exp = cfg.experiments["decoding"]
    scale_model = cfg.scales[exp.scale].model
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = [untrained_row(scale_model, f"{r.model}:{r.K}" + (f":{r.d_s}" if r.d_s else ""), device, dtype)
            for r in expand_runs(cfg, ["decoding"])]
    ref = next(r.label for r in rows if r.label == "vanilla_looped:K4")

    def timed():
        result = bench_decode(rows, prefill, tokens, runs=runs, warmup=1, device=device, reference=ref, progress=False,
                              interleave=interleave)
        result["kernels"] = kernels_found()
        return result

    try:
        return timed()
    except Exception as err:
        if not (kernels.HAS_MAMBA_SSM or kernels.HAS_MAMBA_DECODE or kernels.HAS_FLASH_ATTN):
            raise
        failed = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    found = (kernels.HAS_MAMBA_SSM, kernels.HAS_MAMBA_DECODE, kernels.HAS_FLASH_ATTN)
    kernels.HAS_MAMBA_SSM = kernels.HAS_MAMBA_DECODE = kernels.HAS_FLASH_ATTN = False
    try:  # the later steps still see the kernels
        result = timed()
    finally:
        kernels.HAS_MAMBA_SSM, kernels.HAS_MAMBA_DECODE, kernels.HAS_FLASH_ATTN = found
    result["kernel_error"] = failed
    return result


def decode_step(ctx: Context, out: dict) -> dict:
    a = ctx.args
    out.update(decode_bench(ctx.cfg, a.decode_prefill, a.decode_tokens, a.decode_runs, ctx.device,
                            a.decode_interleave or ctx.cfg.bench.interleave))
    free(ctx.device)
    return out


def _headline_decode(out: dict) -> str:
    return "; ".join(f"{r['label']} {r['latency_ms_per_token']['mean']:.1f} ms ({r['latency_change_pct']:+.1f}%)"
                     for r in out.get("rows", []))


# ----------------------------------------------------------------------------------------------
# Declarations (common.py's rates)

TRITON_DECODE_S = 8.0  # [assume] mamba_ssm's selective_state_update compiled at its first call

STEPS = [
    Step("cuda_graph_decode", cuda_graph_decode,
         estimate_s=6 * (2 + 0.05 + 34 * DECODE_S + 3 * DECODE_S + 0.5) + TRITON_DECODE_S,
         arithmetic=f"6 models x (build 2 s + prefill 0.05 s + 34 eager tokens x {DECODE_S} s + capture and warm-up "
                    f"3 x {DECODE_S} s + 128 replays at ~4 ms 0.5 s) + Mamba-2's decode kernels compiled "
                    f"{TRITON_DECODE_S:.0f} s",
         cap_s=40, headline=_headline_graph),
    Step("decode_1.4b_bf16", decode_step,
         estimate_s=6 * 2 + 3 * 6 * (0.05 + 16 * DECODE_S),
         arithmetic=f"6 models built 2 s each + (1 warm-up + 2 runs) x 6 models x (prefill 0.05 s + 16 tokens x "
                    f"{DECODE_S} s), in lockstep",
         cap_s=30, headline=_headline_decode),
]
