"""The Snakemake DAG: planning at paper scale (dry runs), config errors at DAG build, the smoke
DAG end to end, reruns, MLflow, and resuming an interrupted DAG."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from dag_helpers import copy_workflow, env, snakemake

pytestmark = pytest.mark.slow

OUTPUTS = [f"results/table{i}.{ext}" for i in (1, 2, 3, 4) for ext in ("csv", "md")] + [
    f"figures/{f}.{ext}" for f in ("loop_depth", "state_width", "state_analysis") for ext in ("pdf", "png")]


def jobs(dry_run_output: str) -> list[dict]:
    """Jobs of a dry run: rule name, output and resources of each."""
    out, current = [], None
    for line in dry_run_output.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            current = {"rule": m.group(1)}
            out.append(current)
        elif current is not None and line.strip().startswith(("output:", "resources:", "wildcards:")):
            key, _, value = line.strip().partition(": ")
            current[key] = value
    return out


def test_slurm_profile_plans_the_ten_table1_runs(tmp_path):
    work = copy_workflow(tmp_path)
    planned = jobs(snakemake(work, "--profile", "slurm", "-n", "results/table1.csv").stdout)
    trains = [j for j in planned if j["rule"] == "train"]
    evals = [j for j in planned if j["rule"] == "eval"]
    assert len(trains) == 10 and len(evals) == 10
    assert all("/1.4b/" in j["output"] for j in trains)
    models = {re.search(r"runs/1\.4b/(\w+)/", j["output"]).group(1) for j in trains}
    assert models == {"vanilla_looped", "vanilla_looped_ffn", "hyperloop", "mesh", "ponderlm", "parcae",
                      "pause_token", "stateloop", "stateloop_attn", "stateloop_mamba2"}
    for j in trains:  # the scale's GPUs and nodes (configs/paper.yaml: 4 nodes x 8 GPUs at 1.4B)
        assert "gres=gpu:8" in j["resources"] and "nodes=4" in j["resources"] and "tasks_per_node=8" in j["resources"]


def test_paper_config_plans_26_training_runs_once_each(tmp_path):
    work = copy_workflow(tmp_path)
    # Targets go before --configfile, which takes every following word as a config file.
    planned = jobs(snakemake(work, "-n", "all", "--configfile", "configs/paper.yaml").stdout)
    outputs = [j["output"] for j in planned if j["rule"] == "train"]
    assert len(outputs) == 26 and len(set(outputs)) == 26
    assert sum("/1.4b/" in o for o in outputs) == 10 and sum("/410m/" in o for o in outputs) == 16


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["scales"]["smoke"]["model"].update(d_modle=3), "scales.smoke.model.d_modle: unknown key"),
    (lambda c: c["experiments"]["table4"]["models"].append("stateloop_xl"), "unknown model 'stateloop_xl'"),
    (lambda c: c["scales"]["smoke"]["train"].update(lr="fast"), "scales.smoke.train.lr: expected a number"),
])
def test_bad_config_fails_at_dag_build_naming_the_key(tmp_path, edit, needle):
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    edit(cfg)
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if needle in line]
    assert lines, proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout  # nothing was planned, let alone run


def test_lint_reports_nothing_serious(tmp_path):
    work = copy_workflow(tmp_path)
    proc = snakemake(work, "--lint", "--configfile", "configs/smoke.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Lints for" not in text, text


# ----------------------------------------------------------------------------------------------
# The smoke DAG, run once for the tests below (tests/workflow/conftest.py)


def test_smoke_dag_produces_every_table_and_figure(smoke_dag):
    for rel in OUTPUTS:
        path = smoke_dag / rel
        assert path.is_file() and path.stat().st_size > 0, rel
    import pandas as pd

    t1 = pd.read_csv(smoke_dag / "results/table1.csv")
    assert len(t1) == 10 and t1.pile_ppl.notna().all() and (t1.params_m_paper.notna()).all()
    t2 = pd.read_csv(smoke_dag / "results/table2.csv")
    assert set(t2.shots) == {0, 5} and t2.synth_mc.between(0, 100).all()
    t3 = pd.read_csv(smoke_dag / "results/table3.csv")
    assert len(t3) == 6 and (t3.latency_ms_per_token > 0).all()
    t4 = pd.read_csv(smoke_dag / "results/table4.csv")
    assert list(t4.variant) == ["state_only", "stateloop", "reset_state", "stateloop", "vanilla_looped",
                                "stateloop_gru", "stateloop"]
    assert "ours (paper, ours - paper)" in (smoke_dag / "results/table1.md").read_text().lower() or \
        "Cells: ours (paper, ours - paper)." in (smoke_dag / "results/table1.md").read_text()


def test_touching_one_training_output_reruns_only_its_dependents(smoke_dag):
    assert "Nothing to be done" in snakemake(smoke_dag, "-n", "--configfile", "configs/smoke.yaml").stdout
    # Snakemake compares checksums of small files (under --max-checksum-file-size), so a bare
    # touch of the smoke model changes nothing: write the weights file anew, as retraining does.
    import torch

    model = smoke_dag / "results/runs/smoke/stateloop_gru/K3_ds32/model.pt"
    blob = torch.load(model, weights_only=False)
    blob["code_version"] = "retrained"
    torch.save(blob, model)
    planned = jobs(snakemake(smoke_dag, "-n", "--configfile", "configs/smoke.yaml").stdout)
    rules = sorted(j["rule"] for j in planned)
    assert rules == ["all", "eval", "render_table"], rules  # Table 4 only: its eval and the table
    assert "stateloop_gru" in next(j for j in planned if j["rule"] == "eval")["output"]
    assert "table4" in next(j for j in planned if j["rule"] == "render_table")["output"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_server_lists_every_run(smoke_dag):
    port = _free_port()
    db = smoke_dag / "results" / "mlflow.db"
    assert db.is_file()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--default-artifact-root", str(smoke_dag / "mlartifacts")],
        cwd=smoke_dag, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.read().decode().strip() == "OK":
                        break
            except OSError:
                pass
            assert time.time() < deadline, "MLflow server did not come up in 120 s"
            time.sleep(1)
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search", data=b'{"max_results": 100}',
                                     headers={"Content-Type": "application/json"})
        exps = json.load(urllib.request.urlopen(req, timeout=10))["experiments"]
        body = json.dumps({"experiment_ids": [e["experiment_id"] for e in exps], "max_results": 1000}).encode()
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(req, timeout=10)).get("runs", [])
        names = {r["info"]["run_name"] for r in runs}
        expected = {str(p.relative_to(smoke_dag / "results/runs")) for p in (smoke_dag / "results/runs").glob("*/*/*")}
        assert len(expected) == 16
        assert expected <= names, sorted(expected - names)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_interrupted_dag_resumes_without_redoing_finished_runs(tmp_path):
    """Kill the DAG while a long training job runs; the rerun resumes that run from its checkpoint
    and does not retrain the run that had finished."""
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    cfg["scales"]["smoke"]["train"].update(max_tokens=512 * 150, checkpoint_every=10, val_every=0, val_tokens=0)
    (work / "long.yaml").write_text(yaml.safe_dump(cfg))
    short = "results/runs/smoke/vanilla_looped/K2_ds0/model.pt"
    long_run = work / "results/runs/smoke/stateloop/K2_ds32"
    target = str(long_run.relative_to(work) / "model.pt")
    snakemake(work, short, "--cores", "1", "--configfile", "long.yaml")  # a run that finishes
    finished_mtime = (work / short).stat().st_mtime

    proc = subprocess.Popen([sys.executable, "-m", "snakemake", target, "--cores", "1", "--configfile", "long.yaml"],
                            cwd=work, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while not list(long_run.glob("checkpoints/step_*.ckpt.sha256")):  # a complete checkpoint exists
            assert proc.poll() is None, "the training job ended before it could be interrupted"
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole DAG, training job included, dies at once
        proc.wait()
    assert not (long_run / "model.pt").exists()

    snakemake(work, "--unlock", "--configfile", "long.yaml")  # the killed DAG left its lock behind
    out = snakemake(work, short, target, "--cores", "1", "--configfile", "long.yaml").stdout
    summary = json.loads((long_run / "train.json").read_text())
    assert (summary.get("resumed_from_step") or 0) >= 10, summary
    assert (work / short).stat().st_mtime == finished_mtime  # the finished run was not redone
    assert "vanilla_looped" not in out
