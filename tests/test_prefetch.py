"""`stateloop prefetch` (stateloop/ops/prefetch.py): a config's hub tokenizer, hub dataset files and
lm-eval task data fetched into empty caches through huggingface_hub and lm-eval's own download,
from a stand-in for the Hub (stateloop/ops/rehearse/hub.py: local folders served under hub names);
then, offline with the stand-in gone, the jobs find them, and a missing one stops a job at its
start in one line naming it and the prefetch command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stateloop.config.data import DataConfig
from stateloop.data.hub import card_patterns, corpus_patterns
from stateloop.data.tokenizer import train_bpe
from stateloop.ops.rehearse.hub import Repo, serve_hub
from stateloop.ops.rehearse.mirrors import write_mirror

ROOT = Path(__file__).resolve().parents[1]
PILE = {"source": "monology/pile-uncopyrighted", "data_files": {"train": "train/*.jsonl.zst", "validation": "val.jsonl.zst"},
        "split": "train", "val_split": "validation", "val_fraction": 0.0}
LAMBADA = ["The cat sat on the mat and then it slept", "A dog ran to the park where it played ball",
           "She opened the door and saw her friend", "He wrote a letter to his old teacher today"]


def test_the_files_a_corpus_needs():
    pile = DataConfig(**PILE, tokenizer="bpe")
    assert corpus_patterns(pile, None) == ["README.md", "train/*.jsonl.zst", "val.jsonl.zst"]
    card = "---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n# x\n"
    assert card_patterns(card, "sample-10BT", ["train"]) == ["sample/10BT/*"]
    assert card_patterns(card, "other", ["train"]) is None and card_patterns("# no card", None, ["train"]) is None
    fineweb = DataConfig(source="HuggingFaceFW/fineweb-edu", hub_config="sample-10BT", tokenizer="bpe")
    assert corpus_patterns(fineweb, card) == ["README.md", "sample/10BT/*"]
    assert corpus_patterns(DataConfig(source="org/any", tokenizer="bpe"), None) is None  # every file


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Folders of three hub repositories: a small tokenizer (a BPE trained here), the Pile's layout
    (the rehearsals' mirror, synthetic text) and LAMBADA's, as lm-eval's lambada_openai reads it."""
    root = tmp_path_factory.mktemp("hub")
    tok = root / "tok"
    tok.mkdir()
    texts = [f"document {i}: " + " ".join(LAMBADA) for i in range(50)]
    (tok / "tokenizer.json").write_text(train_bpe(texts, 300).to_str())
    pile = Path(write_mirror(DataConfig(**PILE, tokenizer="bpe"), root / "data", None, 60, 8)["source"])
    lambada = root / "lambada"
    (lambada / "data").mkdir(parents=True)
    (lambada / "data" / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in LAMBADA))
    (lambada / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n"
                                       "  - split: test\n    path: data/test.jsonl\n---\n")
    return {("model", "org/tok"): tok, ("dataset", PILE["source"]): pile, ("dataset", "EleutherAI/lambada_openai"): lambada}


def _config(path: Path) -> Path:
    model = dict(vocab_size=320, n_layers=1, d_model=32, d_ff=64, n_heads=2, head_dim=16, max_seq_len=64,
                 attn_impl="torch", ssd_impl="torch")
    train = dict(accelerator="cpu", devices=1, precision="32-true", seq_len=16, micro_batch=2, global_batch=2,
                 max_steps=2, checkpoint_every=0, mlflow_tracking=False)
    cfg = {"scales": {"t": {"model": model, "train": train, "data": {**PILE, "tokenizer": "org/tok"},
                            "eval": {"tasks": ["lambada_openai"], "shots": [0], "limit": 2}}},
           "experiments": {"table1": {"scale": "t", "models": ["vanilla_looped"], "K": [2], "d_s": [0]}}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stateloop.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _error(proc) -> str:
    return (proc.stderr.strip().splitlines() or [""])[-1]


# `stateloop ARGS` with every socket connection and name lookup refused and recorded (in the file
# $STATELOOP_TEST_SOCKETS): what a process tries to reach, seen from inside it.
_RECORDING = """
import os, socket, sys
def _refuse(what):
    with open(os.environ["STATELOOP_TEST_SOCKETS"], "a") as fh:
        fh.write(repr(what) + "\\n")
    raise OSError(101, "Network is unreachable (test)")
socket.socket.connect = lambda self, address: _refuse(address)
socket.socket.connect_ex = lambda self, address: _refuse(address)
socket.getaddrinfo = lambda host, *args, **kwargs: _refuse(host)
from stateloop.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _online_env(tmp_path: Path) -> dict:
    """An environment with empty caches and the Hub not switched off: as a compute node's shell
    would be where nobody set HF_HUB_OFFLINE."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "STATELOOP_TEST_SOCKETS": str(tmp_path / "sockets.txt")}
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                "HF_ENDPOINT"):
        env.pop(var, None)
    return env


