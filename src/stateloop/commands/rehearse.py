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

import shlex
import sys
from pathlib import Path

from stateloop.config import Bool, Int, StageRequest, Text, arg, whole
from stateloop.ops.rehearse import run as rehearsal

PASSTHROUGH = "snakemake_args"  # every word after the first `--` (commands.parse), wherever the options are


class Request(StageRequest):
    config: Text = arg("pipeline config to rehearse (configs/*.yaml)", positional=True, metavar="CONFIG")
    out: Text | None = arg("rehearsal folder (default: rehearsals/<config name>)", None)
    shared_data: Text | None = arg("folder of the local data copies (default: ../shared/data beside the checkout, or "
                                  "$STATELOOP_SHARED/data)", None)
    cores: Int = arg("Snakemake --cores (default 2)", 2, type=whole("cores"))
    prepare_only: Bool = arg("write the rehearsal folder and print the command", False)
    snakemake_args: list[Text] = arg("passed to snakemake (targets, -n, ...), after --", [], positional=True, metavar="-- SNAKEMAKE_ARGS")


def run(args: Request) -> int:
    out = Path(args.out or Path("rehearsals") / Path(args.config).stem)
    config = rehearsal.prepare(args.config, out, args.shared_data)
    print(f"rehearsal of {args.config}: {config}", file=sys.stderr)
    env = rehearsal.environment(out)
    shown = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    command = rehearsal.snakemake_command(out, args.cores, args.snakemake_args)
    print(f"PATH={shlex.quote(str(out.resolve() / 'bin'))}:$PATH {shown} {shlex.join(command)}", file=sys.stderr)
    if args.prepare_only:
        return 0
    return rehearsal.run_dag(out, args.cores, args.snakemake_args).returncode
