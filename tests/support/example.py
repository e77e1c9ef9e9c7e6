"""docs/adding-a-model.md's example model, built from the page's own code blocks exactly as written:
its module (as ``stateloop.models.<name>``, from a temporary file), its registry entry (the import
lines run, the ``ModelSpec(...)`` evaluated in the registry's namespace and added to ``MODELS``, its
class to ``model_classes()``) and its test file (a module whose tests
tests/models/test_adding_a_model.py collects and whose ``analytic_forward`` test_flops.py reads).

tests/conftest.py calls :func:`register` before any test module is collected, so every test that
loops over the registry runs on the example too. Nothing is written into the repository.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-model.md"
MARKER = re.compile(r"<!-- example: (\w+) -->\n```python\n(.*?)```", re.S)


def blocks(text: str | None = None) -> dict[str, str]:
    """The page's example blocks by their marker: ``model``, ``registry``, ``test``."""
    found = dict(MARKER.findall(DOC.read_text() if text is None else text))
    missing = {"model", "registry", "test"} - found.keys()
    assert not missing, f"{DOC}: no `<!-- example: NAME -->` python block for {sorted(missing)}"
    return found


def registry_entry(text: str) -> tuple[list[str], str]:
    """(the import lines, the ``ModelSpec(...)`` expression) of the registry block."""
    imports = [line.strip() for line in text.splitlines() if line.strip().startswith(("from ", "import "))]
    spec = text[text.index("ModelSpec("):].rstrip().rstrip(",")
    return imports, spec


def returned_classes(text: str) -> list[str]:
    """The class names in the registry block's ``return`` line (what it adds to model_classes())."""
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("return ")), "")
    return re.findall(r"\b([A-Z]\w*LM)\b", line)


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


NAME: str | None = None  # the example's registered name, once registered
TEST_MODULE = None  # its test file as a module


def register() -> str:
    """Build and register the example (once per process); returns its name."""
    global NAME, TEST_MODULE
    if NAME is not None:
        return NAME
    from stateloop.models import registry

    code = blocks()
    imports, spec_text = registry_entry(code["registry"])
    folder = Path(tempfile.mkdtemp(prefix="adding-a-model-"))
    (folder / "model.py").write_text(code["model"])
    namespace = dict(vars(registry))
    for line in imports:
        module = line.split()[1]
        if importlib.util.find_spec(module) is None:  # the page's new module: its model block
            _load(module, folder / "model.py")
        exec(line, namespace)
    spec = eval(spec_text, namespace)
    cls = namespace[spec.model]
    # model_classes() returns the classes it names: the page must say to add the new one there too
    assert spec.model in returned_classes(code["registry"]), (
        f"{DOC}: the registry block imports {spec.model} but does not add it to the classes model_classes() returns")
    registry.MODELS[spec.name] = spec
    builtin = registry.model_classes
    registry.model_classes = lambda: {**builtin(), cls.__name__: cls}
    sys.path.insert(0, str(ROOT / "tests" / "models"))  # the test file imports test_flops, as in tests/models/
    (folder / f"test_{spec.name}.py").write_text(code["test"])
    NAME = spec.name
    TEST_MODULE = _load(f"example_test_{spec.name}", folder / f"test_{spec.name}.py")
    return NAME


def packaged(name: str) -> bool:
    """Whether the registered model ``name`` is the package's (not the example, built from the page)."""
    return name != NAME
