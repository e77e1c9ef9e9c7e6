"""lm-eval's own command line (``stateloop lm-eval ...``, arguments as lm-eval's users type them)
over a run folder: ``pretrained=``, the default ``cuda:0`` on a CPU machine, ``batch_size=auto``,
the YAMLs of workflow/tasks/ from another folder; numbers equal to ``stateloop eval``'s."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from stateloop.cli import main
from stateloop.config.evaluate import EvalConfig
from stateloop.evaluate.harness import run_tasks
from stateloop.evaluate.lm import StateLoopEvalLM, largest_batch, parse_batch_size
from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, task_yamls


def lm_eval_cli(monkeypatch, run_dir: Path, elsewhere: Path, *args: str) -> dict:
    """``stateloop lm-eval`` run from ``elsewhere`` with the task folder given relative to it, no
    --device (lm-eval's default: cuda:0); the results JSON it wrote (and the samples' folder)."""
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc = main(["lm-eval", "--model", "stateloop", "--model_args", f"pretrained={run_dir}",
               "--include_path", os.path.relpath(DEFAULT_TASK_DIR, elsewhere), "--output_path", "out", *args])
    assert rc == 0
    (path,) = (elsewhere / "out").rglob("results_*.json")
    return json.loads(path.read_text()) | {"folder": path.parent}


def cli_samples(res: dict, task: str) -> list[dict]:
    """lm-eval's samples file, in document order; its writer turns each request's arguments into
    {gen_args_i: {arg_j: ...}} and every response into strings."""
    (path,) = res["folder"].glob(f"samples_{task}_*.jsonl")
    samples = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda s: s["doc_id"])
    for s in samples:
        s["arguments"] = [list(a.values()) for a in s["arguments"].values()]
        s["resps"] = [[[float(r[0][0])]] for r in s["resps"]]
    return samples


def pipeline(run_dir: Path, data_dir: Path, work: Path, **settings) -> dict:
    """The same tasks through ``stateloop eval``'s path (evaluate/harness.py)."""
    from stateloop.data.shards import read_meta

    lm = StateLoopEvalLM(str(run_dir), batch_size=3, device="cpu")
    return run_tasks(lm, EvalConfig(bootstrap_iters=0, **settings), work, work / "samples", progress=False,
                     data_meta=read_meta(data_dir))


@pytest.mark.slow
def test_synth_mc_through_lm_evals_cli_equals_stateloop_eval(make_run, data_dir, tmp_path, caplog, monkeypatch):
    """2-shot synth_mc: same prompts and log-likelihoods as `stateloop eval`, the questions drawn
    with the generator settings of the run's data; cuda:0 falls back to the CPU with a warning;
    auto:2 detects a batch size twice (max_batch_size on a CPU)."""
    from stateloop.config.data import SyntheticConfig
    from stateloop.data.synthetic import task_examples

    run_dir, _ = make_run("stateloop")
    with caplog.at_level(logging.WARNING, logger="stateloop"):
        res = lm_eval_cli(monkeypatch, run_dir, tmp_path / "elsewhere", "--tasks", "synth_mc", "--num_fewshot", "2", "--limit", "6",
                          "--batch_size", "auto:2", "--max_batch_size", "5", "--seed", "0", "--log_samples",
                          "--metadata", "synthetic_examples=10", "fewshot_pool=10")
    assert "device cuda:0: not available on this machine; using cpu" in caplog.text
    assert res["config"]["batch_sizes"] == [5, 5]
    theirs = assert_synth_mc_equals_the_pipelines(res, run_dir, data_dir, tmp_path / "work")
    # The run's data says max_hops 3, the generator's default is 4: the questions are the run's.
    assert theirs[0]["doc"]["question"] != task_examples("synth_mc", "test", 1, 0, SyntheticConfig())[0]["question"]


