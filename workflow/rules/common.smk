# Load and check the config, expand the experiments into runs, and define the helpers the rule
# files share. Any config error stops the DAG build with one line naming the key.
import ast
import hashlib
import json
import re

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from stateloop.ops import warm
from stateloop.ops.cluster import check_cluster, estimated_params, warning_seconds
from stateloop.ops.memory import gate
from stateloop.analysis.common import HELDOUT_KEYS
from stateloop.config import ConfigError, load_yaml, resolve_configfiles, to_dict
from stateloop.data.stage import data_homes
from stateloop.files import atomic_write_bytes
from stateloop.experiments import checked_pipeline, decoding_specs
from stateloop.run_ids import RUN_ID_FORM, RUNS_ROOT
from stateloop.models.registry import MODELS
from stateloop.report.outputs import BENCH_FILE, OUTPUTS, baseline_of, comparison_files, comparisons, of_kind, varies_K
from stateloop.runs import FINAL_WEIGHTS

# A rule job of a SLURM submission (remote mode, inside the SLURM job) uses the CPUs its job was
# given. The SLURM plugin starts it with the submitting host's --cores (profiles/default's `cores:
# all`, counted on the login node), and Snakemake caps each job's threads, and so the
# OMP_NUM_THREADS it sets, at --cores: a job that asked for 32 CPUs would run on the login node's
# count. SLURM_CPUS_ON_NODE is what SLURM allocated to the job on this node.
_slurm_cpus = os.environ.get("SLURM_CPUS_ON_NODE", "")
SLURM_JOB_CPUS = int(_slurm_cpus) if workflow.remote_exec and os.environ.get("SLURM_JOB_ID") and _slurm_cpus.isdigit() else None
if SLURM_JOB_CPUS:
    workflow.global_resources["_cores"] = SLURM_JOB_CPUS

# Every job of a SLURM submission runs offline, inside its SLURM job. Its commands read the Hugging
# Face caches that `stateloop prefetch --config C` filled where the network is, and stop at their
# start in one line naming what is missing otherwise (data/hub.py). Compute nodes often
# have no network; where they do, HF_HUB_OFFLINE=0 and HF_DATASETS_OFFLINE=0 in the submitting
# shell (sbatch passes its environment on) keep the jobs online.
if workflow.remote_exec and os.environ.get("SLURM_JOB_ID"):
    for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(_var, "1")

CONFIG_NAME = str(workflow.overwrite_configfiles[-1]) if workflow.overwrite_configfiles else "configs/tiny.yaml"
try:
    for _path in workflow.overwrite_configfiles or [CONFIG_NAME]:
        load_yaml(_path)  # Snakemake's own reading takes a key given twice silently; ours refuses it
    # A config file naming the file it extends (`base: ../tiny.yaml`: an experiment of its own,
    # configs/README.md) is read as every command reads it: its base merged under it, then the
    # other files and --config in order (stateloop.config.resolve_configfiles).
    _resolved = resolve_configfiles(workflow.overwrite_configfiles or [CONFIG_NAME], workflow.config_settings.config)
    if _resolved is not None:
        config.clear()
        config.update(_resolved)
    # strict: unknown keys, wrong types, unknown models; RUNS: every trained run, each once (the
    # experiment grid expanded once, by the check)
    PIPE, RUNS = checked_pipeline(config, CONFIG_NAME)
    check_cluster(PIPE, CONFIG_NAME)  # runtimes within slurm.max_runtime, SLURM's warning and dist_timeout_s
    # every experiment of two models or more that no output reads is compared with its baseline
    try:
        COMPARED = comparisons(PIPE)
    except ConfigError as err:
        raise ConfigError(f"{CONFIG_NAME}: {err}") from None
    gate(PIPE, RUNS, CONFIG_NAME)  # every run of a scale that sets train.gpu_memory_gib fits it, before any job
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None
validate(config, "../schemas/config.schema.yaml", set_default=False)  # the declarations as JSON Schema; defaults stay out

# The commands read the config Snakemake holds (file + --config overrides) from a file named by
# its content, written when this call starts jobs (onstart: never in a dry run, --lint or a call
# refused by Snakemake's lock). A job reads the config it was scheduled with, whatever later
# calls with other configs do. Each rule's params carry the config sections its job depends on,
# so that Snakemake's params rerun trigger redoes exactly the jobs whose settings changed.
_text = yaml.safe_dump(config, sort_keys=True).encode()
CONFIG_DIGEST = hashlib.sha256(_text).hexdigest()[:16]
CONFIGFILE = f"results/configs/{CONFIG_DIGEST}.yaml"


