"""``stateloop export``: the directory transformers loads with no stateloop on the path (a
subprocess that cannot import the package), for every registered model; logits equal to the
project's model, greedy ``generate()`` through the model's own cache equal to the project's
cached decoding; the bundled model code is the project's, only its import lines rewritten; stock
lm-eval's HF backend on the export scores a task as ``stateloop eval`` does."""

from __future__ import annotations

import ast
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from stateloop.cli import main
from stateloop.config import ConfigError
from stateloop.data import load_tokenizer
from stateloop.export import hf
from stateloop.models.generate import greedy_generate
from stateloop.models.registry import MODELS
from stateloop.runs import FINAL_WEIGHTS, load_model, saved_config
from support import example

PROMPT_TEXT = "the quick fox<|endoftext|> sat on"  # a special-token string inside a text is plain text
N_NEW = 5

# Run in a fresh interpreter: `python -I` (no PYTHONPATH, no user site, not the cwd), every sys.path
# entry holding a `stateloop` package dropped (the venv's editable install points at a checkout) and
# the name blocked, so an import of the project's code anywhere fails instead of finding it.
LOADER = r"""
import json, os, sys
sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p, "stateloop"))]
sys.modules["stateloop"] = None
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

job = json.loads(sys.argv[1])
out, meta = {}, {}
for name, folder in job["dirs"].items():
    tok = AutoTokenizer.from_pretrained(folder)  # no trust_remote_code: the tokenizer is plain tokenizers
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = tok(job["text"], add_special_tokens=False)["input_ids"]
    prompt = torch.tensor([ids])
    fed = []  # (tokens, a cache was given) of every call of the registry's model
    inner = model.model.forward
    model.model.forward = lambda idx, cache=None, **kw: (fed.append((idx.shape[1], cache is not None)), inner(idx, cache=cache, **kw))[1]
    with torch.no_grad():
        out[name + ".logits"] = model(prompt).logits[0].contiguous()
        fed.clear()
        gen = model.generate(prompt, max_new_tokens=job["n_new"], do_sample=False, eos_token_id=None, pad_token_id=tok.eos_token_id)
        cached_calls = list(fed)
        plain = model.generate(prompt, max_new_tokens=job["n_new"], do_sample=False, use_cache=False, eos_token_id=None,
                               pad_token_id=tok.eos_token_id)
    out[name + ".generated"] = gen[0, len(ids):].contiguous()
    out[name + ".generated_no_cache"] = plain[0, len(ids):].contiguous()
    meta[name] = {"ids": ids, "eos": [tok.eos_token, tok.eos_token_id], "bos": tok.bos_token_id, "calls": cached_calls,
                  "class": type(model).__module__, "window": model.config.max_position_embeddings}
meta["stateloop_modules"] = sorted(m for m, v in sys.modules.items() if (m == "stateloop" or m.startswith("stateloop.")) and v is not None)
save_file(out, job["out"] + ".safetensors")
with open(job["out"] + ".json", "w") as fh:  # not stdout: transformers asks its remote-code question there
    json.dump(meta, fh)
"""


def load_in_clean_interpreter(dirs: dict[str, Path], tmp_path: Path) -> tuple[dict, dict]:
    """(tensors, facts) the loader above produced for the export folders ``dirs``."""
    from safetensors.torch import load_file

    job = {"dirs": {k: str(v) for k, v in dirs.items()}, "text": PROMPT_TEXT, "n_new": N_NEW, "out": str(tmp_path / "loaded")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "STATELOOP"))}
    env |= {"HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-I", "-c", LOADER, json.dumps(job)], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_file(job["out"] + ".safetensors"), json.loads(Path(job["out"] + ".json").read_text())


