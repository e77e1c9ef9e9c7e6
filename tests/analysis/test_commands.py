"""The commands end to end: `stateloop analyze shapley|interventions RUN_DIR` and
`stateloop bench decode`, their JSON, MLflow logging and one-line errors."""

import json
import math

import pytest

from stateloop.cli import main
from support.analysis import make_run


def test_analyze_shapley_writes_json_into_the_run(tiny_run, capsys):
    run_dir, model = tiny_run
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow", "--no-progress", "--batch-size", "4"]) == 0
    res = json.loads((run_dir / "shapley.json").read_text())
    # No pipeline config: EvalConfig's held-out protocol, the whole "val" split (8 windows of 16).
    assert res["settings"]["split"] == "val" and res["settings"]["seq_len"] == 16 and res["settings"]["windows"] == 8
    assert res["heldout"]["split"] == "val" and res["heldout"]["windows"] == 8 and res["heldout"]["tokens"] == 8 * 16
    assert res["heldout"]["nll"] == res["nll_none_masked"] and res["heldout"]["matches_eval_protocol"]
    assert len(res["masks"]) == 2 ** model.cfg.K
    assert sum(res["shapley"]) == pytest.approx(res["nll_all_masked"] - res["nll_none_masked"], abs=1e-9)
    assert "feedback reads" in capsys.readouterr().out


def test_analyze_logs_to_mlflow_by_run_name_then_by_training_run_id(tiny_run, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    run_dir, model = tiny_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store is quicker to create than sqlite
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    # No train.json: the run named by the run id in the training experiment, created once.
    assert main(["analyze", "shapley", str(run_dir), "--no-progress"]) == 0
    exp = client.get_experiment_by_name("stateloop")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_name for r in runs] == ["tiny/stateloop/K3_ds32_seed1234"]
    shapley = json.loads((run_dir / "shapley.json").read_text())
    assert runs[0].data.metrics["shapley/feedback_share_pct"] == pytest.approx(shapley["feedback_share_pct"])
    # train.json names the training run: the next analysis attaches to it.
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": runs[0].info.run_id}))
    assert main(["analyze", "interventions", str(run_dir), "--no-progress", "--calib-windows", "4"]) == 0
    res = json.loads((run_dir / "interventions.json").read_text())
    assert (res["settings"]["calib_split"], res["settings"]["eval_split"]) == ("train", "val")
    assert res["heldout"]["ppl"] == pytest.approx(shapley["heldout"]["ppl"], rel=1e-9)  # one unmodified baseline
    assert res["settings"]["calib_windows"] == 4 and (run_dir / "interventions_calibration.pt").is_file()
    assert len(res["replacement"]) == len(res["freezing"]) == model.cfg.K - 1
    assert len(client.search_runs([exp.experiment_id])) == 1
    logged = client.get_run(runs[0].info.run_id).data
    assert logged.metrics["interventions/ppl_unmodified"] == pytest.approx(res["unmodified"]["ppl"])
    freeze = client.get_metric_history(runs[0].info.run_id, "interventions/ppl_freeze")  # one curve, step i
    assert [m.step for m in freeze] == [e["i"] for e in res["freezing"]] == list(range(1, model.cfg.K))
    assert [m.value for m in freeze] == pytest.approx([e["ppl"] for e in res["freezing"]])
    phi = client.get_metric_history(runs[0].info.run_id, "shapley/phi")  # one curve, step k
    assert [(m.step, m.value) for m in phi] == list(enumerate(shapley["shapley"], 1))
    assert logged.tags["interventions.eval_split"] == "val" and not any("phi_R" in k for k in logged.metrics)
    artifacts = {a.path for a in client.list_artifacts(runs[0].info.run_id, "analysis")}
    assert artifacts == {"analysis/shapley.json", "analysis/interventions.json"}
    # A train.json naming a run the store does not know is an error naming the file.
    (run_dir / "train.json").write_text(json.dumps({"mlflow_run_id": "0" * 32}))
    assert main(["analyze", "shapley", str(run_dir), "--no-progress"]) == 2


