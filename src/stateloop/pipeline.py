"""Pipeline configs (``configs/*.yaml``): ``scales`` (name -> the sections its runs share) and
``experiments`` (name -> a grid of runs a table or figure reads), expanded into runs.

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
from stateloop.models.config import ModelConfig
from stateloop.models.registry import MODELS, get_spec
from stateloop.sections.data import DataConfig
from stateloop.sections.evaluate import EvalConfig
from stateloop.sections.train import TrainConfig

# The run id, spelled here once: a cell (every seed of one shape) and the seed, always last.
RUN_CELL_FORM = "{scale}/{model}/K{K}_ds{ds}"
RUN_ID_FORM = RUN_CELL_FORM + "_seed{seed}"
_ID_FIELDS = {"scale": r"[^/\s]+", "model": r"[a-z0-9_]+", "K": r"\d+", "ds": r"\d+", "seed": r"\d+"}
# Matched whole (fullmatch): a pattern ending in $ would also match before a final newline.
_RUN_ID = re.compile(re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m[1]}>{_ID_FIELDS[m[1]]})", RUN_ID_FORM))
RUN_ID_EXAMPLE = "tiny/stateloop/K3_ds64_seed1234"
RUNS_ROOT = "results/runs"  # a run id's folder: RUNS_ROOT/<run id>, relative to the working directory
# RUN in every command that addresses runs (train, eval, analyze, bench decode --runs); runs.resolve_run_arg decides.
RUN_HELP = f"a run folder, or a run id {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}; its folder {RUNS_ROOT}/<id>)"


def parse_run_id(run_id: str) -> tuple[str, str, int, int, int] | None:
    """(scale, model, K, d_s, seed) of a run id (RUN_ID_FORM), or None: the one parser of run ids."""
    m = _RUN_ID.fullmatch(run_id)
    return (m["scale"], m["model"], int(m["K"]), int(m["ds"]), int(m["seed"])) if m else None


@dataclass
class StageResources:
    """What one job of a stage asks the scheduler for (Snakemake resources; SLURM under
    ``--profile slurm``). Training's nodes and GPUs come from the scale's ``train`` section."""

    runtime: int = 60  # minutes
    mem_mb: int = 4000  # memory per job
    cpus_per_task: int = 2  # CPUs per task (the job's threads)
    gpus: int = 0  # GPUs per job of the stages other than train (partitions: profiles/slurm)


@dataclass
class AnalyzeResources(StageResources):
    """The analyze stage's jobs: each of Figure 4's analyses may be split into shards over the
    held-out windows, merged bit for bit (analysis/shards.py; hours: ops/analysis_cost.py)."""

    # Jobs the Shapley analysis of a run is split into (1: one job); above 1, each shard is a job
    # of this stage's resources and their merge a job without a GPU.
    shapley_shards: int = 1
    # Jobs the interventions of a run are split into (1: one job); above 1, one calibration job
    # first, then the shards, then their merge.
    interventions_shards: int = 1

    def __post_init__(self) -> None:
        for key in ("shapley_shards", "interventions_shards"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"analyze.{key}: must be a whole number >= 1, got {value!r}")


@dataclass
class ResourcesConfig:
    tokenize: StageResources = field(default_factory=StageResources)
    train: StageResources = field(default_factory=StageResources)
    eval: StageResources = field(default_factory=StageResources)
    analyze: AnalyzeResources = field(default_factory=AnalyzeResources)
    bench: StageResources = field(default_factory=StageResources)


@dataclass
class ScaleConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # the model's shape (each run sets name, K, d_s)
    data: DataConfig = field(default_factory=DataConfig)  # the corpus and tokenizer
    eval: EvalConfig = field(default_factory=EvalConfig)  # held-out PPL, lm-eval tasks and the analyses' settings
    train: TrainConfig = field(default_factory=TrainConfig)  # hardware, batch, optimiser, budget, logging
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)  # what each stage's job asks the scheduler for
    # True only for a scale that is the paper's own (its model shape, data and token budget):
    # then the tables compare absolute numbers (parameters, PPL, latency) with the paper's
    # (ours - paper). At any other scale only scale-free quantities are set beside the paper's:
    # each model's change relative to its reference (Vanilla Looped, StateLoop in Table 4).
    paper: bool = False


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
class ExperimentConfig:
    scale: str  # the scale (a key of scales) whose settings every run of the experiment takes
    models: list[str] | None = None  # None: PAPER_MODELS of the experiment's name (required for other names)
    K: list[int] = field(default_factory=lambda: [4])  # loop counts, one run per K
    d_s: list[int] = field(default_factory=lambda: [0])  # used by models with a state; others get 0
    options: dict[str, dict] = field(default_factory=dict)  # model name -> model.options overrides
    # model name -> its own loop counts, replacing K for that model (MeSH and Parcae count core
    # repetitions: 10 at 1.4B while the other Table 1 models loop K = 4 times)
    K_by_model: dict[str, list[int]] = field(default_factory=dict)
    # False for shapes that are only measured, never trained (Table 3's decoding rows): such an
    # experiment defines no runs unless it is asked for by name.
    trained: bool = True
    # One run per seed; empty: the scale's train.seed alone. Runs of one seed see the same data
    # order, so models are compared seed by seed.
    seeds: list[int] = field(default_factory=list)
    # Test-time depths (this project's study, not the paper's): each run is also evaluated at every
    # K' listed into its eval_depth.json (`stateloop eval RUN --depths ...`).
    test_time_K: list[int] = field(default_factory=list)
    test_time_tasks: bool = False  # also run the lm-eval tasks at every test-time K'
    # The model the others are compared with in the experiment's own comparison (an experiment of
    # two models or more that no table or figure of the paper reads: results/compare_NAME.csv and
    # .md, figures/compare_NAME.pdf where it varies K); null: vanilla_looped, which must then be
    # one of its models
    baseline: str | None = None

    def __post_init__(self) -> None:
        for K in self.test_time_K:
            if isinstance(K, bool) or not isinstance(K, int) or K < 1:
                raise ConfigError(f"test_time_K: {K!r} is not a positive loop count")
        if len(set(self.test_time_K)) != len(self.test_time_K):
            raise ConfigError(f"test_time_K: {self.test_time_K} lists a depth twice")
        for s in self.seeds:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ConfigError(f"seeds: {s!r} is not a non-negative integer")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds: {self.seeds} lists a seed twice")


@dataclass
class BenchConfig:
    """Table 3's decoding benchmark (``stateloop bench decode``); the paper's protocol by default."""

    prefill: int = 1024  # prompt tokens P
    tokens: int = 1024  # generated tokens N
    repeats: int = 5  # timed runs per model
    warmup: int = 1  # untimed runs per model before the timed ones
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    # token: all models decode in lockstep, one token each in turn, so every model sees the same
    # machine state (the job also runs alone: workflow/rules/analysis.smk); run: whole runs
    # round-robin, the paper's literal protocol.
    interleave: str = "token"

    def __post_init__(self) -> None:
        if self.interleave not in ("token", "run"):
            raise ConfigError(f"interleave: {self.interleave!r} is not one of token, run")
        for key in ("prefill", "tokens", "repeats"):
            if getattr(self, key) < 1:
                raise ConfigError(f"bench.{key}: must be positive, got {getattr(self, key)}")
        if self.warmup < 0:
            raise ConfigError(f"bench.warmup: must be >= 0, got {self.warmup}")


_SLURM_WORD = re.compile(r"[A-Za-z0-9_.-]+")  # a partition, QOS or GRES type: one word, as sinfo prints it


@dataclass
class SlurmConfig:
    """The cluster a DAG is sent to (`--profile slurm`); the account and the other jobs'
    partition stay the profile's (docs/cluster.md)."""

    # The partition of every job that asks for a GPU, whatever its rule: a training on GPUs and
    # every job of a stage whose `resources.STAGE.gpus` is above 0 (its other jobs keep the
    # profile's slurm_partition); "": the profile's slurm_partition for every job
    gpu_partition: str = ""
    # The GPU type as the cluster's GRES names it (`sinfo -o "%G"`, e.g. h100): trainings ask for
    # gres gpu:TYPE:N, the other GPU jobs for --gpus=TYPE:N; "": any GPU (gpu:N)
    gpu_type: str = ""
    gpu_constraint: str = ""  # --constraint of every GPU job (node features, e.g. 'h100|a100'); "": none
    gpu_qos: str = ""  # --qos of every GPU job; "": the profile's (slurm-qos, or a default-resources qos)
    # The partitions' MaxTime in minutes (`sinfo -o "%P %l"`): a longer `resources.STAGE.runtime`
    # is refused by the config check (SLURM would keep it pending for ever); 0: not checked
    max_runtime: int = 0
    # The run folders' file system's write speed in MB/s (docs/cluster.md: dd ... conv=fsync): it
    # sizes each training job's warning before its time limit and the least train.dist_timeout_s
    write_mb_per_s: float = 100.0

    def __post_init__(self) -> None:
        for key in ("gpu_partition", "gpu_type", "gpu_qos"):
            value = getattr(self, key)
            if value and not _SLURM_WORD.fullmatch(value):
                raise ConfigError(f"slurm.{key}: {value!r} is not one word (letters, digits, '_', '.', '-')")
        if "'" in self.gpu_constraint or '"' in self.gpu_constraint:
            raise ConfigError(f"slurm.gpu_constraint: {self.gpu_constraint!r}: give it without quotes")
        if isinstance(self.max_runtime, bool) or self.max_runtime < 0:
            raise ConfigError(f"slurm.max_runtime: must be minutes >= 0 (0: not checked), got {self.max_runtime!r}")
        if not self.write_mb_per_s > 0:
            raise ConfigError(f"slurm.write_mb_per_s: must be a measured speed above 0, got {self.write_mb_per_s!r}")


