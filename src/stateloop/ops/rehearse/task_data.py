"""Small data for lm-eval's own tasks in each Hub dataset's schema, for rehearsing a config offline.

The paper's configurations evaluate with lm-eval's tasks by their real names (``arc_easy``,
``hellaswag``, ...), whose data lm-eval fetches from the Hugging Face Hub. :data:`SOURCES` makes
each task's records; they reach lm-eval in one of two ways:

- ``stateloop rehearse`` writes them as Hub repositories under the real dataset names
  (:mod:`stateloop.ops.rehearse.tasks`), which the stand-in hub serves to the rehearsal's prefetch:
  lm-eval's task YAMLs stay unchanged and resolve their datasets from the caches offline;
- :func:`write_tasks`, with no hub cache at all (tests/rehearse/test_rehearse_tasks.py evaluates
  the nine tasks at 0 and 5 shots this way), writes, for each task,

  - small data files in the record schema and under the split names of the Hub dataset that
    lm-eval's YAML reads (``dataset_path``/``dataset_name``), so that lm-eval's own prompt
    templates and ``!function`` processors run on them unchanged;
  - a task YAML that ``include:``\\s lm-eval's installed YAML, keeps its task name and overrides
    only where the data comes from (``dataset_path: json``, ``dataset_name: null``,
    ``dataset_kwargs.data_files`` with absolute paths). lm-eval resolves the ``!function``
    references of an included YAML relative to that YAML's own folder, so the processors are
    lm-eval's installed ones.

The data: lambada, piqa and wikitext from the shared files (a split the shared data lacks is a
stand-in made of the other end of the file, disjoint where it has room for both); the
multiple-choice tasks from the synthetic corpus's questions; winogrande from templated sentences.
Only the schema is real: the numbers measure nothing, they rehearse the code path.

Every task of the default local folder (``workflow/tasks/``) is copied beside the written YAMLs,
so a config's offline tasks (``synth_mc``, ``*_local``) still resolve with ``eval.task_dir``
pointing here. ``tasks.json`` in ``out_dir`` records what was written.
"""

from __future__ import annotations

import ast
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from stateloop.data.synthetic import ANIMALS, JOBS, PEOPLE, TOWNS, task_examples
from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, piqa_dev, task_yamls, wikitext_pages, write_jsonl
from stateloop.evaluate.tasks.prepare import task_manager

# Splits of lm-eval's YAMLs -> the synthetic generator's splits (disjoint by construction).
SYNTH_SPLIT = {"train": "train", "validation": "val", "test": "test"}
MIN_EXAMPLES = 6  # five few-shot examples plus the scored one, for tasks whose only split is their test split
YAML_FOLDER = "yaml"
DATA_FOLDER = "data"
MANIFEST = "tasks.json"


@dataclass(frozen=True)
class Source:
    dataset: tuple[str, str | None]  # lm-eval's dataset_path, dataset_name: the schema written
    records: Callable  # (split, n, shared_data) -> list of records
    origin: str  # where the content comes from (tasks.json)


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (shared data; see shared/data/README.md)")
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _first_and_last(items: list, split: str, n: int, evaluated: str) -> list:
    """The evaluated split: the first ``n`` items; a stand-in split: the last ``n`` (disjoint
    from the first ``n`` when there are at least ``2 n``)."""
    return items[:n] if split == evaluated else items[-n:]


def _lambada(split: str, n: int, shared: Path) -> list[dict]:
    rows = [json.loads(line) for line in _lines(shared / "lambada-openai" / "lambada_test.jsonl")[:n]]
    return [{"text": r["text"]} for r in rows]


def _piqa(split: str, n: int, shared: Path) -> list[dict]:
    rows = [{"goal": d["goal"], "sol1": d["sol1"], "sol2": d["sol2"], "label": d["label"]}
            for d in piqa_dev(shared / "piqa", "shared data; see shared/data/README.md")]
    return _first_and_last(rows, split, n, "validation")


def _wikitext(split: str, n: int, shared: Path) -> list[dict]:
    name = "test.txt" if split == "test" else "valid.txt"
    path = shared / "wikitext-2" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (shared data; see shared/data/README.md)")
    pages = wikitext_pages(path.read_text(encoding="utf-8"))
    pages = pages[:n] if split == "test" else _first_and_last(pages, split, n, "validation")
    return [{"page": p} for p in pages]


