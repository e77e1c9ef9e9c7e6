"""The MLflow store (stateloop.tracking): artifacts beside a sqlite store and following it when it
moves, MLflow's own tags, the store of the stages after training (never one a received run folder
names), eval settings as params, parallel jobs on one sqlite file, and the report run of
`stateloop render`."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stateloop.config import ConfigError
from stateloop.config.run import RunConfig
from stateloop.experiments import load_pipeline
from stateloop.files import code_version
from stateloop.tracking.stages import run_of
from stateloop.tracking.store import client, experiment_id, tracking_uri

ROOT = Path(__file__).resolve().parents[1]
RID = "smoke/stateloop/K2_ds32_seed1234"


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> Path:
    """A migrated, empty sqlite store, copied by each test (creating the tables takes seconds)."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    client(f"sqlite:///{db}")
    return db


def _store(empty_db: Path, db: Path) -> str:
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(empty_db, db)
    return f"sqlite:///{db}"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """cwd = tmp_path, no MLFLOW_TRACKING_URI: the local default store is tmp_path/results/mlflow.db."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.slow
def test_artifacts_sit_beside_the_store_and_follow_it_when_it_moves(empty_db, here):
    uri = _store(empty_db, here / "a" / "results" / "mlflow.db")
    c = client(uri)
    run = c.create_run(experiment_id(c, "my exp")).info.run_id
    (here / "note.txt").write_text("hello")
    c.log_artifact(run, str(here / "note.txt"), "x")
    assert (here / "a/results/mlartifacts/my_exp" / run / "artifacts/x/note.txt").read_text() == "hello"
    assert not (here / "mlruns").exists()  # nothing in the current directory

    shutil.move(here / "a" / "results", here / "b")  # results/ moved (or copied) elsewhere, as a whole
    (here / "a").rmdir()
    from mlflow.tracking._tracking_service import utils

    utils._artifact_repos_cache.clear()  # MLflow's per-process cache of run -> artifact folder: a new process
    c = client(f"sqlite:///{here / 'b' / 'mlflow.db'}")
    moved = (here / "b" / "mlartifacts" / "my_exp").as_uri()
    assert c.get_experiment_by_name("my exp").artifact_location == moved
    assert c.get_run(run).info.artifact_uri == f"{moved}/{run}/artifacts"
    assert Path(c.download_artifacts(run, "x/note.txt", str(here))).read_text() == "hello"
    c.log_artifact(run, str(here / "note.txt"), "y")  # new artifacts land beside the moved store
    assert (here / "b/mlartifacts/my_exp" / run / "artifacts/y/note.txt").is_file()
    assert {a.path for a in c.list_artifacts(run)} == {"x", "y"}


def _smoke_config(path: Path, uri: str | None = None) -> Path:
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    if uri:
        raw["scales"]["smoke"]["train"]["mlflow_tracking_uri"] = uri
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_a_received_run_folder_never_chooses_the_store(empty_db, here, monkeypatch):
    """train.json and the saved config of a run folder trained elsewhere name the trainer's store:
    the stages after training use $MLFLOW_TRACKING_URI, else the local config's setting, else the
    local default; train.json's run id only where this store holds it."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    local = _store(empty_db, here / "results" / "mlflow.db")
    assert tracking_uri() == f"sqlite:///{here.resolve() / 'results' / 'mlflow.db'}"
    foreign = here / "colleague"
    run_dir = here / "run"
    run_dir.mkdir()
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": "f" * 32,
                                                    "mlflow_tracking_uri": f"sqlite:///{foreign / 'mlflow.db'}"}))
    config = RunConfig.read({"run": {"id": RID, "scale": "smoke", "config": str(foreign / "paper.yaml")},
                             "train": {"mlflow_tracking_uri": f"sqlite:///{foreign / 'other.db'}"}}, saved=True)
    c, found = run_of(run_dir, RID, config)
    assert c.tracking_uri == local and not foreign.exists()
    run = c.get_run(found)
    assert run.info.run_name == RID and run.data.tags["mlflow.source.name"] == "stateloop eval"
    assert run.data.tags["mlflow.user"] == getpass.getuser() == run.info.user_id
    assert run.data.tags["mlflow.source.git.commit"] == code_version().removesuffix("+dirty")
    assert run_of(run_dir, RID, config, command="analyze")[1] == found  # found again, not made twice

    # The local pipeline config's setting; $MLFLOW_TRACKING_URI before it.
    configured = _store(empty_db, here / "configured" / "mlflow.db")
    cfg_file = _smoke_config(here / "local.yaml", configured)
    assert run_of(run_dir, RID, config, load_pipeline(cfg_file))[0].tracking_uri == configured
    monkeypatch.setenv("MLFLOW_TRACKING_URI", local)
    assert run_of(run_dir, RID, config, load_pipeline(cfg_file))[0].tracking_uri == local
    assert not foreign.exists()

    # train.json's run id is used where this store holds it (a moved results/: the path differs) ...
    c = client(local)
    other = c.create_run(experiment_id(c, "stateloop")).info.run_id
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": other, "mlflow_tracking_uri": "sqlite:////old/mlflow.db"}))
    assert run_of(run_dir, RID, config)[1] == other
    # ... and must be there when train.json records this very store.
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": "0" * 32, "mlflow_tracking_uri": local}))
    with pytest.raises(ConfigError, match="mlflow_run_id 0{32} is not in the MLflow store"):
        run_of(run_dir, RID, config)


