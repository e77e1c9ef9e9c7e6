"""``stateloop lm-eval``'s stage: lm-eval's own command line (its console entry) with the
``stateloop`` model registered, after the checks lm-eval itself would make late or not at all
(commands/lm_eval.py says why the model must be registered first)."""

from __future__ import annotations

import sys

from stateloop.config import ConfigError


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
    from stateloop.evaluate.lm import parse_batch_size  # torch, lm-eval: `stateloop`'s parser imports this module

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


def run_lm_eval(argv: list[str]) -> int:
    """Run lm-eval's command line on ``argv`` (its arguments, unchanged) with the model registered."""
    from lm_eval.__main__ import cli_evaluate

    import stateloop.evaluate.lm  # noqa: F401  torch, lm-eval; registers the `stateloop` model

    check_arguments(argv)
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    except ValueError as err:  # a bad model argument, an unknown task (lm-eval's and ours): one line, no traceback
        raise ConfigError((str(err).strip().splitlines() or [type(err).__name__])[0]) from None
    finally:
        sys.argv = saved
    return 0
