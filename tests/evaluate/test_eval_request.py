"""``eval_stage`` called from Python with its typed request (evaluate/request.py: Request) scores
what the command line scores."""

import json

from stateloop.commands import run_command
from stateloop.evaluate.stage import Request, eval_stage


def test_the_stage_from_python_scores_what_the_command_scores(make_run, capsys):
    run_dir, _ = make_run()
    assert eval_stage(Request(run=str(run_dir), tasks=[], overrides=["eval.heldout_windows=3"], no_mlflow=True)) == 0
    by_request = json.loads((run_dir / "eval.json").read_text())["heldout"]
    assert run_command(["eval", str(run_dir), "--tasks", "--set", "eval.heldout_windows=3", "--no-mlflow"]) == 0
    by_command = json.loads((run_dir / "eval.json").read_text())["heldout"]
    assert by_request == by_command and by_request["windows"] == 3
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[1] and f": held-out {by_request['split']} perplexity " in out[0]
