"""Every module of the package imports downward only. The layers, bottom first: a module may import
modules of its own layer and of the layers listed before it, never of one listed after it.

core: the package itself, config/ (every config section, declared once with pydantic; ConfigError) and run_ids.py (the run id)
files: files.py (atomic writes, safe loading, the code version)
models: models/ (the architectures and their registry)
fast: fast.py (switches the fused inference forms the modules declare on and off, from outside models/)
pipeline: experiments.py (a config's experiments expanded into runs, the config checked)
runs: runs.py (run folders, saved weights and configs) and resolve.py (a run's config, resolved to train or evaluate it)
data: data/ (synthetic text, sources, tokenizing, shards, the Hub's cache, the tokenize stage)
export: export/ (a run as a Hugging Face directory)
tracking: tracking/ (MLflow: the store, what runs record, model registration, training's Tracker, the later stages' runs)
stages: the stages that read runs: train/, evaluate/, analysis/
report: report/ (tables, figures, claims)
ops: ops/ (planning: memory, cost, probes, cluster.py; measured.py caches; bench_decode.py; prefetching; warm server; rehearse/)
commands: commands/ (the command table, the parser, one module per command)
cli: cli.py (the console script)

The research code (models/, data/, train/, evaluate/, analysis/, report/: RESEARCH) lies below ops
and so never imports it, nor anything that imports it; the memory gate (ops/memory.py) and the cluster
check (ops/cluster.py) are called by the commands and the Snakefile (workflow/, which this test does
not read) only. Imports are read with ast, function-local and ``if TYPE_CHECKING:`` ones included; a module named
in a string (commands/__init__.py's table, importlib) is not an import. The imports form no cycle
anywhere in src, within a layer either (models/ included: the model modules never import the
registry, which imports them when it builds one).
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "stateloop"

# folder or top module -> its layer: a module takes its folder's layer (no module of a folder is named)
LAYER_OF = {
    "stateloop": "core",
    "stateloop.config": "core",
    "stateloop.run_ids": "core",
    "stateloop.files": "files",
    "stateloop.models": "models",
    "stateloop.fast": "fast",
    "stateloop.experiments": "pipeline",
    "stateloop.runs": "runs",
    "stateloop.resolve": "runs",
    "stateloop.data": "data",
    "stateloop.export": "export",
    "stateloop.tracking": "tracking",
    "stateloop.train": "stages",
    "stateloop.evaluate": "stages",
    "stateloop.analysis": "stages",
    "stateloop.report": "report",
    "stateloop.ops": "ops",
    "stateloop.commands": "commands",
    "stateloop.cli": "cli",
}


def _docstring_layers() -> list[str]:
    """The layer names of this module's docstring, bottom first (its `name: ...` lines)."""
    lines = __doc__.split("\n\n")[1].splitlines()
    return [line.split(":", 1)[0] for line in lines]


ORDER = _docstring_layers()