@dataclass
class PipelineConfig:
    scales: dict[str, ScaleConfig]  # scale name -> its settings
    experiments: dict[str, ExperimentConfig] = field(default_factory=dict)  # experiment name -> its runs
    bench: BenchConfig = field(default_factory=BenchConfig)  # Table 3's decoding benchmark
    slurm: SlurmConfig = field(default_factory=SlurmConfig)  # the cluster: GPU jobs' partition and type, limits, write speed


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

    @staticmethod
    def parse(run_id: str) -> tuple[str, str, int, int, int]:
        """(scale, model, K, d_s, seed) of a run id (RUN_ID_FORM); one line when it is not one."""
        parts = parse_run_id(run_id)
        if parts is None:
            raise ConfigError(f"RUN: expected {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}), got {run_id!r}")
        return parts

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
    scale, model, *_ = Run.parse(run_id)
    names = [n for n, e in cfg.experiments.items() if e.trained and e.scale == scale and model in e.models]
    return next((r for r in expand_runs(cfg, names, model) if r.id == run_id), None)


def load_run(path: str | Path, run_id: str) -> tuple[PipelineConfig, Run]:
    """(the pipeline config of file ``path``, its run ``run_id``); an undefined run id is one line
    naming its neighbours: a typo must not start a training nobody planned."""
    cfg = load_checked(path, expand=False)[0]
    scale_name, model, K, d_s, _ = Run.parse(run_id)
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


