"""The analysis jobs' estimates (ops/analysis_cost.py): the counted pieces combine as the analysis code
runs them, a tiny config's rows by hand, and the paper config's jobs against their 12-hour limit."""

import dataclasses

import pytest
import torch
import yaml

from stateloop.analysis import interventions, shapley
from stateloop.experiments import load_pipeline
from stateloop.models.flops import counter
from stateloop.models.registry import build_model
from stateloop.ops import analysis_cost as cost
from support.models import tiny_config

MFU, PEAK = 0.30, 989.0


@pytest.mark.parametrize("name,K", [("stateloop", 3), ("stateloop", 4), ("stateloop_attn", 3), ("stateloop_gru", 4)])
@pytest.mark.slow
def test_the_estimates_count_what_the_analysis_code_runs(name, K):
    """The FLOP counter over the Shapley tree, the interventions' tree and the forward pass
    themselves (on the meta device) gives each per-window estimate exactly."""
    cfg = dataclasses.replace(tiny_config(name, vocab_size=97, K=K), attn_impl="torch", ssd_impl="torch")
    T = 16
    model = build_model(cfg, device="meta", init=False)
    idx = torch.zeros(2, T, dtype=torch.long, device="meta")  # two windows: twice one window's count
    stats = interventions.StateStats(torch.zeros(K, cfg.d_s, dtype=torch.float64, device="meta"),
                                     torch.ones(K, cfg.d_s, dtype=torch.float64, device="meta"), 1)
    with torch.no_grad():
        with counter() as c:
            leaves = list(shapley.mask_tree(model, idx, idx))
        assert len(leaves) == 2**K and c.get_total_flops() == 2 * cost.shapley_flops(cfg, T)
        with counter() as c:
            names = [n for n, _ in interventions.intervention_tree(model, idx, idx, stats)]
        assert names == interventions.intervention_names(K) and c.get_total_flops() == 2 * cost.interventions_flops(cfg, T)
        with counter() as c:
            model(idx)
        assert c.get_total_flops() == 2 * cost.forward_flops(cfg, T) == 2 * cost.clean_flops(cfg, T)


