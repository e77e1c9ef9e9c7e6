"""``stateloop eval`` at test-time depths: ``--set eval.K=K'`` and ``--depths``.

The held-out perplexity at K' is recomputed by hand from a model built fresh at K' with the run's
weights (not through at_depth), on the same windows; the trained depth's entry of a sweep equals
eval.json's number; a depth without a meaning for the model is one line, before any file is
written; the sweep's curve reaches MLflow with K' as the step.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from stateloop.cli import main
from stateloop.data.shards import ShardSet
from stateloop.models.registry import build_model
from support.models import tiny_config


def eval_cli(run_dir, *args):
    return main(["eval", str(run_dir), "--no-progress", "--tasks", *args])


def heldout_by_hand(model, data_dir, windows: int, L: int) -> float:
    shards = ShardSet(data_dir, "val")
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(windows):
            w = torch.from_numpy(shards.window(i * L, L + 1)).long()[None]
            logits = model(w[:, :-1]).logits
            nll += F.cross_entropy(logits[0], w[0, 1:], reduction="sum").item()
            n += L
    return math.exp(nll / n)


def test_eval_at_another_depth_matches_a_fresh_model_at_that_depth(make_run, data_dir):
    run_dir, model = make_run("stateloop", K=3)
    assert eval_cli(run_dir, "--no-mlflow", "--set", "eval.K=5", "eval.heldout_windows=6") == 0
    assert not (run_dir / "eval.json").exists()  # eval.json stays the trained depth's
    res = json.loads((run_dir / "eval_K5.json").read_text())
    assert res["K"] == 5 and res["trained_K"] == 3 and res["eval_config"]["K"] == 5
    fresh = build_model(tiny_config("stateloop", K=5, vocab_size=model.cfg.vocab_size, max_seq_len=64)).eval()
    fresh.load_state_dict(model.state_dict())
    L = res["heldout"]["seq_len"]
    assert res["heldout"]["ppl"] == pytest.approx(heldout_by_hand(fresh, data_dir, 6, L), rel=1e-6)
    # ... and differs from the trained depth's (the depth was applied)
    assert res["heldout"]["ppl"] != pytest.approx(heldout_by_hand(model, data_dir, 6, L), rel=1e-6)


def test_depth_sweep_holds_the_trained_depths_number_and_logs_a_curve(make_run, mlflow_dir):
    from mlflow.tracking import MlflowClient

    run_dir, _ = make_run("vanilla_looped", K=2)
    assert eval_cli(run_dir, "--set", "eval.heldout_windows=4") == 0
    trained = json.loads((run_dir / "eval.json").read_text())
    assert eval_cli(run_dir, "--depths", "4", "1", "2", "--set", "eval.heldout_windows=4") == 0
    sweep = json.loads((run_dir / "eval_depth.json").read_text())
    assert sweep["trained_K"] == 2 and [p["K"] for p in sweep["depths"]] == [1, 2, 4]
    by_K = {p["K"]: p["heldout"]["ppl"] for p in sweep["depths"]}
    assert by_K[2] == trained["heldout"]["ppl"]  # the same windows, the same model: the same number
    assert len(set(by_K.values())) == 3
    history = MlflowClient().get_metric_history(sweep["mlflow_run_id"], "eval_depth/heldout_ppl")
    assert sorted((m.step, m.value) for m in history) == sorted(by_K.items())
    assert sweep["mlflow_run_id"] == trained["mlflow_run_id"]  # one MLflow run per trained run


@pytest.mark.parametrize("name, args, message", [
    ("mesh", ["--depths", "2", "9"], "eval.K: mesh has no meaning at K=9: its routers are per step"),
    ("hyperloop", ["--set", "eval.K=7"], "eval.K: hyperloop has no meaning at K=7"),
    ("stateloop", ["--set", "eval.K=0"], "eval.K: must be positive or null, got 0"),
    ("stateloop", ["--depths", "0"], "eval.K: the loop depth must be a positive integer, got 0"),
    ("stateloop", ["--depths", "2", "4", "--set", "eval.K=4"], "--depths: evaluates the depths it names; drop eval.K"),
])
def test_a_depth_without_a_meaning_is_one_line_before_any_work(make_run, capsys, name, args, message):
    run_dir, _ = make_run(name, K=3)
    before = sorted(p.name for p in run_dir.iterdir())
    assert eval_cli(run_dir, "--no-mlflow", *args) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in run_dir.iterdir()) == before


@pytest.mark.slow
def test_a_sweep_with_tasks_keeps_each_depths_files_apart_from_eval_json(make_run):
    """test_time_tasks: the sweep runs the lm-eval tasks at every depth, and its samples and
    lm-eval files go to folders of their own: eval.json's (eval_samples/, lm_eval/) stay as the
    trained depth's evaluation wrote them."""
    run_dir, _ = make_run("stateloop", K=2)
    small = ["--shots", "0", "--limit", "3", "--set", "eval.heldout_windows=2", "eval.bootstrap_iters=0",
             "eval.synthetic_examples=5", "eval.fewshot_pool=5"]
    assert main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks", "synth_mc", *small]) == 0
    before = {p.relative_to(run_dir): p.read_bytes() for d in ("eval_samples", "lm_eval") for p in (run_dir / d).rglob("*")
              if p.is_file()}
    assert before
    assert main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks", "synth_mc", "--depths", "1", "2", *small]) == 0
    after = {p.relative_to(run_dir): p.read_bytes() for d in ("eval_samples", "lm_eval") for p in (run_dir / d).rglob("*")
             if p.is_file()}
    assert after == before
    sweep = json.loads((run_dir / "eval_depth.json").read_text())
    trained = json.loads((run_dir / "eval.json").read_text())
    accs = {p["K"]: p["tasks"]["synth_mc"]["shots"]["0"]["metrics"]["acc"] for p in sweep["depths"]}
    assert accs[2] == trained["tasks"]["synth_mc"]["shots"]["0"]["metrics"]["acc"]  # the trained depth's number
    for K in (1, 2):
        assert (run_dir / f"eval_depth_K{K}_samples").is_dir() and (run_dir / f"lm_eval_depth_K{K}").is_dir()