# ----------------------------------------------------------------------------------------------
# One run's config: resolved once per process, typed, and the same type when a run folder's saved
# config is read back (docs/architecture.md#how-a-runs-config-resolves).

RUN_SECTIONS = ("model", "train", "data")  # the sections a key=value override may name
FIXED_BY_RUN_ID = ("name", "K", "d_s")  # model keys the run id sets


@dataclass(frozen=True)
class RunSection:
    """Which run a resolved config is; the model, K, d_s and seed its id spells are saved in the
    model section and as ``train.seed``."""

    id: str = ""
    scale: str = ""
    config: str = ""
    experiments: list[str] = field(default_factory=list)

    @property
    def model(self) -> str:
        return Run.parse(self.id)[1]

    @property
    def K(self) -> int:
        return Run.parse(self.id)[2]


@dataclass(frozen=True)
class DataSection:
    dir: str = ""  # absolute path of the token shards


@dataclass(frozen=True)
class RunConfig:
    """The resolved config of one run (run, model, train, data), as training reads it and its
    folder's config.yaml saves it; ``eval`` is resolved when it is evaluated (resolve.py)."""

    run: RunSection
    model: ModelConfig
    train: TrainConfig | None  # None only where a finished run's saved config has no train section (read: saved)
    data: DataSection
    # [choice] Resolved when the run is evaluated (resolve.resolve_eval), never by training
    # nor by read: it is not saved (as_dict), so changing the eval settings never retrains a run.
    eval: EvalConfig | None = None

    @property
    def d_s(self) -> int:
        return self.model.d_s

    def as_dict(self) -> dict:
        """The mapping written to config.yaml and the final weights; never ``eval`` (see the field)."""
        return {"run": to_dict(self.run), "model": to_dict(self.model), "train": to_dict(self.train),
                "data": to_dict(self.data)}

    @classmethod
    def read(cls, config: dict, where: str = "resolved config", saved: bool = False) -> RunConfig:
        """A resolved config read back strictly; other sections (``eval``) are ignored. ``saved``: a
        finished run's, from a folder that may come from elsewhere: [choice] a section it lacks reads
        as its defaults (train as None), a bad key is one line naming ``where`` and the key."""
        if not isinstance(config, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(config).__name__}")
        sections = {}
        for section, tp in (("run", RunSection), ("model", ModelConfig), ("train", TrainConfig), ("data", DataSection)):
            if section not in config and not saved:
                raise ConfigError(f"{section}: missing section in the {where}")
            if section not in config:
                sections[section] = None if section == "train" else tp()
                continue
            try:
                sections[section] = from_dict(tp, config[section], section)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}" if saved else str(err)) from None
        return cls(**sections)


def scale_of(pipeline: PipelineConfig, name: str, where: str) -> ScaleConfig:
    """Scale ``name`` of the pipeline config; else one line: ``where``, then the scales defined."""
    if name not in pipeline.scales:
        raise ConfigError(f"{where} (defined: {', '.join(pipeline.scales)})")
    return pipeline.scales[name]