def _modules() -> dict[str, tuple[Path, bool]]:
    """module name -> (its file, whether it is a package's __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _known(name: str) -> str:
    """The module a dotted name imports: itself, else the closest enclosing module (a name imported
    from a module: ``from stateloop.runs import load_model`` -> stateloop.runs)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> list[tuple[int, str]]:
    """(line, imported stateloop module) of every import in ``module``'s file, nested ones included."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, _known(a.name)) for a in node.names if a.name.split(".")[0] == "stateloop"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "stateloop":
                continue
            for alias in node.names:  # `from stateloop.evaluate import harness` imports a module
                full = f"{source}.{alias.name}"
                out.append((node.lineno, full if full in MODULES else _known(source)))
    return list(dict.fromkeys((line, target) for line, target in out if target != module))


def layer_of(module: str) -> str | None:
    name = module
    while name not in LAYER_OF and "." in name:
        name = name.rpartition(".")[0]
    return LAYER_OF.get(name) if name != "stateloop" or module == "stateloop" else None


def upward_imports() -> list[str]:
    found = []
    for module in MODULES:
        if layer_of(module) is None:
            continue  # test_every_module_has_a_layer names it
        here = ORDER.index(layer_of(module))
        for line, target in imports(module):
            if layer_of(target) is not None and ORDER.index(layer_of(target)) > here:
                found.append(f"{MODULES[module][0].relative_to(SRC.parent)}:{line} imports {target} "
                             f"(layer {layer_of(target)}) from layer {layer_of(module)}")
    return found


def cycles(graph: dict[str, list[str]] | None = None) -> list[list[str]]:
    """The strongly connected components (Tarjan) of more than one module of the import graph
    (``graph``: module -> the modules it imports; None: src's, every import counted)."""
    graph = graph if graph is not None else {m: sorted({t for _, t in imports(m)}) for m in MODULES}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


# The research folders: none imports operations code (stateloop.ops), not even inside a function.
RESEARCH = ("stateloop.models", "stateloop.data", "stateloop.train", "stateloop.evaluate", "stateloop.analysis",
            "stateloop.report")


def _in(module: str, folders) -> bool:
    return any(module == f or module.startswith(f + ".") for f in folders)


def research_imports_of_ops(graph: dict[str, list[str]] | None = None) -> list[str]:
    """``module -> stateloop.ops...`` for every import of operations code by a research module
    (``graph``: module -> the modules it imports; None: src's)."""
    graph = graph if graph is not None else {m: sorted({t for _, t in imports(m)}) for m in MODULES}
    return [f"{m} -> {t}" for m, targets in graph.items() if _in(m, RESEARCH) for t in targets if _in(t, ("stateloop.ops",))]


def test_the_table_names_the_docstrings_layers():
    assert len(set(ORDER)) == len(ORDER) and set(ORDER) == set(LAYER_OF.values()), (ORDER, set(LAYER_OF.values()))


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, f"modules without a layer (add them to LAYER_OF): {missing}"


def test_imports_go_downward_only():
    found = upward_imports()
    assert not found, "imports of a higher layer:\n" + "\n".join(found)


def test_research_code_never_imports_operations():
    """models/, data/, train/, evaluate/, analysis/ and report/ import nothing of ops/ (issue 60: the
    decoding benchmark, the rehearsals' task data, SLURM's timing and the measurement caches moved
    there), and the layers keep it so: ops lies above every research layer."""
    found = research_imports_of_ops()
    assert not found, "research modules importing operations code:\n" + "\n".join(found)
    research_layers = {layer_of(m) for m in MODULES if _in(m, RESEARCH)}
    assert all(ORDER.index(layer) < ORDER.index("ops") for layer in research_layers), research_layers
    assert all(layer_of(m) == "ops" for m in MODULES if _in(m, ("stateloop.ops",)))


def test_a_research_import_of_operations_is_found():
    """The test above is not satisfied by anything: a planted import (the analysis stage reading the
    benchmark's dtypes, as before issue 60) is found, and is an upward import too."""
    graph = {m: sorted({t for _, t in imports(m)}) for m in MODULES}
    graph["stateloop.analysis.stage"] = [*graph["stateloop.analysis.stage"], "stateloop.ops.bench_decode"]
    assert research_imports_of_ops(graph) == ["stateloop.analysis.stage -> stateloop.ops.bench_decode"]
    assert ORDER.index(layer_of("stateloop.ops.bench_decode")) > ORDER.index(layer_of("stateloop.analysis.stage"))


def test_no_import_cycle_in_src():
    """No cycle among src's modules, counting every import (module-level ones, and function-local
    ones too, which a module-level cycle would be hidden behind)."""
    found = cycles()
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle():
    """The test above is not satisfied by anything: a planted cycle (the registry importing the model
    modules and the loop module importing the registry, as before issue 59) is found."""
    graph = {m: sorted({t for _, t in imports(m)}) for m in MODULES}
    assert not cycles(graph)
    graph["stateloop.models.looped"] = [*graph["stateloop.models.looped"], "stateloop.models.registry"]
    assert any({"stateloop.models.looped", "stateloop.models.registry"} <= set(c) for c in cycles(graph))


def test_the_reader_sees_nested_imports():
    """Function-local imports and ``from PACKAGE import MODULE`` are read as imports of that module."""
    assert "stateloop.train.loop" in {t for _, t in imports("stateloop.train.stage")}  # inside _train
    assert "stateloop.evaluate.diagnostics" in {t for _, t in imports("stateloop.evaluate.harness")}


def test_a_folder_tells_its_layer():
    """Every name of the table is a folder or a top module of the package: no module inside a folder
    has a layer of its own."""
    inner = [name for name in LAYER_OF if name.count(".") > 1 or (name.count(".") == 1 and not MODULES[name][1]
                                                                  and name.rpartition(".")[0] != "stateloop")]
    assert not inner, inner


# The package's own modules imported inside a function: at most this many (issue 54 set the budget
# when there were 157), each where a module-level import would cost start-up time (torch and the
# like, in a module a command's parser or a Snakemake rule file imports) or close a cycle.
LOCAL_IMPORT_BUDGET = 60


def local_imports() -> list[tuple[Path, int, str]]:
    """(file, line, its text) of every import of a stateloop module inside a function."""
    found = set()
    for module, (path, _) in MODULES.items():
        lines, own = path.read_text().splitlines(), {line for line, _ in imports(module)}
        for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in own:
                    found.add((path, node.lineno, lines[node.end_lineno - 1]))
    return sorted(found)


def test_function_local_imports_say_why_and_stay_few():
    """Each import of the package's own modules inside a function says on its line why it is not at
    the top (a ``#`` comment), and there are at most LOCAL_IMPORT_BUDGET of them."""
    found = local_imports()
    silent = [f"{path.relative_to(SRC.parent)}:{line}" for path, line, text in found if "#" not in text]
    assert not silent, "function-local imports without a reason comment:\n" + "\n".join(silent)
    assert len(found) <= LOCAL_IMPORT_BUDGET, f"{len(found)} function-local imports of the package's modules"
