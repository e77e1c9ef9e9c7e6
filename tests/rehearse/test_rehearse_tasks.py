"""Rehearsal tasks (stateloop.ops.rehearse.task_data): lm-eval's own paper tasks, by their real names, over
small local files in each Hub dataset's schema; evaluated offline through ``stateloop eval`` at 0
and 5 shots, they fill every column of Table 2 and its Avg-8."""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import socket
from pathlib import Path

import pytest
import yaml

from stateloop.config.evaluate import PAPER_TASKS

N_EXAMPLES = 20  # records per split file
LIMIT = 3  # documents scored per task
WINDOW = 128  # the tiny model's context (longer prompts lose tokens on the left)
MODEL_VOCAB = 50304  # >= the GPT-NeoX tokenizer's 50,277 ids
DATA_KEYS = ("dataset_path", "dataset_name", "dataset_kwargs")

# The record schema of the Hub dataset each lm-eval task reads.
SCHEMA = {
    "lambada_openai": {"text"},
    "arc_easy": {"id", "question", "choices", "answerKey"},
    "arc_challenge": {"id", "question", "choices", "answerKey"},
    "winogrande": {"sentence", "option1", "option2", "answer"},
    "piqa": {"goal", "sol1", "sol2", "label"},
    "hellaswag": {"ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split", "split_type", "label"},
    "sciq": {"question", "distractor3", "distractor1", "distractor2", "correct_answer", "support"},
    "race": {"article", "problems"},
    "wikitext": {"page"},
}

# A field of each record that lm-eval's prompt shows verbatim when the record is a few-shot example.
SHOWN = {
    "lambada_openai": lambda d: d["text"].rsplit(" ", 1)[0],  # not the whole text: lm-eval puts two spaces before the last word
    "arc_easy": lambda d: d["question"],
    "arc_challenge": lambda d: d["question"],
    "winogrande": lambda d: d["sentence"][: d["sentence"].index("_")],
    "piqa": lambda d: d["goal"],
    "hellaswag": lambda d: d["ctx_a"],
    "sciq": lambda d: d["support"],
    "race": lambda d: d["article"],
}

_WRITTEN: dict[str, tuple] = {}


