"""Strict configs: unknown keys and wrong types fail with one line naming the key."""

import json
import re

import pytest

from stateloop.config import ConfigError, from_dict, parse_dotlist
from stateloop.config.model import ModelConfig
from stateloop.experiments import cells, expand_runs, load_pipeline


def test_unknown_key_names_the_path():
    with pytest.raises(ConfigError, match=r"^model\.d_modle: unknown key"):
        from_dict(ModelConfig, {"d_modle": 3}, "model")


@pytest.mark.parametrize("key,value,msg", [
    ("d_model", "wide", "expected an integer"),
    ("d_model", 2.5, "expected an integer"),
    ("mamba_prenorm", "yes", "expected true/false"),
    ("options", [1], "expected a mapping"),
    ("attn_impl", "cuda", "must be one of auto, torch, kernel"),
    ("d_model", 0, "must be positive"),
])
def test_wrong_types_and_values(key, value, msg):
    with pytest.raises(ConfigError, match=msg) as err:
        from_dict(ModelConfig, {key: value}, "model")
    assert str(err.value).startswith(f"model.{key}") and "\n" not in str(err.value)


def test_dotlist_overrides_are_yaml_typed():
    assert parse_dotlist(["model.K=5", "train.lr=3e-4", "model.name=stateloop"]) == {
        "model": {"K": 5, "name": "stateloop"}, "train": {"lr": 3e-4}}
    with pytest.raises(ConfigError):
        parse_dotlist(["model.K"])


def _write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


BASE = """
scales:
  s: {model: {vocab_size: 97, n_layers: 2, d_model: 32, d_ff: 64, n_heads: 4, head_dim: 8}}
experiments:
"""


def test_runs_are_deduplicated_across_experiments(tmp_path):
    cfg = load_pipeline(_write(tmp_path, BASE + """
  a: {scale: s, models: [stateloop, vanilla_looped], K: [2, 3], d_s: [16]}
  b: {scale: s, models: [stateloop], K: [3], d_s: [8, 16]}
"""))
    runs = expand_runs(cfg)
    ids = [r.id for r in runs]
    assert len(ids) == len(set(ids)) == 5
    shared = next(r for r in runs if r.id == "s/stateloop/K3_ds16_seed1234")
    assert shared.experiments == ["a", "b"] and shared.folder == "results/runs/s/stateloop/K3_ds16_seed1234"
    assert "s/vanilla_looped/K2_ds0_seed1234" in ids


