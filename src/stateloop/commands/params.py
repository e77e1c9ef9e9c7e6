"""``stateloop params --config configs/paper.yaml``: one CSV row per run the config defines,
with its parameter count taken from a model built on the meta device (no weights allocated)."""

from __future__ import annotations

import csv
import io
import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="pipeline config (configs/*.yaml)")
    p.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    p.add_argument("--out", help="write the CSV here instead of stdout")


def run(args) -> int:
    from stateloop.models.registry import count_params
    from stateloop.pipeline import expand_runs, load_pipeline

    cfg = load_pipeline(args.config)
    rows = [(r.id, r.model, r.scale, r.K, r.d_s, count_params(r.model_config)) for r in expand_runs(cfg, args.experiments)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["run", "model", "scale", "K", "d_s", "params"])
    writer.writerows(rows)
    if args.out:
        from stateloop.files import atomic_write_bytes

        atomic_write_bytes(args.out, buf.getvalue().encode())
    else:
        sys.stdout.write(buf.getvalue())
    return 0
