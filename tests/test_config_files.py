"""Every shipped config resolves, and the committed JSON schema is the one the dataclasses give."""

import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from stateloop.config.schema import render
from stateloop.experiments import expand_runs, load_pipeline

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# Experiments of their own: a file naming the config it extends (`base:`), in any folder under configs/
OVERLAYS = sorted(p for p in (ROOT / "configs").glob("*/*.yaml") if "base" in yaml.safe_load(p.read_text()))
FIGURE_AND_TABLE_EXPERIMENTS = {"table1", "table4", "loop_depth", "state_width", "state_analysis", "decoding"}
# Scales of their own that render only some of the paper's outputs, and why
PARTIAL = {"decide.yaml": "Tables 1, 4, Figure 2 and the claims", "ladder.yaml": "a compute ladder's rungs",
           "ladder_gpu.yaml": "a compute ladder's rungs"}


def test_committed_schema_is_generated_from_the_declarations():
    assert (ROOT / "workflow/schemas/config.schema.yaml").read_text() == render(), \
        "run: stateloop schema --out workflow/schemas/config.schema.yaml"


def test_config_reference_is_generated_and_documents_every_key():
    """The request: "`config/README.md`-style documentation of every config key (generated from the
    schema)". configs/README.md is what `stateloop schema --docs` writes; every key of every
    section has a line of its own, with its default, and the schema carries the same words."""
    import dataclasses
    import typing

    from stateloop.config.schema import _sections, render_docs

    assert (ROOT / "configs/README.md").read_text() == render_docs(), \
        "run: stateloop schema --out workflow/schemas/config.schema.yaml --docs configs/README.md"
    text = render_docs()
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    train = schema["$defs"]["TrainConfig"]["properties"]  # each section once, named by its class (pydantic's $defs)
    assert train["lr"]["description"] == "peak learning rate"
    for path, cls in _sections():
        assert f"## `{path}`" in text
        for f in dataclasses.fields(cls):
            if f.init:
                assert cls.__pydantic_fields__[f.name].description, \
                    f"{cls.__name__}.{f.name}: no description (the config reference needs one)"
                assert f"| `{f.name}` |" in text.split(f"## `{path}`")[1].split("\n## ")[0], (path, f.name)
    # the sections cover every dataclass a config file can hold
    seen, todo = set(), [cls for _, cls in _sections()[:1]]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        for hint in typing.get_type_hints(cls).values():
            for t in (hint, *typing.get_args(hint)):
                if dataclasses.is_dataclass(t) and t not in seen:
                    todo.append(t)
    from stateloop.config.resources import ResourcesConfig
    assert seen - {cls for _, cls in _sections()} == {ResourcesConfig}  # its keys are the STAGE names


def test_schema_command_writes_the_schema_and_the_reference(tmp_path):
    """`stateloop schema --out S --docs D`, the command the generated files name, writes both."""
    from stateloop.cli import main
    from stateloop.config.schema import render, render_docs

    assert main(["schema", "--out", str(tmp_path / "s.yaml"), "--docs", str(tmp_path / "README.md")]) == 0
    assert (tmp_path / "s.yaml").read_text() == render() and (tmp_path / "README.md").read_text() == render_docs()


@pytest.mark.parametrize("path", CONFIGS + OVERLAYS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_config_resolves_and_matches_the_schema(path):
    """Every config resolves (an experiment of its own with its `base:` merged under it) and
    matches the schema; a scale of its own defines the paper's six experiments, or says in
    PARTIAL which outputs it renders instead."""
    from stateloop.config import read_config

    cfg = load_pipeline(path)
    if path in CONFIGS and path.name not in PARTIAL:
        missing = FIGURE_AND_TABLE_EXPERIMENTS - set(cfg.experiments)
        assert not missing, (
            f"configs/{path.name} defines none of the paper's experiments {sorted(missing)}. An experiment over an "
            f"existing scale belongs in a file of its own that names the config it extends, `base: ../tiny.yaml`, "
            f"under configs/experiments/ (configs/README.md); a new scale of its own defines all six, or is added "
            f"with what it renders to PARTIAL in tests/test_config_files.py")
        assert not cfg.experiments["decoding"].trained
    runs = expand_runs(cfg)
    assert len({r.id for r in runs}) == len(runs) > 0
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate(read_config(path), schema)


def test_schema_rejects_what_the_loader_rejects():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    bad = yaml.safe_load((ROOT / "configs/smoke.yaml").read_text())
    bad["scales"]["smoke"]["train"]["learning_rate"] = 1.0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_papers_experiments_compare_the_papers_models_unless_a_config_lists_others():
    """The models of each paper experiment come from the paper's own tables
    (stateloop/report/reference/, copied from the paper): Table 1's ten rows, Table 3's decoding
    rows, Table 4's variants; Figures 2-4 compare Vanilla Looped and StateLoop (Figure 2) and
    sweep or analyse StateLoop (figures_text.csv: "widths d_s in 128 256 512 1024", the Shapley
    "R1..R6"). An experiment of one of those names without `models:` compares them, a `models:`
    list replaces them, and another name without one is a one-line error."""
    from stateloop.config import ConfigError
    from stateloop.experiments import PAPER_MODELS, pipeline_from_dict
    from stateloop.report.tables import reference

    assert PAPER_MODELS["table1"] == reference("table1_ppl")["model"].tolist()
    assert PAPER_MODELS["decoding"] == list(dict.fromkeys(reference("table3_decoding")["model"]))
    assert sorted(PAPER_MODELS["table4"]) == sorted(set(reference("table4_ablations")["variant"]))
    assert PAPER_MODELS["loop_depth"] == ["vanilla_looped", "stateloop"]
    assert PAPER_MODELS["state_width"] == PAPER_MODELS["state_analysis"] == ["stateloop"]
    raw = yaml.safe_load((ROOT / "configs/smoke.yaml").read_text())
    cfg = pipeline_from_dict(raw)
    for name, models in PAPER_MODELS.items():
        assert "models" not in raw["experiments"][name] and cfg.experiments[name].models == models
    raw["experiments"]["loop_depth"]["models"] = ["stateloop"]
    assert pipeline_from_dict(raw).experiments["loop_depth"].models == ["stateloop"]
    raw["experiments"]["mine"] = {"scale": "smoke", "K": [2]}
    with pytest.raises(ConfigError, match=r"experiments\.mine\.models: missing required key"):
        pipeline_from_dict(raw)


def test_checking_every_config_imports_no_torch():
    """Checking a config (the Snakefile's parse in every Snakemake process, `stateloop plan`) reads
    the model registry, whose builders import the models only when one is built: torch and the
    model modules (about 2 CPU-seconds) stay out of the process; the models' options modules, torch-free, are read."""
    code = ("import sys\nfrom stateloop.experiments import load_checked\nfor path in sys.argv[1:]:\n    load_checked(path)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'stateloop.models.looped',\n"
            "    'stateloop.models.baselines.')) and not m.endswith('.options')))")
    out = subprocess.run([sys.executable, "-c", code, *map(str, CONFIGS + OVERLAYS)], capture_output=True, text=True, check=True)
    assert CONFIGS and out.stdout.strip() == "[]", out.stdout