def test_seeds_make_one_run_each_with_the_seed_spelled_last(tmp_path):
    """An experiment's seeds: one run per seed, ids {scale}/{model}/K{K}_ds{ds}_seed{seed}; seeds
    shared between experiments share runs; without seeds the scale's train.seed is the one."""
    cfg = load_pipeline(_write(tmp_path, BASE + """
  a: {scale: s, models: [stateloop, vanilla_looped], K: [3], d_s: [16], seeds: [1, 2, 3]}
  b: {scale: s, models: [stateloop], K: [3], d_s: [16], seeds: [3, 4]}
  c: {scale: s, models: [vanilla_looped], K: [2]}
"""))
    runs = expand_runs(cfg)
    ids = [r.id for r in runs]
    assert len(ids) == len(set(ids)) == 3 + 3 + 1 + 1
    assert "s/stateloop/K3_ds16_seed4" in ids and "s/vanilla_looped/K2_ds0_seed1234" in ids
    shared = next(r for r in runs if r.id == "s/stateloop/K3_ds16_seed3")
    assert shared.experiments == ["a", "b"] and shared.cell == "s/stateloop/K3_ds16" and shared.seed == 3
    groups = cells(runs)
    assert [r.seed for r in groups["s/stateloop/K3_ds16"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("name", ["s$(touch X)", "a/b", "..", "two words"])
def test_scale_names_that_would_be_shell_or_path_syntax_are_refused(tmp_path, name):
    text = BASE.replace("  s: {", f"  {json.dumps(name)}: {{") + f"  e: {{scale: {json.dumps(name)}, models: [vanilla_looped]}}\n"
    with pytest.raises(ConfigError, match="a name may hold only letters, digits"):
        load_pipeline(_write(tmp_path, text))


def test_a_run_id_names_one_model(tmp_path):
    """Two experiments giving one (model, K, d_s, seed) different options would share a folder."""
    with pytest.raises(ConfigError, match=r"run s/pause_token/K2_ds0_seed1234 is also defined by experiments.a"):
        load_pipeline(_write(tmp_path, BASE + """
  a: {scale: s, models: [pause_token], K: [2], options: {pause_token: {pause_id: 5}}}
  b: {scale: s, models: [pause_token], K: [2], options: {pause_token: {pause_id: 6}}}
"""))


@pytest.mark.parametrize("exp,msg", [
    ("{scale: s, models: [stateloop], d_s: [16], seeds: [1, 1]}", "lists a seed twice"),
    ("{scale: s, models: [stateloop], d_s: [16], seeds: [-1]}", "-1 is not a non-negative integer"),
    ("{scale: s, models: [stateloop_xl]}", "unknown model 'stateloop_xl'"),
    ("{scale: big, models: [stateloop]}", "unknown scale 'big'"),
    ("{scale: s, models: [stateloop], d_s: [0]}", "needs a positive state width"),
    ("{scale: s, models: [stateloop], K: [two]}", "experiments.e.K[0]: expected an integer"),
    ("{scale: s, models: [state_only], d_s: [16]}", "state_only keeps the state at the model width"),
])
def test_pipeline_errors_name_the_problem(tmp_path, exp, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")) as err:
        load_pipeline(_write(tmp_path, BASE + f"  e: {exp}\n"))
    assert "\n" not in str(err.value)


def test_a_split_no_stage_makes_fails_at_load_naming_the_key():
    """paper.yaml without the Pile's validation split (no val_split, no hash hold-out) makes no
    'val': evaluation and the analyses would fail at their first job; the config is refused."""
    from pathlib import Path

    import pytest

    from stateloop.config import ConfigError, load_yaml
    from stateloop.experiments import pipeline_from_dict

    raw = load_yaml(Path(__file__).resolve().parents[1] / "configs" / "paper.yaml")
    raw["scales"]["410m"]["data"].pop("val_split")
    raw["scales"]["410m"]["data"]["data_files"].pop("validation")
    with pytest.raises(ConfigError, match=r"scales\.410m\.eval\.heldout_split: 'val' is not a split the data stage makes"):
        pipeline_from_dict(raw, "paper.yaml")


@pytest.mark.parametrize("text, msg", [
    ("scales:\n  s: {model: {K: 2}}\n  s: {model: {K: 3}}\n", "duplicate key 's' (first on line 2)"),
    ("scales:\n  s:\n    train:\n      lr: 1.0e-3\n      lr: 3.0e-3\n", "duplicate key 'lr' (first on line 4)"),
])
def test_a_key_given_twice_is_refused(tmp_path, text, msg):
    from stateloop.config import load_yaml

    with pytest.raises(ConfigError, match=re.escape(msg)):
        load_yaml(_write(tmp_path, text))


@pytest.mark.parametrize("key, value, msg", [
    ("train.lr", ".nan", "scales.s.train.lr: expected a finite number, got nan"),
    ("train.grad_clip", ".inf", "scales.s.train.grad_clip: expected a finite number, got inf"),
    ("model.norm_eps", "-.inf", "scales.s.model.norm_eps: expected a finite number"),
    ("model.K", "99999", "scales.s.model.K: 99999 is above the sane bound 64"),
    ("model.max_seq_len", "100000000", "scales.s.model.max_seq_len: 100000000 is above the sane bound"),
])
def test_nan_infinite_and_absurd_values_are_refused(tmp_path, key, value, msg):
    section, name = key.split(".")
    text = BASE.replace("  s: {model: {", f"  s: {{{section}: {{{name}: {value}}}, model: {{") if section != "model" else \
        BASE.replace("  s: {model: {", f"  s: {{model: {{{name}: {value}, ")
    with pytest.raises(ConfigError, match=re.escape(msg)):
        load_pipeline(_write(tmp_path, text + "  e: {scale: s, models: [vanilla_looped]}\n"))


def test_resolve_run_expands_only_its_runs_model_in_its_experiments(tmp_path, monkeypatch):
    """A job finds its one run from the run id: of the experiments of its scale that list its
    model, only that model is expanded, never the whole grid."""
    import dataclasses

    from stateloop import experiments, resolve

    path = _write(tmp_path, BASE.replace("model: {", "train: {max_steps: 2, global_batch: 8}, model: {")
                  + "  a: {scale: s, models: [stateloop, vanilla_looped], K: [2, 3], d_s: [16]}\n"
                  + "  b: {scale: s, models: [vanilla_looped], K: [5]}\n")
    calls = []
    real = experiments.expand_runs
    monkeypatch.setattr(experiments, "expand_runs", lambda c, names=None, only=None: calls.append((names, only)) or real(c, names, only))
    first = resolve.resolve_run(path, "s/stateloop/K3_ds16_seed1234", data_dir=tmp_path)
    again = resolve.resolve_run(path, "s/vanilla_looped/K2_ds0_seed1234", ["train.lr=1e-3"], data_dir=tmp_path)
    assert calls == [(["a"], "stateloop"), (["a", "b"], "vanilla_looped")]
    assert (first.model.K, first.model.d_s, again.train.lr, again.run.experiments) == (3, 16, 1e-3, ["a"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.train.lr = 1.0  # TrainConfig and ModelConfig are frozen: a changed copy is dataclasses.replace
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.model.K = 4


def test_a_finished_runs_saved_config_reads_back_typed():
    """A run folder's saved config reads back into RunConfig (the request: "A run folder's saved config
    reads back into the same type"): strictly, a bad key one line naming the file; the sections a
    folder lacks at their defaults, train as None (the trained context is then unknown)."""
    from stateloop.config.run import RunConfig
    from stateloop.runs import run_id_of, trained_length

    model = {"name": "vanilla_looped", "max_seq_len": 64}
    partial = RunConfig.read({"model": model}, "run/model.safetensors", saved=True)
    assert (partial.run.id, partial.data.dir, partial.train, trained_length(partial)) == ("", "", None, None)
    assert run_id_of("x/runs/s/vanilla_looped/K4_ds0_seed1", partial).endswith("s/vanilla_looped/K4_ds0_seed1")
    full = RunConfig.read({"model": model, "train": {"seq_len": 32, "micro_batch": 8, "global_batch": 8},
                           "run": {"id": "s/vanilla_looped/K4_ds0_seed1"}}, "run/model.safetensors", saved=True)
    assert (trained_length(full), run_id_of("anywhere", full)) == (32, "s/vanilla_looped/K4_ds0_seed1")
    with pytest.raises(ConfigError, match=r"^run/model.safetensors: train.lrr: unknown key"):
        RunConfig.read({"model": model, "train": {"lrr": 1.0}}, "run/model.safetensors", saved=True)
    with pytest.raises(ConfigError, match=r"^train: missing section in the resolved config"):
        RunConfig.read({"model": model, "run": {}, "data": {}})  # what training reads back must be whole


def test_the_eval_section_is_resolved_at_eval_and_never_saved(tmp_path):
    """The run config has an eval section, resolved only when a run is evaluated: what
    config.yaml and the weights save (as_dict) is the same with it or without, and reads back
    as without; an old folder's saved eval section is accepted beside the others."""
    import dataclasses

    from stateloop.config.evaluate import EvalConfig
    from stateloop.config.run import RunConfig
    from stateloop.resolve import resolve_run

    path = _write(tmp_path, BASE.replace("model: {", "train: {max_steps: 2, global_batch: 8}, model: {")
                  + "  a: {scale: s, models: [stateloop], K: [3], d_s: [16]}\n")
    rc = resolve_run(path, "s/stateloop/K3_ds16_seed1234", data_dir=tmp_path)
    assert rc.eval is None  # training's config has none
    evaluated = dataclasses.replace(rc, eval=EvalConfig(tasks=["synth_mc"], limit=3, task_dir=str(tmp_path)))
    assert evaluated.as_dict() == rc.as_dict() and list(rc.as_dict()) == ["run", "model", "train", "data"]
    assert RunConfig.read(evaluated.as_dict()) == rc
    old = RunConfig.read({**rc.as_dict(), "eval": {"task_dir": "/elsewhere", "limit": 3}}, "run/model.safetensors", saved=True)
    assert old == rc and old.eval is None  # read ignores it (resolve.py reads its value settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        evaluated.eval.limit = 4  # EvalConfig is frozen like the other sections
