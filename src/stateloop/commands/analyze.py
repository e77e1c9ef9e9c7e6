"""``stateloop analyze {shapley,interventions} RUN``: the Figure 4 analyses of a trained run.

RUN: a run folder (RUN_DIR below) or a run id, as in every command that addresses runs
(runs.resolve_run_arg).

- ``shapley``: held-out NLL of all 2^K masks of the state reads R_1..R_K and each read's exact
  Shapley value and share -> RUN_DIR/shapley.json (analysis/shapley.py).
- ``interventions``: per-channel state statistics from a calibration sample, then held-out PPL
  under calibrated single replacement and freezing at every boundary (eq. 15) ->
  RUN_DIR/interventions.json and RUN_DIR/interventions_calibration.pt (analysis/interventions.py).

Held-out data: exactly that of the run's held-out perplexity (``stateloop eval``, Table 4), so
that all analyses share Table 4's unmodified baseline (the paper: 9.04 at 410M, K = 7): the
``eval`` section of the run's scale in ``--config`` (default: the pipeline config the run was
trained from, as ``stateloop eval``) gives the split (``eval.heldout_split``, default "val"),
the window count (``eval.heldout_windows``, null: the whole split), the window length
(``eval.max_length``, null: the run's ``train.seq_len``), the batch size and the precision.
Windows are consecutive from the start of the split. ``--split`` / ``--eval-split``,
``--max-windows`` (0: the whole split), ``--seq-len``, ``--batch-size`` and ``--dtype`` override
them; the JSON's ``heldout`` block then says ``matches_eval_protocol: false``.

Calibration (interventions): ``--calib-windows`` (default 64) windows of the ``train`` split, a
seeded (``--calib-seed``, default 0) uniform sample of its non-overlapping window slots. train is
in every data folder and disjoint from the held-out split by construction; ``--calib-split``
picks another split, never the evaluated one.

Each JSON has a ``heldout`` block with the keys of eval.json's (split, windows, seq_len, tokens,
split_tokens, nll, ppl): the unmodified model's held-out result (all reads kept; no
intervention), equal to eval.json's ``heldout`` for the same run. Results are logged to MLflow:
into the training run that RUN_DIR/train.json names, else into the run named by the run id in
the training experiment (as ``stateloop eval`` does). Per-read and per-boundary values are one
metric each over steps (``shapley/phi`` and ``shapley/share_pct`` at step k for R_k,
``interventions/ppl_replace`` and ``interventions/ppl_freeze`` at step i for S_i).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stateloop.commands import RUN_HELP

if TYPE_CHECKING:
    import torch

    from stateloop.analysis import common

DTYPE_CHOICES = ["auto", "float32", "bf16-mixed", "bfloat16", "float16"]


def _common(p) -> None:
    p.add_argument("run", metavar="RUN", help=f"the trained run: {RUN_HELP}")
    p.add_argument("--config", help="pipeline config whose scale's `eval:` section sets the held-out data "
                                    "(default: the config the run was trained from, as `stateloop eval`)")
    p.add_argument("--seq-len", type=int, help="window length (default: eval.max_length, else the run's train.seq_len)")
    p.add_argument("--batch-size", type=int, help="windows per forward pass (default: eval.batch_size)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto (default): eval.precision, as the held-out PPL (32-true: float32; bf16-mixed: "
                        "float32 weights under bfloat16 autocast); bfloat16/float16: cast the weights")
    p.add_argument("--out", help="result JSON (default: in the run folder)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_arguments(p) -> None:
    from stateloop.analysis.common import CALIB_SEED, CALIB_SPLIT, CALIB_WINDOWS

    sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    s = sub.add_parser("shapley", help="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
                       description="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)")
    _common(s)
    s.add_argument("--split", help="held-out split evaluated (default: eval.heldout_split, as the held-out PPL)")
    s.add_argument("--max-windows", type=int,
                   help="windows evaluated (default: eval.heldout_windows, as the held-out PPL; 0: the whole split)")
    i = sub.add_parser("interventions", help="calibrated state replacement and freezing (Figure 4b, eq. 15)",
                       description="calibrated state replacement and freezing (Figure 4b, eq. 15)")
    _common(i)
    i.add_argument("--calib-split", default=CALIB_SPLIT,
                   help=f"split the state statistics come from (default: {CALIB_SPLIT}, disjoint from the held-out split)")
    i.add_argument("--calib-windows", type=int, default=CALIB_WINDOWS,
                   help=f"calibration windows, a seeded sample over the whole split (default {CALIB_WINDOWS}; 0: every window)")
    i.add_argument("--calib-seed", type=int, default=CALIB_SEED, help=f"seed of the calibration sample (default {CALIB_SEED})")
    i.add_argument("--eval-split", help="split the perplexities are measured on (default: eval.heldout_split)")
    i.add_argument("--max-windows", type=int,
                   help="evaluation windows (default: eval.heldout_windows, as the held-out PPL; 0: the whole split)")


def run(args) -> int:
    """Set up the held-out data, run the analysis, write its JSON and log it to MLflow."""
    from stateloop.analysis import common
    from stateloop.runs import atomic_write_json, code_version, load_model, resolve_device, resolve_run_arg

    _check_counts(args)
    run_dir = resolve_run_arg(args.run).folder
    device = resolve_device(args.device)
    model, config = load_model(run_dir, device=device)
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
        mlflow_id = common.log_to_mlflow(run_dir, config, args.analysis, metrics, settings, out, curves, args.config)
        print(f"logged to MLflow run {mlflow_id}", file=sys.stderr)
    return 0


def _check_counts(args) -> None:
    """Window lengths and batch sizes must be positive; window counts may be 0 (the whole split)."""
    from stateloop.config import ConfigError

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
        from stateloop.analysis import common

        return common.heldout_block(self.proto, len(self.windows), self.split_tokens, nll, tokens, self.precision,
                                    self.matches_eval)


def _eval_setup(args, run_dir, config, model, device) -> tuple[torch.nn.Module, EvalSetup]:
    """The held-out protocol of the run's `stateloop eval`, then the overriding flags; the model cast
    to the analysis dtype. Returns (model, setup)."""
    import torch

    from stateloop.analysis import common
    from stateloop.analysis.bench_decode import DTYPES
    from stateloop.config import ConfigError

    evalp = common.heldout_protocol(run_dir, config, model, args.config)
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
    from stateloop.analysis.shapley import shapley_analysis

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
    from stateloop.analysis.interventions import intervention_analysis

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
    from stateloop.analysis import common
    from stateloop.config import ConfigError

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
    import torch

    from stateloop.runs import atomic_torch_save

    stats_path = run_dir / "interventions_calibration.pt"
    atomic_torch_save({"mean": stats.mean, "std": stats.std, "tokens": stats.tokens, "split": args.calib_split,
                       "windows": len(starts), "seed": args.calib_seed, "starts": torch.tensor(starts)}, stats_path)
    return stats_path
