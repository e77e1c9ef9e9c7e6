"""The data stage: synthetic corpus, tokenizers, token shards.

For training and evaluation code, a data folder is opened with::

    from stateloop.data import load_tokenizer
    from stateloop.data.shards import ShardSet, read_meta

    tok = load_tokenizer(data_dir)          # tokenizers.Tokenizer, checked against meta.json
    eos = read_meta(data_dir)["eos_id"]     # documents are encode(text).ids + [eos]
    train = ShardSet(data_dir, "train")     # also "val" and "test" when present
"""

from stateloop.data.tokenizer import load_tokenizer

__all__ = ["load_tokenizer"]
