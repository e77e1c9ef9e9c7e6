"""``stateloop eval``'s work: one run folder -> ``eval.json`` (+ samples) and its MLflow run: held-out
token perplexity on the run's own shards (the paper's "Pile" column; evaluate/perplexity.py), every
task of ``eval.tasks`` through lm-eval at each shot count of ``eval.shots`` (rolling-loglikelihood
tasks at zero shots only; evaluate/lm.py), and for the StateLoop family the state's per-iteration
diagnostics from the same forwards (``state``; evaluate/diagnostics.py).

At ``eval.K`` = K' other than the trained K it writes ``eval_K{K'}.json`` (``LoopedLM.at_depth``);
:func:`evaluate_depths` measures several depths from one load into ``eval_depth.json``.
``eval.json`` (atomic) holds the versions, sample counts, each table's metric (evaluate/metrics.py)
and a flat ``summary``, also logged to MLflow; ``lm_eval/`` holds lm-eval's own files, replaced whole.
"""

from __future__ import annotations

import datetime
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from tqdm.auto import tqdm

from stateloop.config import ConfigError, to_dict
from stateloop.config.evaluate import EvalConfig
from stateloop.config.pipeline import PipelineConfig
from stateloop.config.run import RunConfig
from stateloop.data.shards import ShardSet, read_meta
from stateloop.evaluate import diagnostics as state_diagnostics
from stateloop.evaluate import metrics as M
from stateloop.evaluate.lm import StateLoopEvalLM, load_run
from stateloop.evaluate.perplexity import split_windows, token_nll
from stateloop.evaluate.tasks.prepare import prepare_tasks
from stateloop.files import atomic_write_bytes, atomic_write_json, code_version, current_umask
from stateloop.runs import DEPTH_FILE, trained_length
from stateloop.tracking.records import flatten
from stateloop.tracking.stages import log_stage

WORK_DIR = "eval_work"


def depth_stem(K: int, trained_K: int) -> str:
    """The name of an evaluation at depth K of a run trained at ``trained_K``: "eval" at the
    trained depth (eval.json, eval_samples/, MLflow eval/...), "eval_K{K}" at another."""
    return "eval" if K == trained_K else f"eval_K{K}"


def heldout_perplexity(lm, data_dir: Path, cfg: EvalConfig, progress: bool = True, diagnostics: dict | None = None) -> dict:
    """Token perplexity of the model on the held-out split of its data; ``diagnostics`` (a dict)
    collects the state's diagnostics over the same windows (models/looped.py's hook)."""

    try:
        windows, shards = split_windows(data_dir, cfg.heldout_split, lm.max_length, cfg.heldout_windows)
    except ConfigError as err:
        raise ConfigError(f"eval.heldout_split: {err}") from None
    totals = torch.zeros(2, dtype=torch.float64)
    hooks = {} if diagnostics is None else {"diagnostics": diagnostics}  # only the StateLoop family's loop takes it
    step = cfg.batch_size * 8  # progress granularity
    with lm.autocast():
        for start in tqdm(range(0, len(windows), step), desc=f"held-out perplexity ({cfg.heldout_split})",
                          disable=not progress, leave=False):
            totals += token_nll(lm.model, windows[start : start + step], cfg.batch_size, lm.device, **hooks).sum(0)
    nll = float(totals[0] / totals[1])
    return {"split": cfg.heldout_split, "windows": len(windows), "seq_len": lm.max_length,
            "tokens": int(totals[1]), "split_tokens": len(shards), "nll": nll, "ppl": math.exp(nll)}


def chance_level(samples: list[dict]) -> float:
    """The expected accuracy of a uniform guess over each evaluated example's choices: the mean
    of 1 / (number of choices); lm-eval scores one request per choice (``arguments``)."""
    return sum(1.0 / len(s["arguments"]) for s in samples) / len(samples)


def _write_samples(folder: Path, task: str, shots: int, samples: list[dict]) -> Path:
    lines = [json.dumps(s, default=str, ensure_ascii=False) for s in samples]
    path = folder / f"{task}_{shots}shot.jsonl"
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())
    return path


