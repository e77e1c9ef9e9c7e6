"""What a data folder's token shards hold, for comparing with what a test wrote into it."""

from __future__ import annotations


def encoded(data_dir, texts: list[str]) -> list[int]:
    """What a data folder's shards of ``texts`` must hold: encode(text) + [eos] per document, in order."""
    import json
    from pathlib import Path

    from stateloop.data import load_tokenizer

    tok = load_tokenizer(data_dir)
    eos = json.loads((Path(data_dir) / "meta.json").read_text())["eos_id"]
    return [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids + [eos]]


def split_tokens(data_dir, split: str) -> list[int]:
    """Every token of one split of a data folder, in order."""
    from stateloop.data.shards import ShardSet

    shards = ShardSet(data_dir, split)
    return shards.window(0, len(shards)).tolist()


def quiet(*_a, **_k) -> None:
    """A ``log`` callback (stateloop.data.tokenize's) that drops every message."""
