"""A pipeline config's experiments expanded into runs, and the config read and checked once per process.

A run is (scale, model, K, d_s, seed), d_s = 0 without a persistent state; an experiment's
``seeds:`` replace the scale's ``train.seed``. Runs are deduplicated across experiments, and the
runs of one (scale, model, K, d_s) over its seeds form a *cell*, reported as its mean and 95%
confidence interval (``stateloop.report.stats``)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from stateloop.config import ConfigError, config_chain, from_dict, merge, read_config, to_dict
from stateloop.config.model import ModelConfig
from stateloop.config.pipeline import PipelineConfig, ScaleConfig
from stateloop.models.registry import MODELS, get_spec
from stateloop.run_ids import RUN_CELL_FORM, RUN_ID_FORM, RUNS_ROOT, split_run_id

# The models each of the paper's experiments compares (Tables 1-4, Figures 2-4), in the order
# the tables and figures list them: an experiment of one of these names without ``models:``
# compares these, so a config states only what its scale chooses (K, d_s, seeds, options).
PAPER_MODELS = {
    "table1": ["vanilla_looped", "vanilla_looped_ffn", "hyperloop", "mesh", "ponderlm", "parcae", "pause_token",
               "stateloop", "stateloop_attn", "stateloop_mamba2"],
    "table4": ["state_only", "reset_state", "stateloop_gru", "stateloop", "vanilla_looped"],
    "loop_depth": ["vanilla_looped", "stateloop"],
    "state_width": ["stateloop"],
    "state_analysis": ["stateloop"],
    "decoding": ["vanilla_looped", "vanilla_looped_ffn", "stateloop", "stateloop_attn", "stateloop_mamba2"],
}


@dataclass
class Run:
    scale: str
    model: str
    K: int
    d_s: int
    model_config: ModelConfig
    seed: int = 1234
    experiments: list[str] = field(default_factory=list)
    test_time_K: list[int] = field(default_factory=list)  # the depths its experiments evaluate it at, sorted
    test_time_tasks: bool = False

    @property
    def cell(self) -> str:
        """The run without its seed (RUN_CELL_FORM)."""
        return RUN_CELL_FORM.format(scale=self.scale, model=self.model, K=self.K, ds=self.d_s)

    @property
    def id(self) -> str:
        return RUN_ID_FORM.format(scale=self.scale, model=self.model, K=self.K, ds=self.d_s, seed=self.seed)

    @property
    def folder(self) -> str:
        return f"{RUNS_ROOT}/{self.id}"

    def scores_tasks(self, depths: bool = False) -> bool:
        """[choice] Whether its evaluation scores the lm-eval tasks: at the trained depth for
        Tables 1-2 (table1), at the test-time depths with ``test_time_tasks``."""
        return self.test_time_tasks if depths else "table1" in self.experiments


def load_pipeline(path: str | Path, overrides: dict | None = None) -> PipelineConfig:
    """The pipeline config of file ``path`` (with ``overrides`` merged in), checked."""
    return load_checked(path, overrides)[0]


def load_checked(path: str | Path, overrides: dict | None = None,
                 expand: bool = True) -> tuple[PipelineConfig, dict[str, Run]]:
    """(the pipeline config of file ``path``, its runs by id), read and checked once per process
    while the file is unchanged, a copy to each caller. ``expand=False``: no runs (:func:`load_run`)."""
    if overrides or not Path(path).is_file():
        return _read_pipeline(str(path), overrides, expand)
    stats = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in config_chain(path)[1])  # the file and its bases
    return copy.deepcopy(_read_file_once(str(path), stats, expand))


def _read_pipeline(path: str, overrides: dict | None, expand: bool) -> tuple[PipelineConfig, dict[str, Run]]:
    data = read_config(path)  # with the file its `base:` names merged under it
    if overrides:
        data = merge(data, overrides)
    if expand:
        return checked_pipeline(data, path)
    cfg = _typed(data, path)
    check_pipeline(cfg, path)
    require_models(data, cfg, path)
    return cfg, {}


# Keyed by (path, the (path, mtime, size) of it and its bases, expand): a file is read again once it or a base changes.
_read_file_once = functools.lru_cache(maxsize=8)(lambda path, _stats, expand: _read_pipeline(path, None, expand))


def load_scale(path: str | Path, name: str) -> ScaleConfig:
    """Scale ``name`` of the pipeline config file ``path``; one line naming it when it is not defined."""
    return scale_of(load_checked(path, expand=False)[0], name, f"{path}: scales.{name}: not defined")


def find_run(cfg: PipelineConfig, run_id: str) -> Run | None:
    """The run ``run_id`` of the config's trained experiments, or None (only its model expanded)."""
    scale, model, *_ = split_run_id(run_id)
    names = [n for n, e in cfg.experiments.items() if e.trained and e.scale == scale and model in e.models]
    return next((r for r in expand_runs(cfg, names, model) if r.id == run_id), None)