SEEDS = {"arc_easy": 101, "arc_challenge": 102, "hellaswag": 103, "sciq": 104, "race": 105, "winogrande": 106}


def _questions(task: str, split: str, n: int, n_choices: int | None = None) -> list[tuple[str, str, list[str], int]]:
    """``n`` (context, question, choices, label) with distinct contexts, of the synthetic
    multiple-choice task, from the generator's split for lm-eval's ``split``; ``n_choices``: only
    items with that many choices."""
    if split not in SYNTH_SPLIT:
        raise ValueError(f"{task}: no generated data for split {split!r} (known: {', '.join(SYNTH_SPLIT)})")
    out, seen, drawn = [], set(), 0
    while len(out) < n:
        batch = task_examples("synth_mc", SYNTH_SPLIT[split], drawn + 4 * n, SEEDS[task])[drawn:]
        drawn += len(batch)
        for ex in batch:
            context, _, question = ex["question"].partition("\nQuestion: ")
            if context in seen or (n_choices is not None and len(ex["choices"]) != n_choices):
                continue
            seen.add(context)
            out.append((context, question, list(ex["choices"]), ex["label"]))
            if len(out) == n:
                break
    return out


def _arc(task: str) -> Callable:
    """allenai/ai2_arc: id, question, choices {text, label}, answerKey (some items of the real
    set label their choices 1-4 instead of A-D; every fourth one here does too)."""

    def records(split: str, n: int, shared: Path) -> list[dict]:
        prefix = "Rehearsal" + ("Easy" if task == "arc_easy" else "Challenge")
        rows = []
        for i, (context, question, choices, label) in enumerate(_questions(task, split, n)):
            keys = list("1234" if i % 4 == 3 else "ABCD")[: len(choices)]
            rows.append({"id": f"{prefix}_{split}_{i:04d}", "question": f"{context} {question}",
                         "choices": {"text": choices, "label": keys}, "answerKey": keys[label]})
        return rows

    return records


def _sciq(split: str, n: int, shared: Path) -> list[dict]:
    """allenai/sciq: question, distractor3, distractor1, distractor2, correct_answer, support."""
    rows = []
    for context, question, choices, label in _questions("sciq", split, n, n_choices=4):
        wrong = [c for j, c in enumerate(choices) if j != label]
        rows.append({"question": question, "distractor3": wrong[2], "distractor1": wrong[0], "distractor2": wrong[1],
                     "correct_answer": choices[label], "support": context})
    return rows


_SOURCES_OF_TEXT = ["a puzzle book", "a news report", "a cookbook", "a travel guide"]


def _race(split: str, n: int, shared: Path) -> list[dict]:
    """EleutherAI/race (high): article, problems, where problems is a string holding a Python
    literal list of {answer (A-D), options (4), question}, as that dataset stores it. Each article
    gets a cloze-style question (ending in "  _  .", as RACE writes them) and then the question
    that is scored (lm-eval scores an article's last problem, the others go into its prompt)."""
    rng = random.Random(f"rehearse/race/{split}")
    rows = []
    for context, question, choices, label in _questions("race", split, n, n_choices=4):
        kinds = rng.sample(_SOURCES_OF_TEXT, 4)
        problems = [
            {"answer": "ABCD"[kinds.index(_SOURCES_OF_TEXT[0])], "options": kinds,
             "question": "This passage is most likely taken from  _  ."},
            {"answer": "ABCD"[label], "options": choices, "question": question},
        ]
        rows.append({"article": context, "problems": repr(problems)})
    return rows


def _activity(context: str) -> str:
    for start, label in (("The list is", "Sorting numbers"), ("Set ", "Doing sums"), ("Let ", "Following variables")):
        if context.startswith(start):
            return label
    return "Reading about a village"


def _hellaswag(split: str, n: int, shared: Path) -> list[dict]:
    """Rowan/hellaswag: ind, activity_label, ctx_a, ctx_b, ctx, endings (4), source_id, split,
    split_type, label (a string, as in that dataset)."""
    rows = []
    for i, (context, question, choices, label) in enumerate(_questions("hellaswag", split, n, n_choices=4)):
        ctx_b = f'the answer to "{question}"'
        rows.append({"ind": i, "activity_label": _activity(context), "ctx_a": context, "ctx_b": ctx_b,
                     "ctx": f"{context} {ctx_b}", "endings": [f"is {c}." for c in choices],
                     "source_id": f"rehearsal~{split}_{i:04d}", "split": SYNTH_SPLIT[split],
                     "split_type": "indomain", "label": str(label)})
    return rows