@pytest.fixture
def offline(monkeypatch):
    """No Hub, and no network at all: a connection attempt fails the test."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # read once, when datasets was imported
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    connect = socket.socket.connect

    def no_network(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access to {address} in an offline rehearsal")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", no_network)


@pytest.fixture
def written(shared_data, tmp_path_factory):
    """write_tasks(PAPER_TASKS) into a folder shared by this module's tests:
    (out_dir, returned overrides, tasks.json)."""
    for folder in ("lambada-openai", "piqa", "wikitext-2", "gpt-neox-20b"):
        if not (shared_data / folder).is_dir():
            pytest.skip(f"{shared_data / folder} not found")
    key = str(shared_data)
    if key not in _WRITTEN:
        from stateloop.ops.rehearse.task_data import write_tasks

        out = tmp_path_factory.mktemp("rehearse_tasks")
        overrides = write_tasks(PAPER_TASKS, out, shared_data, N_EXAMPLES)
        _WRITTEN[key] = (out, overrides, json.loads((out / "tasks.json").read_text()))
    return _WRITTEN[key]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_lm_evals_own_definitions_over_files_in_the_real_schema(written, shared_data, offline):
    """Each YAML includes lm-eval's installed one under the same task name and overrides only the
    data source; resolved, it equals lm-eval's own config but for where the data comes from. The
    files hold every split lm-eval's config names, in the Hub dataset's schema; the shared data
    is copied as it is."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    out, overrides, manifest = written
    task_dir = Path(overrides["task_dir"])
    assert overrides == {"task_dir": str(out / "yaml")}
    ours = TaskManager(include_path=str(task_dir), include_defaults=False).task_index
    installed = Path(lm_eval.__file__).resolve().parent / "tasks"  # the written include is resolved
    for name in PAPER_TASKS:
        spec = yaml.safe_load((task_dir / f"{name}.yaml").read_text())
        assert set(spec) == {"include", "task", *DATA_KEYS} and spec["task"] == name
        include = Path(spec["include"])
        assert include.is_absolute() and installed in include.parents
        assert (spec["dataset_path"], spec["dataset_name"]) == ("json", None)
        theirs = TaskManager(include_path=str(include.parent), include_defaults=False).task_index[name].cfg
        mine = ours[name].cfg
        assert {k: v for k, v in mine.items() if k not in DATA_KEYS} == {k: v for k, v in theirs.items() if k not in DATA_KEYS}
        splits = {theirs.get(k) for k in ("training_split", "validation_split", "test_split", "fewshot_split")} - {None}
        files = spec["dataset_kwargs"]["data_files"]
        assert set(files) == splits == set(manifest[name]["splits"])
        for split, path in files.items():
            rows = read_jsonl(path)
            assert Path(path).is_absolute() and len(rows) == N_EXAMPLES == manifest[name]["splits"][split]["records"]
            assert all(set(r) == SCHEMA[name] for r in rows), (name, split, rows[0])
            if name in SHOWN and split == (theirs.get("fewshot_split") or theirs.get("training_split") or theirs["test_split"]):
                shown = [SHOWN[name](r) for r in rows]  # distinct, none inside another: the prompt test counts them
                assert all(a == b or a not in b for a in shown for b in shown), name
    # types as the Hub datasets store them
    data = {t: read_jsonl(manifest[t]["splits"][manifest[t]["evaluated_split"]]["file"]) for t in PAPER_TASKS}
    assert all(r["answer"] in ("1", "2") for r in data["winogrande"])
    assert all(isinstance(r["label"], str) and isinstance(r["ind"], int) and len(r["endings"]) == 4 for r in data["hellaswag"])
    assert all(r["answerKey"] in r["choices"]["label"] and len(r["choices"]["label"]) == len(r["choices"]["text"])
               for r in data["arc_easy"] + data["arc_challenge"])
    for r in data["race"]:
        problems = ast.literal_eval(r["problems"])  # a Python literal, as EleutherAI/race stores it
        assert all(set(p) == {"answer", "options", "question"} and len(p["options"]) == 4 for p in problems)
    # the shared files, as they are
    lambada = (shared_data / "lambada-openai" / "lambada_test.jsonl").read_text().splitlines()[:N_EXAMPLES]
    assert data["lambada_openai"] == [json.loads(line) for line in lambada]
    piqa = read_jsonl(shared_data / "piqa" / "valid.jsonl")[:N_EXAMPLES]
    labels = (shared_data / "piqa" / "valid-labels.lst").read_text().split()[:N_EXAMPLES]
    assert data["piqa"] == [{**d, "label": int(y)} for d, y in zip(piqa, labels)]
    assert data["wikitext"][0]["page"].lstrip().startswith("= Robert <unk> =")
    assert all(p["page"].strip() in (shared_data / "wikitext-2" / "test.txt").read_text() for p in data["wikitext"])


