"""The analyze stage (``stateloop analyze``, commands/analyze.py parses its flags): the held-out
set-up every analysis shares, the calibration sample of the interventions, the run of one
analysis, its JSON and its MLflow logging. The protocol is the one commands/analyze.py describes:
the held-out data of the run's ``stateloop eval`` (analysis/common.py), then the flags."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from stateloop.analysis import common
from stateloop.analysis.bench_decode import DTYPES
from stateloop.analysis.interventions import intervention_analysis
from stateloop.analysis.shapley import shapley_analysis
from stateloop.config import ConfigError
from stateloop.evaluate.resolve import resolve_eval
from stateloop.pipeline import PipelineConfig
from stateloop.runs import atomic_torch_save, atomic_write_json, code_version, load_model, resolve_device, resolve_run_arg


@dataclass(frozen=True)
class Request:
    """One analysis as asked for (``stateloop analyze``'s flags; None: the run's eval protocol)."""

    analysis: str  # shapley | interventions
    run: str  # a run folder or a run id (runs.resolve_run_arg)
    config: str | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    out: str | None = None
    no_mlflow: bool = False
    no_progress: bool = False
    split: str | None = None  # shapley's held-out split
    eval_split: str | None = None  # the interventions' held-out split
    max_windows: int | None = None
    calib_split: str = common.CALIB_SPLIT
    calib_windows: int = common.CALIB_WINDOWS
    calib_seed: int = common.CALIB_SEED

    @classmethod
    def of(cls, args) -> Request:
        """The request of parsed flags (an argparse namespace; a flag a subcommand lacks keeps its default)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})


def analyze(args: Request, pipeline: PipelineConfig | None = None) -> int:
    """Set up the held-out data, run the analysis, write its JSON and log it to MLflow. ``pipeline``:
    the config ``args.config`` names, loaded by the command (None without one)."""
    _check_counts(args)
    run_dir = resolve_run_arg(args.run).folder
    device = resolve_device(args.device)
    model, saved = load_model(run_dir, device=device)
    config = resolve_eval(run_dir, pipeline, saved=saved)  # the saved config with the eval section of the run's `stateloop eval`
    common.require_reads(model, f"analyze {args.analysis}")
    model, setup = _eval_setup(args, run_dir, config, model, device)
    analysis = _shapley if args.analysis == "shapley" else _interventions
    result, heldout, settings, metrics, curves, summary = analysis(args, run_dir, config, model, setup)

    out = Path(args.out) if args.out else run_dir / f"{args.analysis}.json"
    result = {"analysis": args.analysis, "run_dir": str(run_dir), "model": model.cfg.name, "settings": settings,
              "code_version": code_version(), "heldout": heldout, **result}
    atomic_write_json(out, result)
    print(summary)
    print(f"wrote {out}", file=sys.stderr)
    if not args.no_mlflow:
        mlflow_id = common.log_to_mlflow(run_dir, config, args.analysis, metrics, settings, out, curves, pipeline)
        print(f"logged to MLflow run {mlflow_id}", file=sys.stderr)
    return 0


def _check_counts(args) -> None:
    """Window lengths and batch sizes must be positive; window counts may be 0 (the whole split)."""
    for flag in ("seq_len", "batch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be positive, got {getattr(args, flag)}")
    for flag in ("max_windows", "calib_windows"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 0:
            raise ConfigError(f"--{flag.replace('_', '-')}: must be >= 0 (0: the whole split), got {getattr(args, flag)}")


@dataclass
class EvalSetup:
    """What both analyses run under: the held-out windows of the run's eval protocol with the flags
    applied, the precision, and the settings they record."""

    proto: common.HeldoutProtocol
    windows: torch.Tensor  # (N, seq_len + 1)
    split_tokens: int
    precision: str  # the resolved --dtype: float32, bf16-mixed, bfloat16 or float16
    matches_eval: bool  # the settings are those of the run's `stateloop eval`
    settings: dict  # the settings both analyses record
    amp: torch.autocast  # bf16 autocast, enabled with bf16-mixed only
    device: torch.device
    progress: bool

    def heldout_block(self, nll: float, tokens: int) -> dict:
        """The unmodified model's held-out result (the JSON's ``heldout`` block)."""
        return common.heldout_block(self.proto, len(self.windows), self.split_tokens, nll, tokens, self.precision,
                                    self.matches_eval)


def _eval_setup(args, run_dir, config, model, device) -> tuple[torch.nn.Module, EvalSetup]:
    """The held-out protocol of the run's `stateloop eval`, then the overriding flags; the model cast
    to the analysis dtype. Returns (model, setup)."""
    evalp = common.heldout_protocol(config, model)
    split_flag = args.split if args.analysis == "shapley" else args.eval_split
    proto = common.HeldoutProtocol(
        split=split_flag or evalp.split,
        max_windows=evalp.max_windows if args.max_windows is None else (args.max_windows or None),
        seq_len=args.seq_len or evalp.seq_len,
        batch_size=args.batch_size or evalp.batch_size,
        precision=evalp.precision,
    )
    dtype = args.dtype if args.dtype != "auto" else ("bf16-mixed" if evalp.precision == "bf16-mixed" else "float32")
    autocast = dtype == "bf16-mixed"  # as `stateloop eval`: bf16 autocast on any device
    model = model.to(torch.float32 if dtype == "bf16-mixed" else DTYPES[dtype])
    eval_precision = "bf16-mixed" if evalp.precision == "bf16-mixed" else "float32"
    matches_eval = (proto.split, proto.max_windows, proto.seq_len, dtype) == (
        evalp.split, evalp.max_windows, evalp.seq_len, eval_precision)
    split_key = ("--split" if args.analysis == "shapley" else "--eval-split") if split_flag else "eval.heldout_split"
    try:
        windows, shards = common.split_windows(config, run_dir, proto.split, proto.seq_len, proto.max_windows)
    except ConfigError as err:
        raise ConfigError(f"{split_key}: {err}") from None
    settings = {"seq_len": proto.seq_len, "batch_size": proto.batch_size, "dtype": dtype, "autocast": autocast,
                "device": str(device), "max_windows": proto.max_windows}
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast)
    return model, EvalSetup(proto, windows, len(shards), dtype, matches_eval, settings, amp, device, not args.no_progress)