# (sentence with "_" for the blank, which of the two people the blank is: 0 the first named, 1 the second)
_WINO_TEMPLATES = [
    ("{a} gave {b} a {animal} because _ was moving away to {town}.", 0),
    ("{a} gave {b} a {animal} because _ had always wanted one.", 1),
    ("{a} asked {b} the way to {town} because _ had never been there.", 0),
    ("{a} asked {b} the way to {town} because _ had grown up there.", 1),
    ("{a} could not catch the {animal}, but {b} could, because _ was much faster.", 1),
    ("{a} could not catch the {animal}, but {b} could, because _ was much slower.", 0),
    ("{a} thanked {b} for feeding the {animal} while _ was away in {town}.", 0),
    ("{a} paid {b} to mend the fence because _ was the only {job} in {town}.", 1),
]


def _winogrande(split: str, n: int, shared: Path) -> list[dict]:
    """allenai/winogrande (winogrande_xl): sentence (one "_"), option1, option2, answer ("1"/"2")."""
    if split not in SYNTH_SPLIT:
        raise ValueError(f"winogrande: no generated data for split {split!r}")
    rng = random.Random(f"rehearse/winogrande/{SEEDS['winogrande']}/{split}")
    rows, seen = [], set()
    while len(rows) < n:
        template, who = rng.choice(_WINO_TEMPLATES)
        a, b = rng.sample(PEOPLE, 2)
        sentence = template.format(a=a, b=b, animal=rng.choice(ANIMALS), town=rng.choice(TOWNS), job=rng.choice(JOBS))
        if sentence.split("_")[0] in seen:
            continue
        seen.add(sentence.split("_")[0])
        options = [a, b] if rng.random() < 0.5 else [b, a]
        rows.append({"sentence": sentence, "option1": options[0], "option2": options[1],
                     "answer": "1" if options[0] == (a, b)[who] else "2"})
    return rows


SOURCES: dict[str, Source] = {
    "lambada_openai": Source(("EleutherAI/lambada_openai", "default"), _lambada,
                             "shared lambada-openai/lambada_test.jsonl (first lines)"),
    "arc_easy": Source(("allenai/ai2_arc", "ARC-Easy"), _arc("arc_easy"), "generated (synthetic multiple choice)"),
    "arc_challenge": Source(("allenai/ai2_arc", "ARC-Challenge"), _arc("arc_challenge"),
                            "generated (synthetic multiple choice)"),
    "winogrande": Source(("allenai/winogrande", "winogrande_xl"), _winogrande, "generated (templated sentences)"),
    "piqa": Source(("baber/piqa", None), _piqa,
                   "shared piqa/valid.jsonl + valid-labels.lst (validation: first items; train stand-in: last items)"),
    "hellaswag": Source(("Rowan/hellaswag", None), _hellaswag, "generated (synthetic multiple choice)"),
    "sciq": Source(("allenai/sciq", None), _sciq, "generated (synthetic multiple choice)"),
    "race": Source(("EleutherAI/race", "high"), _race, "generated (synthetic multiple choice)"),
    "wikitext": Source(("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1"), _wikitext,
                       "shared tokenized wikitext-2 (test: test.txt; validation: first articles of valid.txt; "
                       "train stand-in: its last articles)"),
}


def lm_eval_yamls(tasks: list[str]) -> dict[str, tuple[Path, dict]]:
    """Task -> (lm-eval's installed YAML, its config with includes resolved), from lm-eval's own
    index over the folders of those tasks (:func:`~stateloop.evaluate.tasks.prepare.task_manager`)."""
    index = task_manager(list(tasks)).task_index
    out = {}
    for name in tasks:
        entry = index.get(name)
        if entry is None or entry.yaml_path is None or not entry.cfg:
            raise ValueError(f"{name}: not a task of the installed lm-eval")
        out[name] = (Path(entry.yaml_path).resolve(), dict(entry.cfg))
    return out


def task_splits(cfg: dict) -> list[str]:
    """Every split lm-eval's config names (evaluated, training, validation, few-shot)."""
    names = [cfg.get(k) for k in ("training_split", "validation_split", "test_split", "fewshot_split")]
    fewshot = cfg.get("fewshot_config") or {}
    names.append(fewshot.get("split") if isinstance(fewshot, dict) else None)
    return list(dict.fromkeys(s for s in names if s))