def test_eval_settings_are_params_of_the_run(empty_db, here):
    from stateloop.config import to_dict
    from stateloop.config.evaluate import EvalConfig
    from stateloop.evaluate.harness import log_to_mlflow

    uri = _store(empty_db, here / "results" / "mlflow.db")
    run_dir = here / "run"
    run_dir.mkdir()
    results = {"summary": {"heldout/ppl": 12.5}, "lm_eval_version": "0", "code_version": "c",
               "eval_config": to_dict(EvalConfig(tasks=["piqa_local"], shots=[0, 5], limit=6))}
    run = log_to_mlflow(run_dir, RID, results, {})
    c = client(uri)
    logged = c.get_run(run).data
    assert (logged.params["eval.tasks"], logged.params["eval.shots"], logged.params["eval.limit"]) == ("['piqa_local']", "[0, 5]", "6")
    assert logged.params["eval.heldout_split"] == "val" and logged.metrics["eval/heldout/ppl"] == 12.5
    # Re-evaluated without the limit: params cannot change; the new value is a tag, the metric the newest.
    results.update(summary={"heldout/ppl": 11.0}, eval_config={**results["eval_config"], "limit": None})
    assert log_to_mlflow(run_dir, RID, results, {}) == run
    logged = c.get_run(run).data
    assert logged.params["eval.limit"] == "6" and logged.tags["changed_on_reeval.eval.limit"] == "None"
    assert "changed_on_reeval.eval.tasks" not in logged.tags and logged.metrics["eval/heldout/ppl"] == 11.0
    assert [a.path for a in c.list_artifacts(run, "eval")] == ["eval/eval.json"]


WORKER = """
import sys, time
from pathlib import Path
from stateloop.tracking.store import client, named_run
from stateloop.tracking.tracker import Tracker

uri, worker, ready = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

def together(stage):  # a barrier: the four go on at once
    (ready / f"{stage}{worker}").touch()
    while len(list(ready.glob(f"{stage}*"))) < 4:
        time.sleep(0.002)

together("a")
c = client(uri)  # the first creates the store's tables, the others wait for it
together("b")
shared = named_run(c, "parallel", "attributes.run_name = 'shared'", "shared", {})  # as eval/analyze/render find or make a run
c.log_metric(shared, "seen", worker, step=worker)
for r in range(3):  # as training logs: the background logger, a batch per step
    t = Tracker(uri, "parallel", f"w{worker}-r{r}")
    t.log_params({"worker": str(worker)})
    for step in range(1, 31):
        t.log_metrics({"train/loss": 1.0 / step, "train/worker": worker}, step)
    t.finish()
"""