# Local runs of a few jobs or more start a warm server (stateloop/ops/warm.py): it imports torch,
# Fabric, MLflow and lm-eval once (about 10 CPU-seconds), and each job's `stateloop` command runs in
# a child forked from it instead of importing them again (about 5 CPU-seconds a job).
# STATELOOP_WARM=off turns it off; SLURM jobs never use one.
WARM = []


def jobs_to_run():
    """The jobs of this call with a shell command (Snakemake's DAG; all of them where it is not there)."""
    dag = getattr(workflow, "dag", None)
    return warm.MIN_JOBS if dag is None else sum(1 for job in dag.needrun_jobs() if job.rule.shellcmd)


onstart:
    if not os.path.exists(CONFIGFILE):
        atomic_write_bytes(CONFIGFILE, _text)
    if workflow.local_exec and not workflow.remote_exec and jobs_to_run() >= warm.MIN_JOBS:
        WARM.append(warm.start(".snakemake/stateloop-warm.log"))


onsuccess:
    for server in WARM:
        warm.stop(server)


onerror:
    for server in WARM:
        warm.stop(server)


def job_config(wc, output):
    """Params value: the job's config file. A params function of ``output`` is one Snakemake's params
    rerun trigger leaves out (a derived value), so a new digest alone reruns nothing: the config
    sections each rule carries in its params decide what reruns."""
    return CONFIGFILE


# A run's id and folder (pipeline.Run.folder) as wildcards, spelled once: the seed always, last.
RUN_DIR = f"{RUNS_ROOT}/{RUN_ID_FORM}"


def run_path(name):
    """The pattern of file ``name`` in a run's folder (rule inputs and outputs)."""
    return f"{RUN_DIR}/{name}"


def run_log(stage):
    """The pattern of a run's log of ``stage``: logs/STAGE/{scale}/{model}/K{K}_ds{ds}_seed{seed}.log."""
    return f"logs/{stage}/{RUN_ID_FORM}.log"


# A config makes the outputs (stateloop/report/outputs.py) whose experiments it defines
# (configs/decide.yaml: Tables 1 and 4, Figure 2 and the claims); Table 2 needs the Table 1 scale
# to evaluate some lm-eval task.
MADE = [o.name for o in OUTPUTS.values() if any(e in PIPE.experiments for e in o.experiments)]
if "table2" in MADE and not PIPE.scales[PIPE.experiments["table1"].scale].eval.tasks:
    MADE.remove("table2")
BENCH_SCALE = PIPE.experiments["decoding"].scale if "decoding" in PIPE.experiments else None
if BENCH_SCALE is not None and PIPE.experiments["decoding"].trained:
    raise WorkflowError(f"invalid config: {CONFIG_NAME}: experiments.decoding.trained: must be false (Table 3 times untrained shapes)")

# The data folder each scale trains on: data/<scale>, or another scale's whose tokens its own would
# be the start of (data/stage.py: data_homes; configs/paper.yaml's 410M reads the 1.4B's folder).
DATA_HOME = data_homes(PIPE.scales, [s for s in PIPE.scales if any(r.scale == s for r in RUNS.values())])


def data_meta(wc):
    """Input of a training: the meta.json of its scale's data folder (DATA_HOME)."""
    return f"data/{DATA_HOME[wc.scale]}/meta.json"


TABLES = [f for t in of_kind("table") if t in MADE for f in OUTPUTS[t].files]
FIGURES = [f for t in of_kind("figure") if t in MADE for f in OUTPUTS[t].files]
CLAIMS = list(OUTPUTS["claims"].files)
# Every experiment of two models or more that no output above reads (a config's own, such as a new
# model against Vanilla Looped: COMPARED, above) gets a comparison named after it (report/compare.py):
# its table, and where it varies K its figure in Figure 2's form. Each name is a wildcard's only values.
COMPARED_BY_K = [e for e in COMPARED if varies_K(PIPE, e)]
COMPARISONS = [f for e in COMPARED for f in comparison_files(e)] + [f for e in COMPARED_BY_K for f in comparison_files(e, figure=True)]


