"""Figures of the source tree that the design passes track (issue 54): lines of src, function-local
imports of the package's own modules, and the files a command crosses to reach a model's forward.

    python scripts/tree_figures.py                       # lines and imports
    python scripts/tree_figures.py --stack train ARGS..  # + the stateloop files on the call stack at
                                                         #   the first model forward of `stateloop ARGS`

"Command -> forward" counts the distinct files of the stateloop package on the Python call stack at
the moment the first model forward starts (its own file included), from the console script inward:
the files a reader follows from the command to the model.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "stateloop"


def src_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in SRC.rglob("*.py"))


def local_imports() -> list[tuple[Path, int]]:
    """(file, line) of every import of a stateloop module inside a function."""
    seen = set()
    for path in SRC.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                own = (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "stateloop")) \
                    or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "stateloop" for a in node.names))
                if own:
                    seen.add((path, node.lineno))
    return sorted(seen)


def stack_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """The stateloop files on the stack at the first model forward of ``stateloop ARGV``."""
    import torch.nn as nn

    found: list[str] = []

    class Reached(BaseException):
        pass

    def hook(module, args, kwargs):
        if found or type(module).__module__.split(".")[:2] != ["stateloop", "models"]:
            return None
        frame, files = sys._getframe(), []
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(str(SRC)) and name not in files:
                files.append(name)
            frame = frame.f_back
        found.extend(str(Path(f).relative_to(SRC.parent)) for f in reversed(files))
        raise Reached

    called: dict[str, int] = {}

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(str(SRC)) and not found and frame.f_code.co_name != "<module>":
            called[name] = called.get(name, 0) + 1

    nn.modules.module.register_module_forward_pre_hook(lambda m, a: hook(m, a, None))
    sys.setprofile(profile)
    from stateloop.cli import main

    sys.argv = ["stateloop", *argv]
    try:
        main()
    except (Reached, SystemExit):
        pass
    sys.setprofile(None)
    return found, sorted(str(Path(f).relative_to(SRC.parent)) for f in called)


if __name__ == "__main__":
    print(f"src lines: {src_lines():,}")
    print(f"function-local imports of stateloop modules: {len(local_imports())}")
    if "--stack" in sys.argv:
        files, ran = stack_files(sys.argv[sys.argv.index("--stack") + 1:])
        print(f"command -> forward: {len(files)} files on the stack")
        print("\n".join("  " + f for f in files))
        print(f"files whose functions ran before the first forward: {len(ran)}")
        print("\n".join("  " + f for f in ran))
