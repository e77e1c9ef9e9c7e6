"""``stateloop lm-eval ARGS...``: lm-eval's own command line with the ``stateloop`` model registered.

    stateloop lm-eval --model stateloop --model_args pretrained=RUN_DIR --tasks piqa_local \\
        --include_path workflow/tasks --output_path out/

ARGS are lm-eval's, unchanged (``stateloop lm-eval ls tasks``, ``stateloop lm-eval run -h``):
they go to lm-eval's console entry after ``stateloop.evaluate.lm`` has registered the model:
the released lm-eval (0.4.13) cannot find a model outside its own registry (docs/plugins.md).
"""

from __future__ import annotations

import argparse

from stateloop.evaluate.lm_cli import run_lm_eval


def add_arguments(p) -> None:
    # Everything after the command is lm-eval's, options and -h included: with no prefix
    # characters this parser reads them all as the one positional list.
    p.prefix_chars = ""
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, metavar="ARGS", help="lm-eval's arguments, unchanged")


def run(args) -> int:
    return run_lm_eval(args.lm_eval_args)
