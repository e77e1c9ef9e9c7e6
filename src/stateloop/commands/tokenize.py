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

from stateloop.data.stage import FLAGS  # flag -> help; each flag sets the DataConfig key of the same name


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


def run(args) -> int:
    from stateloop.data.stage import Request, tokenize_stage

    return tokenize_stage(Request.of(args))  # the stage loads --config's --scale
