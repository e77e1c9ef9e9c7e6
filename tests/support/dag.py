"""Running the Snakemake DAG from tests: a copy of the workflow and a subprocess."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_workflow(dest: Path) -> Path:
    """The files of the checkout a DAG needs (tracked or not ignored), without results."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for rel in files:
        src = ROOT / rel
        if rel.startswith(("src/", "tests/", "benchmarks/")) or not src.exists():
            continue  # the installed package runs from the checkout's src/
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)
    return dest


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"  # stateloop, snakemake
    e["PYTHONPATH"] = str(ROOT / "src")
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


def snakemake(cwd: Path, *args, check: bool = True, timeout: int = 600,
              extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` in ``cwd``, in :func:`env` with ``extra_env``'s entries set."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env={**env(), **(extra_env or {})},
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def embedded(html: str, name: str, script: str):
    """The JSON a Snakemake 9 report assigns to ``var NAME = ...;`` in its ``<script id=SCRIPT>``
    (the JavaScript libraries inlined before it hold such lines too)."""
    start = html.index(f"var {name} = ", html.index(f'<script id="{script}">')) + len(f"var {name} = ")
    return json.JSONDecoder().raw_decode(html, start)[0]


def text_of(caption_html: str) -> str:
    """An HTML fragment of a report as plain text, whitespace collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", caption_html))


def jobs(dry_run_output: str) -> list[dict]:
    """Jobs of a dry run: rule name, output and resources of each."""
    out, current = [], None
    for line in dry_run_output.splitlines():
        m = re.match(r"^(?:local)?rule (\w+):", line)
        if m:
            current = {"rule": m.group(1)}
            out.append(current)
        elif current is not None and line.strip().startswith(("output:", "resources:", "wildcards:", "threads:")):
            key, _, value = line.strip().partition(": ")
            current[key] = value
    return out
