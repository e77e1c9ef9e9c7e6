"""An experiment of its own in a file of its own: `base:` names the config it extends (relative to
the file), and every reader of a config file takes it whole: the commands' --config
(stateloop.config.read_config, through pipeline.load_checked), `stateloop rehearse`, and the
Snakefile (resolve_configfiles; its DAG: tests/workflow/test_dag.py)."""

from pathlib import Path

import pytest
import yaml

from stateloop.config import ConfigError, config_chain, read_config, resolve_configfiles
from stateloop.experiments import expand_runs, load_pipeline, load_run

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
IDEA = {"scale": "smoke", "models": ["vanilla_looped", "stateloop_gru"], "K": [2], "d_s": [32], "seeds": [1, 2, 3]}


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_base_is_merged_under_the_file_key_by_key_relative_to_the_file(tmp_path):
    (tmp_path / "configs").mkdir()
    base = write(tmp_path / "configs" / "scale.yaml", yaml.safe_load(SMOKE.read_text()))
    idea = write(tmp_path / "configs" / "experiments" / "idea.yaml", {
        "base": "../scale.yaml", "scales": {"smoke": {"train": {"lr": 0.01}}},
        "experiments": {"idea": IDEA, "table4": {"seeds": [7, 8]}}})
    data, files = config_chain(idea)
    assert files == [idea, idea.parent / "../scale.yaml"] and files[1].resolve() == base
    raw = yaml.safe_load(SMOKE.read_text())
    assert "base" not in data and data["scales"]["smoke"]["train"]["lr"] == 0.01
    # mappings merged key by key (the rest of the scale's train section is the base's), lists replaced
    assert {k: v for k, v in data["scales"]["smoke"]["train"].items() if k != "lr"} == \
        {k: v for k, v in raw["scales"]["smoke"]["train"].items() if k != "lr"}
    assert data["experiments"]["table4"] == {**raw["experiments"]["table4"], "seeds": [7, 8]}
    assert list(data["experiments"])[-1] == "idea" and set(raw["experiments"]) < set(data["experiments"])
    # read from elsewhere: the base is found beside the file, not in the working directory
    chained = write(tmp_path / "more" / "more.yaml", {"base": "../configs/experiments/idea.yaml",
                                                      "experiments": {"idea": {"seeds": [4]}}})
    assert read_config(chained)["experiments"]["idea"] == {**IDEA, "seeds": [4]}  # a base may have a base


@pytest.mark.parametrize("base,needle", [
    ("missing.yaml", r"idea\.yaml: base: missing\.yaml: no such config file \(read relative to the file's own folder"),
    ("idea.yaml", r"extends itself"),
    (3, r"base: expected the path of the config file it extends"),
])
def test_a_bad_base_is_one_line_naming_the_file(tmp_path, base, needle):
    idea = write(tmp_path / "idea.yaml", {"base": base, "experiments": {"idea": IDEA}})
    with pytest.raises(ConfigError, match=needle):
        load_pipeline(idea)


def test_train_eval_and_plan_read_the_experiment_file_whole(tmp_path, capsys):
    """`stateloop train --config F RUN` finds the experiment's runs (and only with it: smoke.yaml
    alone names the runs it lacks), the loaded config is read again when its base changes, and
    `stateloop plan --config F` plans the experiment beside the base's."""
    from stateloop.cli import main
    from stateloop.resolve import resolve_run

    idea = write(tmp_path / "idea.yaml", {"base": str(SMOKE), "experiments": {"idea": IDEA}})
    run_id = "smoke/stateloop_gru/K2_ds32_seed3"
    cfg, run = load_run(idea, run_id)
    assert run.experiments == ["idea"] and resolve_run(idea, run_id, data_dir=tmp_path).run.id == run_id
    with pytest.raises(ConfigError, match=f"{run_id} is not a run of"):
        load_run(SMOKE, run_id)
    assert len(expand_runs(cfg)) == len(expand_runs(load_pipeline(SMOKE))) + 6  # 2 models x 3 seeds smoke.yaml lacks

    local = write(tmp_path / "smoke.yaml", yaml.safe_load(SMOKE.read_text()))
    other = write(tmp_path / "other.yaml", {"base": "smoke.yaml", "experiments": {"idea": IDEA}})
    assert load_pipeline(other).scales["smoke"].train.lr == load_pipeline(SMOKE).scales["smoke"].train.lr
    raw = yaml.safe_load(local.read_text())
    raw["scales"]["smoke"]["train"]["lr"] = 0.0123
    write(local, raw)
    assert load_pipeline(other).scales["smoke"].train.lr == 0.0123  # the cache follows the base too

    assert main(["plan", "--config", str(idea)]) == 0
    out = capsys.readouterr().out
    assert "idea               6 runs" in out and "table4" in out


def test_snakemake_sees_the_files_resolved_in_order_with_its_overrides_last(tmp_path):
    idea = write(tmp_path / "idea.yaml", {"base": str(SMOKE), "experiments": {"idea": IDEA}})
    lr = write(tmp_path / "lr.yaml", {"scales": {"smoke": {"train": {"lr": 0.02}}}})
    assert resolve_configfiles([SMOKE, lr]) is None  # no base: Snakemake's own merge, untouched
    config = resolve_configfiles([idea, lr], {"bench": {"repeats": 9}})
    expected = read_config(SMOKE)
    expected["experiments"]["idea"] = IDEA
    expected["scales"]["smoke"]["train"]["lr"] = 0.02
    expected["bench"]["repeats"] = 9
    assert config == expected
    # the two-file form of an overlay and the overlay alone give the same config
    assert resolve_configfiles([SMOKE, idea]) == resolve_configfiles([idea])


def test_the_rehearsal_reads_the_experiment_file_whole(tmp_path, monkeypatch):
    """`stateloop rehearse F`: its config is F's, base included, shrunk (the prefetch against the
    stand-in hub is stubbed: tests/workflow/ rehearse whole DAGs)."""
    from stateloop.ops.rehearse import run as rehearsal

    monkeypatch.setattr(rehearsal, "prefetch", lambda out, repos: None)
    idea = write(tmp_path / "idea.yaml", {"base": str(SMOKE), "experiments": {"idea": IDEA}})
    written = load_pipeline(rehearsal.prepare(idea, tmp_path / "rehearsal"))
    assert "idea" in written.experiments and "table1" in written.experiments
    assert written.experiments["idea"].seeds == [1, 2]  # a rehearsal keeps two seeds
