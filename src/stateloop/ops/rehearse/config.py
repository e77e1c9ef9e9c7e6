"""The rehearsal of a config: the same DAG with every setting kept and only sizes shrunk.

:func:`shrink` maps a config mapping to its rehearsal. **Kept**: every scale, experiment, model and
option; K and the structure of d_s; precision (CPU bf16 autocast); strategy (FSDP2 over gloo); the
world shape (several nodes: 2 "nodes" x 1 process under a local ``srun``); accumulation; the
checkpoint and validation cadence (every 2 steps, so a resume has a checkpoint); the data stage's
hub and offline paths (rehearse/run.py); the lm-eval tasks and shots; the analyses' splits; Table
3's dtype; rendering. **Shrunk**: seeds (the first two), widths (d = 32, head dim 8), layer counts
(/8), token budgets (4 steps of 32-token windows), data, evaluation sizes, resources; the
vocabulary is kept. **Changed**: evaluation in ``bf16-mixed`` runs in float32 (a bf16 head matmul
without AVX-512 bf16 is 6x float32's; CPU bf16 evaluation is tested in tests/evaluate/test_lm.py).
:func:`kept_settings` lists, per scale, the settings a test checks in the rehearsal's records.
"""

from __future__ import annotations

import copy

D_MODEL = 32  # rehearsal width
HEAD_DIM = 8
SEQ_LEN = 32
STEPS = 4  # optimiser steps per run
CADENCE = 2  # validation and checkpoints every CADENCE steps
EVAL_LIMIT = 2  # documents per lm-eval task: two keep the aggregation over documents; more cost minutes
# The evaluation window: real tasks have continuations of up to ~60 GPT-NeoX tokens (PIQA's
# solutions), more than the 32-token training windows, and a continuation must fit the window.
EVAL_WINDOW = 128
HELDOUT_WINDOWS = 4
SEEDS = 2  # an experiment's seeds, at most: two keep the path that aggregates seeds into intervals
LAYER_OPTIONS = ("n_begin", "n_middle", "n_end", "n_prelude", "n_core", "n_coda")


def shrink_layers(n: int) -> int:
    """24 -> 3, 12 -> 2, 8 -> 1, 6 -> 1: the paper's layer counts divided by 8, at least 1."""
    return max(1, int(n / 8 + 0.5))


def _width(x: int, factor: float, minimum: int = 1) -> int:
    return max(minimum, int(x * factor + 0.5))