def _shapley(args, run_dir, config, model, setup: EvalSetup):
    """Exact Shapley values of the reads on the held-out windows.
    Returns (result, heldout block, settings, metrics, curves, summary line)."""
    proto, windows = setup.proto, setup.windows
    print(f"analyze shapley: {run_dir}, {2 ** model.cfg.K} masks x {len(windows)} windows of {proto.seq_len} "
          f"tokens ({proto.split})", file=sys.stderr)
    with setup.amp:
        result = shapley_analysis(model, windows, proto.batch_size, setup.device, setup.progress)
    heldout = setup.heldout_block(result["nll_none_masked"], result["tokens"])
    settings = {**setup.settings, "split": proto.split, "windows": len(windows)}
    metrics = {"nll_none_masked": result["nll_none_masked"], "ppl_none_masked": result["ppl_none_masked"],
               "nll_all_masked": result["nll_all_masked"],
               "feedback_share_pct": result["feedback_share_pct"], "terminal_share_pct": result["terminal_share_pct"]}
    curves = {"phi": list(enumerate(result["shapley"], 1)), "share_pct": list(enumerate(result["share_pct"], 1))}
    summary = (f"held-out PPL, all reads kept {heldout['ppl']:.3f} ({proto.split}, {len(windows)} windows); "
               f"feedback reads {result['feedback_share_pct']:.2f}%, terminal read {result['terminal_share_pct']:.2f}% "
               f"(paper, K=7: 63.70% / 36.30%)")
    return result, heldout, settings, metrics, curves, summary


def _interventions(args, run_dir, config, model, setup: EvalSetup):
    """State statistics from the calibration sample (saved beside the run), then replacement and
    freezing on the held-out windows. Returns (result, heldout block, settings, metrics, curves,
    summary line)."""
    proto, windows = setup.proto, setup.windows
    calib, starts = _calibration_windows(args, run_dir, config, proto)
    print(f"analyze interventions: {run_dir}, calibration {len(calib)} windows ({args.calib_split}), "
          f"evaluation {len(windows)} windows ({proto.split}) of {proto.seq_len} tokens", file=sys.stderr)
    with setup.amp:
        result, stats = intervention_analysis(model, calib, windows, proto.batch_size, setup.device, setup.progress)
    sampling = "seeded uniform sample of non-overlapping window slots over the whole split"
    result["calibration"] = {"split": args.calib_split, "windows": len(calib), "seed": args.calib_seed,
                             "sampling": sampling, **result["calibration"]}
    stats_path = _save_calibration(args, run_dir, stats, starts)
    heldout = setup.heldout_block(result["unmodified"]["nll"], len(windows) * proto.seq_len)
    settings = {**setup.settings, "calib_split": args.calib_split, "calib_windows": len(calib),
                "calib_seed": args.calib_seed, "eval_split": proto.split, "windows": len(windows),
                "calibration_file": stats_path.name}
    metrics = {"ppl_unmodified": result["unmodified"]["ppl"]}
    curves = {"ppl_replace": [(e["i"], e["ppl"]) for e in result["replacement"]],
              "ppl_freeze": [(e["i"], e["ppl"]) for e in result["freezing"]]}
    summary = "PPL unmodified {:.3f} ({}, {} windows); replace {}; freeze {}".format(
        result["unmodified"]["ppl"], proto.split, len(windows),
        ", ".join(f"S{e['replaced']}<-S{e['i']}: {e['ppl']:.3f}" for e in result["replacement"]),
        ", ".join(f"at S{e['i']}: {e['ppl']:.3f}" for e in result["freezing"]))
    return result, heldout, settings, metrics, curves, summary


def _calibration_windows(args, run_dir, config, proto):
    """The calibration sample of --calib-split, never the evaluated split. Returns (windows, start positions)."""
    if args.calib_split == proto.split:
        raise ConfigError(f"--calib-split: the calibration sample must be separate from the evaluation data "
                          f"(both are {proto.split!r})")
    try:
        return common.sampled_windows(config, run_dir, args.calib_split, proto.seq_len, args.calib_windows or None,
                                      args.calib_seed)
    except ConfigError as err:
        raise ConfigError(f"--calib-split: {err}") from None


def _save_calibration(args, run_dir, stats, starts) -> Path:
    """RUN_DIR/interventions_calibration.pt: the per-channel statistics and the sample they came from."""
    stats_path = run_dir / "interventions_calibration.pt"
    atomic_torch_save({"mean": stats.mean, "std": stats.std, "tokens": stats.tokens, "split": args.calib_split,
                       "windows": len(starts), "seed": args.calib_seed, "starts": torch.tensor(starts)}, stats_path)
    return stats_path
