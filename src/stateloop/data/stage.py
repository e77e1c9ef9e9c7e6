"""``stateloop tokenize``'s stage: the data settings of a command line (a scale's ``data:`` section
of ``--config``/``--scale``, then single keys from flags) and the token shards they make; a train
split, or the split its training validates on, shorter than one training window of the scale is
refused in one line, no shards left. What
it is asked for is a :class:`Request`, its command's flags."""

from __future__ import annotations

from stateloop.config import Bool, ConfigError, Int, StageRequest, Text, arg, from_dict, merge, parse_dotlist, to_dict
from stateloop.config.data import DataConfig
from stateloop.config.pipeline import ScaleConfig
from stateloop.data.hub import data_needs, require
from stateloop.data.tokenize import tokenize
from stateloop.experiments import load_scale


class Request(StageRequest):
    """One tokenization as asked for (``stateloop tokenize``'s flags): the data folder, the scale
    ``config``/``scale`` whose data section to use (else the section's defaults), and ``--set
    data.KEY=VALUE`` overrides of its keys, as train and eval take them."""

    out: Text = arg("data folder to write (shards, tokenizer.json, meta.json)")
    config: Text | None = arg("pipeline config (configs/*.yaml); read with --scale", None)
    scale: Text | None = arg("the scale whose data: section to use", None)
    overrides: list[Text] = arg("override a data setting (configs/README.md: scales.SCALE.data), e.g. data.source=corpus/*.jsonl "
                                "data.vocab_size=8192 data.synthetic.train_docs=100", [], name="--set", metavar="data.KEY=VALUE")
    model_vocab_size: Int | None = arg("fail unless the tokenizer fits this model vocabulary (default: the scale's)", None)
    force: Bool = arg("rewrite even when the folder is up to date", False)
    no_progress: Bool = arg("no progress bar", False)


def resolve_data(args: Request, scale: ScaleConfig | None = None) -> tuple[DataConfig, int | None]:
    """(DataConfig, model vocab size or None) from --config/--scale (``scale``: their ScaleConfig,
    loaded by the caller) and the ``--set data.KEY=VALUE`` overrides."""
    base: dict = {}
    model_vocab = args.model_vocab_size
    where = "data"
    if args.config or args.scale:
        if not (args.config and args.scale) or scale is None:
            raise ConfigError("--config and --scale go together")
        base = to_dict(scale.data)
        where = f"scales.{args.scale}.data"
        if model_vocab is None:
            model_vocab = scale.model.vocab_size
    over = parse_dotlist(args.overrides)
    if set(over) - {"data"}:
        raise ConfigError(f"--set {sorted(set(over) - {'data'})[0]}.*: tokenize sets data.KEY=VALUE only")
    try:
        data = from_dict(DataConfig, merge(base, over.get("data") or {}), where)
    except ConfigError as err:
        raise ConfigError(f"{args.config}: {err}" if args.config else str(err)) from None
    return data, model_vocab


# The keys of a data section that say how much of the source is read, not which tokens in what order.
BUDGET_KEYS = ("max_tokens", "max_docs")


def _covers(big: int | None, small: int | None) -> bool:
    """A read bounded by ``big`` (None: all) includes one bounded by ``small``."""
    return big is None or (small is not None and big >= small)


def reads_within(small: DataConfig, big: DataConfig) -> bool:
    """Whether the tokens of ``small``'s data section are the start of ``big``'s, split by split:
    the same source, splits, tokenizer, hold-out and shard settings (every key but the budgets and
    ``workers``, which the output never depends on), and ``big``'s budget covering ``small``'s.
    A budget moves where documents held out by hash end (the val and test splits grow with it),
    so with a hash hold-out only equal budgets share."""
    a, b = to_dict(small), to_dict(big)
    for d in (a, b):
        d.pop("workers")
    budgets = [(a.pop(k), b.pop(k)) for k in BUDGET_KEYS]
    if a != b:
        return False
    if any(small.holdout_fractions):
        return all(x == y for x, y in budgets)
    return all(_covers(y, x) for x, y in budgets)


def data_homes(scales: dict[str, ScaleConfig], names: list[str]) -> dict[str, str]:
    """Scale -> the scale whose data folder (``data/<scale>``) it trains on, for the scales
    ``names`` (in config order). [choice] A scale reads another's tokens where its own would be
    their start (:func:`reads_within`; e.g. configs/paper.yaml's 410M, 25B tokens of the Pile, and
    its 1.4B's 30B in the same order with the same tokenizer) and its model's vocabulary is at
    least as large: the one with the largest budget (the first in order among equals), so the
    shared tokens are tokenized once. Its runs then draw their budget's windows from the larger
    split (train/sampler.py: no window twice within a budget the split holds), not from a split
    the size of their budget."""
    def size(name: str) -> tuple:
        d = scales[name].data
        return tuple(float("inf") if getattr(d, k) is None else getattr(d, k) for k in BUDGET_KEYS)

    out = {}
    for name in names:
        own = scales[name]
        hosts = [other for other in names if reads_within(own.data, scales[other].data)
                 and own.model.vocab_size >= scales[other].model.vocab_size]
        best = max(size(h) for h in hosts)
        out[name] = next(h for h in hosts if size(h) == best)
    for name in names:  # a host is its own host
        while out[out[name]] != out[name]:
            out[name] = out[out[name]]
    return out


def tokenize_stage(args: Request, scale: ScaleConfig | None = None) -> int:
    """Tokenize as ``args`` and ``scale`` (the scale ``args.config``/``args.scale`` name, loaded
    here unless a caller that holds it already passes it) say; a train split, or the scale's
    ``train.val_split`` where it validates, shorter than one training window of the scale is
    refused (a one-line DataError)."""
    if args.config and args.scale and scale is None:
        scale = load_scale(args.config, args.scale)

    data, model_vocab = resolve_data(args, scale)
    require(data_needs(data), args.config)  # offline: the hub tokenizer and dataset files are cached
    least = validation = None
    if scale is not None:  # a corpus too small to train (or validate) on is refused now, not at training time
        window = scale.train.seq_len + 1
        least = (window, f"one training window of train.seq_len + 1 = {window} (scales.{args.scale}.train)")
        validation = scale.train.val_split if scale.train.val_tokens > 0 else None
    tokenize(data, args.out, model_vocab_size=model_vocab, force=args.force, progress=not args.no_progress, least=least,
             validation=validation)
    return 0
