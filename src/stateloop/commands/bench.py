"""``stateloop bench decode``: per-token decoding latency and throughput (paper, Table 3).

Models come from trained runs (``--runs RUN ...``; each RUN a run folder or a run id, as in every
command that addresses runs: runs.resolve_run_arg), or are built untrained from a shape
(``--models name:K[:d_s] ...`` at ``--scale`` of ``--config``, with ``--set model.key=value``
overrides); with neither, Table 3's rows at the chosen shape. Examples::

    stateloop bench decode --config configs/paper.yaml --scale 1.4b            # Table 3, GPU, bf16
    stateloop bench decode --set model.d_model=128 model.d_ff=344 model.n_heads=2 \\
        --models vanilla_looped:4 stateloop:4:128 --prefill 64 --tokens 64 --out bench.json
"""

from __future__ import annotations

import sys

from stateloop.commands import RUN_HELP
from stateloop.report.outputs import BENCH_FILE


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    d = sub.add_parser("decode", help="per-token latency and throughput at batch 1 (Table 3)",
                       description="per-token latency and throughput at batch 1 (Table 3)")
    d.add_argument("--runs", nargs="+", default=[], metavar="RUN",
                   help=f"trained runs to time, each {RUN_HELP}")
    d.add_argument("--models", nargs="+", default=[], metavar="SPEC",
                   help="untrained models name[:K[:d_s]] (default without --runs: Table 3's rows)")
    d.add_argument("--config", help="pipeline config whose --scale gives the shape of untrained models")
    d.add_argument("--scale", help="scale of --config (required with --config)")
    d.add_argument("--set", nargs="+", default=[], metavar="model.KEY=VALUE", help="shape overrides for untrained models")
    d.add_argument("--prefill", type=int, default=1024, help="prompt tokens P (paper: 1024)")
    d.add_argument("--tokens", type=int, default=1024, help="generated tokens N (paper: 1024)")
    d.add_argument("--repeats", type=int, default=5, help="timed runs per model (paper: 5)")
    d.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per model")
    d.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, else float32), float32, bfloat16, float16")
    d.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    d.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    d.add_argument("--interleave", choices=["run", "token"], default="run",
                   help="run: whole runs round-robin across models (paper protocol); token: models decode in "
                        "lockstep, one token each in turn, synced per step (robust ratios on a busy CPU)")
    d.add_argument("--reference", help="row label the relative latency is taken against (default: the first row)")
    d.add_argument("--seed", type=int, default=0, help="seed of the prompt and of untrained weights")
    d.add_argument("--out", default=f"results/{BENCH_FILE}", help="JSON result (written atomically)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")


def _scale_model(args):
    """The ModelConfig untrained rows are built from: the scale's model section (or the
    defaults, which are the paper's 1.4B shape) with --set overrides."""
    from stateloop.config import ConfigError, from_dict, merge, parse_dotlist, to_dict
    from stateloop.models.config import ModelConfig
    from stateloop.pipeline import load_scale

    base = ModelConfig()
    if args.config:
        if not args.scale:
            raise ConfigError("--scale: required with --config")
        base = load_scale(args.config, args.scale).model
    elif args.scale:
        raise ConfigError("--scale: needs --config")
    overrides = parse_dotlist(args.set)
    if set(overrides) - {"model"}:
        raise ConfigError(f"--set: {next(iter(set(overrides) - {'model'}))}: only model.* keys shape a benchmark model")
    return from_dict(ModelConfig, merge(to_dict(base), overrides.get("model", {})), "model")


def run(args) -> int:
    import torch

    from stateloop.analysis import bench_decode
    from stateloop.runs import atomic_write_json, resolve_device, resolve_run_arg

    run_dirs = [resolve_run_arg(r, "--runs").folder for r in args.runs]  # every RUN checked before any loads
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = bench_decode.resolve_dtype(args.dtype, device)
    specs = list(args.models)
    if not specs and not run_dirs:
        specs = [f"{name}:{K}" for name, K in bench_decode.table3_rows()]
    rows = [bench_decode.run_row(d, device, dtype) for d in run_dirs]
    if specs:
        shape = _scale_model(args)
        for i, spec in enumerate(specs):
            torch.manual_seed(args.seed + i)
            rows.append(bench_decode.untrained_row(shape, spec, device, dtype))
    bench_decode.check_settings(rows, args.prefill, args.tokens, args.repeats, args.warmup, args.interleave)  # before any output
    print(f"bench decode: {len(rows)} models on {bench_decode.device_name(device)}, {str(dtype).replace('torch.', '')}, "
          f"P={args.prefill} N={args.tokens}, {args.warmup} warm-up + {args.repeats} timed runs each", file=sys.stderr)
    result = bench_decode.bench_decode(rows, args.prefill, args.tokens, args.repeats, args.warmup, device,
                                  args.reference, args.seed, progress=not args.no_progress,
                                  interleave=args.interleave)
    atomic_write_json(args.out, result)
    print(bench_decode.format_table(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
