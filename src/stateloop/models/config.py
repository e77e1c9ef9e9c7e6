"""The ``model:`` section of a config: the shape of one model (every variant reads it; variant
options are checked by the registry, models/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stateloop.config import ConfigError

# Upper bounds of model sizes: a value above one is a typo that would otherwise run out of memory.
MODEL_CAPS = {"vocab_size": 1 << 20, "n_layers": 1024, "d_model": 1 << 16, "d_ff": 1 << 18, "n_heads": 1024,
              "head_dim": 1024, "K": 64, "d_s": 1 << 16, "max_seq_len": 1 << 20}


# Frozen: a changed copy is dataclasses.replace(cfg, K=...) (LoopedLM.at_depth).
@dataclass(frozen=True)
class ModelConfig:
    """Shape of one model. Fields shared by every variant; variant-specific knobs go in
    ``options`` and are checked against the variant's own options dataclass (see registry)."""

    name: str = "vanilla_looped"  # registry name (one spelling everywhere)
    vocab_size: int = 50432  # vocabulary size (the default: GPT-NeoX-20B's 50,277 ids padded to a multiple of 128)
    n_layers: int = 24  # layers in the shared backbone T
    d_model: int = 2048  # d, the model width
    d_ff: int = 5504  # SwiGLU width f
    n_heads: int = 32  # attention heads of the backbone
    head_dim: int = 64  # width of each attention head
    K: int = 4  # loop iterations (MeSH / Parcae: core repetitions)
    # d_s, the persistent state width (0: the model has no state); its valid values depend on the
    # model, so it is checked by the registry alone (ModelSpec.check_width)
    d_s: int = 0
    max_seq_len: int = 2048  # longest sequence (RoPE tables, position checks)
    rope_theta: float = 10000.0  # [assume] the paper does not give RoPE's base; LLaMA's 10,000, as the authors' configs
    norm_eps: float = 1e-5  # [assume] the paper does not give RMSNorm's epsilon; LLaMA's 1e-5, as the authors' first release
    init_std: float = 0.02  # std of the normal init of embeddings and input projections
    # [choice] The backbone's init scheme (the paper gives only the cell's; models/init.py):
    # "depth_scaled": residual-output projections N(0, init_std / sqrt(2N)), N = layer applications
    # of the unrolled model (GPT-2's rule over the loop); "plain": every Linear and Embedding
    # N(0, init_std), as transformers' LlamaForCausalLM in the authors' PonderLM-2 configs.
    init_scheme: str = "depth_scaled"
    # Causal attention mixer over the state (eq. 8).
    mixer_heads: int = 32  # heads of the attention mixer
    mixer_head_dim: int = 64  # width of each head of the attention mixer
    # Mamba-2 mixer over the state (eq. 9).
    mamba_expand: int = 2  # Mamba-2 inner width = expand x d_s
    mamba_d_state: int = 128  # Mamba-2 SSM state size per head
    mamba_d_conv: int = 4  # Mamba-2 causal depthwise conv1d width
    mamba_head_dim: int = 64  # Mamba-2 head width (heads = expand x d_s / head_dim)
    mamba_n_groups: int = 8  # Mamba-2 groups sharing B and C
    # [choice] the paper is silent; mamba_ssm's default is 256. The scan is exact at any length; the
    # length sets its cost (the intra-chunk products grow with it) and so the counted FLOPs.
    mamba_chunk_size: int = 64  # chunk length of the SSD scan
    mamba_prenorm: bool = True  # [choice] pre-RMSNorm before the Mamba-2 block; the paper's count rounds the same either way
    # Kernel selection: "auto" uses flash-attn / mamba_ssm on CUDA when importable, "torch" never does,
    # "kernel" requires them and fails loudly.
    attn_impl: str = "auto"  # attention: auto | torch | kernel (flash-attn)
    ssd_impl: str = "auto"  # Mamba-2 scan: auto | torch | kernel (mamba_ssm)
    # [choice] Init of the state reads W_{s->z}, W_{s->out} (the paper gives only the cell's).
    # "residual": N(0, init_std / sqrt(2N)) like the backbone's residual-output projections, since
    # each read is added to the residual stream (Z^{k+1} = H^k + R_{k+1}, the head's H^{K-1} + R_K); "input":
    # N(0, init_std) like input projections, which at init adds a term as large as the embedding.
    read_init: str = "residual"
    options: dict = field(default_factory=dict)  # variant-specific options (registry checks them)

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layers", "d_model", "d_ff", "n_heads", "head_dim", "K", "max_seq_len",
                    "mixer_heads", "mixer_head_dim", "mamba_expand", "mamba_d_state", "mamba_d_conv", "mamba_head_dim",
                    "mamba_n_groups", "mamba_chunk_size", "rope_theta", "norm_eps", "init_std"):
            if not getattr(self, key) > 0:  # also refuses nan
                raise ConfigError(f"model.{key}: must be positive, got {getattr(self, key)}")
        for key, cap in MODEL_CAPS.items():  # far above any model of the field: a typo, not a shape
            if getattr(self, key) > cap:
                raise ConfigError(f"model.{key}: {getattr(self, key)} is above the sane bound {cap}")
        if self.init_scheme not in ("depth_scaled", "plain"):
            raise ConfigError(f"model.init_scheme: must be one of depth_scaled, plain; got {self.init_scheme!r}")
        if self.read_init not in ("residual", "input"):
            raise ConfigError(f"model.read_init: must be one of residual, input; got {self.read_init!r}")
        for key in ("attn_impl", "ssd_impl"):
            if getattr(self, key) not in ("auto", "torch", "kernel"):
                raise ConfigError(f"model.{key}: must be one of auto, torch, kernel; got {getattr(self, key)!r}")
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim: RoPE needs an even head size, got {self.head_dim}")


def refuse_past_trained(trained: ModelConfig, K: int) -> None:
    """A test-time depth check (a registry entry's ``depth``, its class's ``depth_check``) for a model
    whose parameters belong to particular iterations and that has nothing more to say: K up to the
    trained K, the iterations it has parameters for."""
    if K > trained.K:
        raise ConfigError(f"eval.K: {trained.name} has no meaning at K={K}: it has parameters for each of its "
                          f"{trained.K} trained iterations and none past them (K <= {trained.K} only)")