def shrink_model(model: dict) -> tuple[dict, float]:
    """The scale's ``model:`` section shrunk; returns it and the width factor d_new / d_old."""
    m = dict(model)
    d_old = int(m.get("d_model", 512))
    d_new = min(d_old, D_MODEL)
    factor = d_new / d_old
    m["d_model"] = d_new
    m["head_dim"] = min(int(m.get("head_dim", 64)), HEAD_DIM)
    m["n_heads"] = d_new // m["head_dim"]
    if "d_ff" in m:
        m["d_ff"] = _width(m["d_ff"], factor, 8)
    m["n_layers"] = shrink_layers(int(m.get("n_layers", 2)))
    m["max_seq_len"] = EVAL_WINDOW
    mixer_width = int(m.get("mixer_heads", 8)) * int(m.get("mixer_head_dim", 64))
    m["mixer_head_dim"] = min(int(m.get("mixer_head_dim", 64)), HEAD_DIM)
    m["mixer_heads"] = max(1, _width(mixer_width, factor) // m["mixer_head_dim"])
    m["mamba_head_dim"] = min(int(m.get("mamba_head_dim", 64)), HEAD_DIM)
    m["mamba_d_state"] = min(int(m.get("mamba_d_state", 128)), 8)
    m["mamba_chunk_size"] = 8
    for key in ("attn_impl", "ssd_impl"):  # the fused kernels need CUDA: the pure-PyTorch twins run
        m.pop(key, None)
    return m, factor


def shrink_train(train: dict) -> dict:
    t = dict(train)
    nodes, devices = int(t.get("num_nodes", 1)), int(t.get("devices", 1))
    micro, glob = int(t.get("micro_batch", 8)), int(t.get("global_batch", 256))
    accumulation = max(1, glob // (micro * nodes * devices))
    t["num_nodes"] = 2 if nodes > 1 else 1
    t["devices"] = 1 if nodes > 1 else min(devices, 2)
    t["accelerator"] = "cpu"
    t["micro_batch"] = 1
    t["global_batch"] = accumulation * t["num_nodes"] * t["devices"]
    t["seq_len"] = SEQ_LEN
    t.pop("max_steps", None)
    t["max_tokens"] = STEPS * t["global_batch"] * SEQ_LEN
    t["warmup_steps"] = 1 if t.get("warmup_steps", 0) else 0
    for key in ("val_every", "checkpoint_every"):
        t[key] = CADENCE if t.get(key, 1) else 0
    t["val_tokens"] = 2 * SEQ_LEN if t.get("val_tokens", 1) else 0
    t["log_every"] = 1
    t["mlflow_tracking_uri"] = ""  # the rehearsal's own store, never the config's server
    return t


def shrink_data(data: dict) -> dict:
    d = dict(data)
    if d.get("max_tokens"):
        d["max_tokens"] = 20_000
    if d.get("max_docs"):
        d["max_docs"] = min(int(d["max_docs"]), 400)
    d["workers"] = min(int(d.get("workers", 1)), 2)
    d["shard_tokens"] = 8192  # several shards: windows cross shard boundaries as at scale
    d["bpe_docs"] = min(int(d.get("bpe_docs", 100000)), 2000)
    if isinstance(d.get("synthetic"), dict):
        syn = dict(d["synthetic"])
        for key, n in (("train_docs", 400), ("val_docs", 40), ("test_docs", 40)):
            if key in syn:
                syn[key] = min(int(syn[key]), n)
        d["synthetic"] = syn
    return d


def shrink_eval(ev: dict) -> dict:
    e = dict(ev)
    e["limit"] = EVAL_LIMIT
    e["heldout_windows"] = HELDOUT_WINDOWS
    e["batch_size"] = 4
    e["max_length"] = EVAL_WINDOW
    e["bootstrap_iters"] = min(int(e.get("bootstrap_iters", 1000)), 10)
    for key, n in (("synthetic_examples", 20), ("fewshot_pool", 10)):
        e[key] = min(int(e.get(key, n)), n)
    e["device"] = "cpu"
    if e.get("precision") == "bf16-mixed":
        e["precision"] = "32-true"  # see the module docstring: CPU bf16 heads cost minutes
    return e


SHARD_KEYS = ("shapley_shards", "interventions_shards")  # resources.analyze's, kept (at most 2) so the sharded DAG runs


def shrink_resources(resources: dict) -> dict:
    out = {stage: {"runtime": 30, "mem_mb": 4000, "cpus_per_task": 1, "gpus": 0} for stage in resources}
    for key in SHARD_KEYS:
        n = (resources.get("analyze") or {}).get(key)
        if n:
            out["analyze"][key] = min(int(n), 2)
    return out


def shrink_experiment(exp: dict, factor: float) -> dict:
    e = copy.deepcopy(exp)
    if "d_s" in e:
        e["d_s"] = [_width(x, factor) if x else 0 for x in e["d_s"]]
    for model, opts in (e.get("options") or {}).items():
        for key in LAYER_OPTIONS:
            if opts.get(key) is not None:
                opts[key] = shrink_layers(int(opts[key]))
        if model == "vanilla_looped_ffn" and opts.get("d_ff") is not None:
            opts["d_ff"] = _width(opts["d_ff"], factor, 8)
    if len(e.get("seeds") or []) > SEEDS:
        e["seeds"] = list(e["seeds"][:SEEDS])
    return e


def _keep_rung_order(out: dict) -> None:
    """A compute ladder (report/ladder.py) keeps its rungs' order of compute: shrunk to d = 32 and
    one layer, the n-th rung trains n times the steps (4, 8, 12, ...), so that its fit has a
    compute axis."""
    from stateloop.report.ladder import RUNGS  # torch (train.flops): only where a ladder is shrunk

    rungs = [r for r in RUNGS if r in out.get("experiments", {})]
    for n, rung in enumerate(rungs, start=1):
        out["scales"][out["experiments"][rung]["scale"]]["train"]["max_tokens"] *= n


def shrink(raw: dict) -> dict:
    """The rehearsal config of a config mapping (without data or task locations: see
    :func:`stateloop.ops.rehearse.prepare`)."""
    out = copy.deepcopy(raw)
    factors = {}
    for name, scale in out["scales"].items():
        gpu = str((scale.get("train") or {}).get("accelerator", "auto")) in ("cuda", "gpu")
        scale["model"], factors[name] = shrink_model(scale.get("model") or {})
        scale["train"] = shrink_train(scale.get("train") or {})
        if gpu and scale["train"].get("precision", "auto") == "auto":
            scale["train"]["precision"] = "bf16-mixed"  # what `auto` is on the config's GPUs
        scale["data"] = shrink_data(scale.get("data") or {})
        scale["eval"] = shrink_eval(scale.get("eval") or {})
        scale["resources"] = shrink_resources(scale.get("resources") or {s: {} for s in
                                                                          ("tokenize", "train", "eval", "analyze", "bench")})
        scale["_gpu"] = gpu
        scale["paper"] = False  # shrunk: never compared with the paper's absolute numbers
    for exp in out.get("experiments", {}).values():
        exp.update(shrink_experiment(exp, factors[exp["scale"]]))
    _keep_rung_order(out)
    bench = dict(out.get("bench") or {})
    decoding_scale = out.get("experiments", {}).get("decoding", {}).get("scale")
    if bench.get("dtype", "auto") == "auto" and decoding_scale and out["scales"][decoding_scale]["_gpu"]:
        bench["dtype"] = "bfloat16"  # what `auto` resolves to on the config's GPUs
    bench.update(prefill=16, tokens=8, repeats=2, warmup=1)
    out["bench"] = bench
    for scale in out["scales"].values():
        scale.pop("_gpu")
    return out


def kept_settings(raw: dict) -> dict[str, dict]:
    """Per scale, what a rehearsal keeps of the config's training: precision, strategy, world
    shape (nodes > 1, devices > 1) and accumulation, as they are recorded in train.json."""
    out = {}
    for name, scale in raw["scales"].items():
        t = scale.get("train") or {}
        nodes, devices = int(t.get("num_nodes", 1)), int(t.get("devices", 1))
        micro, glob = int(t.get("micro_batch", 8)), int(t.get("global_batch", 256))
        out[name] = {"precision": t.get("precision", "auto"), "strategy": t.get("strategy", "ddp"),
                     "multi_node": nodes > 1, "multi_device": nodes * devices > 1,
                     "accumulation": max(1, glob // (micro * nodes * devices))}
    return out
