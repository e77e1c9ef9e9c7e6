# Load and check the config, expand the experiments into runs, and define the helpers the rule
# files share. Any config error stops the DAG build with one line naming the key.
import hashlib
import re

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from stateloop.config import ConfigError
from stateloop.experiments import expand_runs, pipeline_from_dict
from stateloop.models.registry import MODELS
from stateloop.runs import atomic_write_bytes

CONFIG_NAME = str(workflow.overwrite_configfiles[-1]) if workflow.overwrite_configfiles else "configs/tiny.yaml"
try:
    PIPE = pipeline_from_dict(config, CONFIG_NAME)  # strict: unknown keys, wrong types, unknown models
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None
validate(config, "../schemas/config.schema.yaml")  # the same rules as JSON Schema (documentation, editors)

# The commands read the config Snakemake holds (file + --config overrides), saved under its hash.
_text = yaml.safe_dump(config, sort_keys=True).encode()
CONFIGFILE = f"results/configs/config-{hashlib.sha256(_text).hexdigest()[:12]}.yaml"
if not os.path.exists(CONFIGFILE):
    atomic_write_bytes(CONFIGFILE, _text)

RUNS = {run.id: run for run in expand_runs(PIPE)}  # every trained run, each once
STAGE_EXPERIMENTS = {  # output -> the experiment it reads (ARCHITECTURE.md)
    "table1": "table1", "table2": "table1", "table3": "decoding", "table4": "table4",
    "loop_depth": "loop_depth", "state_width": "state_width", "state_analysis": "state_analysis",
}
for _needed in sorted(set(STAGE_EXPERIMENTS.values())):
    if _needed not in PIPE.experiments:
        raise WorkflowError(f"invalid config: {CONFIG_NAME}: experiments.{_needed}: missing (a table or figure reads it)")
if PIPE.experiments["decoding"].trained:
    raise WorkflowError(f"invalid config: {CONFIG_NAME}: experiments.decoding.trained: must be false (Table 3 times untrained shapes)")

TABLES = [f"results/{t}.{ext}" for t in ("table1", "table2", "table3", "table4") for ext in ("csv", "md")]
FIGURES = [f"figures/{f}.{ext}" for f in ("loop_depth", "state_width", "state_analysis") for ext in ("pdf", "png")]

wildcard_constraints:
    scale="|".join(re.escape(s) for s in PIPE.scales),
    model="|".join(MODELS),
    K=r"\d+",
    ds=r"\d+",


def run_dir(run):
    return f"results/runs/{run.id}"


def runs_of(experiment):
    return [r for r in RUNS.values() if experiment in r.experiments]


def run_files(experiment, name):
    return [f"{run_dir(r)}/{name}" for r in runs_of(experiment)]


def stage(scale, name):
    return getattr(PIPE.scales[scale].resources, name)

