"""A received run folder is data, never code: whatever its saved config says, evaluating
it runs no code the folder brings and reads or writes no file it names outside itself. The
settings that name code or files (``eval.task_dir``, ``eval.task_data``, the MLflow store) come
from the command line (``--config``, ``--set``) or the local defaults only.

Every field of the resolved config a run folder saves, and what a hostile value of it meets:

- ``eval.task_dir`` / ``eval.task_data`` / ``train.mlflow_tracking_uri``: ignored (tested below);
- ``run.config``: the pipeline config it names gives value settings only (tested below);
- ``run.id``: must be a run id (tested below: it goes into an MLflow search);
- ``data.dir``: the run's data, read as data (meta.json, tokenizer.json, token arrays); a shard
  name that leaves the folder is refused (tested below);
- ``run.{scale, model, K, d_s, seed, experiments}``, ``model.*``, the other ``train.*`` and
  ``eval.*`` keys: plain values, typed and range-checked by ``from_dict`` (``model.name`` is
  looked up in the registry: tested below).

The hostile targets sit in an ``outside`` folder that an audit hook watches: no file there may be
opened or listed, and the marker that the hostile task's Python module would write never appears."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from stateloop.cli import main
from stateloop.runs import read_weights, save_final
from support.evaluation import save_run

SMALL = {"tasks": ["synth_mc"], "shots": [0], "limit": 2, "synthetic_examples": 4, "fewshot_pool": 4, "heldout_windows": 2,
         "bootstrap_iters": 0}
WATCHED: list[Path] = []  # folders no file may be opened or listed in
TOUCHED: list[str] = []


def _audit(event, args):
    if event in ("open", "os.listdir", "os.scandir") and WATCHED and args and isinstance(args[0], (str, bytes, Path)):
        path = str(Path(args[0].decode() if isinstance(args[0], bytes) else args[0]).absolute())
        if any(path.startswith(str(w)) for w in WATCHED):
            TOUCHED.append(f"{event} {path}")


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while WATCHED is set


@pytest.fixture
def outside(tmp_path):
    """A folder of hostile targets: a task folder whose YAML names a Python hook that writes
    MARKER, a pipeline config pointing at it, task data. Watched while the test runs."""
    TOUCHED.clear()
    out = (tmp_path / "outside").resolve()
    tasks = out / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "evil.py").write_text(f"import pathlib\npathlib.Path({str(out / 'MARKER')!r}).touch()\n"
                                   "def docs(dataset):\n    return dataset\n")
    (out / "docs.jsonl").write_text(json.dumps({"q": "a", "choices": ["x", "y"], "label": 0}) + "\n")
    (tasks / "base.yml").write_text(yaml.safe_dump({
        "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(out / "docs.jsonl")}},
        "output_type": "multiple_choice", "test_split": "test", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "label", "metric_list": [{"metric": "acc"}]}) + "process_docs: !function evil.docs\n")
    # A local task's name: the hostile folder's synth_mc would win over workflow/tasks' own.
    (tasks / "synth_mc.yaml").write_text("task: synth_mc\ninclude: base.yml\n")  # lm-eval imports evil.py beside base.yml
    (out / "piqa").mkdir()
    (out / "piqa" / "valid.jsonl").write_text("{}\n")
    (out / "piqa" / "valid-labels.lst").write_text("0\n")
    (out / "pipeline.yaml").write_text(yaml.safe_dump({"scales": {"test": {
        "eval": {**SMALL, "task_dir": str(tasks), "task_data": {"piqa_local": str(out / "piqa")}},
        "train": {"mlflow_tracking_uri": f"sqlite:///{out / 'mlflow.db'}"}}}}))
    yield out
    WATCHED.clear()


def _tamper(run_dir: Path, section: str, values: dict) -> None:
    """Set keys of the config saved with the final weights (as a sender could)."""
    _, blob = read_weights(run_dir)
    blob["config"].setdefault(section, {}).update(values)
    save_final(run_dir, blob["model"], blob["config"])


def _hostile(out: Path) -> dict:
    """field -> (section, values of the saved config, one-line error or None when eval succeeds)."""
    return {
        "eval.task_dir": ("eval", {**SMALL, "task_dir": str(out / "tasks")}, None),
        "eval.task_data": ("eval", {"task_data": {"piqa_local": str(out / "piqa")}, "tasks": ["piqa_local"], "shots": [0]},
                           "eval.task_data.piqa_local: missing"),
        "train.mlflow_tracking_uri": ("train", {"mlflow_tracking_uri": f"sqlite:///{out / 'mlflow.db'}"}, None),
        "train.mlflow_experiment": ("train", {"mlflow_experiment": ".."}, None),  # its artifact folder: mlartifacts/..
        "run.id": ("run", {"id": "test/x/K1_ds0_seed1' OR attributes.run_name LIKE '%"},
                   "run.id: expected a run id {scale}/{model}/K{K}_ds{ds}_seed{seed}"),
        "model.name": ("model", {"name": "os.system"}, "model.name: unknown model 'os.system'"),
    }


@pytest.mark.parametrize("field", ["eval.task_dir", "eval.task_data", "train.mlflow_tracking_uri", "train.mlflow_experiment",
                                   "run.id", "model.name"])
@pytest.mark.slow
def test_a_hostile_saved_setting_runs_no_code_and_touches_nothing_outside(field, tmp_path, data_dir, outside, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)  # the local default store: tmp_path/results/mlflow.db
    run_dir = tmp_path / "received" / "run"
    save_run(run_dir, data_dir, "vanilla_looped")
    section, values, error = _hostile(outside)[field]
    _tamper(run_dir, section, values)
    WATCHED.append(outside)
    tasks = [] if section == "eval" else ["--tasks"]  # perplexity only: the saved eval section names no task
    rc = main(["eval", str(run_dir), "--no-progress", *tasks, "--set", "eval.heldout_windows=2", "eval.bootstrap_iters=0"])
    WATCHED.clear()
    err = capsys.readouterr().err.strip()
    if error is None:
        assert rc == 0, err
        assert (tmp_path / "results" / "mlflow.db").is_file()  # logged where this machine logs
        # eval.json's artifact lies under mlartifacts/<one folder>/, whatever the experiment is called
        assert {p.name for p in (tmp_path / "results").iterdir()} == {"mlflow.db", "mlflow.db.lock", "mlartifacts"}
        assert [p.relative_to(tmp_path / "results" / "mlartifacts").parts[2:] for p in
                (tmp_path / "results" / "mlartifacts").rglob("eval.json")] == [("artifacts", "eval", "eval.json")]
        if field == "eval.task_dir":  # the checkout's synth_mc ran
            assert json.loads((run_dir / "eval.json").read_text())["tasks"]["synth_mc"]["shots"]["0"]["n_samples"]["effective"] == 2
    else:
        assert rc == 2 and len(err.splitlines()) == 1 and error in err, err
    assert not (outside / "MARKER").exists() and not (outside / "mlflow.db").exists()
    assert TOUCHED == [], TOUCHED


def test_a_saved_eval_section_gives_the_run_config_its_values_never_its_folders(tmp_path, data_dir, outside):
    """The `eval` section an old run folder saved beside the others reads (RunConfig.read accepts it);
    its value settings reach the RunConfig's eval section, its task folder and task data do not."""
    from stateloop.resolve import resolve_eval
    from stateloop.runs import saved_config, saved_run_config

    run_dir = tmp_path / "received" / "run"
    save_run(run_dir, data_dir, "vanilla_looped")
    _tamper(run_dir, "eval", {**SMALL, "task_dir": str(outside / "tasks"), "task_data": {"piqa_local": str(outside / "piqa")}})
    assert saved_config(run_dir)["eval"]["task_dir"] == str(outside / "tasks")  # the folder does carry them
    rc = resolve_eval(run_dir)
    assert (rc.eval.tasks, rc.eval.limit, rc.eval.heldout_windows) == (["synth_mc"], 2, 2)
    assert (rc.eval.task_dir, rc.eval.task_data) == (None, {})
    assert rc.as_dict() == saved_run_config(run_dir).as_dict()
    mine = str(tmp_path / "mine")
    assert resolve_eval(run_dir, None, {"task_dir": mine}).eval.task_dir == mine  # --set is the user's choice