def check_records(name: str, rows: list[dict]) -> None:
    """Cheap checks of what lm-eval's processors assume of the schema."""
    for r in rows:
        if name == "race":
            ok = all(len(p["options"]) == 4 and p["answer"] in "ABCD" for p in ast.literal_eval(r["problems"]))
        elif name == "winogrande":
            ok = r["sentence"].count("_") == 1 and r["answer"] in ("1", "2")
        elif name in ("arc_easy", "arc_challenge"):
            ok = r["answerKey"] in r["choices"]["label"]
        else:
            ok = True
        if not ok:
            raise ValueError(f"{name}: a written record does not fit lm-eval's processors: {r}")


def write_tasks(tasks: list[str], out_dir: Path, shared_data: Path, n_examples: int = 20) -> dict:
    """Write data files and task YAMLs for lm-eval's ``tasks`` (real names) into ``out_dir``, at most
    ``n_examples`` records a split; returns the ``eval:`` overrides that evaluate them (``task_dir``).
    Names of ``workflow/tasks/`` are copied, not written; any other name not in :data:`SOURCES` is
    an error (it would need the Hub)."""
    if n_examples < MIN_EXAMPLES:
        raise ValueError(f"n_examples: at least {MIN_EXAMPLES} (five-shot prompts need five examples besides the scored one)")
    out_dir, shared_data = Path(out_dir).resolve(), Path(shared_data).resolve()
    local = task_yamls(DEFAULT_TASK_DIR)
    unknown = [t for t in tasks if t not in SOURCES and t not in local]
    if unknown:
        raise ValueError(f"no offline data for lm-eval task(s) {', '.join(unknown)} (rehearsable: {', '.join(SOURCES)}; "
                         f"local tasks of {DEFAULT_TASK_DIR}: {', '.join(local)})")
    yaml_dir = out_dir / YAML_FOLDER
    yaml_dir.mkdir(parents=True, exist_ok=True)
    for path in local.values():  # the config's offline tasks keep resolving from the new task_dir
        shutil.copyfile(path, yaml_dir / path.name)
    real = [t for t in tasks if t in SOURCES]
    installed = lm_eval_yamls(real) if real else {}
    manifest_path = out_dir / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    for name in real:
        source = SOURCES[name]
        lm_yaml, cfg = installed[name]
        dataset = (cfg.get("dataset_path"), cfg.get("dataset_name"))
        if dataset != source.dataset:
            raise ValueError(f"{lm_yaml}: lm-eval's {name} reads {dataset[0]} ({dataset[1]}), not "
                             f"{source.dataset[0]} ({source.dataset[1]}) whose schema this module writes")
        files = {}
        for split in task_splits(cfg):
            rows = source.records(split, n_examples, shared_data)
            if not rows:
                raise ValueError(f"{name}: no records for split {split!r} from {source.origin}")
            check_records(name, rows)
            path = out_dir / DATA_FOLDER / name / f"{split}.jsonl"
            write_jsonl(path, rows)
            files[split] = (path, len(rows))
        spec = {"include": str(lm_yaml), "task": name, "dataset_path": "json", "dataset_name": None,
                "dataset_kwargs": {"data_files": {s: str(p) for s, (p, _) in files.items()}}}
        header = (f"# lm-eval's {name} ({lm_yaml.parent.name}/{lm_yaml.name}) over small local files in the schema of\n"
                  f"# {source.dataset[0]}" + (f" ({source.dataset[1]})" if source.dataset[1] else "") +
                  f": {source.origin}. Written by stateloop.ops.rehearse.task_data;\n"
                  f"# only where the data comes from is overridden (prompt, processors, metrics: the included YAML).\n")
        text = header + yaml.safe_dump(spec, sort_keys=False)
        tmp = yaml_dir / f".{name}.yaml.tmp"
        tmp.write_text(text)
        tmp.replace(yaml_dir / f"{name}.yaml")
        manifest[name] = {"yaml": str(yaml_dir / f"{name}.yaml"), "includes": str(lm_yaml),
                          "dataset": "/".join(s for s in source.dataset if s), "origin": source.origin,
                          "evaluated_split": cfg.get("test_split") or cfg.get("validation_split"),
                          "splits": {s: {"file": str(p), "records": k} for s, (p, k) in files.items()}}
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return {"task_dir": str(yaml_dir)}
