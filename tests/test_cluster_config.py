"""The config's `slurm:` section, checked when the config is: the partitions' time limit, and the
training's warning before its limit and `train.dist_timeout_s` sized from one measured write speed
(issue 53: "Rank 0 writes and hashes a 17 GB checkpoint while the others wait at a barrier: with
dist_timeout_s 600 a file system slower than ~29 MB/s fails every 1.4B checkpoint"). The check is
operations code (ops/cluster.py: check_cluster), which the commands and the Snakefile call where they
load a config; pipeline.py's own check, which the research code calls, knows no cluster (issue 60)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from stateloop.commands import run_command
from stateloop.config import ConfigError, load_yaml
from stateloop.config.resources import SlurmConfig
from stateloop.experiments import pipeline_from_dict
from stateloop.ops.cluster import check_cluster, checkpoint_bytes, estimated_params, timeout_floor, warning_seconds

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paper() -> dict:
    """configs/paper.yaml as a mapping, without its memory gate (train.gpu_memory_gib: a plan of every
    run, issue 53 §4's business, not this check's)."""
    raw = load_yaml(ROOT / "configs/paper.yaml")
    for scale in raw["scales"].values():
        scale["train"].pop("gpu_memory_gib", None)
    return raw


def checked(raw: dict, where: str = "config"):
    """The pipeline config of ``raw`` as the commands and the Snakefile read it: checked, then
    against the cluster."""
    cfg = pipeline_from_dict(raw, where)
    check_cluster(cfg, where)
    return cfg


def _with(raw: dict, **slurm) -> dict:
    out = copy.deepcopy(raw)
    out.setdefault("slurm", {}).update(slurm)
    return out


def test_the_papers_trainings_fit_a_24_hour_limit_which_the_config_states(paper):
    cfg = checked(paper, "paper.yaml")
    assert cfg.slurm.max_runtime == 1440
    assert {s.resources.train.runtime for s in cfg.scales.values()} == {1440}


def test_a_runtime_above_the_partitions_limit_is_refused_in_one_line(paper):
    raw = copy.deepcopy(paper)
    raw["scales"]["1.4b"]["resources"]["train"]["runtime"] = 2880
    with pytest.raises(ConfigError) as err:
        checked(raw, "paper.yaml")
    line = str(err.value)
    assert line.startswith("paper.yaml: scales.1.4b.resources.train.runtime: 2880 min is above slurm.max_runtime = 1440")
    assert "PartitionTimeLimit" in line and "\n" not in line
    checked(_with(raw, max_runtime=0), "paper.yaml")  # 0: not checked
    checked(_with(raw, max_runtime=2880), "paper.yaml")


@pytest.mark.parametrize("speed,refused", [(100, False), (42, False), (41, True), (29, True)])
def test_dist_timeout_is_checked_against_the_measured_write_speed(paper, speed, refused):
    """The 1.4B runs (4 x 8 ranks) at dist_timeout_s 600: a checkpoint (the shape's estimate, 21 GB
    with its 25% margin) written and hashed at the stated speed, plus a minute, must fit: from 42 MB/s
    up. At 29 MB/s it does not: one line naming the key, the speed and the timeout to set."""
    raw = _with(paper, write_mb_per_s=speed)
    if not refused:
        checked(raw, "paper.yaml")
        return
    with pytest.raises(ConfigError) as err:
        checked(raw, "paper.yaml")
    line = str(err.value)
    params = estimated_params(checked(paper).scales["1.4b"].model)
    assert line.startswith("paper.yaml: scales.1.4b.train.dist_timeout_s: 600 s is shorter than rank 0's checkpoint write")
    assert f"slurm.write_mb_per_s = {speed}" in line and f"at least {timeout_floor(params, speed * 1e6)}" in line
    assert "\n" not in line
    raw["scales"]["1.4b"]["train"]["dist_timeout_s"] = timeout_floor(params, speed * 1e6)
    raw["scales"]["410m"]["train"]["dist_timeout_s"] = 900
    checked(raw, "paper.yaml")  # the timeout it names is enough


def test_the_warning_lead_and_the_timeout_come_from_the_same_write_speed(paper):
    """One measurement sizes both: a slower file system moves SIGUSR1 earlier and the timeout's floor
    up by the same write time (10-s rounding apart)."""
    params = estimated_params(checked(paper).scales["1.4b"].model)
    size = checkpoint_bytes(params)
    for speed in (100e6, 50e6, 20e6):
        lead, floor = warning_seconds(params, 1440, speed), timeout_floor(params, speed)
        assert lead >= 120 + size / speed and floor >= 60 + size / speed
        assert abs((lead - floor) - 60) <= 10
    assert warning_seconds(params, 1440, 20e6) - warning_seconds(params, 1440, 100e6) > 800


def test_a_time_limit_too_short_to_save_a_checkpoint_before_it_is_refused(paper):
    raw = copy.deepcopy(paper)
    raw["scales"]["1.4b"]["resources"]["train"]["runtime"] = 20  # SIGUSR1 at most 5 min before: too late at 100 MB/s
    with pytest.raises(ConfigError, match=r"^paper\.yaml: scales\.1\.4b\.resources\.train\.runtime: 20 min is too short "
                                          r"to save a checkpoint before the limit: .* GB at slurm\.write_mb_per_s = 100"):
        checked(raw, "paper.yaml")


@pytest.mark.parametrize("key,value,msg", [
    ("gpu_partition", "gpu a", "slurm.gpu_partition: 'gpu a' is not one word"),
    ("gpu_type", "h100:8", "slurm.gpu_type: 'h100:8' is not one word"),
    ("gpu_constraint", "'h100'", "slurm.gpu_constraint: \"'h100'\": give it without quotes"),
    ("max_runtime", -1, "slurm.max_runtime: must be >= 0, got -1"),
    ("write_mb_per_s", 0, "slurm.write_mb_per_s: must be a measured speed above 0"),
])
def test_bad_slurm_keys_are_one_line_naming_the_key(key, value, msg):
    with pytest.raises(ConfigError) as err:
        SlurmConfig(**{key: value})
    assert str(err.value).startswith(msg), str(err.value)


# Every command that reads a pipeline config refuses one that does not fit the cluster (its check in
# commands/, as the memory gate's), in one line, exit 2, before it starts anything.
REFUSING = {
    "train": ["train", "--config", "{cfg}", "1.4b/stateloop/K4_ds2048_seed1234"],
    "eval": ["eval", "results/runs/1.4b/stateloop/K4_ds2048_seed1234", "--config", "{cfg}", "--no-mlflow"],
    "analyze": ["analyze", "shapley", "results/runs/1.4b/stateloop/K4_ds2048_seed1234", "--config", "{cfg}", "--no-mlflow"],
    "bench": ["bench", "decode", "--config", "{cfg}"],
    "tokenize": ["tokenize", "--config", "{cfg}", "--scale", "1.4b", "--out", "tokens"],
    "render": ["render", "table1", "--config", "{cfg}", "--out", "t.csv", "--no-mlflow"],
    "plan": ["plan", "--config", "{cfg}"],
    "params": ["params", "--config", "{cfg}"],
    "prefetch": ["prefetch", "--config", "{cfg}"],  # not --check: it switches the Hub off for the whole process
}


@pytest.mark.parametrize("command", REFUSING)
def test_every_command_refuses_a_config_beyond_the_cluster_in_one_line(paper, tmp_path, monkeypatch, capsys, command):
    import yaml

    raw = copy.deepcopy(paper)
    raw["scales"]["1.4b"]["resources"]["train"]["runtime"] = 2880
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(raw))
    pipeline_from_dict(copy.deepcopy(raw), "paper.yaml")  # the research side's check: no cluster in it
    monkeypatch.chdir(tmp_path)
    assert run_command([a.replace("{cfg}", "paper.yaml") for a in REFUSING[command]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stateloop {command}: error: paper.yaml: scales.1.4b.resources.train.runtime: 2880 min is "
                          f"above slurm.max_runtime = 1440") and err.count("\n") == 1, err
    assert not (tmp_path / "results").exists() and not (tmp_path / "tokens").exists()
