"""A tiny trained-looking run folder: a StateLoop model saved with save_final and small token
shards (train/val/test) written with ShardWriter, as `stateloop train` and `tokenize` leave them."""

import dataclasses

import numpy as np

from stateloop.data.shards import ShardWriter, token_dtype, write_meta
from stateloop.evaluate.perplexity import split_windows
from stateloop.models.registry import build_model
from stateloop.runs import save_final
from support.models import tiny_config

VOCAB = 97
SEQ = 16


def write_shards(data_dir, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    splits = {}
    for split, n in (("train", 400), ("val", 8 * SEQ + 1), ("test", 6 * SEQ + 1)):
        w = ShardWriter(data_dir, split, token_dtype(VOCAB), shard_tokens=50)  # several shards per split
        w.add(rng.integers(0, VOCAB, n))
        splits[split] = w.close()
    write_meta(data_dir, {"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 0, "tokenizer": {}, "splits": splits})


def run_windows(run_dir, split: str):
    """Held-out windows of a split of the shards beside a run made by :func:`make_run`."""
    return split_windows(run_dir.parents[3] / "data", split, SEQ)[0]


def make_run(root, name: str = "stateloop", **overrides):
    """RUN_DIR with model.safetensors (config: model, data.dir, train.seq_len) and the shards beside it."""
    data_dir = root / "data"
    if not (data_dir / "meta.json").exists():
        write_shards(data_dir)
    cfg = tiny_config(name, vocab_size=VOCAB, init_std=0.2, **overrides)
    model = build_model(cfg).eval()
    run_dir = root / "runs" / "tiny" / name / f"K{cfg.K}_ds{cfg.d_s}_seed1234"
    config = {"model": dataclasses.asdict(cfg), "data": {"dir": str(data_dir)}, "train": {"seq_len": SEQ}}
    save_final(run_dir, model, config)
    return run_dir, model
