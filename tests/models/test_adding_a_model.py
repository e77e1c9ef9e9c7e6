"""docs/adding-a-model.md is a test: its example model is built from the page's code blocks exactly as
written and registered (tests/support/example.py, from tests/conftest.py), so every test that loops
over the registry runs on it; its own test file's tests run here; and the page's code passes the
project's lint (ruff, as configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

from stateloop.models.registry import MODELS, build_model
from support import example
from support.models import tiny_config

globals().update({k: v for k, v in vars(example.TEST_MODULE).items() if k.startswith("test_")})  # the page's tests

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_is_registered_from_the_page():
    assert example.NAME == "looped_iter_emb" and example.NAME in MODELS
    model = build_model(tiny_config(example.NAME))
    assert type(model).__module__ == "stateloop.models.looped_iter_emb" and type(model).per_iteration == ("iter_emb",)


@pytest.mark.parametrize("block", ["model", "test"])
def test_the_pages_code_passes_the_lint(block, tmp_path):
    """ruff with the project's settings on the page's files as they would sit in the repository (the
    import order of ``from test_flops import layer`` included, issue 59)."""
    where = {"model": "src/stateloop/models/looped_iter_emb.py", "test": "tests/models/test_looped_iter_emb.py"}[block]
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.is_file():
        pytest.skip(f"no ruff beside {sys.executable} (scripts/run.sh installs it into .venv)")
    out = subprocess.run([str(ruff), "check", "--stdin-filename", where, "-"], input=example.blocks()[block], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_registry_block_names_an_import_and_a_spec():
    imports, spec = example.registry_entry(example.blocks()["registry"])
    assert imports == ["from stateloop.config.model import refuse_past_trained",
                       "from stateloop.models.looped_iter_emb import IterEmbLM  # torch"]
    assert spec.startswith('ModelSpec("looped_iter_emb", "IterEmbLM"') and spec.endswith(")")
    # Followed from a clean clone on 2026-12-07, the import line alone left the class out of
    # model_classes(): `build_model` raised KeyError 'IterEmbLM' outside the tests and ruff called the
    # import unused. The block now says where the class goes, and the example is registered only if so.
    assert example.returned_classes(example.blocks()["registry"])[-1] == "IterEmbLM"
    assert example.returned_classes("    return {c.__name__: c for c in (LoopedLM, PonderLM)}") == ["LoopedLM", "PonderLM"]