def _check_with_empty_caches(tmp_path: Path, prefix: list[str]) -> tuple[subprocess.CompletedProcess, float, str]:
    import time

    cfg = _config(tmp_path / "c.yaml")
    env = _online_env(tmp_path)
    start = time.monotonic()
    proc = subprocess.run([*prefix, sys.executable, "-c", _RECORDING, "prefetch", "--config", cfg.name, "--check"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    sockets = tmp_path / "sockets.txt"
    return proc, time.monotonic() - start, sockets.read_text() if sockets.exists() else ""


def _assert_missing_named(proc) -> None:
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    line = _error(proc)
    assert "tokenizer org/tok (tokenizer.json)" in line and "dataset monology/pile-uncopyrighted: not in the hub cache" in line
    assert "lm-eval task data lambada_openai (EleutherAI/lambada_openai, default)" in line, line


def test_prefetch_check_never_touches_the_network(tmp_path):
    """Issue 53: "`stateloop prefetch --check` (what the docs run on a compute node) still builds each
    task with `datasets`, which tries the Hub with retries: 3 min 41 s with an empty cache and no
    route". With the Hub not switched off in the environment, the check opens no socket and looks up
    no name: it names what the empty caches lack, in one line."""
    proc, _, sockets = _check_with_empty_caches(tmp_path, [])
    assert sockets == "", sockets
    _assert_missing_named(proc)


def _netns_prefix() -> list[str] | None:
    """`unshare -n` with only loopback up, where this test may create a network namespace (root
    with unshare and ip); None elsewhere."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return None
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30)
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if probe.returncode == 0 else None


def test_prefetch_check_in_a_network_namespace_with_only_loopback(tmp_path):
    """The same check where the network is really gone (no route, as on a compute node), and no
    socket opened on the way; before: 3 min 41 s of datasets' retries."""
    prefix = _netns_prefix()
    if prefix is None:
        pytest.skip("needs root with unshare and ip (a network namespace with only loopback); "
                    "test_prefetch_check_never_touches_the_network covers the check without one")
    proc, elapsed, sockets = _check_with_empty_caches(tmp_path, prefix)
    assert sockets == "", sockets
    _assert_missing_named(proc)
    assert elapsed < 120, elapsed  # no retries: about 10 s here


@pytest.mark.slow
def test_prefetch_fills_empty_caches_and_offline_jobs_find_what_they_read(hub, tmp_path):
    cfg = _config(tmp_path / "c.yaml")
    home = tmp_path / "hf"
    base = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HOME": str(home),
            "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        base.pop(var, None)
    offline = {**base, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    command = f"stateloop prefetch --config {cfg.name}"

    # Offline before any prefetch: the tokenize job stops at its start, naming both hub pieces.
    proc = _run(["tokenize", "--config", cfg.name, "--scale", "t", "--out", "data/t", "--no-progress"], tmp_path, offline)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _error(proc)
    assert "tokenizer org/tok (tokenizer.json)" in line and "dataset monology/pile-uncopyrighted: not in the hub cache" in line
    assert f"run `{command}` where the network is" in line and not (tmp_path / "data").exists()

    with serve_hub([Repo(kind, name, folder) for (kind, name), folder in hub.items()]) as url:
        proc = _run(["prefetch", "--config", cfg.name], tmp_path, {**base, "HF_ENDPOINT": url})
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 needs of c.yaml are in the caches" in proc.stderr
    assert _run(["prefetch", "--config", cfg.name, "--check"], tmp_path, offline).returncode == 0
    # the check switches the Hub off itself: with the variables unset it finds the same files
    proc = _run(["prefetch", "--config", cfg.name, "--check"], tmp_path, {**base, "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert proc.returncode == 0 and "all 3 needs are in the caches" in proc.stderr, proc.stderr[-3000:]

    # Offline with the Hub gone: the tokenize job reads the cached snapshot by the same call.
    proc = _run(["tokenize", "--config", cfg.name, "--scale", "t", "--out", "data/t", "--no-progress"], tmp_path, offline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "data/t/meta.json").read_text())
    assert meta["source"]["kind"] == "hub" and meta["splits"]["train"]["source"] == "split:train"
    assert meta["splits"]["val"]["documents"] == 8

    # A file gone from the snapshot: named, before anything is written.
    snapshot = next((home / "hub/datasets--monology--pile-uncopyrighted/snapshots").iterdir())
    (snapshot / "train/07.jsonl.zst").unlink()
    proc = _run(["tokenize", "--config", cfg.name, "--scale", "t", "--out", "data/t2", "--no-progress"], tmp_path, offline)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert "dataset monology/pile-uncopyrighted: 1 of 32 files missing (train/07.jsonl.zst)" in _error(proc)

    # The task's data gone: the training (whose run Table 2 evaluates) stops at its start, not after it.
    run = "t/vanilla_looped/K2_ds0_seed1234"
    proc = _run(["train", "--config", cfg.name, run, "--data-dir", "data/t", "--out", "run", "--no-progress"], tmp_path, offline)
    assert proc.returncode == 0, proc.stderr[-3000:]  # with it cached, it trains
    shutil.rmtree(home / "datasets")
    for args in (["train", "--config", cfg.name, run, "--data-dir", "data/t", "--out", "run2", "--no-progress"],
                 ["eval", "run", "--config", cfg.name, "--no-mlflow", "--no-progress"]):
        proc = _run(args, tmp_path, offline)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
        line = _error(proc)
        assert "lm-eval task data lambada_openai (EleutherAI/lambada_openai, default)" in line, line
        assert f"run `{command}` where the network is" in line
    assert not (tmp_path / "run2").exists() and not (tmp_path / "run/eval.json").exists()