def one_of(names):
    """A wildcard constraint matching exactly ``names`` (nothing where there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


wildcard_constraints:
    scale="|".join(re.escape(s) for s in PIPE.scales),
    model="|".join(MODELS),
    K=r"\d+",
    ds=r"\d+",
    seed=r"\d+",


def run_of(wc):
    """The run of a job's run-id wildcards (RUN_ID_FORM)."""
    return RUNS[RUN_ID_FORM.format(**wc)]


def all_cores(wc):
    """Threads of a job that must run alone: every core this Snakemake may use (capped at the
    machine's), so the local scheduler starts nothing beside it."""
    if SLURM_JOB_CPUS:  # a SLURM job: what it was given
        return SLURM_JOB_CPUS
    try:
        cores = workflow.cores
    except WorkflowError:  # no --cores (a remote executor): the stage's own CPUs
        return stage(BENCH_SCALE, "bench").cpus_per_task
    return max(1, min(cores, os.cpu_count() or 1))


def run_id(wc):
    """Params value: the job's run id."""
    return run_of(wc).id


def run_dir(wc):
    """Params value: the job's run folder."""
    return run_of(wc).folder


def runs_of(experiment):
    return [r for r in RUNS.values() if experiment in r.experiments]


def run_files(experiment, name):
    return [f"{r.folder}/{name}" for r in runs_of(experiment)]


def stage(scale, name):
    return getattr(PIPE.scales[scale].resources, name)


# What a training job asks for beyond its runtime, memory and CPUs (train_resources): the value
# each key takes when the geometry does not need it.
TRAIN_RESOURCE_DEFAULTS = {"gres": "", "tasks_per_gpu": 1, "nodes": 1, "tasks_per_node": 0, "tasks": 0, "mpi": ""}


# Every job that asks for a GPU runs where the config's `slurm:` section says (its partition, QOS,
# constraint and GPU type), whatever its rule: one rule for all of them, so that no rule's GPU jobs
# are left on the profile's default partition. Each key the section leaves "" is not set here (the
# profile's, as before); a rule's jobs without a GPU get the profile's default-resources value.
GPU_ROUTES = {
    "slurm_partition": PIPE.slurm.gpu_partition,
    "qos": PIPE.slurm.gpu_qos,
    "constraint": PIPE.slurm.gpu_constraint,
    "gpu_model": PIPE.slurm.gpu_type,  # the plugin's --gpus=TYPE:N (trainings ask for a typed gres instead)
}


def profile_default(key):
    """The value the profile's ``default-resources`` give resource ``key``, as written there (None:
    none). A rule setting a resource replaces the default for all its jobs, and its jobs without a GPU
    get this back."""
    defaults = workflow.resource_settings.default_resources
    resource = defaults.get(key) if defaults is not None else None
    raw = getattr(resource, "raw", None)
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)  # a quoted string in the profile: its text
        except (ValueError, SyntaxError):
            pass  # a bare word, as SLURM names a partition
    return raw


def gpu_routing(gpus, typed_gres=False):
    """The resources that send a rule's GPU jobs where ``slurm:`` says: ``gpus(wc)`` is a job's
    GPU count (0: none, then the profile's defaults). ``typed_gres``: the rule asks for its GPUs as
    gres (training), which carries the GPU type itself."""
    out = {}
    for key, value in GPU_ROUTES.items():
        if value and not (typed_gres and key == "gpu_model"):
            out[key] = lambda wc, value=value, default=profile_default(key): value if gpus(wc) else default
    return out


def train_gpus(wc):
    """The GPUs per node a training job asks for (train_resources' gres): its devices where
    ``accelerator`` may be a GPU, else 0."""
    t = train_res(wc)
    return t.devices if t.accelerator in ("cuda", "gpu", "auto") else 0


def job_threads(name, scale=None):
    """A rule's ``threads:``: the CPUs of the scale's ``resources.<name>`` (the job's scale, or ``scale``)."""
    return lambda wc: stage(scale or wc.scale, name).cpus_per_task


