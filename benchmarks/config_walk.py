"""The walk a reader takes from ``stateloop train``'s arguments to the training's first line:
every call of a function of the package, in order, from the command line until
``train.loop.train`` is entered (the resolved config in hand), traced with ``sys.setprofile``;
what modules run as they are imported is not the walk.

    python benchmarks/config_walk.py [--config configs/smoke.yaml] [--run RUN_ID] [--list]

Prints the calls of the package's own functions (comprehensions and lambdas are not calls
here) and how many of their returns go back to another file; then the reader's walk, each
function once at its first call: its stops, the files they are in, and how often the walk
enters each file from another. Run it at two commits to
compare how often a reader changes files on the way."""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))


class Reached(Exception):
    """The walk arrived at the training."""


def walk(argv: list[str]) -> list[tuple[str, str, str]]:
    """(event, file, function) for each call and each return across files, until train() is entered."""
    from stateloop.commands import run_command

    root = str(SRC / "stateloop")
    events: list[tuple[str, str, str]] = []
    stack: list[str] = []

    def importing(frame) -> bool:  # a module's own lines run on import (class bodies, decorators): not the walk
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_code.co_filename.startswith(root):
                return True
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        code = frame.f_code
        if event not in ("call", "return") or not code.co_filename.startswith(root) or code.co_name.startswith("<") \
                or importing(frame):
            return
        where = code.co_filename[len(root) + 1:]
        if event == "call":
            if where == "train/loop.py" and code.co_name == "train":
                raise Reached
            events.append(("call", where, code.co_qualname))
            stack.append(where)
        elif stack:
            stack.pop()
            if stack and stack[-1] != where:
                events.append(("return", stack[-1], code.co_qualname))

    sys.setprofile(profile)
    try:
        run_command(argv)
    except Reached:
        pass
    finally:
        sys.setprofile(None)
    return events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--run", default="smoke/stateloop/K3_ds16_seed1234")
    parser.add_argument("--data-dir", default="/nonexistent-data-dir")
    parser.add_argument("--list", action="store_true", help="print every stop")
    args = parser.parse_args()
    events = walk(["train", "--config", args.config, args.run, "--data-dir", args.data_dir, "--no-progress"])
    calls = [(f, name) for kind, f, name in events if kind == "call"]
    returns = sum(1 for kind, *_ in events if kind == "return")
    # a reader reads a function once: the walk is each function at its first call, in order
    reader = list(dict.fromkeys(calls))
    entries: collections.Counter = collections.Counter(f for i, (f, _) in enumerate(reader) if i == 0 or reader[i - 1][0] != f)
    if args.list:
        for f, name in reader:
            print(f"  {f}: {name}")
    print(f"calls: {len(calls)}, {returns} of their returns to another file")
    print(f"the reader's walk (each function once, at its first call): {len(reader)} stops in {len(entries)} files, "
          f"{sum(entries.values())} entries into a file")
    for f, n in entries.most_common():
        print(f"  {f}: entered {n}x, {sum(1 for g, _ in reader if g == f)} functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