def assert_synth_mc_equals_the_pipelines(res: dict, run_dir, data_dir, work) -> list[dict]:
    """lm-eval's own results ``res`` of synth_mc at 2 shots on 6 documents (synthetic_examples =
    fewshot_pool = 10) against `stateloop eval`'s on the same run: the same accuracies, documents,
    few-shot prompts and per-request log-likelihoods. Returns lm-eval's samples."""
    got = res["results"]["synth_mc"]
    want = pipeline(run_dir, data_dir, work, tasks=["synth_mc"], shots=[2], limit=6,
                    synthetic_examples=10, fewshot_pool=10)["tasks"]["synth_mc"]["shots"]["2"]
    assert (got["acc,none"], got["acc_norm,none"]) == (want["metrics"]["acc"], want["metrics"]["acc_norm"])
    ours = [json.loads(line) for line in (work / "samples" / want["samples_file"]).read_text().splitlines()]
    theirs = cli_samples(res, "synth_mc")
    assert [s["doc"] for s in theirs] == [s["doc"] for s in ours] and len(theirs) == 6
    assert [s["arguments"] for s in theirs] == [s["arguments"] for s in ours]  # the same few-shot prompts
    for a, b in zip(theirs, ours):
        assert [r[0][0] for r in a["resps"]] == pytest.approx([r[0][0] for r in b["resps"]], abs=1e-5)
    return theirs


@pytest.mark.slow
def test_shared_tasks_through_lm_evals_cli_equal_stateloop_eval(make_run, data_dir, shared_data, tmp_path, monkeypatch):
    """PIQA accuracy and WikiText-2 word perplexity over ../shared data, from another folder."""
    for folder in ("piqa", "wikitext-2"):
        if not (shared_data / folder).is_dir():
            pytest.skip(f"{shared_data / folder} not found")
    run_dir, _ = make_run("stateloop", max_seq_len=160)  # PIQA's longer solutions need more than 64 tokens
    res = lm_eval_cli(monkeypatch, run_dir, tmp_path / "elsewhere", "--tasks", "piqa_local,wikitext_local", "--limit", "4",
                      "--batch_size", "auto")
    assert res["config"]["batch_sizes"] == [64]  # auto on a CPU: max_batch_size
    want = pipeline(run_dir, data_dir, tmp_path / "work", tasks=["piqa_local", "wikitext_local"], shots=[0], limit=4,
                    task_data={"piqa_local": str(shared_data / "piqa"), "wikitext_local": str(shared_data / "wikitext-2")})
    piqa, wiki = (want["tasks"][t]["shots"]["0"]["metrics"] for t in ("piqa_local", "wikitext_local"))
    assert res["n-samples"]["piqa_local"] == {"original": 1838, "effective": 4}
    assert res["results"]["piqa_local"]["acc,none"] == piqa["acc"]
    assert res["results"]["piqa_local"]["acc_norm,none"] == piqa["acc_norm"]
    assert res["results"]["wikitext_local"]["word_perplexity,none"] == pytest.approx(wiki["word_perplexity"], rel=1e-6)
    assert wiki["word_perplexity"] > 1.0


def test_every_local_yaml_reads_the_docs_stateloop_eval_prepares(make_run, data_dir, shared_data, tmp_path, monkeypatch):
    """lm-eval's task manager over workflow/tasks/ (custom_dataset hooks) and `stateloop eval`'s
    written copies (data_files) give the same documents, evaluated and few-shot, for every task."""
    from lm_eval.tasks import TaskManager

    from stateloop.data.shards import read_meta
    from stateloop.evaluate.tasks.files import SHARED_SOURCES
    from stateloop.evaluate.tasks.prepare import prepare_tasks

    for folder in SHARED_SOURCES.values():
        if not (shared_data / folder).is_dir():
            pytest.skip(f"{shared_data / folder} not found")
    run_dir, _ = make_run()
    names = sorted(task_yamls(DEFAULT_TASK_DIR))
    cfg = EvalConfig(tasks=names, synthetic_examples=7, fewshot_pool=5,
                     task_data={t: str(shared_data / f) for t, f in SHARED_SOURCES.items()})
    prepared = prepare_tasks(names, tmp_path / "work", cfg, read_meta(data_dir)).task_manager.load(names)["tasks"]
    monkeypatch.chdir(tmp_path)
    direct = TaskManager(include_path=str(DEFAULT_TASK_DIR), include_defaults=False,
                         metadata={"pretrained": str(run_dir), "synthetic_examples": 7, "fewshot_pool": 5}).load(names)["tasks"]
    for name in names:
        assert list(direct[name].eval_docs) == list(prepared[name].eval_docs), name
        assert list(direct[name].fewshot_docs() or []) == list(prepared[name].fewshot_docs() or []), name
    assert len(list(direct["synth_mc"].eval_docs)) == 7 and len(list(direct["piqa_local"].eval_docs)) == 1838