def job_resources(name, scale=None):
    """A rule's ``resources:`` (``**job_resources("eval")``), one callable per key, from the scale's
    ``resources.<name>`` (the job's scale, or ``scale``): runtime, mem_mb, cpus_per_task and gpu
    (0 asks for none), and where a job asks for a GPU, the ``slurm:`` section's partition, QOS,
    constraint and GPU type (gpu_routing). Training asks for what train_resources says: the same three, its GPUs as
    gres, one SLURM task per device (tasks_per_node, or tasks where a node has one device), mpi
    (always present, so that the job runs the command in the batch script, where the launcher
    starts training as a job step; "srun" with several tasks makes the plugin ask for them) and
    slurm_extra (the warning before the time limit, the log of every attempt)."""
    if name == "train":
        keys = {"runtime": None, "mem_mb": None, "cpus_per_task": None, **TRAIN_RESOURCE_DEFAULTS, "slurm_extra": None}
        out = {key: (lambda wc, key=key, default=default: train_resources(wc).get(key, default)) for key, default in keys.items()}
        return {**out, **gpu_routing(train_gpus, typed_gres=True)}
    fields = {"runtime": "runtime", "mem_mb": "mem_mb", "cpus_per_task": "cpus_per_task", "gpu": "gpus"}
    out = {key: (lambda wc, field=field: getattr(stage(scale or wc.scale, name), field)) for key, field in fields.items()}
    return {**out, **gpu_routing(lambda wc: stage(scale or wc.scale, name).gpus)}


def settings(section, keys=None):
    """Params value: the scale's config section ``section`` as JSON, only its ``keys`` where given
    (what the job reads of it)."""

    def value(wc):
        d = to_dict(getattr(PIPE.scales[wc.scale], section))
        return json.dumps(d if keys is None else {k: d[k] for k in keys}, sort_keys=True)

    return value


def run_settings(wc):
    """Params value: the resolved model config of a run."""
    return json.dumps(to_dict(run_of(wc).model_config), sort_keys=True)


def train_res(wc):
    return PIPE.scales[wc.scale].train


def launcher(wc, resources):
    """The command that starts training: srun, one task per device, wherever SLURM runs it.

    SLURM delivers its warning before the time limit (``--signal=USR1@N``, train_resources) and
    ``scancel --signal`` to the processes of job steps only, never to the batch script in which
    the SLURM executor plugin runs a rule; so in a SLURM job training is a job step in every
    geometry, and Fabric reads the ranks from SLURM's variables. Several nodes: always srun
    (locally, the rehearsals' stand-in). One node outside a SLURM job (a local run, or a local
    Snakemake inside an allocation): no launcher, Fabric starts its own processes.

    ``--kill-on-bad-exit=1``: a task that fails (rank 0 at a checkpoint write, say) ends the whole
    step at once, instead of leaving the other ranks at a barrier until the process group's
    timeout (``train.dist_timeout_s``); the ranks that stop on a signal exit 0 but for rank 0,
    which exits 75 once it has requeued the job (train/stage.py), so the option never cuts a requeue short.

    The rule job of a SLURM submission runs in remote mode with SLURM_JOB_ID set; the main
    Snakemake process plans (and prints) the one-node command without srun."""
    t = train_res(wc)
    in_slurm_job = workflow.remote_exec and bool(os.environ.get("SLURM_JOB_ID"))
    if t.num_nodes == 1 and not in_slurm_job:
        return ""
    return f"srun --kill-on-bad-exit=1 --nodes={t.num_nodes} --ntasks-per-node={t.devices} --cpus-per-task={resources.cpus_per_task}"


def warning_lead(wc, runtime):
    """N of the training job's ``--signal=USR1@N``, sized for a checkpoint of the scale's shape at the
    config's measured ``slurm.write_mb_per_s`` (ops/cluster.py: estimated_params, warning_seconds;
    its check_cluster compares the same write with ``train.dist_timeout_s``)."""
    return warning_seconds(estimated_params(PIPE.scales[wc.scale].model), runtime, PIPE.slurm.write_mb_per_s * 1e6)


def train_resources(wc):
    """What a training job asks SLURM for: the scale's runtime, memory and CPUs (per task), its
    GPUs per node (``accelerator: auto`` asks for them too: a SLURM job sees only the GPUs it
    requested, and would otherwise train on the CPU), one task per device, and
    ``slurm_extra``: SIGUSR1 to the job steps (not ``B:``, the batch shell, where the plugin runs
    the rule: srun's tasks would never see it) N seconds before the time limit, N sized for the
    scale's checkpoint at slurm.write_mb_per_s (ops/cluster.py, warning_seconds: at 100 MB/s 1.4B 360 s, 410M 190 s; the trainer then
    checkpoints and requeues the job), and the job's SLURM log appended to, not truncated, when
    SLURM restarts a requeued job."""
    t, res = train_res(wc), stage(wc.scale, "train")
    warning_s = warning_lead(wc, res.runtime)
    out = {
        "runtime": res.runtime,
        "mem_mb": res.mem_mb,
        "cpus_per_task": res.cpus_per_task,
        "slurm_extra": f"--signal=USR1@{warning_s} --open-mode=append",
    }
    if train_gpus(wc):
        gpu = f"gpu:{PIPE.slurm.gpu_type}" if PIPE.slurm.gpu_type else "gpu"  # typed: gpu:h100:8
        out.update(gres=f"{gpu}:{t.devices}", tasks_per_gpu=0)  # tasks_per_gpu=0: see ecosystem.md 1.2
    if t.num_nodes * t.devices > 1:
        # The plugin asks for the tasks of an "mpi" job, and refuses tasks_per_node = 1: one
        # device per node is `tasks` = nodes (SLURM puts at least one task on each node).
        out.update(nodes=t.num_nodes, mpi="srun")
        if t.devices > 1:
            out["tasks_per_node"] = t.devices
        else:
            out["tasks"] = t.num_nodes
    return out


