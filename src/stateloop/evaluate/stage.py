"""``stateloop eval``'s stage: the eval settings of a command line (resolve.py, then
``--set eval.*`` and the dedicated flags; a run the pipeline config plans scores its tasks only
where the DAG needs them, pipeline.Run.scores_tasks), the evaluation (evaluate/harness.py) and
what it prints. What it is asked for is a :class:`Request` (evaluate/request.py), its command's flags."""

from __future__ import annotations

from stateloop import resolve
from stateloop.config import ConfigError, parse_dotlist
from stateloop.data.hub import require
from stateloop.evaluate import harness
from stateloop.evaluate.request import Request
from stateloop.evaluate.tasks.needs import task_needs
from stateloop.experiments import find_run, load_checked
from stateloop.runs import DEPTH_FILE, resolve_run_arg


def eval_stage(args: Request) -> int:
    """Evaluate the run ``args`` asks for, with the eval settings of ``args.config`` when given."""
    pipeline = load_checked(args.config, expand=False)[0] if args.config else None
    target = resolve_run_arg(args.run)
    run_dir = target.folder

    dotted = parse_dotlist(args.overrides)
    unknown = [k for k in dotted if k != "eval"]
    if unknown:
        raise ConfigError(f"--set {unknown[0]}...: only eval.* settings can be overridden here")
    overrides = dict(dotted.get("eval", {}))
    overrides.update({k: v for k in ("tasks", "shots", "limit", "batch_size", "device") if (v := getattr(args, k)) is not None})
    planned = find_run(pipeline, target.id) if pipeline and target.id else None
    if planned and "tasks" not in overrides and not planned.scores_tasks(depths=bool(args.depths)):
        overrides["tasks"] = []  # a run of the config that needs only its held-out perplexity
    rc = resolve.resolve_eval(run_dir, pipeline, overrides)
    require(task_needs(rc.eval.tasks, rc.eval), args.config)  # offline: the tasks' data is cached
    if args.depths:
        if rc.eval.K is not None:
            raise ConfigError("--depths: evaluates the depths it names; drop eval.K")
        results = harness.evaluate_depths(run_dir, rc, args.depths, mlflow=not args.no_mlflow,
                                          progress=not args.no_progress, pipeline=pipeline)
        ppl = ", ".join(f"K={p['K']} {p['heldout']['ppl']:.4f}" for p in results["depths"])
        print(f"{results['run_id']}: held-out perplexity {ppl}; wrote {run_dir / DEPTH_FILE}")  # one line, always
        return 0
    results = harness.evaluate_run(run_dir, rc, mlflow=not args.no_mlflow, progress=not args.no_progress, pipeline=pipeline)
    held = results["heldout"]
    if not args.no_progress:
        for task, entry in results["tasks"].items():
            for shots, block in entry["shots"].items():
                shown = ", ".join(f"{k} {v:.4f}" for k, v in block["metrics"].items() if not k.endswith("_stderr"))
                n = (block.get("n_samples") or {}).get("effective")
                print(f"{task} {shots}-shot (n={n}): {shown}")
    path = run_dir / (harness.depth_stem(results["K"], results["trained_K"]) + ".json")
    print(f"{results['run_id']}: held-out {held['split']} perplexity {held['ppl']:.4f} ({held['tokens']} tokens), "
          f"{len(results['tasks'])} task(s); wrote {path}")  # one line on success, with or without --no-progress
    return 0
