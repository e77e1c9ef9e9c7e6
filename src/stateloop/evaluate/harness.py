"""``stateloop eval``'s work: one run folder -> ``eval.json`` (+ samples) and its MLflow run.

1. Held-out token perplexity on the run's own data (the paper's "Pile" column): consecutive
   windows of L + 1 tokens from the start of ``eval.heldout_split`` of the run's token shards,
   PPL = exp(sum NLL / number of predicted tokens) (evaluate/perplexity.py).
2. Every task of ``eval.tasks`` through lm-eval at every shot count of ``eval.shots``
   (rolling-loglikelihood tasks, i.e. document perplexities, at zero shots only), through the
   ``stateloop`` lm-eval model (evaluate/lm.py).
3. For the StateLoop family, the state's per-iteration diagnostics on the held-out windows of 1.,
   collected in the same forward passes (``state`` in eval.json, evaluate/diagnostics.py; MLflow
   curves ``eval/state/<quantity>`` stepped by the state index i).

``eval.json`` records the lm-eval version, each task's version and sample counts, the metric
each table reports (evaluate/metrics.py) and a flat ``summary`` of every number, which is also
what goes to MLflow. It is written atomically; prompts and answers of every request go to
``eval_samples/{task}_{shots}shot.jsonl`` when ``eval.log_samples`` is on.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from stateloop.config import ConfigError, to_dict
from stateloop.data.shards import read_meta
from stateloop.evaluate import diagnostics as state_diagnostics
from stateloop.evaluate import metrics as M
from stateloop.evaluate.config import EvalConfig
from stateloop.evaluate.lm import StateLoopEvalLM, load_run
from stateloop.evaluate.perplexity import split_windows, token_nll
from stateloop.evaluate.tasks import prepare_tasks
from stateloop.runs import atomic_write_bytes, atomic_write_json, code_version, trained_length
from stateloop.tracking import flatten, log_stage

RESULTS_FILE = "eval.json"
SAMPLES_DIR = "eval_samples"
WORK_DIR = "eval_work"
def heldout_perplexity(lm, data_dir: Path, cfg: EvalConfig, progress: bool = True, diagnostics: dict | None = None) -> dict:
    """Token perplexity of the model on the held-out split of its data; ``diagnostics`` (a dict)
    collects the state's diagnostics over the same windows (models/looped.py's hook)."""

    try:
        windows, shards = split_windows(data_dir, cfg.heldout_split, lm.max_length, cfg.heldout_windows)
    except ConfigError as err:
        raise ConfigError(f"eval.heldout_split: {err}") from None
    totals = torch.zeros(2, dtype=torch.float64)
    step = cfg.batch_size * 8  # progress granularity
    with lm.autocast():
        for start in tqdm(range(0, len(windows), step), desc=f"held-out perplexity ({cfg.heldout_split})",
                          disable=not progress, leave=False):
            totals += token_nll(lm.model, windows[start : start + step], cfg.batch_size, lm.device,
                                **({"diagnostics": diagnostics} if diagnostics is not None else {})).sum(0)
    nll = float(totals[0] / totals[1])
    return {"split": cfg.heldout_split, "windows": len(windows), "seq_len": lm.max_length,
            "tokens": int(totals[1]), "split_tokens": len(shards), "nll": nll, "ppl": math.exp(nll)}


def _metric_name(key: str) -> str:
    """lm-eval's "acc,none" -> "acc"; another filter keeps its name: "exact_match,strict" -> "exact_match_strict"."""
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else f"{metric}_{filt}"


def _task_entry(task: str, shots: int, res: dict) -> dict:
    raw = res["results"][task]
    values = {}
    for key, value in raw.items():
        if key in ("alias", "sample_len") or not isinstance(value, (int, float)):
            continue  # not metrics; stderr is "N/A" when bootstrapping is off
        values[_metric_name(key)] = float(value)
    table = {kind: values[m] for kind, m in M.reported(task).items() if m in values}
    return {"n_shot": res.get("n-shot", {}).get(task, shots), "n_samples": res.get("n-samples", {}).get(task),
            "metrics": values, "table": table}


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
              data_meta: dict | None = None) -> dict:
    """lm-eval over cfg.tasks x cfg.shots. Returns {"lm_eval_version", "tasks": {...}}."""
    import lm_eval
    from lm_eval import simple_evaluate


    prepared = prepare_tasks(cfg.tasks, work_dir, cfg, data_meta)
    tasks: dict[str, dict] = {}
    for shots in sorted(cfg.shots):
        names = [t for t in cfg.tasks if shots == 0 or prepared.output_types[t] != "loglikelihood_rolling"]
        if not names:
            continue
        if progress:
            print(f"[eval] {shots}-shot: {', '.join(names)}", file=sys.stderr, flush=True)
        res = simple_evaluate(
            model=lm, tasks=names, num_fewshot=shots, task_manager=prepared.task_manager, limit=cfg.limit,
            bootstrap_iters=cfg.bootstrap_iters, log_samples=cfg.log_samples, random_seed=cfg.seed,
            numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed, fewshot_random_seed=cfg.seed,
            verbosity=None,
        )
        for task in names:
            entry = tasks.setdefault(task, {
                "column": M.column(task), "reported": M.reported(task),
                "version": res.get("versions", {}).get(task), "output_type": prepared.output_types[task],
                "source": "local" if task in prepared.local else "lm-eval", "shots": {},
            })
            entry["shots"][str(shots)] = _task_entry(task, shots, res)
            if prepared.output_types[task] == "multiple_choice" and res.get("samples") and res["samples"].get(task):
                entry["shots"][str(shots)]["chance"] = chance_level(res["samples"][task])
            if samples_dir is not None and res.get("samples") and task in res["samples"]:
                path = _write_samples(samples_dir, task, shots, res["samples"][task])
                entry["shots"][str(shots)]["samples_file"] = str(path.name)
    return {"lm_eval_version": lm_eval.__version__, "tasks": tasks}


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


