"""``stateloop lm-eval ARGS...``: lm-eval's own command line with the ``stateloop`` model registered.

    stateloop lm-eval --model stateloop --model_args pretrained=RUN_DIR --tasks piqa_local \\
        --include_path workflow/tasks --output_path out/

ARGS are lm-eval's, unchanged (``stateloop lm-eval ls tasks``, ``stateloop lm-eval run -h``):
they go to lm-eval's console entry (the ``lm_eval`` command) after ``stateloop.evaluate.lm`` has
registered the model. The released lm-eval (0.4.13) looks models up only in its own registry,
which nothing outside lm-eval can join before its command line runs, so there ``lm_eval --model
stateloop`` itself cannot find the model. Its development branch discovers models through the
``lm_eval.models`` entry-point group (docs/plugins.md), which pyproject.toml declares: with it
``lm_eval --model stateloop`` works as it is. An export (``stateloop export``) is scored by any
lm-eval as ``--model hf --model_args pretrained=DIR,trust_remote_code=True``.
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


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in lm-eval's arguments (the last), else None."""
    found = None
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key == name and (eq or i + 1 < len(argv)):
            found = value if eq else argv[i + 1]
    return found


def check_arguments(argv: list[str]) -> None:
    """What lm-eval would take silently (``--num_fewshot -1`` runs as 0) or reject only after
    indexing every task (the ``stateloop`` model's ``batch_size`` and ``max_length``): one line
    each, before any work."""
    from stateloop.evaluate.lm import parse_batch_size

    shots = _option(argv, "--num_fewshot")
    if shots is not None and not (shots.lstrip("-").isdigit() and int(shots) >= 0):
        raise ConfigError(f"--num_fewshot: expected a count >= 0, got {shots!r}")
    if _option(argv, "--model") != "stateloop":
        return
    model_args = dict(kv.partition("=")[::2] for kv in (_option(argv, "--model_args") or "").split(",") if kv)
    for where, value in (("--batch_size", _option(argv, "--batch_size")), ("batch_size", model_args.get("batch_size"))):
        if value is not None:
            try:
                parse_batch_size(value)
            except ValueError as err:
                raise ConfigError(str(err)) from None
    length = model_args.get("max_length")
    if length not in (None, "", "None") and not (length.lstrip("-").isdigit() and int(length) > 1):
        raise ConfigError(f"max_length: the context window must hold at least 2 tokens, got {length}")


def run(args) -> int:
    from lm_eval.__main__ import cli_evaluate

    import stateloop.evaluate.lm  # noqa: F401  (registers the `stateloop` model)

    check_arguments(args.lm_eval_args)
    saved = sys.argv
    sys.argv = ["lm-eval", *args.lm_eval_args]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except ValueError as err:  # a bad model argument, an unknown task (lm-eval's and ours): one line, no traceback
        raise ConfigError((str(err).strip().splitlines() or [type(err).__name__])[0]) from None
    finally:
        sys.argv = saved
    return 0