def run_tasks(lm, cfg: EvalConfig, work_dir: Path, samples_dir: Path | None, progress: bool = True,
              data_meta: dict | None = None, lm_eval_dir: Path | None = None) -> dict:
    """lm-eval over cfg.tasks x cfg.shots. Returns {"lm_eval_version", "tasks": {...}}. With
    ``lm_eval_dir``, lm-eval's own result (and sample) files go there (replacing the folder)."""
    import lm_eval
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    staging = None
    if lm_eval_dir is not None:
        lm_eval_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{lm_eval_dir.name}.", suffix=".tmp", dir=lm_eval_dir.parent))

    try:
        prepared = prepare_tasks(cfg.tasks, work_dir, cfg, data_meta)
        tasks: dict[str, dict] = {}
        for shots in sorted(cfg.shots):
            names = [t for t in cfg.tasks if shots == 0 or prepared.output_types[t] != "loglikelihood_rolling"]
            if not names:
                continue
            if progress:
                print(f"[eval] {shots}-shot: {', '.join(names)}", file=sys.stderr, flush=True)
            # A file path (not a folder) puts lm-eval's files straight into the folder, not into a
            # subfolder named after the model; lm_eval_dir's parent is the run folder evaluated.
            tracker = EvaluationTracker(output_path=str(staging / "results.json")) if staging is not None else None
            res = simple_evaluate(
                model=lm, tasks=names, num_fewshot=shots, task_manager=prepared.task_manager, limit=cfg.limit,
                bootstrap_iters=cfg.bootstrap_iters, log_samples=cfg.log_samples, random_seed=cfg.seed,
                numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed,
                verbosity=None, evaluation_tracker=tracker, model_args=f"pretrained={lm_eval_dir.parent}" if tracker else None,
            )
            for task in names:
                entry = tasks.setdefault(task, {
                    "column": M.column(task), "reported": M.reported(task),
                    "version": res.get("versions", {}).get(task), "output_type": prepared.output_types[task],
                    "source": "local" if task in prepared.local else "lm-eval", "shots": {},
                })
                values = {}
                for key, value in res["results"][task].items():
                    if key in ("alias", "sample_len") or not isinstance(value, (int, float)):
                        continue  # not metrics; stderr is "N/A" when bootstrapping is off
                    metric, _, filt = key.partition(",")  # "acc,none" -> acc; "exact_match,strict" -> exact_match_strict
                    values[metric if filt in ("", "none") else f"{metric}_{filt}"] = float(value)
                shot = entry["shots"][str(shots)] = {
                    "n_shot": res.get("n-shot", {}).get(task, shots), "n_samples": res.get("n-samples", {}).get(task),
                    "metrics": values, "table": {kind: values[m] for kind, m in M.reported(task).items() if m in values}}
                if prepared.output_types[task] == "multiple_choice" and res.get("samples") and res["samples"].get(task):
                    shot["chance"] = chance_level(res["samples"][task])
                if samples_dir is not None and res.get("samples") and task in res["samples"]:
                    shot["samples_file"] = _write_samples(samples_dir, task, shots, res["samples"][task]).name
            if tracker is not None:  # last: lm-eval's writers rewrite the samples they are given in place
                name = _save_lm_eval_files(tracker, res, staging, cfg.log_samples)
                for task in names:
                    tasks[task]["shots"][str(shots)]["lm_eval_results"] = f"{lm_eval_dir.name}/{name}"
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if staging is not None:
        staging.chmod(0o777 & ~current_umask())
        shutil.rmtree(lm_eval_dir, ignore_errors=True)
        staging.rename(lm_eval_dir)
    return {"lm_eval_version": lm_eval.__version__, "tasks": tasks}


def _save_lm_eval_files(tracker, res: dict, folder: Path, log_samples: bool) -> str:
    """lm-eval's results_<time>.json (and samples_<task>_<time>.jsonl) of one simple_evaluate call,
    written by its own tracker as its command line does; returns the results file's name."""
    before = set(folder.glob("results_*.json"))
    samples = res.pop("samples", None) if log_samples else None
    tracker.save_results_aggregated(results=res, samples=samples)
    for task in res.get("configs", {}) if samples else ():
        tracker.save_results_samples(task_name=task, samples=samples[task])
    new = set(folder.glob("results_*.json")) - before
    if len(new) != 1:  # its tracker logs a failure as a warning and carries on
        raise OSError(f"{folder}: lm-eval's tracker wrote no results file (its warning above says why)")
    return new.pop().name