@pytest.mark.slow
def test_parallel_jobs_on_one_sqlite_store_lose_nothing(tmp_path):
    """Four processes, as four parallel Snakemake jobs, on one new sqlite store: every run with
    every metric point, and one run where all four find-or-make the same name."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    (tmp_path / "ready").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, uri, str(w), str(tmp_path / "ready")], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("parallel").experiment_id], max_results=100)
    assert sorted(r.info.run_name for r in runs) == sorted([f"w{w}-r{r}" for w in range(4) for r in range(3)] + ["shared"])
    for run in runs:
        if run.info.run_name == "shared":
            assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "seen")) == [0, 1, 2, 3]
            continue
        assert run.info.status == "FINISHED" and run.data.params["worker"] == run.info.run_name[1]
        for key in ("train/loss", "train/worker"):
            assert sorted(m.step for m in c.get_metric_history(run.info.run_id, key)) == list(range(1, 31)), key
    assert not (tmp_path / "mlruns").exists()


def _fake_evals(cfg, results: Path) -> None:
    from stateloop.experiments import expand_runs

    for i, run in enumerate(expand_runs(cfg)):
        folder = results / "runs" / run.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": 10.0 + i}, "tasks": {}}))


@pytest.mark.slow
def test_render_logs_its_files_to_the_configs_report_run(empty_db, here):
    from mlflow.tracking import MlflowClient

    from stateloop.cli import main
    from stateloop.experiments import load_pipeline

    uri = _store(empty_db, here / "results" / "mlflow.db")
    cfg_file = _smoke_config(here / "results" / "configs" / "abc.yaml")
    _fake_evals(load_pipeline(cfg_file), here / "results")
    for target, out in (("table1", "results/table1.csv"), ("table4", "results/table4.csv"),
                        ("loop_depth", "figures/loop_depth.pdf"), ("table1", "results/table1.csv")):
        assert main(["render", target, "--config", str(cfg_file), "--out", out]) == 0
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("stateloop")
    name = "report/" + "+".join(load_pipeline(cfg_file).scales)  # report/smoke+decode: Table 3 times the decode scale
    (run,) = c.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.source.name"] == "stateloop render"
    assert {a.path for a in c.list_artifacts(run.info.run_id, "table1")} == {"table1/table1.csv", "table1/table1.md"}
    assert {a.path for a in c.list_artifacts(run.info.run_id, "table4")} == {"table4/table4.csv", "table4/table4.md"}
    assert {a.path for a in c.list_artifacts(run.info.run_id, "loop_depth")} == {"loop_depth/loop_depth.pdf", "loop_depth/loop_depth.png"}
    logged = Path(c.download_artifacts(run.info.run_id, "table1/table1.md", str(here)))
    assert logged.read_text() == (here / "results" / "table1.md").read_text()
    assert (here / "results" / "mlartifacts" / "stateloop" / run.info.run_id).is_dir()
    # Another config (content) gets its own report run; --no-mlflow logs nothing.
    other = _smoke_config(here / "results" / "configs" / "def.yaml", "")
    other.write_text(other.read_text() + "# changed\n")
    assert main(["render", "table1", "--config", str(other), "--out", "results/table1.csv"]) == 0
    assert main(["render", "table1", "--config", str(other), "--out", "results/table1.csv", "--no-mlflow"]) == 0
    runs = c.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")
    assert len(runs) == 2 and {r.data.tags["config_file"] for r in runs} == {str(cfg_file), str(other)}


def test_the_ui_opens_a_model_training_experiment_and_no_empty_default(empty_db, tmp_path):
    """MLflow 3's UI opens an experiment in the view of its ``mlflow.experimentKind`` tag; a new
    sqlite store makes an empty "Default" experiment, which the pipeline never logs to."""
    from mlflow.entities import ViewType

    uri = _store(empty_db, tmp_path / "results" / "mlflow.db")
    c = client(uri)
    listed = {e.name: e for e in c.search_experiments()}  # the UI's list: active experiments
    assert "Default" not in listed and c.get_experiment("0").lifecycle_stage == "deleted"
    exp = c.get_experiment(experiment_id(c, "stateloop"))
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    # an experiment made before the tag existed gets it when a stage next finds it
    old = c.create_experiment("older")
    assert "mlflow.experimentKind" not in c.get_experiment(old).tags
    assert c.get_experiment(experiment_id(c, "older")).tags["mlflow.experimentKind"] == "custom_model_development"

    # a Default that holds runs (someone's own) is left alone, here restored with one run in it
    c.restore_experiment("0")
    c.create_run("0")
    c = client(uri)
    assert c.get_experiment("0").lifecycle_stage == "active"
    assert len(c.search_runs(["0"], run_view_type=ViewType.ALL)) == 1