def test_analyze_errors_are_one_line(tmp_path, capsys):
    run_dir, _ = make_run(tmp_path, name="vanilla_looped")
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow"]) == 2
    assert "needs a model with a persistent state" in capsys.readouterr().err
    run_dir, _ = make_run(tmp_path, name="state_only", d_s=32)
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow"]) == 2
    assert "needs state reads" in capsys.readouterr().err
    run_dir, _ = make_run(tmp_path)
    assert main(["analyze", "interventions", str(run_dir), "--no-mlflow", "--calib-split", "val"]) == 2
    assert "separate from the evaluation data" in capsys.readouterr().err
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow", "--split", "dev"]) == 2
    assert "no split 'dev'" in capsys.readouterr().err
    assert main(["analyze", "shapley", str(tmp_path / "nowhere"), "--no-mlflow"]) == 2
    assert "no final weights" in capsys.readouterr().err


def test_analyze_refuses_damaged_shards_in_one_line(tmp_path, capsys):
    """A held-out shard of the wrong size (cut short, as by a full disk) or changed bytes end in one
    line naming the file, as in training, not in a traceback."""
    run_dir, _ = make_run(tmp_path)
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    shard = tmp_path / "data" / meta["splits"]["val"]["shards"][0]["file"]
    data = shard.read_bytes()
    for damaged, words in ((data[:-2], "size does not match"), (bytes(len(data)), "sha256")):
        shard.write_bytes(damaged)
        capsys.readouterr()
        assert main(["analyze", "shapley", str(run_dir), "--no-mlflow", "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(shard.name) in err[0] and words in err[0], err


TINY_SHAPE = ["model.n_layers=2", "model.d_model=32", "model.d_ff=64", "model.n_heads=4", "model.head_dim=8",
              "model.vocab_size=97", "model.mixer_heads=4", "model.mixer_head_dim=8", "model.mamba_d_state=8",
              "model.mamba_head_dim=8", "model.mamba_n_groups=2", "model.attn_impl=torch", "model.ssd_impl=torch"]


@pytest.mark.parametrize("interleave,dtype", [("run", "float32"), ("token", "bfloat16")])
def test_bench_decode_tiny_shapes(tmp_path, interleave, dtype, capsys):
    out = tmp_path / "bench.json"
    models = ["vanilla_looped:2", "vanilla_looped:3", "vanilla_looped_ffn:2", "stateloop:2", "stateloop_attn:2:16",
              "stateloop_mamba2:2"]
    assert main(["bench", "decode", "--set", *TINY_SHAPE, "--models", *models, "--prefill", "5", "--tokens", "3",
                 "--repeats", "2", "--warmup", "1", "--no-progress", "--interleave", interleave, "--dtype", dtype,
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["prefill_tokens"] == 5 and res["settings"]["new_tokens"] == 3
    assert res["settings"]["reference"] == "vanilla_looped:K2" and res["settings"]["dtype"] == dtype
    rows = {r["label"]: r for r in res["rows"]}
    assert list(rows) == ["vanilla_looped:K2", "vanilla_looped:K3", "vanilla_looped_ffn:K2", "stateloop:K2:ds32",
                          "stateloop_attn:K2:ds16", "stateloop_mamba2:K2:ds32"]
    for r in res["rows"]:
        lat = r["latency_ms_per_token"]
        assert len(lat["runs"]) == 2 and lat["mean"] > 0 and math.isfinite(lat["std"])
        assert r["throughput_tok_s"]["mean"] == pytest.approx(sum(1000 / x for x in lat["runs"]) / 2)
        if interleave == "token":  # each run's median step; the median over all (equal-sized) runs lies between them
            medians = r["step_ms_median_runs"]
            assert len(medians) == 2 and min(medians) <= r["step_ms_median"] <= max(medians)
    assert rows["vanilla_looped:K2"]["latency_change_pct"] == 0.0
    assert rows["stateloop:K2:ds32"]["params"] > rows["vanilla_looped:K2"]["params"]
    assert "stateloop_mamba2:K2:ds32" in capsys.readouterr().out
    # The FLOP floor beside each change, by hand: a decoded step with c tokens cached attends to c + 1
    # keys, c = 5..7 over the 3 steps (mean 7 keys); per application of the 2 layers 2 (4 d^2 + 3 d f)
    # + 4 keys d each, and the head 2 d V once.
    app, head = 2 * (2 * (4 * 32 * 32 + 3 * 32 * 64) + 4 * 7 * 32), 2 * 32 * 97
    assert rows["vanilla_looped:K2"]["flops_change_pct"] == 0.0
    assert rows["vanilla_looped:K3"]["flops_change_pct"] == pytest.approx(100 * ((3 * app + head) / (2 * app + head) - 1))
    state = 2 * (2 * 32 * 2 * 32 + 2 * 32 * 32)  # K = 2 iterations of W_u, W_Delta (d x d_s each) and a read (d_s x d)
    assert rows["stateloop:K2:ds32"]["flops_change_pct"] == pytest.approx(100 * state / (2 * app + head))
    if interleave == "token":  # Table 3 and the claims row print the floor beside the change
        from stateloop.config.pipeline import ExperimentConfig, PipelineConfig, ScaleConfig
        from stateloop.report.claims import _state_branch_latency
        from stateloop.report.outputs import BENCH_FILE
        from stateloop.report.tables import table3

        cfg = PipelineConfig(scales={"t": ScaleConfig()}, experiments={"decoding": ExperimentConfig(scale="t", trained=False)})
        (tmp_path / BENCH_FILE).parent.mkdir(parents=True)
        (tmp_path / BENCH_FILE).write_text(out.read_text())
        table, notes = table3(cfg, tmp_path)
        floors = table.set_index(["model", "K"]).flops_floor_pct
        assert floors[("stateloop", 2)] == pytest.approx(rows["stateloop:K2:ds32"]["flops_change_pct"])
        assert any("flops_floor_pct" in n for n in notes)
        _, detail = _state_branch_latency(cfg, tmp_path)
        assert "stateloop K=2: " in detail and f"(FLOP floor {rows['stateloop:K2:ds32']['flops_change_pct']:+.1f}%)" in detail


def test_bench_decode_reads_its_shapes_and_protocol_from_the_config(tmp_path):
    """Given only ``--config``, bench decode times the config's decoding experiment (its scale's
    shape, its models and loop counts) under the config's ``bench:`` section, as the DAG's
    bench_decode job runs it; a flag still overrides one setting."""
    import yaml

    shape = {k.split("=")[0].removeprefix("model."): yaml.safe_load(k.split("=")[1]) for k in TINY_SHAPE}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({
        "scales": {"t": {"model": shape}},
        "experiments": {"decoding": {"scale": "t", "trained": False, "models": ["vanilla_looped", "stateloop"],
                                     "K": [2], "K_by_model": {"vanilla_looped": [2, 3]}, "d_s": [16]}},
        "bench": {"prefill": 5, "tokens": 3, "repeats": 2, "warmup": 0, "dtype": "float32", "interleave": "run"},
    }))
    out = tmp_path / "bench.json"
    assert main(["bench", "decode", "--config", str(cfg), "--device", "cpu", "--no-progress", "--out", str(out),
                 "--repeats", "1"]) == 0
    res = json.loads(out.read_text())
    assert [r["label"] for r in res["rows"]] == ["vanilla_looped:K2", "vanilla_looped:K3", "stateloop:K2:ds16"]
    s = res["settings"]
    assert (s["prefill_tokens"], s["new_tokens"], s["runs"], s["warmup"], s["interleave"]) == (5, 3, 1, 0, "run")
    assert res["rows"][0]["params"] < res["rows"][2]["params"]


def test_bench_decode_run_folders_and_errors(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    out = tmp_path / "b.json"
    assert main(["bench", "decode", "--runs", str(run_dir), "--prefill", "4", "--tokens", "2", "--repeats", "1",
                 "--warmup", "0", "--no-progress", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["source"] == str(run_dir) and row["label"] == "stateloop:K3:ds32"
    assert main(["bench", "decode", "--set", "model.d_modle=3", "--models", "stateloop", "--out", str(out)]) == 2
    assert "model.d_modle: unknown key" in capsys.readouterr().err
    assert main(["bench", "decode", "--set", *TINY_SHAPE, "--models", "stateloop:x", "--out", str(out)]) == 2
    assert "name:K:d_s" in capsys.readouterr().err
