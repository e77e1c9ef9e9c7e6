"""``stateloop export RUN --out DIR``: a run folder as a Hugging Face model directory (config.json,
model.safetensors, tokenizer files, modeling_stateloop.py and the ``stateloop_*.py`` modules it
imports), so ``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(DIR)`` load it with no stateloop installed.

The model code is the project's own, copied at export time: the modules reached from
:mod:`stateloop.export.hf_modeling` are copied flat (``stateloop.models.backbone`` as
``stateloop_models_backbone.py``) and their imports rewritten to ``from .stateloop_models_backbone
import ...``. [choice] Flat files and rewritten imports, because transformers' remote-code loader
copies only the files named by single-level ``from .name import`` lines; :func:`bundle` refuses
any other form, naming the line. Tokenization is as ``stateloop eval`` does it (no added special
tokens, no BOS; the end-of-document token starts a document). Nothing here needs transformers.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import stateloop
from stateloop.config import ConfigError
from stateloop.data.shards import read_meta
from stateloop.data.tokenizer import load_tokenizer, meta_eos_id, tokenizer_file
from stateloop.files import code_version, current_umask, write_safetensors
from stateloop.runs import load_model, run_id_of, saved_run_config, trained_length, weights_metadata

ENTRY = "stateloop.export.hf_modeling"
MODELING_FILE = "modeling_stateloop.py"  # the entry module's name in an export (transformers' convention)
CONFIG_CLASS, MODEL_CLASS = "StateLoopConfig", "StateLoopForCausalLM"
HF_WEIGHTS = "model.safetensors"
PREFIX = "model."  # StateLoopForCausalLM keeps the registry's model as self.model
PACKAGE_DIR = Path(stateloop.__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# The modeling files


def source_file(module: str) -> Path | None:
    """The source file of ``stateloop[.a.b]`` (a module or a package's __init__), or None."""
    rel = Path(*module.split(".")[1:])
    for path in (PACKAGE_DIR / rel.with_suffix(".py"), PACKAGE_DIR / rel / "__init__.py"):
        if module != "stateloop" and path.is_file():
            return path
    return None


def flat_name(module: str) -> str:
    """The file a module becomes in an export: ``stateloop.models.backbone`` -> ``stateloop_models_backbone``."""
    return MODELING_FILE[:-3] if module == ENTRY else module.replace(".", "_")


def _is_ours(module: str | None) -> bool:
    return module is not None and (module == "stateloop" or module.startswith("stateloop."))


def rewrite(module: str) -> tuple[str, list[str]]:
    """(the module's source with its stateloop imports made flat and relative, the stateloop
    modules it imports). A form the remote-code loader cannot follow is a ConfigError naming the line."""
    path = source_file(module)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    needed = []
    for node in ast.walk(ast.parse(text, str(path))):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import) and any(_is_ours(a.name) for a in node.names):
            raise ConfigError(f"{where}: `import stateloop...` cannot be bundled into an export; import names (from M import name)")
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            raise ConfigError(f"{where}: a relative import cannot be bundled into an export; spell it from stateloop...")
        if not _is_ours(node.module):
            continue
        if source_file(node.module) is None:
            raise ConfigError(f"{where}: {node.module} is not a module of the package")
        for alias in node.names:
            if source_file(f"{node.module}.{alias.name}") is not None:
                raise ConfigError(f"{where}: imports the module {node.module}.{alias.name}; a bundled module imports "
                                  f"names (from {node.module}.{alias.name} import ...), which transformers' loader follows")
        i = node.lineno - 1
        new, n = re.subn(rf"\bfrom\s+{re.escape(node.module)}\s+import\b", f"from .{flat_name(node.module)} import", lines[i], count=1)
        if n != 1:
            raise ConfigError(f"{where}: write `from {node.module} import` on one line to bundle it into an export")
        lines[i] = new
        needed.append(node.module)
    return "".join(lines), needed


def bundle(entry: str = ENTRY) -> dict[str, str]:
    """{file name: source} of ``entry`` and every stateloop module it reaches, rewritten (module docstring)."""
    files, todo, seen = {}, [entry], {entry}
    while todo:
        module = todo.pop()
        text, needed = rewrite(module)
        files[flat_name(module) + ".py"] = text
        for dep in needed:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return dict(sorted(files.items()))


# ----------------------------------------------------------------------------------------------
# The export


def hf_config(model_section: dict, context: int, eos_id: int, run: dict) -> dict:
    """config.json: what transformers reads (StateLoopConfig's keys, auto_map) and lm-eval's HF
    backend uses (max_position_embeddings: its window, as ``stateloop eval``'s)."""
    module = MODELING_FILE[:-3]
    return {
        "architectures": [MODEL_CLASS],
        "auto_map": {"AutoConfig": f"{module}.{CONFIG_CLASS}", "AutoModelForCausalLM": f"{module}.{MODEL_CLASS}"},
        "model_type": "stateloop",
        "stateloop_model": model_section,
        "stateloop_run": run,
        "vocab_size": model_section["vocab_size"],
        "max_position_embeddings": context,
        "eos_token_id": eos_id,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def tokenizer_files(tokenizer_json: str, eos_token: str, context: int) -> dict[str, str]:
    """tokenizer.json (the data folder's own bytes) and the two small files around it."""
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token, "model_max_length": context,
           "split_special_tokens": True, "clean_up_tokenization_spaces": False, "add_bos_token": False}
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": json.dumps(cfg, indent=2) + "\n",
            "special_tokens_map.json": json.dumps({"eos_token": eos_token}, indent=2) + "\n"}