def test_a_local_task_dir_name_wins_over_lm_evals_builtin(written, tmp_path, offline):
    """With eval.task_dir holding arc_easy, `arc_easy` is the local task even when a built-in task
    runs beside it (lm-eval's folder indexed first, ours after); with only local tasks lm-eval's
    folder is not indexed. A local YAML may include another by a relative path."""
    from stateloop.config import ConfigError
    from stateloop.config.evaluate import EvalConfig
    from stateloop.evaluate.tasks.prepare import prepare_tasks
    from stateloop.ops.rehearse.task_data import write_tasks

    task_dir = written[1]["task_dir"]
    prepared = prepare_tasks(["arc_easy", "lambada_standard"], tmp_path / "mixed", EvalConfig(task_dir=task_dir))
    assert list(prepared.local) == ["arc_easy"] and prepared.builtin == ["lambada_standard"]
    index = prepared.task_manager.task_index
    assert Path(index["arc_easy"].yaml_path) == prepared.local["arc_easy"]
    assert "lm_eval/tasks/lambada" in index["lambada_standard"].yaml_path.as_posix()
    task = prepared.task_manager.load(["arc_easy"])["tasks"]["arc_easy"]
    assert task.config.dataset_path == "json" and len(task.eval_docs) == N_EXAMPLES  # not the Hub's 2,376

    prepared = prepare_tasks(PAPER_TASKS, tmp_path / "local", EvalConfig(task_dir=task_dir))
    assert set(prepared.local) == set(PAPER_TASKS) and prepared.builtin == []
    assert "lambada_standard" not in prepared.task_manager.task_index
    assert prepared.output_types["wikitext"] == "loglikelihood_rolling"  # read through the include
    assert prepared.output_types["lambada_openai"] == "loglikelihood"
    assert all(prepared.output_types[t] == "multiple_choice" for t in PAPER_TASKS if t not in ("wikitext", "lambada_openai"))

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "again.yaml").write_text(f"include: {os.path.relpath(Path(task_dir) / 'sciq.yaml', mine)}\ntask: sciq_again\n")
    prepared = prepare_tasks(["sciq_again"], tmp_path / "again", EvalConfig(task_dir=str(mine)))
    assert prepared.output_types["sciq_again"] == "multiple_choice"
    assert len(prepared.task_manager.load(["sciq_again"])["tasks"]["sciq_again"].eval_docs) == N_EXAMPLES
    with pytest.raises(ValueError, match="mmlu"):
        write_tasks(["mmlu"], tmp_path / "nope", Path("/nonexistent"))
    # the offline tasks of workflow/tasks/ come along: a config's synth_mc still resolves, and
    # relative data files still need eval.task_data
    small = EvalConfig(task_dir=task_dir, synthetic_examples=6, fewshot_pool=6)
    assert list(prepare_tasks(["synth_mc"], tmp_path / "synth", small).local) == ["synth_mc"]
    with pytest.raises(ConfigError, match="task_data"):
        prepare_tasks(["piqa_local"], tmp_path / "piqa", EvalConfig(task_dir=task_dir))


def _data_dir(folder: Path, shared_data: Path) -> Path:
    """The paper's tokenizer, meta.json and a few held-out shards (from LAMBADA's texts)."""
    from tokenizers import Tokenizer

    from stateloop.data.shards import ShardWriter, token_dtype, write_meta

    folder.mkdir(parents=True)
    shutil.copyfile(shared_data / "gpt-neox-20b" / "tokenizer.json", folder / "tokenizer.json")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    dtype = token_dtype(tok.get_vocab_size())
    writer = ShardWriter(folder, "val", dtype)
    for line in (shared_data / "lambada-openai" / "lambada_test.jsonl").read_text().splitlines()[-10:]:
        writer.add(tok.encode(json.loads(line)["text"], add_special_tokens=False).ids + [eos])
    write_meta(folder, {"dtype": dtype.name, "vocab_size": tok.get_vocab_size(), "eos_id": eos,
                        "tokenizer": {"file": "tokenizer.json"}, "splits": {"val": writer.close()}})
    return folder


def _run_dir(folder: Path, data_dir: Path) -> Path:
    from stateloop.config import to_dict
    from stateloop.models.registry import build_model
    from stateloop.runs import save_final
    from support.models import tiny_config

    cfg = tiny_config("vanilla_looped", vocab_size=MODEL_VOCAB, max_seq_len=WINDOW)
    config = {"run": {"id": f"rehearsal/{cfg.name}/K{cfg.K}_ds{cfg.d_s}_seed1234", "scale": "rehearsal"},
              "model": to_dict(cfg), "data": {"dir": str(data_dir)}}
    save_final(folder, build_model(cfg).eval(), config)
    return folder


