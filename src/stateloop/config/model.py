"""The ``model:`` section of a config: the shape of one model (every variant reads it; variant
options are checked by the registry, models/registry.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stateloop.config import Bool, ConfigError, Float, Int, Text, section

# Upper bounds of model sizes: a value above one is a typo that would otherwise run out of memory.
MODEL_CAPS = {"vocab_size": 1 << 20, "n_layers": 1024, "d_model": 1 << 16, "d_ff": 1 << 18, "n_heads": 1024,
              "head_dim": 1024, "K": 64, "d_s": 1 << 16, "max_seq_len": 1 << 20}


# Frozen: a changed copy is dataclasses.replace(cfg, K=...) (LoopedLM.at_depth).
@section(key="model", frozen=True)
class ModelConfig:
    """Shape of one model. Fields shared by every variant; variant-specific knobs go in
    ``options`` and are checked against the variant's own options dataclass (see registry)."""

    name: Text = Field("vanilla_looped", description="registry name (one spelling everywhere)")
    vocab_size: Int = Field(50432, gt=0, description="vocabulary size (the default: GPT-NeoX-20B's 50,277 ids padded to a multiple of 128)")
    n_layers: Int = Field(24, gt=0, description="layers in the shared backbone T")
    d_model: Int = Field(2048, gt=0, description="d, the model width")
    d_ff: Int = Field(5504, gt=0, description="SwiGLU width f")
    n_heads: Int = Field(32, gt=0, description="attention heads of the backbone")
    head_dim: Int = Field(64, gt=0, description="width of each attention head")
    K: Int = Field(4, gt=0, description="loop iterations (MeSH / Parcae: core repetitions)")
    d_s: Int = Field(0, description="d_s, the persistent state width (0: the model has no state); its valid values depend on the model, so "
        "it is checked by the registry alone (ModelSpec.check_width)")
    max_seq_len: Int = Field(2048, gt=0, description="longest sequence (RoPE tables, position checks)")
    rope_theta: Float = Field(10000.0, gt=0, description="[assume] the paper does not give RoPE's base; LLaMA's 10,000, as the authors' "
        "configs")
    norm_eps: Float = Field(1e-5, gt=0, description="[assume] the paper does not give RMSNorm's epsilon; LLaMA's 1e-5, as the authors' "
        "first release")
    init_std: Float = Field(0.02, gt=0, description="std of the normal init of embeddings and input projections")
    init_scheme: Literal["depth_scaled", "plain"] = Field("depth_scaled", description="[choice] The backbone's init scheme (the paper "
        "gives only the cell's; models/init.py): \"depth_scaled\": residual-output projections N(0, init_std / sqrt(2N)), N = layer "
        "applications of the unrolled model (GPT-2's rule over the loop); \"plain\": every Linear and Embedding N(0, init_std), as "
        "transformers' LlamaForCausalLM in the authors' PonderLM-2 configs.")
    mixer_heads: Int = Field(32, gt=0, description="Causal attention mixer over the state (eq. 8). heads of the attention mixer")
    mixer_head_dim: Int = Field(64, gt=0, description="width of each head of the attention mixer")
    mamba_expand: Int = Field(2, gt=0, description="Mamba-2 mixer over the state (eq. 9). Mamba-2 inner width = expand x d_s")
    mamba_d_state: Int = Field(128, gt=0, description="Mamba-2 SSM state size per head")
    mamba_d_conv: Int = Field(4, gt=0, description="Mamba-2 causal depthwise conv1d width")
    mamba_head_dim: Int = Field(64, gt=0, description="Mamba-2 head width (heads = expand x d_s / head_dim)")
    mamba_n_groups: Int = Field(8, gt=0, description="Mamba-2 groups sharing B and C")
    mamba_chunk_size: Int = Field(64, gt=0, description="[choice] the paper is silent; mamba_ssm's default is 256. The scan is exact at "
        "any length; the length sets its cost (the intra-chunk products grow with it) and so the counted FLOPs. chunk length of the SSD "
        "scan")
    mamba_prenorm: Bool = Field(True, description="[choice] pre-RMSNorm before the Mamba-2 block; the paper's count rounds the same either "
        "way")
    attn_impl: Literal["auto", "torch", "kernel"] = Field("auto", description="Kernel selection: \"auto\" uses flash-attn / mamba_ssm on "
        "CUDA when importable, \"torch\" never does, \"kernel\" requires them and fails loudly. attention: auto | torch | kernel "
        "(flash-attn)")
    ssd_impl: Literal["auto", "torch", "kernel"] = Field("auto", description="Mamba-2 scan: auto | torch | kernel (mamba_ssm)")
    read_init: Literal["residual", "input"] = Field("residual", description="[choice] Init of the state reads W_{s->z}, W_{s->out} (the "
        "paper gives only the cell's). \"residual\": N(0, init_std / sqrt(2N)) like the backbone's residual-output projections, since "
        "each read is added to the residual stream (Z^{k+1} = H^k + R_{k+1}, the head's H^{K-1} + R_K); \"input\": N(0, init_std) like "
        "input projections, which at init adds a term as large as the embedding.")
    options: dict = Field(default_factory=dict, description="variant-specific options (registry checks them)")

    def __post_init__(self) -> None:
        for key, cap in MODEL_CAPS.items():  # far above any model of the field: a typo, not a shape
            if getattr(self, key) > cap:
                raise ConfigError(f"model.{key}: {getattr(self, key)} is above the sane bound {cap}")
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim: RoPE needs an even head size, got {self.head_dim}")


def refuse_past_trained(trained: ModelConfig, K: int) -> None:
    """A test-time depth check (a registry entry's ``depth``, its class's ``depth_check``) for a model
    whose parameters belong to particular iterations and that has nothing more to say: K up to the
    trained K, the iterations it has parameters for."""
    if K > trained.K:
        raise ConfigError(f"eval.K: {trained.name} has no meaning at K={K}: it has parameters for each of its "
                          f"{trained.K} trained iterations and none past them (K <= {trained.K} only)")
