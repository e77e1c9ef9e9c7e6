"""``stateloop export RUN --out DIR``: a trained run as a Hugging Face model directory.

RUN: a run folder or a run id, as in every command that addresses runs (runs.resolve_run_arg).
DIR (replaced whole, atomically; never the run folder or its data folder, nor a folder holding
or inside either: refused in one line) then loads with transformers alone::

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
    AutoTokenizer.from_pretrained(DIR)

and is scored by stock lm-eval (``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``).
What the directory holds and why: stateloop/export/hf.py.
"""

from __future__ import annotations

import sys

from stateloop.commands import RUN_HELP


def add_arguments(p) -> None:
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="the Hugging Face directory to write (replaced if it exists; outside "
                                                       "the run and data folders)")


def run(args) -> int:
    from stateloop.export.hf import export_run
    from stateloop.runs import resolve_run_arg

    out = export_run(resolve_run_arg(args.run).folder, args.out)
    print(f"wrote {out}", file=sys.stderr)
    return 0
