"""The ``train:`` section of a scale: hardware, optimiser, schedule, budget, checkpoints, tracking.

A frozen section (a changed copy: ``dataclasses.replace``). Every field is a YAML value, declared
with its type, bounds and choices; :func:`stateloop.config.from_dict` refuses unknown keys, wrong
types and values out of bounds, and :meth:`TrainConfig.__post_init__` the settings that contradict
each other, each with a one-line :class:`~stateloop.config.ConfigError` naming the key
(``train.strategy: ...``).

Batch arithmetic (paper: 256 sequences x 2048 tokens per optimiser step)::

    world        = devices * num_nodes
    accumulation = global_batch / (micro_batch * world)        must be an integer
    tokens/step  = global_batch * seq_len
    steps        = max_tokens // tokens/step   (or max_steps when no token budget is set)
"""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field

from stateloop.config import Bool, ConfigError, Float, Int, Text, section

Checkpointing = Literal["none", "layer", "iteration"]
CHECKPOINTING = typing.get_args(Checkpointing)
FsdpSharding = Literal["full", "hybrid", "grad_op", "hybrid_grad_op"]


@section(key="train", frozen=True)
class TrainConfig:
    # -- hardware (Lightning Fabric) ------------------------------------------------------------
    accelerator: Literal["auto", "cpu", "cuda", "gpu"] = Field("auto", description="auto: cuda when available, else cpu")
    devices: Int = Field(1, gt=0, description="devices per node (one process each)")
    num_nodes: Int = Field(1, gt=0, description="nodes; > 1 expects SLURM with --ntasks-per-node = devices")
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="ddp | fsdp (FSDP2, train/parallel.py); a single device uses no wrapper at "
        "all")
    precision: Literal["auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "64-true"] = Field("auto", description="auto: bf16-mixed "
        "on GPU, 32-true on CPU")
    compile: Bool = Field(False, description="torch.compile each decoder layer and state branch (train/compiling.py; off: eager is the "
        "reference)")
    dist_timeout_s: Int = Field(600, gt=0, description="Seconds a collective (all-reduce, barrier, the start's rendezvous) may wait for "
        "the other ranks before the process group fails it (Fabric's default: 1800). It must exceed the longest stretch one rank works "
        "alone while the others wait: rank 0's checkpoint write and hash (a 17 GB checkpoint of the 1.4B runs: about 2 minutes on a "
        "parallel file system)")
    fsdp_sharding: FsdpSharding = Field("full", description="FSDP's sharding (strategy fsdp): "
        "full = parameters, gradients and optimizer state sharded over every rank; hybrid = the same within a node, replicated across "
        "nodes; grad_op = gradients and optimizer state sharded, parameters kept whole between forward and backward (ZeRO-2); "
        "hybrid_grad_op = grad_op within a node, replicated across nodes")
    # -- memory -----------------------------------------------------------------------------------
    activation_checkpointing: Checkpointing = Field("none", description="Activation checkpointing: none = every activation kept for "
        "backward (the reference); layer = only each decoder-layer application's input kept, the layer recomputed in backward; "
        "iteration = only each loop iteration's inputs kept, the whole backbone application recomputed in backward")
    loss_chunk_tokens: Int = Field(0, ge=0, description="The loss over this many tokens at a time (LM head + cross-entropy; each chunk's "
        "logits recomputed in backward instead of kept); 0: the whole micro-batch's logits at once (the reference)")
    gpu_memory_gib: Float = Field(0.0, ge=0, description="Memory of one device in GiB: a run whose planned peak (stateloop plan) does not "
        "fit is refused when the config is checked, before anything is submitted; 0: unknown, not checked")
    # -- batch ------------------------------------------------------------------------------------
    seq_len: Int = Field(2048, gt=0, description="tokens per training sequence (inputs; each window reads seq_len + 1)")
    micro_batch: Int = Field(8, gt=0, description="sequences per device per forward/backward")
    global_batch: Int = Field(256, gt=0, description="sequences per optimiser step, over all devices and accumulation steps")
    # -- optimiser: AdamW with decoupled weight decay on matrices only ---------------------------
    lr: Float = Field(3e-4, gt=0, description="peak learning rate")
    min_lr: Float = Field(3e-5, ge=0, description="floor the cosine decays to")
    warmup_steps: Int = Field(0, ge=0, description="linear warmup from lr/warmup_steps to lr")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="cosine: warmup then cosine decay to min_lr; constant: warmup "
        "then lr")
    weight_decay: Float = Field(0.1, ge=0, description="AdamW decoupled weight decay (matrices only)")
    betas: list[Float] = Field(default_factory=lambda: [0.9, 0.95], description="AdamW (beta1, beta2)")
    eps: Float = Field(1e-8, gt=0, description="AdamW epsilon")
    grad_clip: Float = Field(1.0, ge=0, description="max global gradient norm; 0 disables clipping (the norm is still logged)")
    # -- budget -----------------------------------------------------------------------------------
    max_tokens: Int = Field(0, ge=0, description="token budget; steps = max_tokens // (global_batch * seq_len)")
    max_steps: Int = Field(0, ge=0, description="used when max_tokens is 0")
    # -- validation, checkpoints, logging ---------------------------------------------------------
    val_every: Int = Field(0, ge=0, description="steps between validation passes (0: only after the last step)")
    val_tokens: Int = Field(0, ge=0, description="held-out tokens per validation pass (0: no validation)")
    val_split: Text = Field("val", description="the shard split validation reads")
    checkpoint_every: Int = Field(1000, ge=0, description="steps between periodic checkpoints (0: only on signals and at the end)")
    keep_checkpoints: Int = Field(2, ge=2, description="newest complete checkpoints kept (>= 2, so a corrupt one has a fallback)")
    seed: Int = Field(1234, ge=0, description="init and data order (an experiment's seeds replace it)")
    log_every: Int = Field(10, gt=0, description="steps between metric logs (MLflow) and progress-bar updates of the loss")
    mlflow_tracking: Bool = Field(True, description="Track the training run in MLflow (params, metrics, system metrics, the model); false: "
        "the training job uses no MLflow at all, not even its import (about 3 CPU-s per job: benchmarks/bench_startup.py), and writes "
        "its run folder as always; the later stages still log unless given --no-mlflow")
    mlflow_experiment: Text = Field("stateloop", description="MLflow experiment of the runs")
    mlflow_tracking_uri: Text = Field("", description="\"\": $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/results/mlflow.db")
    mlflow_system_metrics_s: Float = Field(10.0, ge=0, description="MLflow's own system metrics (CPU, memory, disk, network; GPU where "
        "pynvml sees one) of the training process's node (rank 0), sampled every this many seconds; 0: not logged")
    mlflow_log_model: Bool = Field(True, description="The final weights as an MLflow model of the run (a LoggedModel: the Hugging Face "
        "export directory of `stateloop export`, listed in the UI's Models tab)")
    mlflow_register_model: Text = Field("", description="Register each logged model under this name ({scale}, {model}, {K}, {d_s} filled "
        "in, e.g. '{scale}-{model}', quoted in YAML): one version per run; \"\": not registered")
    peak_tflops: Float = Field(0.0, ge=0, description="per-device peak for MFU; 0: the device's datasheet bf16 rate (train/flops.py)")

    def __post_init__(self) -> None:
        if self.mlflow_register_model:
            registered_model_name(self.mlflow_register_model, scale="s", model="m", K=1, d_s=0)  # one line if malformed
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr: the floor {self.min_lr} is above the peak lr {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {self.betas}")
        if self.global_batch % (self.micro_batch * self.world_size):
            raise ConfigError(
                f"train.global_batch: {self.global_batch} sequences is not a multiple of micro_batch x devices x "
                f"num_nodes = {self.micro_batch} x {self.devices} x {self.num_nodes}")
        if self.max_tokens and self.max_steps:
            raise ConfigError("train.max_steps: set either max_tokens or max_steps, not both")
        if self.max_tokens and self.max_tokens < self.tokens_per_step:
            raise ConfigError(f"train.max_tokens: {self.max_tokens} is less than one step of "
                              f"global_batch x seq_len = {self.tokens_per_step} tokens")
        if self.val_tokens and self.val_tokens < self.seq_len:
            raise ConfigError(f"train.val_tokens: {self.val_tokens} is less than one sequence of seq_len = {self.seq_len}")

    def check_budget(self) -> None:
        """A run needs a budget; a scale that is never trained (only counted) does not."""
        if self.total_steps <= 0:
            raise ConfigError("train.max_tokens: set a token budget (or train.max_steps) for a run to train")

    # -- derived ----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def accumulation(self) -> int:
        """Micro-batches per device per optimiser step."""
        return self.global_batch // (self.micro_batch * self.world_size)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def total_steps(self) -> int:
        return self.max_tokens // self.tokens_per_step if self.max_tokens else self.max_steps


def registered_model_name(template: str, **fields) -> str:
    """``train.mlflow_register_model`` filled in for one run; one line naming the key when the
    template names an unknown field or yields a name the registry refuses."""
    import string

    try:
        # plain {field} names only: no attribute or index lookups ("{model.__class__}"), so a saved
        # config's template reads nothing but the four values given here
        unknown = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None and f not in fields]
        if unknown:
            raise KeyError(unknown[0])
        name = template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
        raise ConfigError(f"train.mlflow_register_model: {template!r} is not a name with the fields "
                          f"{{{'}, {'.join(fields)}}} ({type(err).__name__}: {err})") from None
    if not name.strip() or "/" in name or ":" in name:
        raise ConfigError(f"train.mlflow_register_model: {template!r} gives {name!r}; a registered model's name "
                          f"is not empty and has no '/' or ':'")
    return name
