"""The GPU check: every measurement only a CUDA GPU can give, in one run of at most 7 minutes.

    python3 benchmarks/gpu_check.py                       # -> benchmarks/records/gpu_check_<device>_<date>.json + .md
    python3 benchmarks/gpu_check.py --smoke               # every step on any device at rehearsal sizes -> benchmarks/results/

Needs torch, lightning, pyyaml, tqdm, pytest (a GPU image's usual set; no mlflow, lm-eval or
Snakemake) and, for the fused kernels, the `gpu` extra (flash-attn, mamba-ssm, causal-conv1d);
where those are absent the pure-PyTorch paths run and the record says so. ``--mamba-ssm-src DIR``
(an unpacked mamba-ssm sdist) imports mamba_ssm's Triton kernels where its CUDA extensions were
never built: every mamba_ssm function this project calls (the chunked SSD scan, the decode
recurrence, the gated RMSNorm) is Triton, but the package's ``__init__`` imports Mamba-1's CUDA
extension and transformers, so the check registers the package without running that file.

The steps (benchmarks/gpu_steps/; ``--skip`` / ``--only`` choose) run in the order of what the plan
needs first, each with its own cap (the caps add up to 420 s on an H100; each cap and the
arithmetic of its estimate are printed before the first step starts). A step past its cap is
stopped (its loops check the clock between iterations; an alarm is the backstop) and recorded as
``timed_out`` with what it had measured. Each step's entry: ``status`` (``ran``, ``skipped`` with
``reason``, ``timed_out``, ``failed`` with the error's last lines), ``cap_s``, ``estimate_s``,
``wall_s``. The record (JSON and a markdown page) is rewritten after every step: a kill keeps what
finished. Its top level: device, date, commit, torch, smoke, steps, and ``mfu``: one flat entry per
measured training throughput, which ``stateloop plan`` reads (smoke records are CPU numbers).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import re
import signal
import sys
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from gpu_steps import CAP_TOTAL_S, STEPS  # noqa: E402
from gpu_steps.common import Context, Skip, StepTimeout, dynamo_reset, kernels_found, last_lines  # noqa: E402
from gpu_steps.decoding import decode_bench  # noqa: E402,F401  (tests/test_benchmarks.py calls it here)

STATUSES = ("ran", "skipped", "timed_out", "failed")


def use_mamba_ssm_sources(src: Path) -> dict:
    """Make ``import mamba_ssm.ops.triton...`` load from an unpacked sdist without running the
    package's ``__init__`` (which imports Mamba-1's CUDA extension, Mamba-3 and transformers).
    Must run before :mod:`stateloop.models.kernels` is imported."""

    pkg_dir = src / "mamba_ssm"
    if not (pkg_dir / "ops" / "triton" / "ssd_combined.py").is_file():
        raise SystemExit(f"--mamba-ssm-src {src}: no mamba_ssm/ops/triton/ssd_combined.py there")
    if "stateloop.models.kernels" in sys.modules:
        raise RuntimeError("use_mamba_ssm_sources must run before stateloop.models.kernels is imported")
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [str(pkg_dir)]
    sys.modules["mamba_ssm"] = pkg
    found = re.search(r'__version__\s*=\s*"([^"]+)"', (pkg_dir / "__init__.py").read_text())
    return {"source": str(src), "version": found.group(1) if found else None, "package_init_run": False}


def load_paper(smoke: bool):
    from stateloop.config import load_yaml
    from stateloop.experiments import pipeline_from_dict

    raw = load_yaml(ROOT / "configs" / "paper.yaml")
    if smoke:
        from stateloop.ops.rehearse.config import shrink

        raw = shrink(raw)
    return pipeline_from_dict(raw, "configs/paper.yaml" + (" (rehearsal sizes)" if smoke else ""))


def device_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"; "NVIDIA H200" -> "h200"; "cpu" -> "cpu"."""
    words = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-").split("-")
    return "-".join(w for w in words if w not in ("nvidia", "tesla")) or "device"


def record_paths(out_dir: Path, device: str, date: str) -> tuple[Path, Path]:
    slug = device_slug(device)
    return out_dir / f"gpu_check_{slug}_{date}.json", out_dir / f"{date}-gpu-check-{slug}.md"


# ----------------------------------------------------------------------------------------------
# Running one step under its cap