def eval_tasks(wc):
    """Whether the eval job scores the lm-eval tasks (the command decides the same from the config:
    pipeline.Run.scores_tasks); a params value, so that a change reruns the job."""
    return run_of(wc).scores_tasks()


def test_time_depths(wc):
    """The test-time depths a run is evaluated at (its experiments' test_time_K), as words."""
    return " ".join(map(str, run_of(wc).test_time_K))


def test_time_tasks(wc):
    """Held-out PPL only at the test-time depths, unless an experiment asks for its tasks too (a
    params value, as eval_tasks)."""
    return run_of(wc).scores_tasks(depths=True)


def decode_models():
    """Params value: Table 3's rows, the (untrained) shapes of the decoding experiment as name:K[:d_s]."""
    return " ".join(decoding_specs(PIPE)) if BENCH_SCALE is not None else ""


def output_inputs(name):
    """The files output ``name`` reads, as OUTPUTS says (where the config defines what it reads):
    its run_files in the run folders of its experiment, the runs of its reference model at the
    experiment's loop counts, Table 3's timings. The claims read every trained run's eval.json and
    everything the other outputs read."""
    o = OUTPUTS[name]
    if o.experiment is None:
        files = [f"{r.folder}/eval.json" for r in RUNS.values()]
        files += [f for other in MADE if OUTPUTS[other].experiment is not None for f in output_inputs(other)]
    else:
        files = [f for e in o.experiments if e in PIPE.experiments for name in o.run_files for f in run_files(e, name)]
        if o.reference:
            K = {r.K for r in runs_of(o.experiment)}
            files += [f"{r.folder}/eval.json" for r in RUNS.values() if r.model == o.reference and r.K in K]
    if o.bench and BENCH_SCALE is not None:
        files.append(f"results/{BENCH_FILE}")
    return list(dict.fromkeys(files))


def render_settings(wc):
    """Params value of a render job: the config sections its output reads, so that a change
    reruns the renders that read it and no other. [choice] By section, not key by key: the
    experiments the output reads (every one for the claims), the whole sections of their scales
    but ``resources`` (read by no render), ``bench`` where it reads Table 3's timings, and the
    names and MLflow settings of every scale (the MLflow run it logs to: commands/render.py)."""
    name = wc.get("experiment") or wc.get("table") or wc.get("figure") or "claims"
    if wc.get("experiment"):
        experiments, bench = [name], False
    else:
        o = OUTPUTS[name]
        experiments = list(PIPE.experiments) if o.experiment is None else [e for e in o.experiments if e in PIPE.experiments]
        bench = o.bench
    scales = sorted({PIPE.experiments[e].scale for e in experiments})
    return json.dumps(
        {
            "experiments": {e: to_dict(PIPE.experiments[e]) for e in experiments},
            "scales": {s: {k: v for k, v in to_dict(PIPE.scales[s]).items() if k != "resources"} for s in scales},
            "bench": to_dict(PIPE.bench) if bench else None,
            "mlflow": {s: [sc.train.mlflow_experiment, sc.train.mlflow_tracking_uri] for s, sc in PIPE.scales.items()},
        },
        sort_keys=True,
    )


def render_inputs(wc):
    """Input function of the render rules (the table, figure, comparison or the claims of the wildcards);
    an experiment's own comparison reads the held-out PPL of its runs, its baseline's among them."""
    if wc.get("experiment"):
        return run_files(wc.experiment, "eval.json")
    return output_inputs(wc.get("table") or wc.get("figure") or "claims")
