"""``stateloop tokenize``: text -> flat token shards (see :mod:`stateloop.data.tokenize`).

    stateloop tokenize --config configs/tiny.yaml --scale tiny --out data/tiny
    stateloop tokenize --source 'corpus/*.jsonl' --tokenizer path/tokenizer.json --out data/mine
    stateloop tokenize --source monology/pile-uncopyrighted --split train --val-fraction 0.0005 \\
        --tokenizer EleutherAI/gpt-neox-20b --workers 32 --out data/pile

With ``--config``/``--scale`` the scale's ``data:`` section is read and the tokenizer is checked
against the scale's ``model.vocab_size``; flags given as well override single keys of it.
Without them the flags describe the data alone (defaults: DataConfig's).
"""

from __future__ import annotations

import sys

# flag -> help; each flag sets the DataConfig key of the same name
FLAGS = {
    "source": "source for the text: synthetic, a hub dataset name, or local files/globs (json/jsonl/txt/parquet)",
    "hub_config": "the hub dataset's config name",
    "split": "hub split read for training",
    "val_split": "hub split (or local files) used whole as val",
    "test_split": "hub split (or local files) used whole as test",
    "val_fraction": "fraction of training documents held out as val (by content hash)",
    "test_fraction": "fraction of training documents held out as test (by content hash)",
    "text_field": "column holding the text (json/parquet/hub)",
    "text_unit": ".txt files: document, paragraph or line",
    "max_docs": "read at most this many training documents",
    "max_tokens": "stop reading once the train split has this many tokens",
    "tokenizer": "bpe (train on the corpus), a tokenizer.json path, or a hub name",
    "vocab_size": "vocabulary size of a trained BPE",
    "bpe_docs": "train the BPE on this many documents",
    "eos_token": "end-of-document token (default: the tokenizer's own)",
    "shard_tokens": "tokens per shard file",
    "workers": "encoding processes (0: in this process)",
    "seed": "seed of the synthetic generator and the held-out hash",
}


NUMBERS = ("val_fraction", "test_fraction", "max_docs", "max_tokens", "vocab_size", "bpe_docs", "shard_tokens", "workers", "seed")


def add_arguments(p) -> None:
    p.add_argument("--config", help="pipeline config (configs/*.yaml); read with --scale")
    p.add_argument("--scale", help="the scale whose data: section to use")
    p.add_argument("--out", required=True, help="data folder to write (shards, tokenizer.json, meta.json)")
    for key, help_text in FLAGS.items():
        p.add_argument("--" + key.replace("_", "-"), dest=key, metavar="VALUE", help=help_text)
    p.add_argument("--synthetic-docs", metavar="TRAIN,VAL,TEST", help="documents per synthetic split, e.g. 20000,500,500")
    p.add_argument("--model-vocab-size", type=int, help="fail unless the tokenizer fits this model vocabulary")
    p.add_argument("--force", action="store_true", help="rewrite even when the folder is up to date")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def resolve(args, scale=None):
    """(DataConfig, model vocab size or None) from --config/--scale (their ScaleConfig ``scale``
    where the caller has it) and the flags."""
    import yaml

    from stateloop.config import ConfigError, from_dict, merge, to_dict
    from stateloop.data.config import DataConfig
    from stateloop.pipeline import load_scale

    base: dict = {}
    model_vocab = args.model_vocab_size
    where = "data"
    if args.config or args.scale:
        if not (args.config and args.scale):
            raise ConfigError("--config and --scale go together")
        scale = scale or load_scale(args.config, args.scale)
        base = to_dict(scale.data)
        where = f"scales.{args.scale}.data"
        if model_vocab is None:
            model_vocab = scale.model.vocab_size
    over: dict = {}
    for key in FLAGS:
        raw = getattr(args, key)
        if raw is None:
            continue
        if raw.lower() in ("null", "none"):
            over[key] = None  # unset (YAML's null; Python's None)
        elif key in NUMBERS or raw.startswith("["):
            over[key] = yaml.safe_load(raw)  # numbers, lists of files
        else:
            over[key] = raw  # names and paths stay strings ("1.4b", "yes.txt")
    if args.synthetic_docs:
        try:
            train, val, test = (int(x) for x in args.synthetic_docs.split(","))
        except ValueError:
            raise ConfigError(f"--synthetic-docs: expected TRAIN,VAL,TEST integers, got {args.synthetic_docs!r}") from None
        over["synthetic"] = {"train_docs": train, "val_docs": val, "test_docs": test}
    try:
        data = from_dict(DataConfig, merge(base, over), where)
    except ConfigError as err:
        raise ConfigError(f"{args.config}: {err}" if args.config else str(err)) from None
    return data, model_vocab


def run(args) -> int:
    from stateloop.data.tokenize import tokenize
    from stateloop.pipeline import load_scale

    scale = load_scale(args.config, args.scale) if args.config and args.scale else None
    data, model_vocab = resolve(args, scale)
    meta = tokenize(data, args.out, model_vocab_size=model_vocab, force=args.force, progress=not args.no_progress)
    if scale is not None:  # a corpus too small to train on: said now, not at training time
        window = scale.train.seq_len + 1
        tokens = ((meta.get("splits") or {}).get("train") or {}).get("tokens", 0)
        if tokens < window:
            print(f"stateloop tokenize: warning: {args.out}: the train split has {tokens} tokens, fewer than one training "
                  f"window of train.seq_len + 1 = {window} (scales.{args.scale}.train): training will refuse it; "
                  f"give a larger corpus", file=sys.stderr)
    return 0
