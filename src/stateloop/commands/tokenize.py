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

from stateloop.data import stage
from stateloop.ops.cluster import check_cluster_file

Request = stage.Request


def run(request: Request) -> int:
    if request.config and request.scale:
        check_cluster_file(request.config)
    return stage.tokenize_stage(request)  # the stage loads --config's --scale
