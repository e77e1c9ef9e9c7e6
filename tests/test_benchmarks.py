"""The state branch's benchmark scripts run end to end at a tiny shape and print their verdict
lines. Their figures belong in benchmarks/README.md, never in a test (timings on a shared machine
are noise); what is checked here is that the scripts still run against the package as it is, and
that each x floor they print is a number."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"-?\d+\.\d\d"

BRANCH = "bench_state_branch.py"  # the state branch's CPU cost, one subcommand per measurement
RUNS = {  # test id -> (script, its arguments at the smallest setting)
    "decode": (BRANCH, ["decode", "--layers", "1", "--width", "64", "--prefill", "4", "--tokens", "4", "--rounds", "1",
                        "--plain", "--printed"]),
    "train": (BRANCH, ["train", "--layers", "1", "--width", "64", "--seq", "16", "--rounds", "2", "--vocab", "256",
                       "--groups", "2"]),
    "pieces": (BRANCH, ["pieces", "--width", "64", "--seq", "16", "--rounds", "4", "--inner", "1"]),
    "cold": (BRANCH, ["cold", "--layers", "1", "--width", "64", "--prefill", "4", "--tokens", "4", "--hot", "5"]),
    "whole": (BRANCH, ["whole", "--layers", "1", "--width", "64", "--batch", "1", "--seq", "8", "--rounds", "4",
                       "--vocab", "256"]),
    "bench_plan.py": ("bench_plan.py", ["--config", "configs/tiny.yaml", "--warm", "1", "--no-snakemake"]),
    "bench_memory.py": ("bench_memory.py", ["--layers", "1", "--width", "64", "--seq", "16", "--batch", "2", "--vocab",
                                            "256", "--chunk", "8", "--rounds", "1"]),
}
VARIANTS = ("stateloop", "stateloop_attn", "stateloop_mamba2")


@pytest.mark.parametrize("run", RUNS)
def test_a_benchmark_runs_at_a_tiny_shape(run, monkeypatch, capsys):
    """Run in this process, as ``python benchmarks/<script> ...`` would (the imports are paid once)."""
    script, argv = RUNS[run]
    monkeypatch.setattr(sys, "argv", [script, *argv])
    monkeypatch.setattr(sys, "path", [str(ROOT / "benchmarks"), *sys.path])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    finally:
        torch.set_num_threads(threads)  # the state branch's measurements pin one thread
    out = capsys.readouterr().out
    if run in ("decode", "train", "pieces", "whole"):
        # stateloop:plain's logits were checked equal first; vanilla:<piece> are the backbone's sub-blocks
        extra = {"decode": ("stateloop:plain", *(f"{v}:printed" for v in VARIANTS), "vanilla:attention", "vanilla:swiglu"),
                 "train": ("vanilla:attention", "vanilla:swiglu")}.get(run, ())
        for variant in (*VARIANTS, *extra):
            line = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == variant)
            assert re.search(NUMBER, line), line
        if run == "pieces":  # one token's forward, fused against printed (checked close first): both times, their ratio
            for piece in ("backbone attention", "StateLoop cell", "attention mixer"):
                line = [ln for ln in out.splitlines() if ln.startswith(piece)][-1]
                assert len(re.findall(r"\d+\.\d+", line[len(piece) :])) == 3, line
    elif run == "bench_memory.py":  # saved MiB, its ratio, step s, time ratio for every setting; per-token rows
        for setting in ("none", "layer", "iteration", "none + loss/8", "iteration + loss/8", "layer, branch kept"):
            assert any(re.match(rf"\s+{re.escape(setting)}\s+-?\d+\.\d\s+\d+\.\d{{3}}\s+\d+\.\d\d", ln)
                       for ln in out.splitlines()), (setting, out)
        assert out.count("per token (") == 2
    elif run == "bench_plan.py":  # a cold and a warm plan of tiny.yaml, each with its wall and CPU seconds
        for what in ("plan, cold", "plan, warm (median of 1)"):
            assert re.search(rf"after\s+{re.escape(what)}\s+\d+\.\d\s+\d+\.\d", out), (what, out)
    else:  # cold: its step-by-step cell and SwiGLU were checked equal to the modules first
        for piece in import_benchmark("bench_state_branch").COLD_PIECES:
            line = next(ln for ln in out.splitlines() if ln.startswith(piece))
            assert len(re.findall(r"\d+\.\d+", line[len(piece) :])) == 3, line  # in a token, hot, their ratio


MERGED = {"bench_branch_share.py": "decode", "bench_train_share.py": "train", "bench_pieces.py": "pieces",
          "bench_cold_ops.py": "cold", "bench_forward_backward.py": "whole"}  # issue 54: now bench_state_branch.py's


def test_every_script_the_benchmarks_name_exists_or_was_merged():
    """benchmarks/README.md and the dated records name scripts by file; a name that is gone must be
    one of the merged ones, and the README must say which measurement of bench_state_branch.py it became."""
    readme = " ".join((ROOT / "benchmarks" / "README.md").read_text().split())
    for old, new in MERGED.items():
        assert not (ROOT / "benchmarks" / old).exists(), old
        assert f"`{old}` is its `{new}`" in readme or f"`{old}` `{new}`" in readme, old
    for page in [ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "records").glob("*.md"))]:
        for name in set(re.findall(r"benchmarks/(\w+\.(?:py|sh))|`(\w+\.(?:py|sh))", page.read_text())):
            name = name[0] or name[1]
            if name.startswith(("bench_", "gpu_check", "golden_", "checkpoint_", "baselines_", "eval_")):
                assert (ROOT / "benchmarks" / name).exists() or name in MERGED, (page.name, name)


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts sit beside the package, not in it)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_training_share_counts_the_backward_of_the_operators_in_its_ranges_only():
    """bench_state_branch.py train times the state branch's backward as the autograd nodes made by the
    operators that ran inside its profiler ranges: here the first of two products and nothing of
    the second, nor of the tanh and sum after it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    bench = import_benchmark("bench_state_branch")
    a = torch.randn(8, 16, requires_grad=True)
    W1, W2 = torch.randn(16, 32, requires_grad=True), torch.randn(32, 4, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(bench.LABEL):
            y = a @ W1
        (y @ W2).tanh().sum().backward()
    forward, backward, nodes = bench.labelled_times(prof.events())
    assert nodes == ["MmBackward0"]
    assert forward > 0 and backward > 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:  # nothing labelled: nothing counted
        (a @ W1 @ W2).sum().backward()
    assert bench.labelled_times(prof.events()) == (0, 0, [])


def test_the_backbone_pieces_flops_add_up_to_vanilla_looped_decoded_token():
    """bench_state_branch.py decode scores the backbone's attention and SwiGLU sub-blocks against their
    share of a decoded token's FLOPs: the two and the head (2 d V) are the whole token as
    models/flops.py counts it (itself checked against torch's counter in tests/models/test_flops.py)."""
    decode_piece_flops = import_benchmark("bench_state_branch").decode_piece_flops
    from stateloop.config.model import ModelConfig
    from stateloop.models.flops import decode_flops_per_token

    for shape in (dict(n_layers=8, d_model=512, d_ff=1376, n_heads=8), dict(n_layers=3, d_model=96, d_ff=256, n_heads=3)):
        cfg = ModelConfig(name="vanilla_looped", K=4, d_s=0, vocab_size=4096, head_dim=32, **shape)
        for context in (0, 32, 63.5):
            pieces = sum(decode_piece_flops(cfg, piece, context) for piece in ("attention", "swiglu"))
            assert pieces + 2 * cfg.d_model * cfg.vocab_size == decode_flops_per_token(cfg, context)


def test_the_gpu_check_imports_mamba_ssm_triton_kernels_without_the_package_init(tmp_path):
    """--mamba-ssm-src: the Triton modules this project imports load from the sources, and the
    package's __init__ (which needs Mamba-1's CUDA extension) never runs. A fake package whose
    __init__ raises stands in for the sdist (a subprocess: stateloop.models.kernels must be
    imported after the call)."""
    import subprocess

    triton = tmp_path / "mamba_ssm" / "ops" / "triton"
    triton.mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "__init__.py").write_text('__version__ = "9.9.9"\nimport selective_scan_cuda\n')
    for sub in (tmp_path / "mamba_ssm" / "ops", triton):
        (sub / "__init__.py").write_text("")
    (triton / "ssd_combined.py").write_text("def mamba_chunk_scan_combined(*a, **k): pass\n")
    (triton / "layernorm_gated.py").write_text("def rmsnorm_fn(*a, **k): pass\n")
    (triton / "selective_state_update.py").write_text("def selective_state_update(*a, **k): pass\n")
    code = (
        "import sys, pathlib; sys.path.insert(0, 'benchmarks'); import gpu_check\n"
        f"info = gpu_check.use_mamba_ssm_sources(pathlib.Path({str(tmp_path)!r}))\n"
        "from stateloop.models import kernels\n"
        "print(info['version'], kernels.HAS_MAMBA_SSM, kernels.HAS_MAMBA_DECODE, kernels.HAS_FLASH_ATTN)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["9.9.9", "True", "True", "False"]


def test_the_gpu_checks_decode_falls_back_to_the_twins_when_a_kernel_fails(monkeypatch):
    """A fused kernel failing inside Table 3's decode (one try on a lent GPU) is recorded, the rows
    are timed again on the pure-PyTorch paths, and the later steps see the kernels again."""
    import stateloop.ops.bench_decode as bench
    from stateloop.models import kernels

    gpu_check = import_benchmark("gpu_check")
    real, calls = bench.bench_decode, []

    def failing_once(*args, **kwargs):
        calls.append(kernels.HAS_MAMBA_SSM)
        if len(calls) == 1:
            raise RuntimeError("triton: out of resources")
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "bench_decode", failing_once)
    monkeypatch.setattr(kernels, "HAS_MAMBA_SSM", True)
    result = gpu_check.decode_bench(gpu_check.load_paper(smoke=True), 8, 2, 1, torch.device("cpu"), "token")
    assert calls == [True, False] and result["kernel_error"] == "RuntimeError: triton: out of resources"
    assert result["kernels"]["mamba_ssm"] is False and kernels.HAS_MAMBA_SSM is True
    assert len(result["rows"]) == 6


def test_the_config_walk_reaches_the_training_and_stops_at_its_first_line(tmp_path, monkeypatch, capsys):
    """benchmarks/config_walk.py traces `stateloop train` until train.loop.train is entered: it
    passes through the config's resolution and never trains (no run folder is written)."""
    from stateloop.data.stage import Request, tokenize_stage

    data = tmp_path / "data"
    assert tokenize_stage(Request(config=str(ROOT / "configs/smoke.yaml"), scale="smoke", out=str(data), no_progress=True)) == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["config_walk.py", "--config", str(ROOT / "configs/smoke.yaml"), "--data-dir", str(data), "--list"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "benchmarks/config_walk.py"), run_name="__main__")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    stops = [line.strip() for line in out.splitlines() if line.startswith("  ") and ": entered" not in line]
    for stop in ("experiments.py: load_run", "train/stage.py: train_stage", "resolve.py: resolve_run"):
        assert stop in stops, (stop, stops)
    assert not (tmp_path / "results").exists()  # stopped before the training wrote anything
    assert re.search(r"\d+ stops in \d+ files, \d+ entries into a file", out), out
