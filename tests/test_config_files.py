"""Every shipped config resolves, and the committed JSON schema is the one the dataclasses give."""

from pathlib import Path

import jsonschema
import pytest
import yaml

from stateloop.commands.schema import render
from stateloop.experiments import expand_runs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
FIGURE_AND_TABLE_EXPERIMENTS = {"table1", "table4", "loop_depth", "state_width", "state_analysis", "decoding"}


def test_committed_schema_is_generated_from_the_dataclasses():
    assert (ROOT / "workflow/schemas/config.schema.yaml").read_text() == render(), \
        "run: stateloop schema --out workflow/schemas/config.schema.yaml"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_resolves_and_matches_the_schema(path):
    cfg = load_pipeline(path)
    if path.name != "decide.yaml":  # the claims scale runs Tables 1 and 4 and Figure 2 only
        assert FIGURE_AND_TABLE_EXPERIMENTS <= set(cfg.experiments)
        assert not cfg.experiments["decoding"].trained
    runs = expand_runs(cfg)
    assert len({r.id for r in runs}) == len(runs) > 0
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schema_rejects_what_the_loader_rejects():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    bad = yaml.safe_load((ROOT / "configs/smoke.yaml").read_text())
    bad["scales"]["smoke"]["train"]["learning_rate"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
