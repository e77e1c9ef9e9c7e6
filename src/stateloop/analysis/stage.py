"""The analyze stage (``stateloop analyze``): the held-out set-up, the interventions' calibration,
one analysis run whole, as one shard or as the merge of its shards (analysis/shards.py), its JSON
and MLflow logging."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from stateloop.analysis import common, interventions, shapley, shards
from stateloop.analysis.interventions import StateStats, state_statistics
from stateloop.analysis.jobs import CALIBRATION_FILE
from stateloop.analysis.request import Request
from stateloop.config import ConfigError, from_dict
from stateloop.config.model import ModelConfig
from stateloop.config.pipeline import PipelineConfig
from stateloop.fast import accelerate
from stateloop.files import atomic_torch_save, atomic_write_json, code_version, safe_torch_load
from stateloop.models.registry import build_model
from stateloop.resolve import resolve_eval
from stateloop.runs import load_model, read_weights, resolve_device, resolve_run_arg


def analyze(args: Request, pipeline: PipelineConfig | None = None) -> int:
    """Set up the held-out data, then evaluate the analysis (whole, or one shard: --shard) or merge
    its shards (--merge), write its JSON and log it to MLflow. ``pipeline``: the config
    ``args.config`` names, loaded by the command (None without one)."""
    _check_counts(args)
    shard = _check_sharding(args)
    run_dir = resolve_run_arg(args.run).folder
    merging = args.merge is not None
    device = torch.device("cpu") if merging else resolve_device(args.device)
    model, saved = _shape_only(run_dir) if merging else load_model(run_dir, device=device)
    accelerate(model)  # the fused inference forms, once (stateloop/fast.py); the analyses leave the model as handed
    config = resolve_eval(run_dir, pipeline, saved=saved)  # the saved config with the eval section of the run's `stateloop eval`
    common.require_reads(model, f"analyze {args.analysis}")
    model, setup = _eval_setup(args, run_dir, config, model, device)
    if args.calibrate_only:
        calib, path = _calibrate(args, run_dir, config, model, setup)
        print(f"calibration: {calib['windows']} windows of {args.calib_split} ({calib['tokens']} tokens); wrote {path}")
        return 0
    spec = _shapley_spec(model, setup) if args.analysis == "shapley" else _interventions_spec(args, run_dir, config, model,
                                                                                                setup, shard)
    key = spec.key(setup)
    sums, docs = _evaluate(args, run_dir, setup, spec, key, shard)
    if sums is None:
        return 0  # one shard: its file is written
    result, heldout, settings, metrics, curves, summary = spec.finish(sums, setup)
    devices = sorted({d.get("device") or str(device) for d in docs})
    settings = {**settings, "device": ", ".join(devices), "shards": len(docs)}

    out = Path(args.out) if args.out else run_dir / f"{args.analysis}.json"
    result = {"analysis": args.analysis, "run_dir": str(run_dir), "model": model.cfg.name, "settings": settings,
              "code_version": code_version(), "heldout": heldout, **result}
    if merging:
        result["shards"] = [{"shard": f"{d['shard']['index']}/{d['shard']['count']}", "windows": d["shard"]["windows"],
                             "device": d.get("device"), "code_version": d.get("code_version")} for d in docs]
    atomic_write_json(out, result)
    shards.partial_file(run_dir, args.analysis, shards.Shard(1, 1)).unlink(missing_ok=True)
    print(summary)
    print(f"wrote {out}", file=sys.stderr)
    if not args.no_mlflow:
        mlflow_id = common.log_to_mlflow(run_dir, config, args.analysis, metrics, settings, out, curves, pipeline)
        print(f"logged to MLflow run {mlflow_id}", file=sys.stderr)
    return 0


def _check_sharding(args) -> shards.Shard | None:
    """--shard, --merge and --calibrate-only: one of them at most; the shard they name."""
    given = [flag for flag, on in (("--shard", args.shard is not None), ("--merge", args.merge is not None),
                                   ("--calibrate-only", args.calibrate_only)) if on]
    if len(given) > 1:
        raise ConfigError(f"{given[1]}: not together with {given[0]}")
    if args.merge is not None and args.merge < 1:
        raise ConfigError(f"--merge: the number of shards must be >= 1, got {args.merge}")
    if args.save_every < 0:
        raise ConfigError(f"--save-every: must be >= 0 seconds, got {args.save_every}")
    if args.calibrate_only and args.out:
        raise ConfigError(f"--out: --calibrate-only writes RUN_DIR/{CALIBRATION_FILE}")
    return shards.Shard.parse(args.shard) if args.shard is not None else None


def _shape_only(run_dir):
    """The run's model on the meta device (its config and class; no weights read) and its saved
    config: all that a merge needs of the model."""
    _, blob = read_weights(run_dir, tensors=False)
    mcfg = from_dict(ModelConfig, blob["config"].get("model"), "model")
    return build_model(mcfg, device="meta", init=False).eval(), blob["config"]


def _evaluate(args, run_dir, setup: EvalSetup, spec, key: dict, shard: shards.Shard | None):
    """The exact sums of the whole analysis (None: one shard, whose file is written here) and the
    shard documents they came from."""
    n, bs = len(setup.windows), setup.proto.batch_size
    if args.merge is not None:
        print(f"analyze {args.analysis}: merging {args.merge} shards of {run_dir}", file=sys.stderr)
        return shards.merge(args.analysis, key, args.merge, n, bs, setup.proto.seq_len, spec.names, run_dir)
    one = shard or shards.Shard(1, 1)
    partial = shards.partial_file(run_dir, args.analysis, one)

    def compute(lo: int, hi: int):
        with setup.amp:
            return spec.batch(setup.windows[lo:hi].to(setup.device))

    doc = shards.run_shard(args.analysis, key, one, n, bs, spec.names, compute, partial, save_every=args.save_every,
                           progress=setup.progress, device=str(setup.device), code_version=code_version())
    if shard is None:
        return shards.Sums.from_json(doc, spec.names, str(partial)), [doc]
    out = Path(args.out) if args.out else shards.shard_file(run_dir, args.analysis, shard)
    atomic_write_json(out, doc)
    partial.unlink(missing_ok=True)
    lo, hi = doc["shard"]["windows"]
    print(f"analyze {args.analysis}: shard {shard.label}, windows [{lo}, {hi}) of {n}: wrote {out}")
    return None, [doc]


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
    windows: common.WindowSet  # N windows of seq_len + 1 tokens, read when a batch asks for them
    split_tokens: int
    split_fingerprint: str  # the held-out split's shard list (data/shards.py: ShardSet.fingerprint)
    weights_sha256: str  # the run's final weights
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

    def key(self, analysis: str, model, **more) -> dict:
        """What the analysis's sums depend on (analysis/shards.py: shards and partial results
        must share it)."""
        return shards.shard_key(analysis=analysis, weights_sha256=self.weights_sha256, model=model.cfg.name,
                                K=model.cfg.K, split=self.proto.split, split_fingerprint=self.split_fingerprint,
                                seq_len=self.proto.seq_len, windows=len(self.windows),
                                batch_size=self.proto.batch_size, dtype=self.precision, **more)


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
    model = model.to(torch.float32 if dtype == "bf16-mixed" else getattr(torch, dtype))  # float32, bfloat16, float16
    eval_precision = "bf16-mixed" if evalp.precision == "bf16-mixed" else "float32"
    matches_eval = (proto.split, proto.max_windows, proto.seq_len, dtype) == (
        evalp.split, evalp.max_windows, evalp.seq_len, eval_precision)
    split_key = ("--split" if args.analysis == "shapley" else "--eval-split") if split_flag else "eval.heldout_split"
    try:
        windows, split = common.heldout_set(config, run_dir, proto.split, proto.seq_len, proto.max_windows)
    except ConfigError as err:
        raise ConfigError(f"{split_key}: {err}") from None
    settings = {"seq_len": proto.seq_len, "batch_size": proto.batch_size, "dtype": dtype, "autocast": autocast,
                "device": str(device), "max_windows": proto.max_windows}
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast)
    return model, EvalSetup(proto, windows, len(split), split.fingerprint(), common.weights_sha256(run_dir), dtype,
                            matches_eval, settings, amp, device, not args.no_progress)


@dataclass
class _Shapley:
    """Exact Shapley values of the reads on the held-out windows."""

    model: torch.nn.Module

    @property
    def names(self) -> list[str]:
        return shapley.sum_names(self.model.cfg.K)

    def key(self, setup: EvalSetup) -> dict:
        return setup.key("shapley", self.model)

    def batch(self, windows: torch.Tensor):
        return shapley.batch_sums(self.model, windows)

    def finish(self, sums: shards.Sums, setup: EvalSetup):
        """Returns (result, heldout block, settings, metrics, curves, summary line)."""
        proto, n = setup.proto, len(setup.windows)
        result = shapley.shapley_result(self.model.cfg.K, sums)
        heldout = setup.heldout_block(result["nll_none_masked"], result["tokens"])
        settings = {**setup.settings, "split": proto.split, "windows": n}
        metrics = {"nll_none_masked": result["nll_none_masked"], "ppl_none_masked": result["ppl_none_masked"],
                   "nll_all_masked": result["nll_all_masked"],
                   "feedback_share_pct": result["feedback_share_pct"], "terminal_share_pct": result["terminal_share_pct"]}
        curves = {"phi": list(enumerate(result["shapley"], 1)), "share_pct": list(enumerate(result["share_pct"], 1))}
        summary = (f"held-out PPL, all reads kept {heldout['ppl']:.3f} ({proto.split}, {n} windows); "
                   f"feedback reads {result['feedback_share_pct']:.2f}%, terminal read {result['terminal_share_pct']:.2f}% "
                   f"(paper, K=7: 63.70% / 36.30%)")
        return result, heldout, settings, metrics, curves, summary


def _shapley_spec(model, setup: EvalSetup) -> _Shapley:
    K = model.cfg.K
    print(f"analyze shapley: {2 ** K} masks x {len(setup.windows)} windows of {setup.proto.seq_len} tokens "
          f"({setup.proto.split})", file=sys.stderr)
    return _Shapley(model)


@dataclass
class _Interventions:
    """Replacement and freezing on the held-out windows, under the calibration statistics."""

    model: torch.nn.Module
    stats: StateStats
    calibration: dict  # the calibration file's settings and sample (without the statistics)
    calib_file: Path

    @property
    def names(self) -> list[str]:
        return interventions.intervention_names(self.model.cfg.K)

    def key(self, setup: EvalSetup) -> dict:
        c = self.calibration
        return setup.key("interventions", self.model, calibration=c["digest"], calib_split=c["split"],
                         calib_windows=c["requested_windows"], calib_seed=c["seed"])

    def batch(self, windows: torch.Tensor):
        return interventions.batch_sums(self.model, windows, self.stats)

    def finish(self, sums: shards.Sums, setup: EvalSetup):
        """Returns (result, heldout block, settings, metrics, curves, summary line)."""
        proto, n, c = setup.proto, len(setup.windows), self.calibration
        result = interventions.intervention_result(self.model.cfg.K, sums, self.stats)
        sampling = "seeded uniform sample of non-overlapping window slots over the whole split"
        result["calibration"] = {"split": c["split"], "windows": c["windows"], "seed": c["seed"], "sampling": sampling,
                                 **result["calibration"]}
        heldout = setup.heldout_block(result["unmodified"]["nll"], sums.tokens)
        settings = {**setup.settings, "calib_split": c["split"], "calib_windows": c["windows"], "calib_seed": c["seed"],
                    "eval_split": proto.split, "windows": n, "calibration_file": self.calib_file.name}
        metrics = {"ppl_unmodified": result["unmodified"]["ppl"]}
        curves = {"ppl_replace": [(e["i"], e["ppl"]) for e in result["replacement"]],
                  "ppl_freeze": [(e["i"], e["ppl"]) for e in result["freezing"]]}
        summary = "PPL unmodified {:.3f} ({}, {} windows); replace {}; freeze {}".format(
            result["unmodified"]["ppl"], proto.split, n,
            ", ".join(f"S{e['replaced']}<-S{e['i']}: {e['ppl']:.3f}" for e in result["replacement"]),
            ", ".join(f"at S{e['i']}: {e['ppl']:.3f}" for e in result["freezing"]))
        return result, heldout, settings, metrics, curves, summary


def _interventions_spec(args, run_dir, config, model, setup: EvalSetup, shard: shards.Shard | None) -> _Interventions:
    """The calibration the evaluation runs under. One shard of several, and the merge, read the
    calibration file (``--calibrate-only`` writes it once, so every shard has the same statistics);
    the whole analysis makes it afresh, unless it continues a partial result made under the
    file's statistics."""
    path = run_dir / CALIBRATION_FILE
    sharded = args.merge is not None or (shard is not None and shard.count > 1)
    if sharded or _continues(args, run_dir, setup, path):
        stats, calib = _load_calibration(args, path, setup)
    else:
        calib, path = _calibrate(args, run_dir, config, model, setup)
        stats = StateStats(calib.pop("mean"), calib.pop("std"), calib["tokens"])
    print(f"analyze interventions: {run_dir}, calibration {calib['windows']} windows ({calib['split']}), "
          f"evaluation {len(setup.windows)} windows ({setup.proto.split}) of {setup.proto.seq_len} tokens",
          file=sys.stderr)
    return _Interventions(model, stats, calib, path)