def run_step(step, ctx: Context, entry: dict) -> None:
    """``step`` under its cap: the context's deadline for its own checks, SIGALRM (main thread only)
    for a step stuck in one long call. Fills ``entry``'s status, reason / error and wall."""
    entry.clear()
    entry.update(cap_s=step.cap_s, estimate_s=round(step.estimate_s, 1), estimate=step.arithmetic)
    ctx.step = step.name
    t0 = time.perf_counter()
    limit = step.cap_s * ctx.args.cap_scale
    ctx.deadline = t0 + limit
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    running = [True]

    def on_alarm(signum, frame):
        if running[0]:
            raise StepTimeout()

    if alarm:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        step.run(ctx, entry)
        entry["status"] = "ran"
    except StepTimeout:
        entry["status"] = "timed_out"
    except Skip as why:
        entry.update(status="skipped", reason=str(why))
    except Exception as err:  # recorded; the other steps still run
        entry.update(status="failed", error=f"{type(err).__name__}: {err}"[:2000],
                     traceback=last_lines(traceback.format_exc(), 25))
    finally:
        running[0] = False
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        entry["wall_s"] = time.perf_counter() - t0
        try:
            entry["headline"] = step.headline(entry)
        except Exception as err:  # a partial entry: the headline is not worth a failure
            entry["headline"] = f"(no headline: {type(err).__name__})"
    if entry["status"] != "ran":  # a stopped step's tensors: give them back before the next
        dynamo_reset()
        gc.collect()
        if ctx.cuda:
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# The record: JSON and a markdown page