@pytest.mark.slow
def test_the_config_file_a_run_names_gives_values_only(tmp_path, data_dir, outside, monkeypatch, capsys):
    """run.config names a pipeline config (here a hostile one): its value settings apply (the
    evaluation asks for its task), its task folder, task data and MLflow store do not."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "received" / "run"
    save_run(run_dir, data_dir, "vanilla_looped")
    _tamper(run_dir, "run", {"config": str(outside / "pipeline.yaml")})
    from stateloop.resolve import resolve_eval

    cfg = resolve_eval(run_dir).eval
    assert (cfg.tasks, cfg.limit, cfg.task_dir, cfg.task_data) == (["synth_mc"], 2, None, {})
    rc = main(["eval", str(run_dir), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((run_dir / "eval.json").read_text())["eval_config"]["limit"] == 2  # its value settings ran
    assert not (outside / "MARKER").exists() and not (outside / "mlflow.db").exists()
    assert (tmp_path / "results" / "mlflow.db").is_file()
    # The same folder named on the command line is the user's choice: its task runs.
    rc = main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--set", f"eval.task_dir={outside / 'tasks'}"])
    assert rc == 0, capsys.readouterr().err
    assert (outside / "MARKER").exists()  # proves the hostile hook is real


def test_a_shard_name_that_leaves_the_data_folder_is_refused(tmp_path, data_dir, outside, capsys):
    """data.dir is read as data; meta.json's shard names must name files inside it."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    secret = outside / "secret.bin"
    secret.write_bytes(b"\0" * 2 * meta["splits"]["val"]["shards"][0]["tokens"])
    meta["splits"]["val"]["shards"][0]["file"] = str(Path("..") / "outside" / "secret.bin")
    (data / "meta.json").write_text(json.dumps(meta))
    run_dir = tmp_path / "received" / "run"
    save_run(run_dir, data, "vanilla_looped")
    WATCHED.append(outside)
    rc = main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks", "--set", "eval.heldout_windows=2"])
    WATCHED.clear()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{data / 'meta.json'}: shard file '../outside/secret.bin' is not a file name inside the data folder" in err, err
    assert TOUCHED == [], TOUCHED