def summary(results: dict) -> dict[str, float]:
    """Every number as a flat {name: value}: heldout/ppl, {task}/{n}shot/{metric}."""
    out = {}
    held = results.get("heldout")
    if held:
        out["heldout/nll"], out["heldout/ppl"] = held["nll"], held["ppl"]
    for task, entry in results.get("tasks", {}).items():
        for shots, block in entry["shots"].items():
            for metric, value in block["metrics"].items():
                if math.isfinite(value):
                    out[f"{task}/{shots}shot/{metric}"] = value
    return out


def evaluate_run(run_dir: str | Path, rc: RunConfig, *, mlflow: bool = True, progress: bool = True,
                 pipeline: PipelineConfig | None = None) -> dict:
    """Evaluate one run folder with ``rc.eval`` (``rc``: its config, resolve.resolve_eval);
    write ``eval.json`` (atomically) and log to MLflow (the store of the settings of ``pipeline``,
    the config named on the command line, see tracking.stages.stage_uri). Returns the results."""

    run_dir = Path(run_dir)
    run, lm, cfg = _load(run_dir, rc)
    trained_K = run.model.cfg.K
    if cfg.K is not None:
        run.model.at_depth(cfg.K)  # one line, before any work, where K has no meaning for the model
    K = run.model.cfg.K
    stem = depth_stem(K, trained_K)
    started = datetime.datetime.now(datetime.timezone.utc)
    results: dict = {
        "run_id": run.run_id, "model": run.config.model.name, "run_dir": str(run_dir), "K": K, "trained_K": trained_K,
        "data_dir": str(run.data_dir), "code_version": code_version(), "started": started.isoformat(timespec="seconds"),
        "device": str(lm.device), "max_length": lm.max_length, "eval_config": to_dict(cfg),
        "metrics_note": {"accuracy": M.describe("accuracy"), "perplexity": M.describe("perplexity")},
    }
    if progress:
        at = "" if K == trained_K else f" at test-time depth K={K} (trained at K={trained_K})"
        print(f"[eval] {run.run_id}: {results['model']}{at} on {lm.device}, window {lm.max_length}", file=sys.stderr, flush=True)
    results.update(_measure(run, lm, cfg, run_dir, stem, progress))
    results["seconds"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 2)
    results["summary"] = summary(results)
    if mlflow:
        results["mlflow_run_id"] = log_to_mlflow(run_dir, run.run_id, results, run.config, pipeline, stem)
    atomic_write_json(run_dir / f"{stem}.json", results)
    return results


def evaluate_depths(run_dir: str | Path, rc: RunConfig, depths: list[int], *, mlflow: bool = True,
                    progress: bool = True, pipeline: PipelineConfig | None = None) -> dict:
    """A run at each test-time depth K' of ``depths`` (the trained K among them or not): the
    held-out perplexity (and ``rc.eval.tasks``, when any) per K', from one load of the weights.
    Every depth is checked before any work. Writes ``eval_depth.json`` and logs the curves
    ``eval_depth/heldout_ppl`` and ``eval_depth/heldout_nll`` (step = K') to the run's MLflow run."""
    run_dir = Path(run_dir)
    if not depths:
        raise ConfigError("--depths: name at least one loop depth")
    run, lm, cfg = _load(run_dir, rc)
    trained_K = run.model.cfg.K
    for K in depths:
        run.model.at_depth(K)  # every depth is checked (one line) before any work
    started = datetime.datetime.now(datetime.timezone.utc)
    points = []
    for K in tqdm(sorted(set(depths)), desc=f"test-time depths of {run.run_id}", disable=not progress, leave=False):
        run.model.at_depth(K)
        # Samples and lm-eval's files of a sweep go to eval_depth_K{K}_samples/ and lm_eval_depth_K{K}/,
        # never over eval.json's (the trained depth's eval_samples/ and lm_eval/).
        point = {"K": K, **_measure(run, lm, cfg, run_dir, f"eval_depth_K{K}", False)}
        point["summary"] = summary(point)
        points.append(point)
        if progress:
            print(f"[eval] K={K}: held-out perplexity {point['heldout']['ppl']:.3f}", file=sys.stderr, flush=True)
    run.model.at_depth(trained_K)
    results = {
        "run_id": run.run_id, "model": run.config.model.name, "run_dir": str(run_dir), "trained_K": trained_K,
        "code_version": code_version(), "started": started.isoformat(timespec="seconds"), "device": str(lm.device),
        "max_length": lm.max_length, "eval_config": to_dict(cfg), "depths": points,
        "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 2),
    }
    if mlflow:
        curves = {name: [(p["K"], p["summary"][key]) for p in points]
                  for name, key in (("heldout_ppl", "heldout/ppl"), ("heldout_nll", "heldout/nll"))}
        results["mlflow_run_id"] = log_stage(run_dir, run.run_id, run.config, pipeline, "eval", "eval_depth", {},
                                             curves=curves, artifact=(results, f"eval/{DEPTH_FILE}"))
    atomic_write_json(run_dir / DEPTH_FILE, results)
    return results