@pytest.mark.slow
def test_every_model_loads_in_transformers_alone_with_equal_logits_and_cached_generation(make_run, data_dir, tmp_path):
    dirs, models = {}, {}
    for name in filter(example.packaged, MODELS):  # the package's models: an export bundles the package's modules
        run_dir, model = make_run(name)
        dirs[name] = hf.export_run(run_dir, tmp_path / "exports" / name)
        models[name] = model
    got, facts = load_in_clean_interpreter(dirs, tmp_path)
    assert facts.pop("stateloop_modules") == []  # nothing of the package was imported ...
    tok = load_tokenizer(data_dir)
    want_ids = tok.encode(PROMPT_TEXT, add_special_tokens=False).ids
    eos = json.loads((data_dir / "meta.json").read_text())["eos_id"]
    for name, model in models.items():
        f = facts[name]
        assert f["class"].startswith("transformers_modules."), f["class"]  # ... the model is the export's code
        assert f["ids"] == want_ids and f["eos"] == [tok.id_to_token(eos), eos] and f["bos"] is None, name
        prompt = torch.tensor([want_ids])
        with torch.no_grad():
            want = model(prompt).logits[0]
        torch.testing.assert_close(got[name + ".logits"], want, rtol=1e-6, atol=1e-6, msg=name)  # seen: <= 1e-7
        ours = greedy_generate(model, prompt, N_NEW, use_cache=True)[0]
        assert got[name + ".generated"].tolist() == ours.tolist(), name
        assert got[name + ".generated_no_cache"].tolist() == ours.tolist(), name
        # generate() ran the prompt once into the model's cache, then one token per step through it
        assert f["calls"] == [[len(want_ids), True]] + [[1, True]] * (N_NEW - 1), (name, f["calls"])
        assert f["window"] == model.cfg.max_seq_len  # the runs here have no train.seq_len


def test_the_bundle_is_the_projects_code_with_only_import_lines_rewritten():
    """Every stateloop module the remote code needs is there, transformers' own loader finds every
    one of them from modeling_stateloop.py, and no other line differs from the project's source."""
    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    files = hf.bundle()
    assert {"modeling_stateloop.py", "stateloop_models_registry.py", "stateloop_models_looped.py",
            "stateloop_models_baselines_parcae.py", "stateloop_config.py"} <= set(files)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, text in files.items():
            (folder / name).write_text(text)
        found = {Path(p).name for p in get_relative_import_files(str(folder / "modeling_stateloop.py"))}
        assert found | {"modeling_stateloop.py"} == set(files)
        needed = {m for name in files for m in get_imports(str(folder / name))}
        assert needed <= {"torch", "transformers", "yaml", "pydantic", "pydantic_core", "argparse", "dataclasses", "math", "re", "types",
                          "typing", "pathlib", "collections", "contextlib", "functools", "itertools", "threading", "__future__"}, needed
    sources = {}
    for path in hf.PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(hf.PACKAGE_DIR).with_suffix("").parts
        module = ".".join(("stateloop",) + (parts[:-1] if parts[-1] == "__init__" else parts))
        sources[hf.flat_name(module) + ".py"] = path
    for name, text in files.items():
        original = sources[name].read_text().splitlines()
        changed = [line for line in difflib.ndiff(original, text.splitlines()) if line.startswith(("- ", "+ "))]
        assert all(line[2:].lstrip().startswith("from ") and " import " in line for line in changed), (name, changed)
        assert len(changed) % 2 == 0
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("stateloop"), (name, node.module)


def test_a_module_import_cannot_be_bundled(tmp_path, monkeypatch):
    """transformers' loader follows `from .name import x` lines only: `from stateloop.models import
    kernels` would leave kernels.py behind on the Hub, so the export refuses it, naming the line."""
    pkg = tmp_path / "stateloop"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "kernels.py").write_text("X = 1\n")
    (pkg / "models" / "user.py").write_text("from stateloop.models import kernels\n")
    monkeypatch.setattr(hf, "PACKAGE_DIR", pkg)
    with pytest.raises(ConfigError, match=r"user.py:1: imports the module stateloop.models.kernels; a bundled module imports names"):
        hf.bundle("stateloop.models.user")
    (pkg / "models" / "user.py").write_text("from stateloop.models.kernels import (\n    X,\n)\n")
    assert hf.bundle("stateloop.models.user")["stateloop_models_user.py"] == "from .stateloop_models_kernels import (\n    X,\n)\n"


def test_export_command_writes_the_folder_and_says_why_not(make_run, tmp_path, capsys):
    run_dir, _ = make_run("stateloop")
    out = tmp_path / "hf" / "stateloop"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_stateloop.StateLoopForCausalLM"
    assert config["stateloop_model"] == saved_config(run_dir)["model"]
    assert saved_config(out) == saved_config(run_dir)  # the export's weights carry the run's config, as the run's do
    (out / "stale.txt").write_text("x")
    assert main(["export", str(run_dir), "--out", str(out)]) == 0 and not (out / "stale.txt").exists()  # replaced whole
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folders left
    capsys.readouterr()
    (run_dir / FINAL_WEIGHTS).unlink()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run_dir / FINAL_WEIGHTS}: no final weights" in err, err