def markdown(report: dict) -> str:
    lines = [
        f"# The GPU check on {report['device']}" + (" (smoke: CPU rehearsal sizes)" if report["smoke"] else ""),
        "",
        f"- **Date:** {report['date']}",
        f"- **Machine:** {report['device']}, torch {report['torch']}, kernels {report['kernels']}",
        f"- **Commit:** {report['commit']}",
        f"- **Command:** `{report['command']}`",
        f"- **Time:** {report.get('wall_s', 0):.0f} s of steps; caps {report['caps_total_s']:.0f} s, "
        f"estimated {report['estimate_total_s']:.0f} s",
        "",
        "Written by `benchmarks/gpu_check.py` with "
        f"[{record_paths(Path('.'), report['device'], report['date'])[0].name}]"
        f"({record_paths(Path('.'), report['device'], report['date'])[0].name}) beside it (every figure).",
        "",
        "| step | status | cap s | estimate s | wall s | headline |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, e in report["steps"].items():
        status = e.get("status", "running")
        note = e.get("reason") or (e.get("error", "").splitlines()[0] if e.get("error") else "") or e.get("headline", "")
        note = note.replace("|", "/")
        lines.append(f"| `{name}` | {status} | {e.get('cap_s', 0):.0f} | {e.get('estimate_s', 0):.0f} | "
                     f"{e.get('wall_s', 0):.1f} | {note} |")
    if report.get("mfu"):
        lines += ["", "MFU (training FLOPs a token, models/flops.py, x tokens/s / peak):", "",
                  "| step | scale | model | compile | checkpointing | micro-batch | tokens/s | MFU |",
                  "|---|---|---|---|---|---:|---:|---:|"]
        for m in report["mfu"]:
            mfu = f"{m['mfu']:.3f}" if m.get("mfu") is not None else "-"
            lines.append(f"| `{m['step']}` | {m['scale']} | {m['model']} | {m['compile']} | "
                         f"{m.get('activation_checkpointing', '')} | {m.get('micro_batch', '')} | "
                         f"{m['tokens_per_s']:,.0f} | {mfu} |")
    return "\n".join(lines) + "\n"


def write_record(report: dict, json_path: Path, md_path: Path) -> None:
    from stateloop.files import atomic_write_bytes, atomic_write_json

    atomic_write_json(json_path, report)
    atomic_write_bytes(md_path, markdown(report).encode())


# ----------------------------------------------------------------------------------------------
# The command line


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the folder the record goes to (default: benchmarks/records; under --smoke the "
                                 "git-ignored benchmarks/results)")
    p.add_argument("--smoke", action="store_true", help="every step at rehearsal sizes on any device (CPU: the tests)")
    p.add_argument("--mamba-ssm-src", type=Path, help="an unpacked mamba-ssm sdist: its Triton kernels without its CUDA build")
    p.add_argument("--train-models", default="vanilla_looped,stateloop,stateloop_attn",
                   help="memory_vs_plan_410m's models (stateloop_mamba2's peak: mamba_chunk_256_vs_64)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--train-steps", type=int, default=6, help="timed steps of each form in compile_* (after 2 warm-up)")
    p.add_argument("--micro-1-4b", type=int, default=2, help="micro-batch of memory_vs_plan_1.4b and fsdp2_1x1")
    p.add_argument("--chunks", default="64,256", help="mamba_chunk_256_vs_64's two chunk lengths")
    p.add_argument("--ssd-seq", type=int, default=2048)
    p.add_argument("--decode-prefill", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--decode-runs", type=int, default=2)
    p.add_argument("--decode-interleave", choices=("run", "token"),
                   help="decode_1.4b_bf16: run: whole runs in turn; token: lockstep (default: the config's bench.interleave)")
    p.add_argument("--mamba-chunk", type=int, help="the SSD chunk length of every model outside mamba_chunk_256_vs_64")
    p.add_argument("--cap-scale", type=float, default=1.0,
                   help="every step's time limit is its cap times this (a slow CPU under --smoke; the record keeps the caps)")
    p.add_argument("--skip", default="", help="comma-separated steps to leave out")
    p.add_argument("--only", default="", help="comma-separated steps to run alone (a rerun)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / ("results" if args.smoke else "records"))
    if args.smoke:
        args.seq, args.train_steps, args.micro_1_4b, args.chunks = 32, 2, 1, "8,32"
        args.decode_prefill, args.decode_tokens, args.decode_runs, args.ssd_seq = 16, 4, 1, 64
    return args


def chosen(args) -> list:
    names = [s.name for s in STEPS]
    skip, only = ({s for s in text.split(",") if s} for text in (args.skip, args.only))
    unknown = (skip | only) - set(names)
    if unknown:
        raise SystemExit(f"unknown steps {sorted(unknown)} (steps: {', '.join(names)})")
    return [s for s in STEPS if s.name not in skip and (not only or s.name in only)]


def say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse(argv)
    run = chosen(args)
    mamba_src = use_mamba_ssm_sources(args.mamba_ssm_src) if args.mamba_ssm_src else None
    from stateloop.files import code_version

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke and device.type == "cpu":
        torch.set_num_threads(1)  # tiny shapes: a second thread only contends
    cfg = load_paper(args.smoke)
    if args.mamba_chunk:  # a [choice] (config/model.py): mamba_ssm's kernels are tuned for 256
        for scale in cfg.scales.values():
            scale.model = dataclasses.replace(scale.model, mamba_chunk_size=args.mamba_chunk)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    report = {
        "device": name, "date": date, "commit": code_version(), "torch": torch.__version__, "smoke": args.smoke,
        "command": "python3 benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "mamba_ssm_sources": mamba_src, "kernels": kernels_found(),
        "caps_total_s": sum(s.cap_s for s in STEPS), "estimate_total_s": sum(s.estimate_s for s in STEPS),
        "steps": {s.name: {"status": "skipped", "reason": "--skip / --only", "cap_s": s.cap_s,
                           "estimate_s": round(s.estimate_s, 1), "estimate": s.arithmetic, "wall_s": 0.0}
                  for s in STEPS},
        "mfu": [],
    }
    for s in run:  # until it runs: what a record cut short by a kill says of it
        report["steps"][s.name].update(reason="not reached: the check stopped before this step")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = record_paths(out_dir, name, date)
    say(f"device {name}, torch {torch.__version__}, kernels {report['kernels']}; the record: {json_path}")
    say(f"estimates (rates of the 2026-12-04 H200 record, on an H100); caps sum to {report['caps_total_s']} s "
        f"(at most {CAP_TOTAL_S}):")
    for s in run:
        say(f"  {s.name:<30} estimate {s.estimate_s:6.1f} s  cap {s.cap_s:4.0f} s  = {s.arithmetic}")
    say(f"  {'total':<30} estimate {sum(s.estimate_s for s in run):6.1f} s  cap {sum(s.cap_s for s in run):4.0f} s")
    ctx = Context(device=device, cfg=cfg, args=args, report=report)
    write_record(report, json_path, md_path)
    t_all = time.perf_counter()
    for s in run:
        entry = report["steps"][s.name]
        run_step(s, ctx, entry)
        report["wall_s"] = time.perf_counter() - t_all
        write_record(report, json_path, md_path)  # after every step: a kill keeps what finished
        say(f"[{report['wall_s']:5.0f} s] {s.name}: {entry['status']} in {entry['wall_s']:.1f} s (cap {s.cap_s:.0f}) "
            f"{entry.get('reason') or entry.get('error') or entry.get('headline', '')}")
    say(f"wrote {json_path} and {md_path}")
    return 0 if all(report["steps"][s.name]["status"] != "failed" for s in run) else 1


if __name__ == "__main__":
    sys.exit(main())
