"""Every stage takes a typed request (config.StageRequest): a frozen dataclass ``Request`` in the
stage's module whose fields are exactly the flags its command parses, built from them in one place
(``Request.of(args)``) and checked on construction, from Python as from flags. The stages called
through their requests: tests/data/test_tokenize_request.py, tests/train/test_train_request.py,
tests/evaluate/test_eval_request.py."""

import argparse
import dataclasses

import pytest

from stateloop.commands import build_parser
from stateloop.config import ConfigError

RID = "s/stateloop/K2_ds16_seed7"
# the request type -> command lines of its command (every subcommand it serves)
REQUESTS = {
    "stateloop.train.stage": [["train", "--config", "c.yaml", RID]],
    "stateloop.evaluate.stage": [["eval", RID]],
    "stateloop.data.stage": [["tokenize", "--out", "x"]],
    "stateloop.analysis.stage": [["analyze", "shapley", RID], ["analyze", "interventions", RID]],
    "stateloop.analysis.bench_decode": [["bench", "decode"]],
}
NOT_FLAGS = {"command", "_module", "bench"}  # the parser's own entries, no flags


@pytest.mark.parametrize("module", REQUESTS)
def test_a_request_holds_exactly_its_commands_flags_and_the_parsed_values(module):
    import importlib

    request = importlib.import_module(module).Request
    fields = {f.name for f in dataclasses.fields(request)}
    flags = set()
    for argv in REQUESTS[module]:
        args = build_parser().parse_args(argv)
        built = request.of(args)
        assert dataclasses.is_dataclass(built) and built.__dataclass_params__.frozen
        given = {k: v for k, v in vars(args).items() if k not in NOT_FLAGS}
        assert {k: getattr(built, k) for k in given} == given  # every flag, as parsed
        flags |= set(given)
    assert fields == flags


def test_a_request_missing_a_field_or_with_a_bad_value_is_refused_in_one_line_naming_it():
    from stateloop.train.stage import Request

    def refused(error, make) -> str:
        with pytest.raises(error) as caught:
            make()
        message = str(caught.value)
        assert len(message.splitlines()) == 1, message
        return message

    # from Python: the missing argument is named
    assert "'config'" in refused(TypeError, lambda: Request(run=RID))
    # from flags (a namespace without it): a ConfigError naming the request's field, as a config key
    assert refused(ConfigError, lambda: Request.of(argparse.Namespace(run=RID))) == (
        "train.stage.Request.config: missing required key")
    # a bad value, from Python as from flags
    assert refused(ConfigError, lambda: Request(config="c.yaml", run=RID, overrides="train.lr=1e-3")) == (
        "train.stage.Request.overrides: expected a list, got str 'train.lr=1e-3'")
    assert refused(ConfigError, lambda: Request(config="c.yaml", run=RID, no_progress="yes")) == (
        "train.stage.Request.no_progress: expected true/false, got 'yes'")
    assert refused(ConfigError, lambda: Request.of(argparse.Namespace(config="c.yaml", run=RID, overrides=[3e-4, None]))) == (
        "train.stage.Request.overrides[1]: expected a string, got None")
    # a request is a value: frozen, and checked values converted to the declared types
    request = Request(config="c.yaml", run=RID, overrides=("train.lr=1e-3",))
    assert request.overrides == ["train.lr=1e-3"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.run = "other"
