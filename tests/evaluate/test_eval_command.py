"""``stateloop eval``: held-out perplexity, local tasks over shared data, results JSON, MLflow,
config resolution and one-line errors for bad run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from stateloop.cli import main
from support.evaluation import save_run


def eval_cli(run_dir, *args):
    return main(["eval", str(run_dir), "--no-progress", *args])


@pytest.mark.slow
def test_lambada_piqa_wikitext_from_shared_data(make_run, shared_data, tmp_path):
    """The local YAMLs over ../shared/data: LAMBADA gives token perplexity and accuracy, PIQA
    accuracy, WikiText-2 word perplexity; eval.json names versions and sample counts."""
    for folder in ("lambada-openai", "piqa", "wikitext-2"):
        if not (shared_data / folder).is_dir():
            pytest.skip(f"{shared_data / folder} not found")
    L = 160  # PIQA's longer solutions need more than 64 of this small tokenizer's tokens
    run_dir, model = make_run("stateloop", max_seq_len=L)
    rc = eval_cli(run_dir, "--no-mlflow", "--tasks", "lambada_openai_local", "piqa_local", "wikitext_local", "--shots", "0", "--limit", "6",
                  "--set", f"eval.task_data={{lambada_openai_local: {shared_data / 'lambada-openai'}, "
                  f"piqa_local: {shared_data / 'piqa'}, wikitext_local: {shared_data / 'wikitext-2'}}}",
                  "eval.heldout_windows=20", "eval.bootstrap_iters=0")
    assert rc == 0
    res = json.loads((run_dir / "eval.json").read_text())
    assert res["model"] == "stateloop" and res["lm_eval_version"]
    lam = res["tasks"]["lambada_openai_local"]
    assert lam["column"] == "lambada_openai" and lam["reported"] == {"accuracy": "acc", "perplexity": "perplexity"}
    assert lam["version"] == 1.0 and lam["shots"]["0"]["n_samples"] == {"original": 5153, "effective": 6}
    m = lam["shots"]["0"]["metrics"]
    assert 0.0 <= m["acc"] <= 1.0 and m["perplexity"] > 1.0 and "sample_len" not in m
    assert lam["shots"]["0"]["table"] == {"accuracy": m["acc"], "perplexity": m["perplexity"]}
    # LAMBADA's perplexity is exp(-mean target log-likelihood): check it from the logged samples.
    samples = [json.loads(l) for l in (run_dir / "eval_samples" / "lambada_openai_local_0shot.jsonl").read_text().splitlines()]
    assert len(samples) == 6
    lls = [s["resps"][0][0][0] for s in samples]
    assert m["perplexity"] == pytest.approx(math.exp(-sum(lls) / len(lls)), rel=1e-6)
    assert samples[0]["arguments"][0][1] == " " + samples[0]["doc"]["text"].split(" ")[-1]  # lm-eval's target
    assert res["tasks"]["piqa_local"]["shots"]["0"]["n_samples"] == {"original": 1838, "effective": 6}
    wiki = res["tasks"]["wikitext_local"]
    assert wiki["output_type"] == "loglikelihood_rolling" and wiki["shots"]["0"]["metrics"]["word_perplexity"] > 1.0
    # Held-out perplexity on the run's own shards, recomputed by hand.
    held = res["heldout"]
    assert held["windows"] == 20 and held["tokens"] == 20 * L
    from stateloop.data.shards import ShardSet

    shards = ShardSet(res["data_dir"], "val")
    nll = 0.0
    with torch.no_grad():
        for i in range(20):
            w = torch.from_numpy(shards.window(i * L, L + 1))
            nll += F.cross_entropy(model(w[None, :-1]).logits[0].double(), w[1:], reduction="sum").item()
    assert held["ppl"] == pytest.approx(math.exp(nll / (20 * L)), rel=1e-5)


@pytest.mark.slow
def test_logs_into_the_runs_mlflow_run(make_run):
    """Into train.json's mlflow_run_id when training recorded one; else into a run named by the
    run id, the same one on every evaluation."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name("training") or client.get_experiment(client.create_experiment("training"))
    train_id = client.create_run(exp.experiment_id, run_name="test/vanilla_looped/K3_ds0_seed1234").info.run_id
    run_dir, _ = make_run()
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": train_id}))
    assert eval_cli(run_dir, "--tasks", "--set", "eval.heldout_windows=3") == 0  # perplexity only
    res = json.loads((run_dir / "eval.json").read_text())
    assert res["mlflow_run_id"] == train_id and res["tasks"] == {} and "state" not in res  # Vanilla: no state
    assert client.get_run(train_id).data.metrics["eval/heldout/ppl"] == pytest.approx(res["heldout"]["ppl"])
    # The held-out split it read is the run's "evaluation" dataset input (the runs table's Datasets column).
    from stateloop.data.shards import ShardSet

    inputs = {[t.value for t in d.tags if t.key == "mlflow.data.context"][0]: d.dataset
              for d in client.get_run(train_id).inputs.dataset_inputs}
    assert list(inputs) == ["evaluation"] and inputs["evaluation"].name == "test/val"
    assert inputs["evaluation"].digest == ShardSet(Path(res["data_dir"]), "val").fingerprint()

    other, _ = make_run("stateloop_gru")
    ids = []
    for windows in (2, 3):
        assert eval_cli(other, "--tasks", "--set", f"eval.heldout_windows={windows}") == 0
        ids.append(json.loads((other / "eval.json").read_text())["mlflow_run_id"])
    assert ids[0] == ids[1] != train_id
    found = client.get_run(ids[0])
    assert found.info.run_name == "test/stateloop_gru/K3_ds32_seed1234"
    assert found.data.metrics["eval/heldout/ppl"] == pytest.approx(json.loads((other / "eval.json").read_text())["heldout"]["ppl"])
    assert client.get_experiment(found.info.experiment_id).name == "stateloop"
    # The state's diagnostics on the held-out windows (the GRU's update has no write rate), a curve per quantity.
    state = json.loads((other / "eval.json").read_text())["state"]
    assert state["states"] == [1, 2, 3] and "write_rate_mean" not in state and len(state["read_ratio"]) == 3
    norms = client.get_metric_history(ids[0], "eval/state/state_norm")  # both evaluations logged the curve
    assert {m.step for m in norms} == {1, 2, 3} and len(norms) == 6
    for i, value in enumerate(state["state_norm"], start=1):
        assert any(m.step == i and m.value == pytest.approx(value) for m in norms)