@pytest.mark.slow
def test_paper_tasks_evaluate_offline_by_their_real_names(written, shared_data, tmp_path, offline):
    """`stateloop eval` over the written task folder: every paper task under its real name, the eight
    accuracy tasks at 0 and 5 shots and WikiText-2 at 0, each with the metric its table reports;
    the documents are the local files' (sample counts), the 5-shot prompts hold five examples of
    the few-shot split, and Table 2 comes out with all eight columns and Avg-8 at both shot counts."""
    from lm_eval.tasks import TaskManager

    from stateloop.cli import main
    from stateloop.evaluate import metrics as M

    out, overrides, manifest = written
    run_dir = _run_dir(tmp_path / "run", _data_dir(tmp_path / "data", shared_data))
    rc = main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks", *PAPER_TASKS, "--shots", "0", "5",
               "--limit", str(LIMIT), "--batch-size", "32", "--device", "cpu",
               "--set", f"eval.task_dir={overrides['task_dir']}", "eval.heldout_windows=2", "eval.bootstrap_iters=0"])
    assert rc == 0
    res = json.loads((run_dir / "eval.json").read_text())
    assert list(res["tasks"]) == PAPER_TASKS
    accuracy_tasks = [t for t in PAPER_TASKS if t in M.ACCURACY_METRIC]
    assert len(accuracy_tasks) == 8
    for name, entry in res["tasks"].items():
        lm_cfg = TaskManager(include_path=str(Path(manifest[name]["includes"]).parent), include_defaults=False).task_index[name].cfg
        assert entry["source"] == "local" and entry["column"] == name
        assert entry["version"] == lm_cfg["metadata"]["version"]  # lm-eval's definition
        assert set(entry["shots"]) == ({"0", "5"} if name in accuracy_tasks else {"0"})
        written_docs = manifest[name]["splits"][manifest[name]["evaluated_split"]]["records"]
        for shots, block in entry["shots"].items():
            assert block["n_shot"] == int(shots)
            assert block["n_samples"] == {"original": written_docs, "effective": LIMIT}  # the local files' documents
            assert set(block["table"]) == set(M.reported(name)) and all(math.isfinite(v) for v in block["table"].values())
    assert res["tasks"]["wikitext"]["shots"]["0"]["table"]["perplexity"] > 1.0
    assert set(res["tasks"]["lambada_openai"]["shots"]["5"]["table"]) == {"accuracy", "perplexity"}

    # 5-shot prompts: the 0-shot prompt of the same document after five examples of the few-shot split
    samples = run_dir / "eval_samples"
    for name in accuracy_tasks:
        pool_file = manifest[name]["splits"].get("train") or manifest[name]["splits"]["test"]
        pool = {SHOWN[name](d) for d in read_jsonl(pool_file["file"])}
        zero = {s["doc_id"]: s for s in read_jsonl(samples / f"{name}_0shot.jsonl")}
        five = read_jsonl(samples / f"{name}_5shot.jsonl")
        assert len(zero) == len(five) == LIMIT
        for s in five:
            base = zero[s["doc_id"]]
            assert s["doc"] == base["doc"]
            for args, base_args in zip(s["arguments"], base["arguments"]):
                prompt, prompt0 = args[0], base_args[0]
                assert prompt.endswith(prompt0) and args[1] == base_args[1]
                examples = prompt[: -len(prompt0)]
                assert sum(key in examples for key in pool) == 5, (name, examples)

    # Table 2, as the report builds it for the paper's config: eight columns and Avg-8, 0 and 5 shots
    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.report.tables import table2

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "paper.yaml")
    results = tmp_path / "results"
    for run in expand_runs(cfg, ["table1"]):
        (results / "runs" / run.id).mkdir(parents=True)
        shutil.copyfile(run_dir / "eval.json", results / "runs" / run.id / "eval.json")
    df, _ = table2(cfg, results)
    assert sorted(df["shots"].unique()) == [0, 5]
    models = df[df.model != "chance"]
    for column in accuracy_tasks + ["avg8"]:
        assert models[column].notna().all() and models[column].between(0, 100).all(), column
    # the chance row, measured from the examples lm-eval scored: PIQA has two solutions, ARC four
    # (a few ARC questions have three or five), LAMBADA is open-ended
    chance = df[df.model == "chance"].set_index("shots")
    assert (chance.piqa == 50.0).all() and chance.arc_easy.between(20, 34).all() and chance.lambada_openai.isna().all()