def load_run(path: str | Path, run_id: str) -> tuple[PipelineConfig, Run]:
    """(the pipeline config of file ``path``, its run ``run_id``); an undefined run id is one line
    naming its neighbours: a typo must not start a training nobody planned."""
    cfg = load_checked(path, expand=False)[0]
    scale_name, model, K, d_s, _ = split_run_id(run_id)
    scale = scale_of(cfg, scale_name, f"RUN: unknown scale {scale_name!r} in {path}")
    run = find_run(cfg, run_id)
    if run is None:
        run_model_config(scale, model, K, d_s)  # an unknown model or bad width: its own line
        known = [r.id for r in expand_runs(cfg, [n for n, e in cfg.experiments.items() if e.trained and e.scale == scale_name])]
        near = [r for r in known if r.startswith(f"{scale_name}/{model}/")] or known
        listed = ", ".join(near[:6]) + (f", ... ({len(near)} in all)" if len(near) > 6 else "")
        raise ConfigError(f"RUN: {run_id} is not a run of {path}; add it to an experiment there "
                          f"(its runs like it: {listed or 'none'})")
    return cfg, run


def pipeline_from_dict(data: dict, where: str = "config") -> PipelineConfig:
    """Check a config mapping (as Snakemake holds it) strictly and build the pipeline config."""
    return checked_pipeline(data, where)[0]