def test_arguments_go_to_lm_eval_unchanged(capsys):
    """`-h` after the command is lm-eval's (its `run` usage), not stateloop's."""
    with pytest.raises(SystemExit) as exit_:
        main(["lm-eval", "run", "-h"])
    assert exit_.value.code == 0
    assert "lm-eval run --model <model>" in capsys.readouterr().out


def test_pretrained_is_the_run_folder_and_missing_cuda_falls_back(make_run, caplog):
    run_dir, _ = make_run()
    requested = f"cuda:{torch.cuda.device_count()}"  # a CUDA device this machine lacks
    with caplog.at_level(logging.WARNING, logger="stateloop"):
        lm = StateLoopEvalLM(pretrained=str(run_dir), device=requested)
    assert lm.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert f"device {requested}: not available" in caplog.text
    assert StateLoopEvalLM(run_dir=str(run_dir), device="cpu").tokenizer_name == lm.tokenizer_name
    with pytest.raises(ValueError, match=r"pretrained=.* and run_dir=.*: give the run folder once"):
        StateLoopEvalLM(pretrained=str(run_dir), run_dir=str(run_dir))


def test_auto_batch_size(make_run):
    """Halving on out-of-memory, lm-eval's spellings, and auto:2 detecting again halfway through
    the length-sorted requests without changing any score."""
    tried = []

    def forward(size):
        tried.append(size)
        if size > 12:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    assert largest_batch(forward, 64) == 8 and tried == [64, 32, 16, 8]
    assert largest_batch(lambda size: forward(99), 4) == 1
    with pytest.raises(RuntimeError, match="shape"):
        largest_batch(lambda size: (_ for _ in ()).throw(RuntimeError("bad shape")), 4)  # other errors propagate
    assert [parse_batch_size(v) for v in ("auto", "auto:4", "8", 3)] == [("auto", 1), ("auto", 4), (8, 1), (3, 1)]
    for bad in ("0", "auto:0", "auto:x", "big"):
        with pytest.raises(ValueError, match=f"batch_size: .*got '{bad}'"):
            parse_batch_size(bad)

    run_dir, _ = make_run()
    fixed = StateLoopEvalLM(str(run_dir), batch_size=4, device="cpu")
    auto = StateLoopEvalLM(str(run_dir), batch_size="auto:2", device="cpu")
    lengths, shapes, logits = [], [], auto._logits
    auto._detect_batch_size = lambda length: lengths.append(length) or (2, 3)[len(lengths) - 1]
    auto._logits = lambda idx, cache=None: shapes.append(len(idx)) or logits(idx, cache)
    words = "the cat sat on the mat near a big red house and then it ran over the hill".split()
    requests = [Instance("loglikelihood", {}, (" ".join(words[: 2 + i]), " dog"), i) for i in range(9)]
    got = auto.loglikelihood(requests, disable_tqdm=True)
    assert shapes == [2, 2, 2, 3] and lengths[0] > lengths[1]  # slot 0: positions 0-5; slot 1: 6-8
    assert auto.batch_sizes == {0: 2, 1: 3}
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in fixed.loglikelihood(requests, disable_tqdm=True)], abs=1e-5)


def test_the_lm_eval_plugin_entry_point_resolves_to_the_model(tmp_path, monkeypatch):
    """pyproject.toml's [project.entry-points."lm_eval.models"] (the group lm-eval's development
    branch discovers, docs/plugins.md) names the `stateloop` model class. Checked as lm-eval finds
    it: through importlib.metadata, from a distribution whose entry_points.txt holds the pyproject's
    declaration (as pip writes it; the installed package's metadata may predate this checkout's
    pyproject, and then is checked too once it has the group)."""
    import importlib.metadata as md

    from lm_eval.api.registry import get_model

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["lm_eval.models"]
    assert declared == {"stateloop": "stateloop.evaluate.lm:StateLoopEvalLM"}
    dist = tmp_path / "stateloop_check-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: stateloop-check\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[lm_eval.models]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [ep for ep in md.entry_points(group="lm_eval.models") if ep.name == "stateloop"]
    assert found and all(ep.value == declared["stateloop"] for ep in found)
    assert {ep.load() for ep in found} == {StateLoopEvalLM} == {get_model("stateloop")}
