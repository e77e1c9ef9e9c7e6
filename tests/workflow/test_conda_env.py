"""`snakemake --software-deployment-method conda`: the env file installs this checkout wherever
Snakemake copies it.

Snakemake 9 (snakemake/deployment/conda.py) copies ``envs/stateloop.yaml`` to
``.snakemake/conda/<hash>.yaml`` under the working directory and runs ``conda env create --file
<that copy> --prefix <env>``; conda (conda/env/installers/pip.py) writes the ``pip:`` list to a
``condaenv.*.requirements.txt`` beside the file it was given and runs ``python -m pip install -U -r
<it>`` from that folder. A relative ``-e ../`` therefore pointed at ``.snakemake/``.

No conda here (and no network for one): the tests put a stand-in ``conda`` first on PATH. It
answers what Snakemake asks (``info --json``, ``--version``, ``config --get channel_priority``)
and, for ``env create``, does what conda's pip installer does (same requirements file, same folder,
same command) with this machine's real pip in ``--dry-run --no-deps --no-index`` mode, recording
what pip would install.

What this proves: the file Snakemake hands to conda, from where conda would run pip and with the
environment Snakemake passes on, makes pip install this workflow's checkout (editable), not
``.snakemake/``; the old ``-e ../`` line fails the same check. What it does not prove: that conda
solves ``python=3.11`` and ``pip`` from conda-forge, that the project's dependencies (or torch
2.13.0, taken here from the installed one) resolve on a cluster, or that conda's code matches
the version of conda/env/installers/pip.py read for this test (no conda runs here).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.dag import ROOT, copy_workflow, env

pytestmark = pytest.mark.slow

FAKE_CONDA = '''#!{python}
"""Stand-in for conda (tests/workflow/test_conda_env.py): records each call in calls.jsonl."""
import json, os, subprocess, sys, tempfile

import yaml

HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the fake installation
args = sys.argv[1:]


def record(**fields):
    with open(os.path.join(HOME, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({{"argv": args, "cwd": os.getcwd(), **fields}}) + "\\n")


def option(name):
    return args[args.index(name) + 1]


if args == ["info", "--json"]:
    print(json.dumps({{"conda_prefix": HOME, "root_prefix": HOME, "platform": "linux-64", "conda_version": "25.1.1"}}))
elif args == ["--version"]:
    print("conda 25.1.1")
elif args[:2] == ["config", "--get"]:
    print(json.dumps({{"get": {{"channel_priority": "strict"}}, "success": True}}))
elif args[:1] == ["clean"]:  # Snakemake's --conda-cleanup-pkgs (default: tarballs)
    record()
elif args[:2] == ["env", "create"]:
    env_file, prefix = option("--file"), option("--prefix")
    spec = yaml.safe_load(open(env_file))
    pip_specs = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    # conda/env/installers/pip.py: the pip list as a requirements file beside the env file, pip
    # run from that folder
    workdir = os.path.dirname(os.path.abspath(env_file))
    req = tempfile.NamedTemporaryFile("w", prefix="condaenv.", suffix=".requirements.txt", dir=workdir, delete=False)
    req.write("\\n".join(pip_specs))
    req.close()
    report = os.path.join(HOME, "pip-report.json")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-U", "-r", req.name, "--exists-action=b",
                           "--dry-run", "--no-deps", "--no-index", "--no-build-isolation", "--quiet", "--report", report],
                          cwd=workdir, capture_output=True, text=True)
    os.remove(req.name)
    record(env_file=env_file, prefix=prefix, content=open(env_file).read(), pip_cwd=workdir,
           pip_rc=proc.returncode, pip_stderr=proc.stderr[-3000:], STATELOOP_ROOT=os.environ.get("STATELOOP_ROOT"))
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        sys.exit(1)
    os.makedirs(os.path.join(prefix, "bin"), exist_ok=True)
else:
    record(unknown=True)
    sys.exit(1)
'''


def fake_conda(home: Path) -> Path:
    (home / "bin").mkdir(parents=True)
    conda = home / "bin" / "conda"
    conda.write_text(FAKE_CONDA.format(python=sys.executable))
    conda.chmod(0o755)
    activate = home / "bin" / "activate"  # sourced by Snakemake for post-deploy scripts and jobs
    activate.write_text(f'echo "activate $*" >> "{home}/activations.log"\n')
    return home


def workflow_with_sources(dest: Path) -> Path:
    """A copy of the workflow with the package sources, so that pip can build it (the build
    writes into the copy, not into the checkout)."""
    work = copy_workflow(dest)
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return work


def calls(home: Path) -> list[dict]:
    path = home / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_snakemake_hands_conda_an_env_that_installs_this_checkout(tmp_path):
    work = workflow_with_sources(tmp_path / "work")
    home = fake_conda(tmp_path / "conda")
    e = env()
    e["PATH"] = f"{home / 'bin'}{os.pathsep}{e['PATH']}"
    e.pop("STATELOOP_ROOT", None)  # the Snakefile sets it
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--software-deployment-method", "conda",
                           "--conda-create-envs-only", "--configfile", "configs/smoke.yaml"],
                          cwd=work, env=e, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    (create,) = [c for c in calls(home) if c["argv"][:2] == ["env", "create"]]  # one env for every rule
    assert not [c for c in calls(home) if c.get("unknown")], calls(home)
    # Snakemake's copy, under .snakemake/conda/, byte for byte the checkout's envs/stateloop.yaml
    env_file = Path(create["env_file"])
    assert env_file.parent == work / ".snakemake" / "conda" and env_file.suffix == ".yaml"
    assert create["content"] == (work / "envs" / "stateloop.yaml").read_text()
    assert Path(create["pip_cwd"]) == env_file.parent
    assert create["STATELOOP_ROOT"] == str(work)
    # what pip would install from there: torch is pinned, the project is this checkout, editable
    spec = yaml.safe_load(create["content"])
    pip_lines = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert "torch==2.13.0" in pip_lines
    report = json.loads((home / "pip-report.json").read_text())
    (project,) = [i for i in report["install"] if i["metadata"]["name"] == "stateloop"]
    assert project["download_info"]["url"] == work.as_uri()
    assert project["download_info"]["dir_info"].get("editable") is True
    assert (work / ".snakemake" / "conda" / (env_file.stem + ".env_setup_done")).exists()
    assert not list(env_file.parent.glob("condaenv.*"))  # the stand-in cleaned up as conda does

    # The same check fails for the old line: from .snakemake/conda/, `-e ../` is .snakemake/.
    old = env_file.parent / "condaenv.old.requirements.txt"
    old.write_text("-e ../\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-U", "-r", old.name, "--dry-run", "--no-deps",
                           "--no-index", "--no-build-isolation", "--quiet"],
                          cwd=old.parent, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and f"{(work / '.snakemake').as_uri()} " in proc.stderr, proc.stderr


def test_env_file_without_the_variable_fails_loudly(tmp_path):
    """Run by hand without STATELOOP_ROOT (docs/cluster.md says to set it), pip stops naming the line
    instead of installing something else."""
    spec = yaml.safe_load((ROOT / "envs" / "stateloop.yaml").read_text())
    pip_lines = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    editable = [line for line in pip_lines if line.startswith("-e")]
    assert editable == ['-e "${STATELOOP_ROOT}"']
    req = tmp_path / "condaenv.req.requirements.txt"
    req.write_text("\n".join(editable) + "\n")
    e = env()
    e.pop("STATELOOP_ROOT", None)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-r", req.name, "--dry-run", "--no-deps", "--no-index",
                           "--quiet"], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "${STATELOOP_ROOT}" in proc.stderr, proc.stderr