def _typed(data: dict, where: str) -> PipelineConfig:
    try:
        return from_dict(PipelineConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def checked_pipeline(data: dict, where: str = "config") -> tuple[PipelineConfig, dict[str, Run]]:
    """(the pipeline config of a mapping, checked strictly; its runs by id, expanded once). The
    memory gate on ``train.gpu_memory_gib`` is not here (ops/memory.py: ``gate``)."""
    cfg = _typed(data, where)
    check_pipeline(cfg, where)
    require_models(data, cfg, where)
    return cfg, {r.id: r for r in expand_runs(cfg)}  # building every run's config checks options and shapes


def require_models(data: dict, cfg: PipelineConfig, where: str = "config") -> None:
    """Refuse, in one line, a scale that an experiment runs on but whose ``model:`` section is
    missing or empty in the mapping ``data`` (as read, before defaults): it would silently take
    ModelConfig's defaults, the 1.4B shape. A scale no experiment names (a tokenize- or eval-only
    config's) may leave it out."""
    for name, exp in cfg.experiments.items():
        raw = (data.get("scales") or {}).get(exp.scale)
        if isinstance(raw, dict) and not raw.get("model"):
            d = ModelConfig()
            raise ConfigError(f"{where}: scales.{exp.scale}.model: missing section (experiments.{name} runs on it); without "
                              f"it every model takes the default shape, d_model {d.d_model} and {d.n_layers} layers (the "
                              f"1.4B's): state vocab_size, n_layers, d_model, d_ff, n_heads, head_dim and max_seq_len")


NAME = re.compile(r"[A-Za-z0-9._-]+")  # scale and experiment names: they become paths and command words


def check_pipeline(cfg: PipelineConfig, where: str = "config") -> None:
    """Check a pipeline config beyond its types, but for its runs; fills in the paper's experiments'
    default models."""
    for kind, names in (("scales", cfg.scales), ("experiments", cfg.experiments)):
        for name in names:
            if not NAME.fullmatch(str(name)) or str(name) in (".", ".."):
                raise ConfigError(f"{where}: {kind}.{name!r}: a name may hold only letters, digits, '.', '_' and '-'")

    for name, exp in cfg.experiments.items():
        if exp.models is None:
            if name not in PAPER_MODELS:
                raise ConfigError(f"{where}: experiments.{name}.models: missing required key (only the paper's "
                                  f"experiments, {', '.join(PAPER_MODELS)}, have default models)")
            exp.models = list(PAPER_MODELS[name])
        if exp.scale not in cfg.scales:
            raise ConfigError(f"{where}: experiments.{name}.scale: unknown scale {exp.scale!r} (defined: {', '.join(cfg.scales)})")
        for model in list(exp.models) + list(exp.options) + list(exp.K_by_model):
            if model not in MODELS:
                raise ConfigError(f"{where}: experiments.{name}.models: unknown model {model!r} (registered: {', '.join(MODELS)})")
        if exp.baseline is not None and exp.baseline not in exp.models:
            raise ConfigError(f"{where}: experiments.{name}.baseline: {exp.baseline!r} is not one of its models "
                              f"({', '.join(exp.models)}); name one of them")
    # Every split a stage reads must be one the data stage makes (evaluation and the analyses
    # read eval.heldout_split, training's validation train.val_split).
    for name, scale in cfg.scales.items():
        splits = scale.data.splits
        reads = [("eval.heldout_split", scale.eval.heldout_split)]
        if scale.train.val_tokens:
            reads.append(("train.val_split", scale.train.val_split))
        for key, split in reads:
            if split not in splits:
                raise ConfigError(f"{where}: scales.{name}.{key}: {split!r} is not a split the data stage makes "
                                  f"(data: {', '.join(splits)})")
    # Each scale against the cluster (runtimes, SLURM's warning, dist_timeout_s): ops/cluster.py's check_cluster,
    # which the Snakefile and the commands call.


def run_model_config(scale: ScaleConfig, model: str, K: int, d_s: int, options: dict | None = None) -> ModelConfig:
    """The scale's model shape with name, K, d_s (0 without a state) and options set, checked."""
    cfg = dataclasses.replace(scale.model, name=model, K=K, d_s=d_s,
                              options=merge(to_dict(scale.model).get("options", {}), options or {}))
    get_spec(model).check(cfg)
    return cfg


def expand_runs(cfg: PipelineConfig, experiments: list[str] | None = None, only: str | None = None) -> list[Run]:
    """Every run the chosen experiments define (``only``: of that model), deduplicated, in order."""
    runs: dict[str, Run] = {}
    names = experiments if experiments is not None else [n for n, e in cfg.experiments.items() if e.trained]
    for name in names:
        if name not in cfg.experiments:
            raise ConfigError(f"experiments.{name}: not defined (defined: {', '.join(cfg.experiments)})")
        exp = cfg.experiments[name]
        scale = cfg.scales[exp.scale]
        seeds = exp.seeds or [scale.train.seed]
        for model in (m for m in exp.models if only in (None, m)):
            spec = get_spec(model)
            widths = exp.d_s if spec.has_state else [0]
            for K in exp.K_by_model.get(model, exp.K):
                for d_s in widths:
                    try:
                        mcfg = run_model_config(scale, model, K, d_s, exp.options.get(model))
                    except ConfigError as err:
                        raise ConfigError(f"experiments.{name} ({model}, K={K}, d_s={d_s}): {err}") from None
                    if exp.test_time_K:
                        check_depths(mcfg, exp.test_time_K, f"experiments.{name}.test_time_K ({model}, K={K})")
                    for seed in seeds:
                        run = Run(exp.scale, model, K, mcfg.d_s, mcfg, seed)
                        run = runs.setdefault(run.id, run)
                        if run.model_config != mcfg:
                            raise ConfigError(f"experiments.{name} ({model}, K={K}, d_s={d_s}): run {run.id} is also defined "
                                              f"by experiments.{run.experiments[0]} with other model options; "
                                              f"a run id names one model (use another scale for a variant)")
                        if name not in run.experiments:
                            run.experiments.append(name)
                        if exp.test_time_K:
                            run.test_time_K = sorted(set(run.test_time_K) | set(exp.test_time_K))
                            run.test_time_tasks = run.test_time_tasks or exp.test_time_tasks
    return list(runs.values())


def decoding_specs(cfg: PipelineConfig) -> list[str]:
    """Table 3's rows: the decoding experiment's shapes as name:K[:d_s] (d_s only with a state)."""
    return [f"{r.model}:{r.K}:{r.d_s}" if r.d_s else f"{r.model}:{r.K}" for r in expand_runs(cfg, ["decoding"])]


def check_depths(mcfg: ModelConfig, depths: list[int], where: str) -> None:
    """Every test-time depth must have a meaning for the model (LoopedLM.at_depth), checked when
    the config is loaded: a depth MeSH or Hyperloop cannot run is one line, not a failed job."""
    spec = get_spec(mcfg.name)
    for K in depths:
        try:
            spec.check_depth(mcfg, K)
        except ConfigError as err:
            raise ConfigError(f"{where}: {str(err).removeprefix('eval.K: ')}") from None


def cells(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by cell (everything but the seed), in order; each cell's runs sorted by seed."""
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault(run.cell, []).append(run)
    return {cell: sorted(rs, key=lambda r: r.seed) for cell, rs in out.items()}


def scale_of(pipeline: PipelineConfig, name: str, where: str) -> ScaleConfig:
    """Scale ``name`` of the pipeline config; else one line: ``where``, then the scales defined."""
    if name not in pipeline.scales:
        raise ConfigError(f"{where} (defined: {', '.join(pipeline.scales)})")
    return pipeline.scales[name]