def _tree(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1) for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["run", "parent", "dot", "empty", "inside", "data"])
def test_an_export_never_writes_over_around_or_into_what_it_reads(data_dir, tmp_path, monkeypatch, capsys, where):
    """An export replaces its folder whole: `--out` the run folder, a folder holding it (its parent,
    the working directory as `.` or ''), a folder inside it, or the run's data folder is refused in
    one line naming the folder, and nothing is touched."""
    from support.evaluation import save_run

    data, run_dir = tmp_path / "data", tmp_path / "runs" / "stateloop"
    shutil.copytree(data_dir, data)
    save_run(run_dir, data, "stateloop")
    monkeypatch.chdir(tmp_path)
    out, named, what = {"run": (str(run_dir), run_dir, "run folder"), "parent": (str(run_dir.parent), run_dir.parent, "run folder"),
                        "dot": (".", tmp_path, "run folder"), "empty": ("", tmp_path, "run folder"),
                        "inside": (str(run_dir / "hf"), run_dir / "hf", "run folder"), "data": (str(data), data, "data folder")}[where]
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stateloop export: error: --out {named.resolve()}: ") and what in err[0], err
    assert _tree(tmp_path) == before


def test_an_export_replaces_only_an_empty_folder_or_an_earlier_export(data_dir, tmp_path, capsys):
    """`--out` a folder of other files (a slip such as `--out ~` or `--out src`) or a file is refused
    in one line and left as it was; an empty folder and an earlier export are replaced."""
    from support.evaluation import save_run

    run_dir = tmp_path / "runs" / "stateloop"
    save_run(run_dir, data_dir, "stateloop")
    other = tmp_path / "src"
    (other / "pkg").mkdir(parents=True)
    (other / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "file").write_text("keep\n")
    for out in (other, tmp_path / "file"):
        before = _tree(tmp_path)
        capsys.readouterr()
        assert main(["export", str(run_dir), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"stateloop export: error: --out {out}: "), err
        assert _tree(tmp_path) == before
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "empty"):  # the second time over the first export
        assert main(["export", str(run_dir), "--out", str(out)]) == 0
        assert json.loads((out / "config.json").read_text())["model_type"] == "stateloop"


@pytest.mark.parametrize("name", ["../tokenizer.json", "ABSOLUTE/tokenizer.json", "ABSOLUTE/notes.txt"])
def test_a_tokenizer_file_outside_the_data_folder_is_refused(data_dir, tmp_path, capsys, name):
    """meta.json's tokenizer.file is a file name inside the data folder, as the shards' names are:
    a path out of it (relative or absolute, to a tokenizer or to any file) is refused in one line."""
    from support.evaluation import save_run

    data, run_dir = tmp_path / "data", tmp_path / "runs" / "stateloop"
    shutil.copytree(data_dir, data)
    shutil.copy(data_dir / "tokenizer.json", tmp_path / "tokenizer.json")  # a good tokenizer, outside the folder
    (tmp_path / "notes.txt").write_text("not a tokenizer\n")
    name = name.replace("ABSOLUTE", str(tmp_path))
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer"] = {"file": name}
    (data / "meta.json").write_text(json.dumps(meta))
    save_run(run_dir, data, "stateloop")
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{data / 'meta.json'}: tokenizer file {name!r} is not a file name inside the data folder" in err[0], err
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_stock_lm_eval_hf_backend_scores_the_export_as_stateloop_eval(make_run, data_dir, tmp_path, monkeypatch):
    """`lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True` (lm-eval's own command
    line, in this process): 2-shot synth_mc, the same prompts and per-request log-likelihoods as
    `stateloop eval` on the run folder (the questions drawn with the run's data settings, which the
    export's weights file records)."""
    from lm_eval.__main__ import cli_evaluate
    from test_lm_cli import assert_synth_mc_equals_the_pipelines

    from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR

    run_dir, _ = make_run("stateloop_mamba2")
    export = hf.export_run(run_dir, tmp_path / "export")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "hf", "--model_args", f"pretrained={export},trust_remote_code=True",
                                      "--device", "cpu", "--tasks", "synth_mc", "--num_fewshot", "2", "--limit", "6",
                                      "--batch_size", "2", "--seed", "0", "--log_samples", "--include_path", str(DEFAULT_TASK_DIR),
                                      "--output_path", str(tmp_path / "out"),
                                      "--metadata", "synthetic_examples=10", "fewshot_pool=10"])
    cli_evaluate()
    (path,) = (tmp_path / "out").rglob("results_*.json")
    res = json.loads(path.read_text()) | {"folder": path.parent}
    assert_synth_mc_equals_the_pipelines(res, run_dir, data_dir, tmp_path / "work")
    model, _ = load_model(run_dir)  # the window lm-eval's HF backend used is the run's
    assert json.loads((export / "config.json").read_text())["max_position_embeddings"] == model.cfg.max_seq_len