def evaluate_run(run_dir: str | Path, cfg: EvalConfig, *, mlflow: bool = True, progress: bool = True,
                 config_file: str | None = None) -> dict:
    """Evaluate one run folder; write ``eval.json`` (atomically) and log to MLflow (the store of
    ``config_file``'s settings, see tracking.stage_uri). Returns the results."""

    run_dir = Path(run_dir)
    run = load_run(run_dir, cfg.device)
    lm = StateLoopEvalLM(model=run.model, tokenizer=run.tokenizer, eos_id=run.eos_id, batch_size=cfg.batch_size,
                         max_length=cfg.max_length or trained_length(run.config), device=str(next(run.model.parameters()).device),
                         precision=cfg.precision, name=run.run_id)
    started = datetime.datetime.now(datetime.timezone.utc)
    results: dict = {
        "run_id": run.run_id, "model": run.config["model"]["name"], "run_dir": str(run_dir),
        "data_dir": str(run.data_dir), "code_version": code_version(), "started": started.isoformat(timespec="seconds"),
        "device": str(lm.device), "max_length": lm.max_length, "eval_config": to_dict(cfg),
        "metrics_note": {"accuracy": M.describe("accuracy"), "perplexity": M.describe("perplexity")},
    }
    if progress:
        print(f"[eval] {run.run_id}: {results['model']} on {lm.device}, window {lm.max_length}", file=sys.stderr, flush=True)
    sums = {} if state_diagnostics.supports(lm.model) else None
    results["heldout"] = heldout_perplexity(lm, run.data_dir, cfg, progress, diagnostics=sums)
    if sums is not None:  # the state's diagnostics on the held-out windows (evaluate/diagnostics.py)
        results["state"] = state_diagnostics.summarise(sums)
    if progress:
        print(f"[eval] held-out perplexity {results['heldout']['ppl']:.3f} over {results['heldout']['tokens']} tokens",
              file=sys.stderr, flush=True)
    samples_dir = run_dir / SAMPLES_DIR if cfg.log_samples else None
    if cfg.tasks:

        results.update(run_tasks(lm, cfg, run_dir / WORK_DIR, samples_dir, progress, read_meta(run.data_dir)))
    else:
        import lm_eval

        results.update({"lm_eval_version": lm_eval.__version__, "tasks": {}})
    results["seconds"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 2)
    results["summary"] = summary(results)
    if mlflow:
        results["mlflow_run_id"] = log_to_mlflow(run_dir, run.run_id, results, run.config, config_file)
    atomic_write_json(run_dir / RESULTS_FILE, results)
    return results


# ----------------------------------------------------------------------------------------------
# MLflow


def log_to_mlflow(run_dir: Path, run_id: str, results: dict, config: dict | None = None, config_file=None) -> str:
    """Log the summary metrics (as ``eval/<name>``), the eval settings (as ``eval.<key>`` params;
    a re-evaluation with other settings keeps them as ``changed_on_reeval.eval.<key>`` tags) and
    eval.json (as an artifact) into the run's MLflow run (tracking.log_stage)."""

    tags = {"eval.lm_eval_version": results.get("lm_eval_version", ""), "eval.code_version": results.get("code_version", "")}
    curves = state_diagnostics.curves(results["state"]) if results.get("state") else None  # eval/state/<quantity> at step i
    return log_stage(run_dir, run_id, config, config_file, "eval", "eval", results["summary"], curves=curves,
                     params=flatten(results.get("eval_config") or {}, "eval."), tags=tags,
                     artifact=(results, "eval/eval.json"))