def _load(run_dir: Path, rc: RunConfig):
    """(the run, its lm-eval model, ``rc.eval``) for the eval section's device, batch size, window
    and precision; ``rc`` (the run's saved config) stands for the saved config, not read again."""
    if rc.eval is None:
        raise ValueError(f"{run_dir}: the run config has no eval section (resolve.resolve_eval)")
    cfg = rc.eval
    run = load_run(run_dir, cfg.device, rc)
    lm = StateLoopEvalLM(model=run.model, tokenizer=run.tokenizer, eos_id=run.eos_id, batch_size=cfg.batch_size,
                         max_length=cfg.max_length or trained_length(run.config), device=str(next(run.model.parameters()).device),
                         precision=cfg.precision, name=run.run_id)
    return run, lm, cfg


def _measure(run, lm, cfg: EvalConfig, run_dir: Path, stem: str, progress: bool) -> dict:
    """The held-out perplexity and the tasks of ``cfg`` at the model's current depth:
    {"heldout", "state" (the StateLoop family), "lm_eval_version", "tasks"}; samples go to
    ``{stem}_samples/`` (eval_samples/)."""
    sums = {} if state_diagnostics.supports(lm.model) else None
    out = {"heldout": heldout_perplexity(lm, run.data_dir, cfg, progress, diagnostics=sums)}
    if sums is not None:  # the state's diagnostics on the held-out windows (evaluate/diagnostics.py)
        out["state"] = state_diagnostics.summarise(sums)
    if progress:
        print(f"[eval] held-out perplexity {out['heldout']['ppl']:.3f} over {out['heldout']['tokens']} tokens",
              file=sys.stderr, flush=True)
    samples_dir = run_dir / f"{stem}_samples" if cfg.log_samples else None
    if cfg.tasks:
        out.update(run_tasks(lm, cfg, run_dir / WORK_DIR, samples_dir, progress, read_meta(run.data_dir),
                             lm_eval_dir=run_dir / ("lm_eval" + stem.removeprefix("eval"))))  # lm_eval/, lm_eval_K{K}/
    else:
        import lm_eval

        out.update({"lm_eval_version": lm_eval.__version__, "tasks": {}})
    return out


# ----------------------------------------------------------------------------------------------
# MLflow


def log_to_mlflow(run_dir: Path, run_id: str, results: dict, config: RunConfig | None = None,
                  pipeline: PipelineConfig | None = None, stem: str = "eval") -> str:
    """Log the summary metrics (as ``{stem}/<name>``), the eval settings (as ``{stem}.<key>`` params;
    a re-evaluation with other settings keeps them as ``changed_on_reeval.{stem}.<key>`` tags) and
    the results (as the artifact ``eval/{stem}.json``) into the run's MLflow run
    (tracking.stages.log_stage). ``stem``: "eval" at the trained depth, "eval_K{K}" at another."""

    tags = {f"{stem}.lm_eval_version": results.get("lm_eval_version", ""), f"{stem}.code_version": results.get("code_version", "")}
    curves = state_diagnostics.curves(results["state"]) if results.get("state") else None  # {stem}/state/<quantity> at step i
    return log_stage(run_dir, run_id, config, pipeline, "eval", stem, results["summary"], curves=curves,
                     params=flatten(results.get("eval_config") or {}, f"{stem}."), tags=tags,
                     artifact=(results, f"eval/{stem}.json"), datasets=_heldout_input(results))


def _heldout_input(results: dict) -> dict:
    """The held-out split the perplexity read, as the run's "evaluation" dataset input (lm-eval's
    task data is named in eval.json's tasks, not here)."""
    split = (results.get("eval_config") or {}).get("heldout_split")
    if not results.get("data_dir") or not split or not results.get("heldout"):
        return {}
    return {"evaluation": ShardSet(Path(results["data_dir"]), split)}
