"""The ``train:`` section of a scale: hardware, optimiser, schedule, budget, checkpoints, tracking.

A frozen dataclass (a changed copy: ``dataclasses.replace``). Every field is a YAML value;
:func:`stateloop.config.from_dict` rejects unknown keys and wrong types, and
:meth:`TrainConfig.__post_init__` rejects impossible values, each with a one-line
:class:`~stateloop.config.ConfigError` naming the key (``train.strategy: ...``).

Batch arithmetic (paper: 256 sequences x 2048 tokens per optimiser step)::

    world        = devices * num_nodes
    accumulation = global_batch / (micro_batch * world)        must be an integer
    tokens/step  = global_batch * seq_len
    steps        = max_tokens // tokens/step   (or max_steps when no token budget is set)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stateloop.config import ConfigError

STRATEGIES = ("ddp", "fsdp")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "bf16-true", "16-mixed", "64-true")
ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
SCHEDULES = ("cosine", "constant")
CHECKPOINTING = ("none", "layer", "iteration")
FSDP_SHARDING = ("full", "hybrid", "grad_op", "hybrid_grad_op")


@dataclass(frozen=True)
class TrainConfig:
    # -- hardware (Lightning Fabric) ------------------------------------------------------------
    accelerator: str = "auto"  # auto: cuda when available, else cpu
    devices: int = 1  # devices per node (one process each)
    num_nodes: int = 1  # nodes; > 1 expects SLURM with --ntasks-per-node = devices
    strategy: str = "ddp"  # ddp | fsdp (FSDP2, train/parallel.py); a single device uses no wrapper at all
    precision: str = "auto"  # auto: bf16-mixed on GPU, 32-true on CPU
    compile: bool = False  # torch.compile each decoder layer and state branch (train/compiling.py; off: eager is the reference)
    # Seconds a collective (all-reduce, barrier, the start's rendezvous) may wait for the other
    # ranks before the process group fails it (Fabric's default: 1800). It must exceed the longest
    # stretch one rank works alone while the others wait: rank 0's checkpoint write and hash (a
    # 17 GB checkpoint of the 1.4B runs: about 2 minutes on a parallel file system)
    dist_timeout_s: int = 600
    # FSDP's sharding (strategy fsdp): full = parameters, gradients and optimizer state sharded over
    # every rank; hybrid = the same within a node, replicated across nodes; grad_op = gradients and
    # optimizer state sharded, parameters kept whole between forward and backward (ZeRO-2);
    # hybrid_grad_op = grad_op within a node, replicated across nodes
    fsdp_sharding: str = "full"
    # -- memory -----------------------------------------------------------------------------------
    # Activation checkpointing: none = every activation kept for backward (the reference); layer =
    # only each decoder-layer application's input kept, the layer recomputed in backward; iteration =
    # only each loop iteration's inputs kept, the whole backbone application recomputed in backward
    activation_checkpointing: str = "none"
    # The loss over this many tokens at a time (LM head + cross-entropy; each chunk's logits
    # recomputed in backward instead of kept); 0: the whole micro-batch's logits at once (the reference)
    loss_chunk_tokens: int = 0
    # Memory of one device in GiB: a run whose planned peak (stateloop plan) does not fit is refused
    # when the config is checked, before anything is submitted; 0: unknown, not checked
    gpu_memory_gib: float = 0.0
    # -- batch ------------------------------------------------------------------------------------
    seq_len: int = 2048  # tokens per training sequence (inputs; each window reads seq_len + 1)
    micro_batch: int = 8  # sequences per device per forward/backward
    global_batch: int = 256  # sequences per optimiser step, over all devices and accumulation steps
    # -- optimiser: AdamW with decoupled weight decay on matrices only ---------------------------
    lr: float = 3e-4  # peak learning rate
    min_lr: float = 3e-5  # floor the cosine decays to
    warmup_steps: int = 0  # linear warmup from lr/warmup_steps to lr
    schedule: str = "cosine"  # cosine: warmup then cosine decay to min_lr; constant: warmup then lr
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW (beta1, beta2)
    eps: float = 1e-8  # AdamW epsilon
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping (the norm is still logged)
    # -- budget -----------------------------------------------------------------------------------
    max_tokens: int = 0  # token budget; steps = max_tokens // (global_batch * seq_len)
    max_steps: int = 0  # used when max_tokens is 0
    # -- validation, checkpoints, logging ---------------------------------------------------------
    val_every: int = 0  # steps between validation passes (0: only after the last step)
    val_tokens: int = 0  # held-out tokens per validation pass (0: no validation)
    val_split: str = "val"  # the shard split validation reads
    checkpoint_every: int = 1000  # steps between periodic checkpoints (0: only on signals and at the end)
    keep_checkpoints: int = 2  # newest complete checkpoints kept (>= 2, so a corrupt one has a fallback)
    seed: int = 1234  # init and data order (an experiment's seeds replace it)
    log_every: int = 10  # steps between metric logs (MLflow) and progress-bar updates of the loss
    # Track the training run in MLflow (params, metrics, system metrics, the model); false: the
    # training job uses no MLflow at all, not even its import (about 3 CPU-s per job:
    # benchmarks/bench_startup.py), and writes its run folder as always; the later stages still
    # log unless given --no-mlflow
    mlflow_tracking: bool = True
    mlflow_experiment: str = "stateloop"  # MLflow experiment of the runs
    mlflow_tracking_uri: str = ""  # "": $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/results/mlflow.db
    # MLflow's own system metrics (CPU, memory, disk, network; GPU where pynvml sees one) of the
    # training process's node (rank 0), sampled every this many seconds; 0: not logged
    mlflow_system_metrics_s: float = 10.0
    # The final weights as an MLflow model of the run (a LoggedModel: the Hugging Face export
    # directory of `stateloop export`, listed in the UI's Models tab)
    mlflow_log_model: bool = True
    # Register each logged model under this name ({scale}, {model}, {K}, {d_s} filled in, e.g.
    # '{scale}-{model}', quoted in YAML): one version per run; "": not registered
    mlflow_register_model: str = ""
    peak_tflops: float = 0.0  # per-device peak for MFU; 0: the device's datasheet bf16 rate (train/flops.py)

    def __post_init__(self) -> None:
        for key, allowed in (("strategy", STRATEGIES), ("precision", PRECISIONS), ("accelerator", ACCELERATORS),
                             ("schedule", SCHEDULES), ("activation_checkpointing", CHECKPOINTING),
                             ("fsdp_sharding", FSDP_SHARDING)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"train.{key}: must be one of {', '.join(allowed)}; got {getattr(self, key)!r}")
        for key in ("devices", "num_nodes", "seq_len", "micro_batch", "global_batch", "keep_checkpoints", "log_every",
                    "dist_timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}: must be positive, got {getattr(self, key)}")
        for key in ("warmup_steps", "loss_chunk_tokens", "max_tokens", "max_steps", "val_every", "val_tokens", "checkpoint_every", "seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("lr", "eps"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"train.{key}: must be positive, got {getattr(self, key)}")
        for key in ("min_lr", "weight_decay", "grad_clip", "peak_tflops", "mlflow_system_metrics_s", "gpu_memory_gib"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}: must be >= 0, got {getattr(self, key)}")
        if self.mlflow_register_model:
            registered_model_name(self.mlflow_register_model, scale="s", model="m", K=1, d_s=0)  # one line if malformed
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr: the floor {self.min_lr} is above the peak lr {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {self.betas}")
        if self.keep_checkpoints < 2:
            raise ConfigError(f"train.keep_checkpoints: keep at least 2 (a corrupt newest one falls back), got {self.keep_checkpoints}")
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