def test_a_model_built_from_its_config_alone_has_the_projects_init():
    """StateLoopForCausalLM(config) (no weights: fine-tuning from scratch, tests) initialises as
    training does, the depth-scaled init of models/init.py, not transformers' N(0, 0.02) everywhere."""
    from stateloop.config import to_dict
    from stateloop.export.hf_modeling import StateLoopConfig, StateLoopForCausalLM
    from stateloop.models.registry import build_model
    from support.models import tiny_config

    cfg = tiny_config("stateloop_mamba2")
    torch.manual_seed(3)
    want = build_model(cfg).state_dict()
    torch.manual_seed(3)
    got = StateLoopForCausalLM(StateLoopConfig(stateloop_model=to_dict(cfg))).model.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


# What the outside probe of issue 53 found: a SIGTERM during an export left its temporary folder,
# which later exports never removed; a full-disk export exited 74 with a line that named no path.

# `stateloop export ARGS` in a fresh interpreter whose export receives a real SIGTERM (as from
# `scancel` or `kill`) in the middle of writing its weights.
SIGTERM_DURING_WRITE = r"""
import os, signal, sys
import stateloop.files
real = stateloop.files.write_safetensors
def write(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
stateloop.files.write_safetensors = write
from stateloop.commands import run_command
sys.exit(run_command(sys.argv[1:]))
"""


def _beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def test_a_sigterm_during_an_export_removes_its_temporary_folder_and_keeps_the_earlier_export(data_dir, tmp_path, capsys):
    import stateloop
    from support.evaluation import save_run

    run_dir, out = tmp_path / "runs" / "stateloop", tmp_path / "exports" / "hf"
    save_run(run_dir, data_dir, "stateloop")
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    before = _tree(out)
    env = {**os.environ, "PYTHONPATH": str(Path(stateloop.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SIGTERM_DURING_WRITE, "export", str(run_dir), "--out", str(out)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + 15, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.strip().splitlines() == [f"stateloop export: stopped by SIGTERM; its temporary folder is removed and "
                                                f"{out} holds no partial export"], proc.stderr
    assert _beside(out) == [] and _tree(out) == before


def test_an_export_removes_what_killed_exports_to_its_folder_left_and_only_that(data_dir, tmp_path, capsys):
    """A SIGKILL leaves the temporary folder (and, inside a replacement, the earlier export moved
    aside as .DIR.old): the next export to DIR removes them and says so; a temporary folder another
    export is writing (it holds a lock on it) and other files stay."""
    import fcntl

    from support.evaluation import save_run

    run_dir, out = tmp_path / "runs" / "stateloop", tmp_path / "exports" / "hf"
    save_run(run_dir, data_dir, "stateloop")
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    for name in (".hf.x1y2z3w4.tmp", ".hf.old", ".hf.abcd_123.tmp"):
        (out.parent / name).mkdir()
        (out.parent / name / "config.json").write_text("{}")
    (out.parent / ".hf.notes.tmp").write_text("not ours")  # a file, and not an export's name
    (out.parent / ".other.q1w2e3r4.tmp").mkdir()  # an export to another folder
    busy = os.open(out.parent / ".hf.abcd_123.tmp", os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another export, writing
    try:
        capsys.readouterr()
        assert main(["export", str(run_dir), "--out", str(out)]) == 0
    finally:
        os.close(busy)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stateloop export: {out.parent}: removed 2 folder(s) that interrupted exports to hf left: "
                   f".hf.x1y2z3w4.tmp, .hf.old", f"wrote {out}"], err
    assert _beside(out) == [".hf.abcd_123.tmp", ".hf.notes.tmp", ".other.q1w2e3r4.tmp"]


def test_a_full_disk_export_is_one_line_naming_its_folder_exit_74_and_leaves_nothing(data_dir, tmp_path, capsys):
    from support.disks import mount_tmpfs
    from support.evaluation import save_run

    run_dir, disk = tmp_path / "runs" / "stateloop", tmp_path / "disk"
    save_run(run_dir, data_dir, "stateloop")
    mount_tmpfs(disk, 64 * 1024)  # room for the model code, not for the weights
    try:
        out = disk / "hf"
        capsys.readouterr()
        assert main(["export", str(run_dir), "--out", str(out)]) == 74  # EX_IOERR
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"stateloop export: error: [Errno 28] {out}: export not written (No space left on device); nothing "
                       f"of it is left: free space in {disk} and export again"], err
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)
