"""``stateloop params --config configs/paper.yaml``: one CSV row per run the config defines,
with its parameter count taken from a model built on the meta device (no weights allocated)."""

from __future__ import annotations

import csv
import io
import sys

from stateloop.config import StageRequest, Text, arg
from stateloop.experiments import expand_runs, load_pipeline
from stateloop.files import atomic_write_bytes
from stateloop.models.registry import count_params
from stateloop.ops.cluster import check_cluster


class Request(StageRequest):
    config: Text = arg("pipeline config (configs/*.yaml)")
    experiments: list[Text] | None = arg("only these experiments (default: all)", None)
    out: Text | None = arg("write the CSV here instead of stdout", None)


def run(args: Request) -> int:
    cfg = load_pipeline(args.config)
    check_cluster(cfg, args.config)
    rows = [(r.id, r.model, r.scale, r.K, r.d_s, count_params(r.model_config)) for r in expand_runs(cfg, args.experiments)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["run", "model", "scale", "K", "d_s", "params"])
    writer.writerows(rows)
    if args.out:
        atomic_write_bytes(args.out, buf.getvalue().encode())
    else:
        sys.stdout.write(buf.getvalue())
    return 0
