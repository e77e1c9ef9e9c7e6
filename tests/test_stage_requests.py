"""Every stage takes a typed request (config.StageRequest): a frozen dataclass whose fields are
exactly the flags its command parses (the parser is built from them), built from them in one place
(``Request.of(args)``) and checked on construction, from Python as from flags. The stages called
through their requests: tests/data/test_tokenize_request.py, tests/train/test_train_request.py,
tests/evaluate/test_eval_request.py."""

import argparse
import dataclasses

import pytest

from stateloop.commands import build_parser
from stateloop.config import ConfigError

RID = "s/stateloop/K2_ds16_seed7"
# the request type (module:class) -> (command line, fields it sets) of its command, every subcommand it serves
REQUESTS = {
    "stateloop.train.stage:Request": [(["train", "--config", "c.yaml", RID, "--set", "train.lr=1e-3"],
                                       {"config": "c.yaml", "run": RID, "overrides": ["train.lr=1e-3"]})],
    "stateloop.evaluate.request:Request": [(["eval", RID, "--shots", "0", "5"], {"run": RID, "shots": [0, 5]})],
    "stateloop.data.stage:Request": [(["tokenize", "--out", "x", "--set", "data.max_docs=12", "--model-vocab-size", "64"],
                                      {"out": "x", "overrides": ["data.max_docs=12"], "model_vocab_size": 64})],
    "stateloop.analysis.request:Request": [(["analyze", "shapley", RID], {"analysis": "shapley", "run": RID}),
                                           (["analyze", "interventions", RID, "--calib-windows", "8"],
                                            {"analysis": "interventions", "run": RID, "calib_windows": 8})],
    "stateloop.analysis.request:DecodeRequest": [(["bench", "decode", "--threads", "2"],
                                                  {"benchmark": "decode", "threads": 2})],
}


@pytest.mark.parametrize("name", REQUESTS)
def test_a_request_is_its_commands_parsed_flags(name):
    """The flags given arrive in the fields of their names, typed; the other fields keep their
    defaults (tests/test_cli_declared.py: the flags are the fields)."""
    import importlib

    module, cls = name.split(":")
    request = getattr(importlib.import_module(module), cls)
    for argv, expected in REQUESTS[name]:
        built = request.of(build_parser().parse_args(argv))
        assert dataclasses.is_dataclass(built) and built.__dataclass_params__.frozen
        for f in dataclasses.fields(request):
            if f.name not in expected:  # a required field is always given
                assert getattr(built, f.name) == (f.default_factory() if f.default is dataclasses.MISSING else f.default)
            else:
                assert getattr(built, f.name) == expected[f.name], f.name


def test_a_request_missing_a_field_or_with_a_bad_value_is_refused_in_one_line_naming_it():
    from stateloop.train.stage import Request

    def refused(error, make) -> str:
        with pytest.raises(error) as caught:
            make()
        message = str(caught.value)
        assert len(message.splitlines()) == 1, message
        return message

    # from Python: the missing argument is named, as from flags
    assert refused(ConfigError, lambda: Request(run=RID)) == "train.stage.Request.config: missing required key"
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
