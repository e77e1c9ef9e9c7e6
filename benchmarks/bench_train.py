"""Training-loop throughput against a bare loop of the same model and batch, side by side.

    PYTHONPATH=src python benchmarks/bench_train.py [RUN] [--steps 60] [--repeats 3] [key=value ...]

"ours" is ``stateloop.train.loop.train`` exactly as ``stateloop train`` runs it: Lightning
Fabric, batches read from memory-mapped token shards, gradient accumulation, clipping, the
finite/stop check, AdamW + schedule, MLflow metrics every ``log_every`` steps (a throw-away sqlite
store), progress bar off. Its tokens/s is measured after the first log window (warm-up).

"bare" is the minimum that trains the same model on the same batch shape: pre-made token
tensors on the device, forward, cross-entropy / accumulation, backward, AdamW step, zero_grad,
nothing else (no Fabric, no data reads, no clipping, no logging).

The two alternate ``--repeats`` times in one process, each going first in turn (so machine load
hits both alike). Printed: the ratio ours / bare of each pair, their median, and best-of-N ours
over best-of-N bare (the least disturbed run of each). Aim: >= 0.9.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def make_shards(folder: Path, vocab: int, n_tokens: int) -> Path:
    from stateloop.data.shards import ShardWriter, token_dtype, write_meta

    dtype = token_dtype(vocab)
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", n_tokens), ("val", 20_000)):
        w = ShardWriter(folder, split, dtype)
        w.add(rng.integers(1, vocab, n))
        splits[split] = w.close()
    write_meta(folder, {"dtype": dtype.name, "vocab_size": vocab, "eos_id": 0, "tokenizer": {"kind": "random"},
                        "splits": splits})
    return folder


def bare_loop(config: dict, steps: int, warmup: int) -> float:
    """tokens/s of forward/backward/step on pre-made batches (after ``warmup`` steps)."""
    from stateloop.config import from_dict
    from stateloop.config.model import ModelConfig
    from stateloop.config.train import TrainConfig
    from stateloop.models.registry import build_model

    mcfg = from_dict(ModelConfig, config["model"], "model")
    tcfg = from_dict(TrainConfig, config["train"], "train")
    device = torch.device("cuda" if torch.cuda.is_available() and tcfg.accelerator != "cpu" else "cpu")
    torch.manual_seed(tcfg.seed)
    model = build_model(mcfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay,
                            fused=device.type == "cuda" or None)
    accum = tcfg.accumulation
    batches = [torch.randint(0, mcfg.vocab_size, (tcfg.micro_batch, tcfg.seq_len + 1), device=device) for _ in range(accum)]
    # bf16 autocast on GPU, as Fabric's bf16-mixed; on CPU no context at all (even a disabled
    # torch.autocast costs time on every exit, which would flatter "ours").
    mixed = device.type == "cuda" and tcfg.precision in ("auto", "bf16-mixed")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if mixed else contextlib.nullcontext()
    t0 = None
    for step in range(steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        for b in batches:
            with autocast:
                logits = model(b[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten()) / accum
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (steps - warmup) * tcfg.tokens_per_step / (time.perf_counter() - t0)


def our_loop(config: dict, run_dir: Path) -> float:
    from stateloop.train.loop import train

    return train(config, run_dir, progress=False).summary["tokens_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    p.add_argument("run", nargs="?", default="tiny/stateloop/K4_ds64_seed1234", metavar="RUN",
                   help="run id of --config, as `stateloop train RUN` (default: %(default)s)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the run (train.micro_batch=8, ...)")
    args = p.parse_intermixed_args()
    if args.run and "=" in args.run:  # only overrides given: they are not a run id
        args.overrides, args.run = [args.run, *args.overrides], p.get_default("run")
    if args.threads:
        torch.set_num_threads(args.threads)
    from stateloop.resolve import resolve_run

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        probe = resolve_run(args.config, args.run, args.overrides + ["train.max_steps=1"], tmp).as_dict()
        data = make_shards(tmp / "data", probe["model"]["vocab_size"], 2_000_000)
        log_every = probe["train"]["log_every"]
        if args.steps <= log_every:  # the first log_every steps are warm-up in both loops
            p.error(f"--steps: more than train.log_every = {log_every} steps are needed, got {args.steps}")
        overrides = args.overrides + [f"train.max_steps={args.steps}", "train.val_tokens=0", "train.checkpoint_every=0"]
        config = resolve_run(args.config, args.run, overrides, data).as_dict()
        t = config["train"]
        print(f"run {args.run}: micro_batch {t['micro_batch']} x seq {t['seq_len']}, global batch {t['global_batch']} "
              f"(accumulation {t['global_batch'] // t['micro_batch']}), {args.steps} steps, log every {log_every}, "
              f"torch threads {torch.get_num_threads()}, device {'cuda' if torch.cuda.is_available() else 'cpu'}")
        print(f"{'repeat':>6} {'bare tok/s':>12} {'ours tok/s':>12} {'ours/bare':>10}")
        ratios, bares, ourss = [], [], []
        for r in range(args.repeats):
            if r % 2 == 0:  # alternate which goes first, so a drifting machine load favours neither
                bare = bare_loop(config, args.steps, warmup=log_every)
                ours = our_loop(config, tmp / f"run{r}")
            else:
                ours = our_loop(config, tmp / f"run{r}")
                bare = bare_loop(config, args.steps, warmup=log_every)
            ratios.append(ours / bare)
            bares.append(bare)
            ourss.append(ours)
            print(f"{r:>6} {bare:>12,.0f} {ours:>12,.0f} {ours / bare:>10.3f}", flush=True)
        print(f"{'best':>6} {max(bares):>12,.0f} {max(ourss):>12,.0f} {max(ourss) / max(bares):>10.3f}")
        print(f"median of the per-repeat ratios: {statistics.median(ratios):.3f}; best / best: "
              f"{max(ourss) / max(bares):.3f}  (aim >= 0.9)")


if __name__ == "__main__":
    main()