def one_line_error(capsys, run_dir, path_part):
    rc = eval_cli(run_dir, "--no-mlflow", "--tasks")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert path_part in err, err
    return err


def test_bad_run_folders_fail_with_one_line_naming_the_file(tmp_path, data_dir, capsys):
    from stateloop.config import to_dict
    from support.models import tiny_config

    one_line_error(capsys, tmp_path / "nowhere", "nowhere")
    empty = tmp_path / "runs" / "empty"
    empty.mkdir(parents=True)
    assert "no final weights" in one_line_error(capsys, empty, str(empty / "model.safetensors"))
    # weights saved with a config that does not describe them
    wrong = to_dict(tiny_config("vanilla_looped", vocab_size=320, max_seq_len=64, d_model=48, n_heads=6))
    bad = tmp_path / "runs" / "mismatch"
    save_run(bad, data_dir, "vanilla_looped", config_model=wrong)
    assert "do not match" in one_line_error(capsys, bad, str(bad / "model.safetensors"))
    # a folder config.yaml that disagrees with the weights' config
    ok = tmp_path / "runs" / "ok"
    _, config = save_run(ok, data_dir, "vanilla_looped")
    import yaml

    (ok / "config.yaml").write_text(yaml.safe_dump({**config, "model": {**config["model"], "K": 5}}))
    assert "model.K" in one_line_error(capsys, ok, str(ok / "config.yaml"))
    # ... and the analyses and the latency benchmark, which load runs the same way, refuse it too
    for argv in (["analyze", "shapley", str(ok), "--no-mlflow"], ["bench", "decode", "--runs", str(ok), "--device", "cpu",
                                                                 "--out", str(tmp_path / "d.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "model.K" in err and str(ok / "config.yaml") in err, err
    # a data folder without its tokenizer
    nodata = tmp_path / "runs" / "nodata"
    save_run(nodata, tmp_path / "missing-data", "vanilla_looped")
    one_line_error(capsys, nodata, str(tmp_path / "missing-data" / "meta.json"))


def test_the_run_config_an_eval_resolves_carries_the_scales_eval_section_and_the_overrides(make_run, tmp_path, monkeypatch):
    """The request: one typed run config "(model, data, train, eval sections)" that every stage takes:
    `stateloop eval` hands the harness the run's saved RunConfig with ``eval`` resolved: the scale's
    section of --config, then --set and the flags; the saved sections as the folder has them."""
    from stateloop.config.evaluate import EvalConfig
    from stateloop.evaluate import harness
    from stateloop.runs import saved_run_config

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("scales:\n  test:\n    eval: {tasks: [synth_mc, synth_cloze], shots: [0], limit: 4, heldout_windows: 3}\n")
    run_dir, _ = make_run()
    given = []
    done = {"run_id": "r", "heldout": {"split": "val", "ppl": 2.0, "tokens": 8}, "tasks": {}, "K": 3, "trained_K": 3}
    monkeypatch.setattr(harness, "evaluate_run", lambda run_dir, rc, **k: given.append(rc) or done)
    assert main(["eval", str(run_dir), "--config", str(cfg_file), "--no-progress", "--no-mlflow", "--tasks", "synth_mc",
                 "--set", "eval.limit=2", "eval.precision=bf16-mixed"]) == 0
    (rc,) = given
    assert rc.eval == EvalConfig(tasks=["synth_mc"], shots=[0], limit=2, heldout_windows=3, precision="bf16-mixed")
    saved = saved_run_config(run_dir)
    assert (rc.run, rc.model, rc.train, rc.data, saved.eval) == (saved.run, saved.model, saved.train, saved.data, None)


def test_a_successful_eval_prints_one_line(make_run, capsys):
    """`stateloop eval` says what it measured and where it wrote it, in one line, also with --no-progress."""
    run_dir, _ = make_run()
    assert eval_cli(run_dir, "--no-mlflow", "--set", "eval.tasks=[]", "eval.heldout_windows=2") == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert "held-out val perplexity" in line and line.endswith(f"0 task(s); wrote {run_dir / 'eval.json'}"), line


def test_eval_config_is_strict_and_resolves_from_the_pipeline_config(make_run, tmp_path, capsys):
    from stateloop.config import ConfigError
    from stateloop.experiments import load_pipeline
    from stateloop.resolve import resolve_eval

    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("scales:\n  test:\n    eval: {tasks: [synth_mc], shots: [0], limit: 4}\n")
    assert load_pipeline(cfg_file).scales["test"].eval.tasks == ["synth_mc"]
    run_dir, _ = make_run()
    cfg = resolve_eval(run_dir, load_pipeline(cfg_file), {"limit": 2}).eval
    assert (cfg.tasks, cfg.shots, cfg.limit) == (["synth_mc"], [0], 2)
    assert resolve_eval(run_dir).eval.tasks[0] == "lambada_openai"  # the paper's by default
    cfg_file.write_text("scales:\n  test:\n    eval: {taks: [synth_mc]}\n")
    with pytest.raises(ConfigError, match=r"scales.test.eval.taks: unknown key"):
        load_pipeline(cfg_file)
    with pytest.raises(ConfigError, match=r"eval.shots"):
        resolve_eval(run_dir, None, {"shots": [-1]})
    assert main(["eval", str(run_dir), "--set", "eval.batch_sise=3"]) == 2
    assert "eval.batch_sise: unknown key" in capsys.readouterr().err


def test_paper_task_names_are_lm_evals_own(tmp_path):
    """Every paper task resolves in the installed lm-eval's index (no download), with the output
    type the tables assume; each has its reported metric."""
    from stateloop.config.evaluate import PAPER_TASKS, EvalConfig
    from stateloop.evaluate import metrics
    from stateloop.evaluate.tasks.prepare import prepare_tasks

    prepared = prepare_tasks(PAPER_TASKS, tmp_path / "work", EvalConfig())
    assert prepared.builtin == PAPER_TASKS
    assert prepared.output_types["wikitext"] == "loglikelihood_rolling"
    assert prepared.output_types["lambada_openai"] == "loglikelihood"
    assert all(prepared.output_types[t] == "multiple_choice" for t in PAPER_TASKS if t not in ("wikitext", "lambada_openai"))
    assert all(metrics.reported(t) for t in PAPER_TASKS)
    assert "acc_norm for arc_challenge, hellaswag" in metrics.describe("accuracy", PAPER_TASKS)


def test_lm_evals_tasks_found_by_scan_as_by_its_whole_index():
    """The scan of lm-eval's installed YAMLs places the paper's tasks (and two more) in the files
    lm-eval's whole index gives them; a task manager over only their folders gives each the same
    YAML and resolved config. (The one test that pays for the whole index.)"""
    from lm_eval.tasks import TaskManager

    from stateloop.config.evaluate import PAPER_TASKS
    from stateloop.evaluate.tasks.files import lm_eval_task_files
    from stateloop.evaluate.tasks.prepare import task_manager

    names = [*PAPER_TASKS, "lambada_standard", "arc_easy", "mmlu_anatomy"]
    files = lm_eval_task_files(names)
    fast = task_manager(names).task_index
    whole = TaskManager().task_index
    assert len(whole) > 10 * len(fast)  # not the whole index
    for name in dict.fromkeys(names):
        assert files[name].resolve() == Path(whole[name].yaml_path).resolve(), name
        assert Path(fast[name].yaml_path).resolve() == files[name].resolve(), name
        assert fast[name].kind == whole[name].kind and fast[name].cfg == whole[name].cfg, name
    for name in ("mmlu", "ai2_arc", "no_such_task_x"):  # a group, a tag, unknown: placed by the whole index only
        assert lm_eval_task_files(["arc_easy", name]) is None, name
        assert (name in whole) == (name != "no_such_task_x")


def test_task_manager_falls_back_to_lm_evals_whole_folder(monkeypatch, tmp_path):
    """A name the scan cannot place, or placed elsewhere than the index over its folder finds it,
    takes lm-eval's whole folder, listed before the local paths; without built-in tasks only the
    local paths are indexed."""
    import lm_eval.tasks

    from stateloop.evaluate.tasks import prepare

    calls = []

    class Index:  # records how the task manager is built; its index gives arc_easy another file
        def __init__(self, include_path=None, include_defaults=True):
            calls.append((include_path, include_defaults))
            self.task_index = {}

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", Index)
    local = [str(tmp_path)]
    prepare.task_manager(["no_such_task_x"], local)
    prepare.task_manager(["arc_easy"], local)
    prepare.task_manager([], local)
    folder = str(prepare.lm_eval_task_files(["arc_easy"])["arc_easy"].parent)
    assert calls == [(local, True), ([folder, *local], False), (local, True), (local, False)]


@pytest.mark.slow
def test_offline_synthetic_tasks_zero_and_five_shot(make_run):
    """The synthetic multiple-choice and cloze tasks run offline through lm-eval at 0 and 5 shots;
    the logged 5-shot prompts hold five answered examples from the few-shot pool, then the item."""
    run_dir, _ = make_run("stateloop", max_seq_len=256)
    assert eval_cli(run_dir, "--no-mlflow", "--tasks", "synth_mc", "synth_cloze", "--shots", "0", "5", "--limit", "5",
                    "--set", "eval.heldout_windows=4", "eval.bootstrap_iters=0", "eval.fewshot_pool=20") == 0
    res = json.loads((run_dir / "eval.json").read_text())
    work = run_dir / "eval_work"
    for task in ("synth_mc", "synth_cloze"):
        entry = res["tasks"][task]
        assert entry["source"] == "local" and entry["reported"]["accuracy"] == "acc"
        for shots in ("0", "5"):
            block = entry["shots"][shots]
            assert block["n_shot"] == int(shots) and block["n_samples"]["effective"] == 5
            assert 0.0 <= block["metrics"]["acc"] <= 1.0
        pool = [json.loads(l) for l in (work / task / "train.jsonl").read_text().splitlines()]
        if task == "synth_mc":
            answered = {f"{d['question']}\nAnswer: {d['choices'][d['label']]}" for d in pool}
        else:
            answered = {d["context"] + d["target"] for d in pool}
        for shots in (0, 5):
            samples = [json.loads(l) for l in (run_dir / "eval_samples" / f"{task}_{shots}shot.jsonl").read_text().splitlines()]
            assert len(samples) == 5
            for s in samples:
                prompt = s["arguments"][0][0]
                assert prompt.count("Answer:") == shots + 1
                blocks = prompt.split("\n\n")  # lm-eval's few-shot delimiter
                assert len(blocks) == shots + 1
                assert all(b in answered for b in blocks[:-1])
                assert len(set(blocks[:-1])) == shots
    # lm-eval's own files beside eval.json, as `lm_eval --output_path` writes them: one results file
    # per shot count (one lm-eval call each), the samples of every task, the same numbers.
    lm_dir = run_dir / "lm_eval"
    for shots in ("0", "5"):
        (name,) = {res["tasks"][task]["shots"][shots]["lm_eval_results"] for task in ("synth_mc", "synth_cloze")}
        theirs = json.loads((run_dir / name).read_text())
        stamp = Path(name).name.removeprefix("results_").removesuffix(".json")
        for task in ("synth_mc", "synth_cloze"):
            assert theirs["results"][task]["acc,none"] == res["tasks"][task]["shots"][shots]["metrics"]["acc"]
            assert theirs["n-shot"][task] == int(shots)
            logged = [json.loads(l) for l in (lm_dir / f"samples_{task}_{stamp}.jsonl").read_text().splitlines()]
            ours = [json.loads(l) for l in (run_dir / "eval_samples" / f"{task}_{shots}shot.jsonl").read_text().splitlines()]
            assert [s["doc_id"] for s in logged] == [s["doc_id"] for s in ours]
            assert [float(s["resps"][0][0][0]) for s in logged] == [s["resps"][0][0][0] for s in ours]
    assert len(list(lm_dir.glob("results_*.json"))) == 2 and len(list(lm_dir.glob("samples_*.jsonl"))) == 4
    # The held-out items differ from the few-shot pool (the generator's test vs train split).
    test_items = (work / "synth_mc" / "test.jsonl").read_text().splitlines()
    assert not set(test_items) & set((work / "synth_mc" / "train.jsonl").read_text().splitlines())


@pytest.mark.parametrize("case", ["eval-device-cuda", "lm-eval-max-length", "lm-eval-batch-size", "lm-eval-unknown-task",
                                  "lm-eval-num-fewshot"])
@pytest.mark.slow
def test_bad_eval_and_lm_eval_arguments_are_one_line(case, make_run, capsys):
    """The request: "Tracebacks to turn into one line: eval --device cuda without CUDA; stateloop
    lm-eval with max_length=-1, batch_size=0, or an unknown task"; "--num_fewshot -1" was accepted."""
    from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR

    if case == "eval-device-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run_dir, _ = make_run()
    lm_eval = ["lm-eval", "--model", "stateloop", "--include_path", str(DEFAULT_TASK_DIR), "--limit", "2"]
    argv, needle = {
        "eval-device-cuda": (["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks", "--device", "cuda"],
                             "device cuda: this machine has no CUDA device; use --device cpu or auto"),
        "lm-eval-max-length": ([*lm_eval, "--model_args", f"pretrained={run_dir},max_length=-1", "--tasks", "synth_mc"],
                               "max_length: the context window must hold at least 2 tokens, got -1"),
        "lm-eval-batch-size": ([*lm_eval, "--model_args", f"pretrained={run_dir}", "--batch_size", "0", "--tasks", "synth_mc"],
                               "batch_size: expected a positive integer, auto or auto:N; got '0'"),
        "lm-eval-unknown-task": ([*lm_eval, "--model_args", f"pretrained={run_dir}", "--tasks", "no_such_task"],
                                 "Tasks not found: no_such_task"),
        "lm-eval-num-fewshot": ([*lm_eval, "--model_args", f"pretrained={run_dir}", "--tasks", "synth_mc", "--num_fewshot", "-1"],
                                "--num_fewshot: expected a count >= 0, got '-1'"),
    }[case]
    capsys.readouterr()
    assert main(argv) == 2
    text = capsys.readouterr().err
    # lm-eval adds a log handler on the stderr of each call: in one pytest process the handler of an
    # earlier test's captured (closed) stderr reports "--- Logging error ---" with a traceback. No other.
    assert text.count("Traceback") == text.count("--- Logging error ---"), text[-3000:]
    err = [line for line in text.splitlines() if line.startswith("stateloop")]
    assert err == [f"stateloop {argv[0]}: error: {needle}"], err


@pytest.mark.parametrize("run_id, depths, scored", [
    ("tiny/stateloop/K4_ds64_seed1234", False, True),        # Table 1: its tasks feed Table 2
    ("tiny/state_only/K7_ds64_seed1235", False, False),      # Table 4 reads its held-out PPL only
    ("tiny/stateloop/K7_ds64_seed1234", True, False),        # test-time depths without test_time_tasks
    ("tiny/stateloop/K4_ds64_seed99", False, True),          # a run the config does not plan: its tasks
])
def test_the_eval_command_scores_tasks_where_the_config_needs_them(run_id, depths, scored, monkeypatch):
    """The eval rule names no tasks: the command reads from the config which of its runs need
    lm-eval's tasks (Tables 1-2) and which only held-out perplexity (pipeline.Run.scores_tasks)."""
    from stateloop import resolve
    from stateloop.config.model import ModelConfig
    from stateloop.config.run import DataSection, RunConfig, RunSection
    from stateloop.evaluate import harness

    seen = {}

    def fake_resolve(run_dir, config_file, overrides):
        seen.update(overrides)
        # no tasks in the result: offline (this module's autouse fixture) the command would first
        # check that the tasks' data is cached (tests/test_prefetch.py), and the paper's is not here
        return RunConfig(RunSection(), ModelConfig(), None, DataSection(), resolve.EvalConfig(tasks=[]))

    monkeypatch.setattr(resolve, "resolve_eval", fake_resolve)
    held = {"split": "val", "ppl": 2.0, "tokens": 8}
    monkeypatch.setattr(harness, "evaluate_run", lambda *a, **k: {"run_id": run_id, "heldout": held, "tasks": {}, "K": 4,
                                                                   "trained_K": 4})
    monkeypatch.setattr(harness, "evaluate_depths", lambda *a, **k: {"run_id": run_id, "depths": [{"K": 1, "heldout": held}]})
    root = Path(__file__).resolve().parents[2]
    args = ["eval", run_id, "--config", str(root / "configs/tiny.yaml"), "--no-progress", "--no-mlflow"]
    assert main(args + (["--depths", "1", "14"] if depths else [])) == 0
    assert ("tasks" not in seen) == scored, seen
    assert main(args + ["--tasks", "synth_mc"] + (["--depths", "1"] if depths else [])) == 0  # named: always scored
    assert seen["tasks"] == ["synth_mc"]
