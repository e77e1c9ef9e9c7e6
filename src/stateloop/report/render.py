"""``stateloop render``'s stage: one table or figure of a pipeline config from the results, written
atomically with its twin (CSV and Markdown; PDF and PNG), then logged to the config's report run in
MLflow (commands/render.py says which files and where)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.pipeline import PipelineConfig
from stateloop.files import atomic_write_bytes
from stateloop.report.outputs import COMPARE, OUTPUTS, comparisons, varies_K
from stateloop.tracking.records import standard_tags
from stateloop.tracking.store import client, named_run, tracking_uri


def render(cfg: PipelineConfig, config_file, target: str, results: Path, out: Path, bench: Path | None = None,
           mlflow: bool = True, experiment: str | None = None) -> int:
    """Render ``target`` of ``cfg`` (the pipeline config of file ``config_file``, loaded by the
    command) from the ``results`` folder into ``out`` and its twin; log both unless ``mlflow`` is false.
    Target ``compare`` is ``experiment``'s own comparison: its table where ``out`` ends in .csv, its
    figure where it ends in .pdf (report/compare.py)."""
    if target == COMPARE:
        written = _render_comparison(cfg, config_file, results, out, experiment)
        target = f"{COMPARE}_{experiment}"
    elif OUTPUTS[target].kind == "claims":
        from stateloop.report import claims  # pandas, matplotlib: `stateloop`'s parser imports this module

        df = claims.judge(cfg, results)
        written = _save_table(df, claims.to_markdown(df, cfg, str(config_file)), out)
    elif OUTPUTS[target].kind == "table":
        from stateloop.report import tables  # pandas: `stateloop`'s parser imports this module

        kwargs = {"bench_json": bench} if OUTPUTS[target].bench and bench else {}
        df, notes = tables.TABLES[target](cfg, results, **kwargs)
        written = _save_table(df, tables.to_markdown(df, notes, OUTPUTS[target].title), out)
    else:
        from stateloop.report import figures  # matplotlib: `stateloop`'s parser imports this module

        written = _save_figure(figures.FIGURES[target](cfg, results), out)
    print(f"stateloop render: wrote {out}")
    if mlflow:
        print(f"stateloop render: logged to MLflow run {log_to_mlflow(cfg, config_file, target, written)}")
    return 0


def _save_table(df, markdown: str, out: Path) -> list[Path]:
    """``df`` as ``out`` (CSV) and ``markdown`` as its .md twin."""
    atomic_write_bytes(out, df.to_csv(index=False, float_format="%.4f").encode())
    atomic_write_bytes(out.with_suffix(".md"), markdown.encode())
    return [out, out.with_suffix(".md")]


def _save_figure(fig, out: Path) -> list[Path]:
    """``fig`` as ``out`` (PDF) and its PNG twin, then closed."""
    import matplotlib.pyplot as plt

    for path, fmt in ((out, "pdf"), (out.with_suffix(".png"), "png")):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)  # PNG at style.RC["savefig.dpi"]
        atomic_write_bytes(path, buf.getvalue())
    plt.close(fig)
    return [out, out.with_suffix(".png")]


def _render_comparison(cfg, config_file, results: Path, out: Path, experiment: str | None) -> list[Path]:
    """Experiment ``experiment``'s comparison: the table (``out`` .csv, and .md) or the figure
    (``out`` .pdf, and .png); one line where the experiment has none."""
    if experiment not in comparisons(cfg):
        raise ConfigError(f"--experiment: {experiment!r} has no comparison of its own in {config_file} (those that do: "
                          f"{', '.join(comparisons(cfg)) or 'none'}; an experiment of two models or more that no table "
                          "or figure reads)")
    if out.suffix == ".csv":
        from stateloop.report import compare  # pandas: `stateloop`'s parser imports this module

        df = compare.compare(cfg, results, experiment)
        return _save_table(df, compare.to_markdown(df, cfg, experiment, str(config_file)), out)
    if out.suffix == ".pdf":
        if not varies_K(cfg, experiment):
            raise ConfigError(f"--out {out}: experiment {experiment} does not vary K: its comparison is a table (--out .csv)")
        from stateloop.report import figures  # matplotlib: `stateloop`'s parser imports this module

        return _save_figure(figures.comparison(cfg, results, experiment), out)
    raise ConfigError(f"--out {out}: a comparison is a table (.csv, with its .md) or a figure (.pdf, with its .png)")


def log_to_mlflow(cfg, config_file, target: str, paths) -> str:
    """Log rendered files as artifacts under TARGET/ of the config's report run (found by the
    sha256 of the config file, made once, closed FINISHED after each render). Returns its id."""
    digest = hashlib.sha256(Path(config_file).read_bytes()).hexdigest()[:16]
    first = next(iter(cfg.scales.values()))
    c = client(tracking_uri(*(s.train.mlflow_tracking_uri for s in cfg.scales.values())))
    tags = {"report_config": digest, "config_file": str(config_file), "scales": ",".join(cfg.scales),
            **standard_tags("render")}
    run_id = named_run(c, first.train.mlflow_experiment, f"tags.report_config = '{digest}'",
                       f"report/{'+'.join(cfg.scales)}", tags)
    for path in paths:
        c.log_artifact(run_id, str(path), artifact_path=target)
    c.set_terminated(run_id, "FINISHED")
    return run_id