def _tiny_pipeline(tmp_path, **analyze):
    shape = {"vocab_size": 97, "n_layers": 1, "d_model": 16, "d_ff": 32, "n_heads": 2, "head_dim": 8, "max_seq_len": 64,
             "attn_impl": "torch", "ssd_impl": "torch"}
    raw = {"scales": {"t": {"model": shape, "train": {"seq_len": 16},
                            "eval": {"heldout_windows": 10, "batch_size": 4, "tasks": []},
                            "resources": {"eval": {"runtime": 20, "gpus": 1},
                                          "analyze": {"runtime": 30, "gpus": 1, **analyze}}}},
           "experiments": {"state_analysis": {"scale": "t", "K": [3], "d_s": [8]}}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_pipeline(path)


def test_the_eval_job_counts_its_lm_eval_tasks_at_most_a_window_a_request(tmp_path):
    """A Table 1 run's eval job scores the scale's lm-eval tasks too: at most one window of T tokens
    per request, by hand: ARC-Easy 2,376 documents x 4 choices at 0 and 5 shots, wikitext's 62
    documents and ceil(300,000 / 16) whole windows once; a task of unknown size is named, not counted.
    The held-out PPL alone (the row's old figure) is less."""
    _tiny_pipeline(tmp_path)  # writes tiny.yaml
    path = tmp_path / "tiny.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["scales"]["t"]["eval"].update(tasks=["arc_easy", "wikitext", "my_local_task"], shots=[0, 5])
    raw["experiments"] = {"table1": {"scale": "t", "models": ["stateloop"], "K": [3], "d_s": [8]}}
    path.write_text(yaml.safe_dump(raw))
    row = next(r for r in cost.analysis_plan_rows(load_pipeline(path), MFU, PEAK, data_root=tmp_path / "data")
               if r["job"] == "eval")
    T, clean = 16, 23840  # a token's forward FLOPs of this model (test_a_tiny_configs_jobs_by_hand)
    windows = 2376 * 4 * 2 + 62 + -(-300_000 // T)
    assert row["flops"] == (10 + windows) * T * clean
    assert f"lm-eval tasks (at most {windows} windows)" in row["note"] and "not counted: my_local_task" in row["note"]


def test_a_tiny_configs_jobs_by_hand(tmp_path):
    """d = 16, one layer, SwiGLU 32, 2 heads of 8, V = 97, K = 3, d_s = 8, windows of T = 16,
    10 windows (eval.heldout_windows) in batches of 4. Per token: a backbone application
    2 (4 d^2 + 3 d f) + 4 T d (attention over all T keys, as the counter counts it) = 6144; the
    state update's W_u and W_Delta 2 * 2 d d_s = 512; a read 2 d_s d = 256; the head 2 d V = 3104."""
    rows = cost.analysis_plan_rows(_tiny_pipeline(tmp_path, shapley_shards=2), MFU, PEAK, data_root=tmp_path / "data")
    T, step, read, head = 16, 6144 + 512, 256, 3104
    clean = 3 * step + 3 * read + head  # 2 feedback reads and the terminal read = 23,840 a token
    tree = 7 * step + (1 + 2) * read + 4 * read + 8 * head  # 2^k iterations k, 2^k reads after k < 2, 4 terminals, 8 heads
    pairs = (read + step + 2 * (read + head)) + (read + head)  # i = 1: read, iteration 2, then twice the end; i = 2: one end
    assert (clean, tree, pairs) == (23840, 73216, 16992)
    table = {(r["job"], r["shard"]): r for r in rows}
    assert list(table) == [("eval", ""), ("shapley_shard", "1/2"), ("shapley_shard", "2/2"), ("shapley", ""),
                           ("interventions", "")]
    assert table[("eval", "")]["flops"] == 10 * T * clean and table[("eval", "")]["limit_min"] == 20
    # 3 batches (4, 4, 2 windows): shard 1 takes batch 0, shard 2 batches 1 and 2
    assert [table[("shapley_shard", s)]["windows"] for s in ("1/2", "2/2")] == [4, 6]
    assert [table[("shapley_shard", s)]["flops"] for s in ("1/2", "2/2")] == [4 * T * tree, 6 * T * tree]
    merge = table[("shapley", "")]
    assert (merge["flops"], merge["gpus"], merge["limit_min"], merge["note"]) == (0.0, 0, 30, "merge of 2 shards")
    one = table[("interventions", "")]  # one job: the calibration's 64 windows of train, then the 10 windows
    assert one["flops"] == 10 * T * (clean + pairs) + 64 * T * clean and one["gpus"] == 1
    for r in rows:
        assert r["hours"] == pytest.approx(r["flops"] / (MFU * PEAK * 1e12) / 3600) and r["fits"] is True
        assert r["heldout_from"].startswith("eval.heldout_windows = 10")


def test_the_split_size_comes_from_the_tokenized_data(tmp_path):
    """Without a window cap the whole split: (tokens - 1) // T windows, from data/<scale>/meta.json;
    with no size at all, no estimate rather than a guess."""
    import json

    pipe = _tiny_pipeline(tmp_path, interventions_shards=3)
    pipe.scales["t"].eval = dataclasses.replace(pipe.scales["t"].eval, heldout_windows=None)
    rows = cost.analysis_plan_rows(pipe, MFU, PEAK, data_root=tmp_path / "data")
    unknown = [r for r in rows if r["job"] != "interventions_calibration" and not r["note"].startswith("merge")]
    assert len(unknown) == 5 and all(r["flops"] is None and r["fits"] is None for r in unknown)  # the merges cost nothing
    (tmp_path / "data" / "t").mkdir(parents=True)
    (tmp_path / "data" / "t" / "meta.json").write_text(json.dumps({"splits": {"val": {"tokens": 16 * 21 + 1}}}))
    rows = cost.analysis_plan_rows(pipe, MFU, PEAK, data_root=tmp_path / "data")
    shards = [r for r in rows if r["job"] == "interventions_shard"]
    assert [r["windows"] for r in shards] == [8, 8, 5]  # 21 windows, 6 batches of 4: two batches each
    assert sum(r["tokens"] for r in shards) == 21 * 16 and "meta.json" in shards[0]["heldout_from"]
    assert [r["job"] for r in rows if r["job"].startswith("interventions")] == [
        "interventions_calibration", "interventions_shard", "interventions_shard", "interventions_shard", "interventions"]


def test_a_scale_reading_another_scales_data_folder_counts_that_split(tmp_path):
    """paper.yaml's 410M runs read data/1.4b (data/stage.py data_homes): their held-out size comes
    from data/1.4b/meta.json, as the jobs will read it."""
    import json

    from stateloop.ops.analysis_cost import heldout

    cfg = load_pipeline("configs/paper.yaml")
    (tmp_path / "1.4b").mkdir()
    (tmp_path / "1.4b" / "meta.json").write_text(json.dumps({"splits": {"val": {"tokens": 2048 * 1000 + 1}}}))
    h = heldout(cfg, "410m", data_root=tmp_path)
    assert h.windows == 1000 and str(tmp_path / "1.4b" / "meta.json") in h.source


@pytest.mark.slow  # counts every paper model's forward pass on the meta device (about 30 s)
def test_the_paper_configs_analysis_jobs_fit_their_limit(tmp_path):
    """Sec. 5: "We analyze a trained 410M StateLoop with identity mixing and K = 7 on the full Pile
    validation set". At about 4e8 tokens (cost.ASSUMED_SPLIT_TOKENS) the Shapley tree is
    about 44 GPU-hours and the interventions about 10, against the 12-hour limit: in 8 and 2 shards
    (configs/paper.yaml) every job fits; in one job the Shapley values would not."""
    pipe = load_pipeline("configs/paper.yaml")
    assert pipe.scales["410m"].eval.heldout_windows is None  # the whole split, not a subset
    rows = cost.analysis_plan_rows(pipe, MFU, PEAK, data_root=tmp_path / "none")
    analysis = [r for r in rows if r["job"] != "eval"]
    assert [r["job"] for r in analysis] == ["shapley_shard"] * 8 + ["shapley", "interventions_calibration"] + \
        ["interventions_shard"] * 2 + ["interventions"]
    assert {r["run"] for r in analysis} == {"410m/stateloop/K7_ds1024_seed1234"}
    assert all(r["tokens"] is not None and r["limit_min"] <= 720 for r in rows)
    assert all(r["fits"] for r in rows), [(r["job"], r["run"], r["shard"], r["hours"]) for r in rows if not r["fits"]]
    whole = sum(r["tokens"] for r in analysis if r["job"] == "shapley_shard")
    assert whole == (cost.ASSUMED_SPLIT_TOKENS[("monology/pile-uncopyrighted", "validation")] - 1) // 2048 * 2048
    shapley_hours = sum(r["hours"] for r in analysis if r["job"] == "shapley_shard")
    assert 40 < shapley_hours < 48 and max(r["hours"] for r in analysis) < 6  # about 5.5 h a shard

    one = load_pipeline("configs/paper.yaml")
    one.scales["410m"].resources.analyze = dataclasses.replace(one.scales["410m"].resources.analyze, shapley_shards=1,
                                                               interventions_shards=1)
    unsharded = {r["job"]: r for r in cost.analysis_plan_rows(one, MFU, PEAK, data_root=tmp_path / "none")
                 if r["job"] != "eval"}
    assert unsharded["shapley"]["fits"] is False and unsharded["shapley"]["hours"] == pytest.approx(shapley_hours, rel=1e-3)
    assert 8 < unsharded["interventions"]["hours"] < 12  # fits alone, with little room: 2 shards (module docstring)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_a_bad_shard_count_is_one_line_naming_the_key(tmp_path, value):
    from stateloop.config import ConfigError

    with pytest.raises(ConfigError, match=r"tiny.yaml: scales\.t\.resources\.analyze\.shapley_shards: ") as err:
        _tiny_pipeline(tmp_path, shapley_shards=value)
    assert "\n" not in str(err.value)


def test_a_forward_count_is_kept_on_disk_by_config_and_code(tmp_path, monkeypatch):
    """`stateloop plan --analyses` counts every run's forward once: read back by a later process
    (the in-memory table emptied) without counting; another version of the code counts again."""
    from stateloop.ops import analysis_cost, measured

    monkeypatch.setenv("STATELOOP_CACHE", str(tmp_path))
    monkeypatch.setattr(analysis_cost, "_FORWARD", {})
    cfg = tiny_config("stateloop")
    first = analysis_cost.forward_flops(cfg, 16)
    monkeypatch.setattr(analysis_cost, "_FORWARD", {})
    monkeypatch.setattr(analysis_cost, "meta_model", lambda *a: pytest.fail("counted again"))
    assert analysis_cost.forward_flops(cfg, 16) == first
    monkeypatch.setattr(analysis_cost, "_FORWARD", {})
    monkeypatch.setattr(measured, "code_digest", lambda *m: "another version of the code")
    with pytest.raises(pytest.fail.Exception, match="counted again"):
        analysis_cost.forward_flops(cfg, 16)