# Every text-valued field of a resolved config with its eval section, and what reading it from a received
# folder can reach. A new field that holds text fails the test below until it is classified here.
TEXT_FIELDS = {
    "run.id": "checked: must be a run id (tested above)",
    "run.scale": "a key looked up in the local config's scales",
    "run.model": "a name in the run id",
    "run.config": "a pipeline config read for its value settings only (tested above)",
    "run.experiments": "names, recorded",
    "model.name": "looked up in the model registry (tested above)",
    "model.attn_impl": "one of auto, torch, kernel", "model.ssd_impl": "one of auto, torch, kernel",
    "model.read_init": "one of residual, input", "model.init_scheme": "one of depth_scaled, plain",
    "model.options": "a variant's options, checked by the registry",
    "train.accelerator": "one of a list", "train.strategy": "one of a list", "train.precision": "one of a list",
    "train.schedule": "one of a list", "train.activation_checkpointing": "one of a list",
    "train.fsdp_sharding": "one of a list", "train.val_split": "a key of meta.json's splits",
    "train.mlflow_experiment": "an experiment name; its artifact folder is one component (tested above)",
    "train.mlflow_tracking_uri": "never read from a run folder (tested above)",
    "train.mlflow_register_model": "a name template of plain {scale}/{model}/{K}/{d_s} fields, no lookups "
                                   "(tests/train/test_tracking_train.py); used only when training finishes",
    "data.dir": "the run's data, read as data; shard names stay inside it (tested above)",
    "eval.tasks": "names resolved in workflow/tasks/ or lm-eval's own index",
    "eval.precision": "one of a list", "eval.device": "a device name, checked",
    "eval.task_dir": "never read from a run folder (tested above)",
    "eval.task_data": "never read from a run folder (tested above)",
    "eval.heldout_split": "a key of meta.json's splits",
}


def test_every_text_field_of_a_saved_config_is_classified():
    from dataclasses import fields

    from stateloop.config.evaluate import EvalConfig
    from stateloop.config.model import ModelConfig
    from stateloop.config.train import TrainConfig
    from stateloop.resolve import resolve_run

    root = Path(__file__).resolve().parents[2]
    config = resolve_run(root / "configs" / "tiny.yaml", "tiny/stateloop/K3_ds64_seed1234", data_dir="data/tiny").as_dict()
    text = {f"{section}.{key}" for section, values in config.items() for key, value in values.items()
            if isinstance(value, (str, list)) and any(isinstance(v, str) for v in ([value] if isinstance(value, str) else value))}
    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("eval", EvalConfig)):
        text |= {f"{section}.{f.name}" for f in fields(cls) if any(t in str(f.type) for t in ("str", "dict"))}
    assert text - set(TEXT_FIELDS) == set(), "classify these fields in TEXT_FIELDS"