def _calibration_settings(args, setup: EvalSetup) -> dict:
    """What the calibration statistics depend on (besides the code)."""
    return {"weights_sha256": setup.weights_sha256, "split": args.calib_split, "requested_windows": args.calib_windows,
            "seed": args.calib_seed, "seq_len": setup.proto.seq_len, "dtype": setup.precision}


def _calibrate(args, run_dir, config, model, setup: EvalSetup) -> tuple[dict, Path]:
    """State statistics of the calibration sample, saved as RUN_DIR/interventions_calibration.pt
    (the statistics, the sample they came from and the settings). Returns (its content, path)."""
    calib_windows, starts = _calibration_windows(args, run_dir, config, setup.proto)
    with setup.amp:
        stats = state_statistics(model, calib_windows, setup.proto.batch_size, setup.device, setup.progress)
    calib = {"mean": stats.mean, "std": stats.std, "tokens": stats.tokens, "windows": len(starts),
             "starts": torch.tensor(starts), "digest": interventions.stats_digest(stats), "device": str(setup.device),
             **_calibration_settings(args, setup)}
    path = run_dir / CALIBRATION_FILE
    atomic_torch_save(calib, path)
    return calib, path


def _load_calibration(args, path: Path, setup: EvalSetup) -> tuple[StateStats, dict]:
    """The calibration file, which must have been made for these settings (one line naming the
    file and the first setting that differs otherwise)."""
    rerun = "stateloop analyze interventions RUN --calibrate-only (with the same flags)"
    if not path.is_file():
        raise ConfigError(f"{path}: no calibration statistics; shards share one calibration: run {rerun} first")
    calib = safe_torch_load(path)
    if not isinstance(calib, dict) or "mean" not in calib or "digest" not in calib:
        raise ConfigError(f"{path}: not a calibration file of this version; run {rerun}")
    for name, value in _calibration_settings(args, setup).items():
        if calib.get(name) != value:
            raise ConfigError(f"{path}: made for {name} {calib.get(name)!r}, here {value!r}; run {rerun}")
    stats = StateStats(calib.pop("mean"), calib.pop("std"), int(calib["tokens"]))
    if interventions.stats_digest(stats) != calib["digest"]:
        raise ConfigError(f"{path}: its statistics do not match their digest; run {rerun}")
    return stats, calib


def _continues(args, run_dir, setup: EvalSetup, path: Path) -> bool:
    """Whether the whole analysis continues a partial result made under the calibration file."""
    partial = shards.partial_file(run_dir, "interventions", shards.Shard(1, 1))
    if not (partial.is_file() and path.is_file()):
        return False
    try:
        made = json.loads(partial.read_text()).get("key", {}).get("calibration")
        _, calib = _load_calibration(args, path, setup)
    except (ConfigError, OSError, ValueError, AttributeError):
        return False
    return made == calib["digest"]


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
