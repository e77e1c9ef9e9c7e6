"""``stateloop lm-eval ARGS...``: lm-eval's own command line with the ``stateloop`` model registered.

    stateloop lm-eval --model stateloop --model_args pretrained=RUN_DIR --tasks piqa_local \\
        --include_path workflow/tasks --output_path out/

ARGS are lm-eval's, unchanged (``stateloop lm-eval ls tasks``, ``stateloop lm-eval run -h``):
they go to lm-eval's console entry (the ``lm_eval`` command) after ``stateloop.evaluate.lm`` has
registered the model. lm-eval 0.4 looks models up only in its own registry, which nothing
outside lm-eval can join before its command line runs (no entry points, no plugin hook), so
``lm_eval --model stateloop`` itself cannot find the model.
"""

from __future__ import annotations

import argparse
import sys

from stateloop.config import ConfigError


def add_arguments(p) -> None:
    # Everything after the command is lm-eval's, options and -h included: with no prefix
    # characters this parser reads them all as the one positional list.
    p.prefix_chars = ""
    p.add_argument("lm_eval_args", nargs=argparse.REMAINDER, metavar="ARGS", help="lm-eval's arguments, unchanged")


def _check_num_fewshot(argv: list[str]) -> None:
    """lm-eval runs ``--num_fewshot -1`` as if it were 0; refuse it (and a non-integer) in one line."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name != "--num_fewshot" or (not eq and i + 1 >= len(argv)):
            continue
        value = value if eq else argv[i + 1]
        try:
            ok = int(value) >= 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"--num_fewshot: expected a count >= 0, got {value!r}")


def run(args) -> int:
    from lm_eval.__main__ import cli_evaluate

    import stateloop.evaluate.lm  # noqa: F401  (registers the `stateloop` model)

    _check_num_fewshot(args.lm_eval_args)
    saved = sys.argv
    sys.argv = ["lm-eval", *args.lm_eval_args]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except ValueError as err:  # a bad model argument, an unknown task (lm-eval's and ours): one line, no traceback
        raise ConfigError((str(err).strip().splitlines() or [type(err).__name__])[0]) from None
    finally:
        sys.argv = saved
    return 0