def check_out(out: Path, folder: Path, what: str) -> None:
    """An export replaces ``out`` whole, so ``out`` is never a folder it reads, one holding it
    (a parent, the working directory as ``.`` or ''), or one inside it: a one-line ConfigError."""
    o, f = out.resolve(), folder.resolve()
    how = "is" if o == f else "holds" if o in f.parents else "is inside" if f in o.parents else None
    if how:
        raise ConfigError(f"--out {o}: {how} the {what} {f}, which the export reads; an export replaces its folder "
                          f"whole: choose a folder outside it")


def check_replaceable(out: Path) -> None:
    """An existing ``out`` is replaced whole only when it is empty or an earlier export (its
    config.json says ``model_type: stateloop``); any other folder or file is refused in one line,
    so a slip such as ``--out ~`` or ``--out src`` never deletes what is there."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ConfigError(f"--out {out}: exists and is not a folder; an export writes a folder there: choose a new path")
    if not any(out.iterdir()):
        return
    try:
        earlier = json.loads((out / "config.json").read_text(encoding="utf-8")).get("model_type") == "stateloop"
    except (OSError, ValueError, AttributeError):
        earlier = False
    if not earlier:
        raise ConfigError(f"--out {out}: a folder that is not an earlier export (no config.json of model_type "
                          f"stateloop); an export replaces its folder whole: choose a new or empty folder")


def _temp_name(out: Path) -> re.Pattern:
    """The names of the temporary folders that exports to ``out`` write beside it (mkdtemp's
    ``.<name>.XXXXXXXX.tmp``)."""
    return re.compile(rf"\.{re.escape(out.name)}\.[a-z0-9_]{{8}}\.tmp")


def _hold(folder: Path) -> int | None:
    """Lock ``folder`` (flock on its descriptor, released when the process ends, however it ends):
    an export holds its temporary folder so that another export's :func:`_leftovers` leaves it be.
    None where the file system has no flock for folders (some network file systems)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return None
    return fd


def _leftovers(out: Path) -> list[Path]:
    """What interrupted exports to ``out`` left beside it (a SIGKILL, a power cut): their temporary
    folders, except one a running export holds (:func:`_hold`), and ``.<name>.old``, the earlier
    export a replacement moved aside, once ``out`` is in place again."""
    found, temp = [], _temp_name(out)
    if out.parent.is_dir():
        for path in sorted(out.parent.iterdir()):
            if not temp.fullmatch(path.name) or path.is_symlink() or not path.is_dir():
                continue
            try:
                fd = _hold(path)
            except OSError:
                continue  # another export is writing it
            if fd is not None:
                os.close(fd)
            found.append(path)
    old = out.with_name(f".{out.name}.old")
    if out.is_dir() and old.is_dir() and not old.is_symlink():
        found.append(old)
    return found


def _remove_leftovers(out: Path, log) -> None:
    leftovers = _leftovers(out)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    if leftovers and log is not None:
        log(f"{out.parent}: removed {len(leftovers)} folder(s) that interrupted exports to {out.name} left: "
            f"{', '.join(p.name for p in leftovers)}")


def export_run(run_dir: str | Path, out: str | Path, log=None) -> Path:
    """Write the Hugging Face directory of a run folder to ``out``, replaced whole (written beside
    it, then renamed): :func:`check_out` and :func:`check_replaceable` say which ``out`` may be
    used. An exception or signal leaves ``out`` as it was; what a killed export left beside it the
    next export removes (``log`` says so). A failed write is one OSError naming ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    check_out(out, run_dir, "run folder")
    model, saved = load_model(run_dir)  # one line naming the file when the weights are missing or wrong
    config = saved_run_config(run_dir, saved)
    if not config.data.dir:
        raise ConfigError(f"{run_dir}: the saved config has no data.dir (where the run's tokenizer is)")
    data_dir = Path(config.data.dir)
    check_out(out, data_dir, "data folder")
    check_replaceable(out)
    meta = read_meta(data_dir)
    tok = load_tokenizer(data_dir)  # checked against meta.json's sha256
    eos_id = meta_eos_id(data_dir)
    eos_token = tok.id_to_token(eos_id)
    if eos_token is None:
        raise ConfigError(f"{data_dir / 'meta.json'}: eos_id {eos_id} is not in the tokenizer's vocabulary")
    context = trained_length(config) or model.cfg.max_seq_len  # the window `stateloop eval` scores with
    tok_json = tokenizer_file(data_dir, meta).read_text(encoding="utf-8")
    run = {"id": run_id_of(run_dir, config), "code_version": code_version()}

    # The saved model section and config go over verbatim (the typed read above checked them).
    files = {"config.json": json.dumps(hf_config(saved["model"], context, eos_id, run), indent=2) + "\n",
             **tokenizer_files(tok_json, eos_token, context), **bundle()}
    _remove_leftovers(out, log)  # first: a full disk may be full of them
    held = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as err:
        raise _not_written(out, err) from None
    try:
        held = _hold(tmp)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        write_safetensors(tmp / HF_WEIGHTS, {PREFIX + k: v for k, v in model.state_dict().items()}, weights_metadata(saved))
        tmp.chmod(0o777 & ~current_umask())
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            try:
                tmp.rename(out)
            except BaseException:
                old.rename(out)  # the earlier export back in place
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise _not_written(out, err) from None
        raise
    finally:
        if held is not None:
            os.close(held)
    _remove_leftovers(out, log)  # an earlier export that a killed replacement had moved aside
    return out


def _not_written(out: Path, err: OSError) -> OSError:
    """The one-line OSError of an export that could not be written (a full disk: the write's own
    error names no file), naming ``out``; nothing of it is left."""
    why = os.strerror(err.errno) if err.errno else str(err)
    then = f": free space in {out.parent} and export again" if err.errno == errno.ENOSPC else ""
    return OSError(err.errno, f"{out}: export not written ({why}); nothing of it is left{then}")

