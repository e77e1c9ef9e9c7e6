"""Open and check the token shards a resolved run config names, before anything trains (train/loop.py).

A run's config resolves in one place, :func:`stateloop.resolve.resolve_run`
(docs/architecture.md#how-a-runs-config-resolves), into a :class:`~stateloop.config.run.RunConfig`;
a saved one reads back with :meth:`~stateloop.config.run.RunConfig.read`. Every failure is a one-line
:class:`ConfigError` (or ``FileNotFoundError``) naming the key or file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from stateloop.config import ConfigError
from stateloop.data.shards import META, ShardSet, open_split, read_meta
from stateloop.data.tokenizer import tokenizer_file

if TYPE_CHECKING:
    from stateloop.config.run import RunConfig


def open_data(rc: RunConfig):
    """Open and check the token shards a resolved config names: (train ShardSet, val ShardSet or None).

    Fails, naming the folder or file, when the folder or its meta.json is missing, a split is
    missing or shorter than one window, a shard's size disagrees with meta.json, a shard is listed
    twice (in one split, or in both train and the validation split), the tokenizer's vocabulary
    does not fit ``model.vocab_size``, or its file is named outside the folder. The validation
    split's shards are compared with the train split's by name and by content (their sha256).
    """
    folder, mcfg, tcfg = Path(rc.data.dir), rc.model, rc.train
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: data folder not found (run `stateloop tokenize` first)")
    meta = read_meta(folder)  # FileNotFoundError naming meta.json
    where = folder / META
    try:
        vocab = int(meta["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: no integer vocab_size") from None
    if vocab > mcfg.vocab_size:
        raise ConfigError(f"{where}: the tokenizer's vocabulary ({vocab} ids) does not fit model.vocab_size = {mcfg.vocab_size}")
    tokenizer_file(folder, meta)  # a name inside the folder (the final weights' MLflow model exports it)

    def split(name: str):
        shards = open_split(folder, name)
        if len(shards) < tcfg.seq_len + 1:
            raise ConfigError(f"{where}: split {name!r} has {len(shards)} tokens, fewer than one window of "
                              f"train.seq_len + 1 = {tcfg.seq_len + 1}")
        return shards

    train = split("train")
    val = split(tcfg.val_split) if tcfg.val_tokens > 0 else None
    if val is not None and val.split != train.split:
        shared = next((name for name in val.files if name in train.files), None)
        if shared is not None:  # the validation loss would measure tokens the run trains on
            raise ConfigError(f"{where}: shard file {shared!r} is in both split 'train' and split {val.split!r} (an edited "
                              f"or foreign meta.json; rerun `stateloop tokenize`)")
        # The same bytes under another name, by the sha256 meta.json records: ShardSet has checked
        # every shard's contents against it (verify_once), so nothing is read again here.
        trained = {digest: name for name, digest in shard_digests(train)}
        copy = next(((name, trained[digest]) for name, digest in shard_digests(val) if digest in trained), None)
        if copy is not None:
            raise ConfigError(f"{where}: shard file {copy[0]!r} of split {val.split!r} has the same contents (sha256) as "
                              f"{copy[1]!r} of split 'train': validation would measure training tokens; make the "
                              f"validation split from other text and rerun `stateloop tokenize`")
    return train, val


def shard_digests(shards: ShardSet) -> list[tuple[str, str]]:
    """(file, sha256) of each non-empty shard of a split, as meta.json records them (verified on opening)."""
    return [(s["file"], s["sha256"]) for s in shards.meta["splits"][shards.split]["shards"] if s["tokens"]]

