"""``stateloop rehearse CONFIG``: run a config's own DAG offline on this machine, sizes shrunk.

Everything the config's real run exercises is kept (models, K, d_s structure, precision, DDP and
the multi-node geometry through a local ``srun``, accumulation, checkpoint cadence, the data
stage's path over local copies of the hub datasets, the tokenizer, lm-eval's own tasks, the
analyses, Table 3's dtype, rendering); only sizes shrink (stateloop/ops/rehearse/config.py). The
rehearsal lives in its own folder (default ``rehearsals/<config name>/``): its config, local
data copies, and the DAG's data, results, figures and logs.

    stateloop rehearse configs/paper.yaml                  # prepare, then run the whole DAG
    stateloop rehearse configs/paper.yaml -- results/table4.csv -n   # Snakemake arguments after --
    stateloop rehearse configs/paper.yaml --prepare-only   # write the folder, print the command
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def cores(text: str) -> int:
    """``--cores``: a whole number >= 1 (Snakemake waits forever for a core at 0)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of cores >= 1, got {text}")
    return n


PASSTHROUGH = "snakemake_args"  # every word after the first `--` (commands.parse), wherever the options are


def add_arguments(p) -> None:
    p.add_argument("config", metavar="CONFIG", help="pipeline config to rehearse (configs/*.yaml)")
    p.add_argument("--out", help="rehearsal folder (default: rehearsals/<config name>)")
    p.add_argument("--shared-data", help="folder of the local data copies (default: ../shared/data beside the "
                                         "checkout, or $STATELOOP_SHARED/data)")
    p.add_argument("--cores", type=cores, default=2, help="Snakemake --cores (default 2)")
    p.add_argument("--prepare-only", action="store_true", help="write the rehearsal folder and print the command")
    p.add_argument("snakemake_args", nargs="*", metavar="-- SNAKEMAKE_ARGS",
                   help="passed to snakemake (targets, -n, ...), after --")


def run(args) -> int:
    from stateloop.ops.rehearse.run import environment, prepare, run_dag, snakemake_command

    out = Path(args.out or Path("rehearsals") / Path(args.config).stem)
    config = prepare(args.config, out, args.shared_data)
    print(f"rehearsal of {args.config}: {config}", file=sys.stderr)
    env = environment(out)
    shown = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    command = snakemake_command(out, args.cores, args.snakemake_args)
    print(f"PATH={shlex.quote(str(out.resolve() / 'bin'))}:$PATH {shown} {shlex.join(command)}", file=sys.stderr)
    if args.prepare_only:
        return 0
    return run_dag(out, args.cores, args.snakemake_args).returncode
