"""``stateloop tokenize``: text -> flat token shards (see :mod:`stateloop.data.tokenize`).

    stateloop tokenize --config configs/tiny.yaml --scale tiny --out data/tiny
    stateloop tokenize --set data.source='corpus/*.jsonl' data.tokenizer=path/tokenizer.json --out data/mine
    stateloop tokenize --set data.source=monology/pile-uncopyrighted data.val_fraction=0.0005 \\
        data.tokenizer=EleutherAI/gpt-neox-20b data.workers=32 --out data/pile

With ``--config``/``--scale`` the scale's ``data:`` section is read and the tokenizer is checked
against the scale's ``model.vocab_size``; ``--set data.KEY=VALUE`` overrides single keys of it (the
keys of configs/README.md's ``scales.SCALE.data``), as train and eval take ``--set``. Without them
the overrides describe the data alone (defaults: DataConfig's).
"""

from __future__ import annotations

from stateloop.data import stage
from stateloop.ops.cluster import check_cluster_file

Request = stage.Request


def run(request: Request) -> int:
    if request.config and request.scale:
        check_cluster_file(request.config)
    return stage.tokenize_stage(request)  # the stage loads --config's --scale
