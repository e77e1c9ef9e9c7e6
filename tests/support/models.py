"""Tiny model configs for tests, and a copy of a model into transformers' Llama."""

from __future__ import annotations

import math

from stateloop.config.model import ModelConfig
from stateloop.models.registry import MODELS

# Options some models need at the tiny shape (their defaults are sized for the paper).
TINY_OPTIONS: dict[str, dict] = {
    "vanilla_looped_ffn": {"d_ff": 80},
    "hyperloop": {"n_begin": 1, "n_middle": 1, "n_end": 1, "n_streams": 3},
    "mesh": {"n_prelude": 1, "n_core": 1, "n_coda": 1},
    "parcae": {"n_prelude": 1, "n_core": 1, "n_coda": 1},
}


def tiny_config(name: str = "vanilla_looped", **overrides) -> ModelConfig:
    """A model small enough for many forward/backward passes on CPU."""
    base = dict(
        name=name, vocab_size=97, n_layers=2, d_model=32, d_ff=64, n_heads=4, head_dim=8, K=3,
        d_s=32 if MODELS[name].has_state else 0, max_seq_len=64, mixer_heads=4, mixer_head_dim=8,
        mamba_d_state=8, mamba_head_dim=8, mamba_n_groups=2, mamba_chunk_size=8,
        options=dict(TINY_OPTIONS.get(name, {})), attn_impl="torch", ssd_impl="torch",
    )
    base.update(overrides)
    return ModelConfig(**base)


def to_transformers_llama(model):
    """Copy a K=1 vanilla_looped into transformers' LlamaForCausalLM (same weights, fp32).

    The sqrt(d) input scale of eq. (1) is folded into the copied embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    assert cfg.K == 1, "only a single application of the backbone is a plain Llama"
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=model.backbone.layers[0].ffn.w_up.out_features,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, max_position_embeddings=cfg.max_seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
    )
    hf = LlamaForCausalLM(hf_cfg).float().eval()
    sd = {
        "model.embed_tokens.weight": model.embed.weight * math.sqrt(cfg.d_model),
        "model.norm.weight": model.norm_f.weight,
        "lm_head.weight": model.head.weight,
    }
    for i, layer in enumerate(model.backbone.layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": layer.attn.wq.weight, p + "self_attn.k_proj.weight": layer.attn.wk.weight,
            p + "self_attn.v_proj.weight": layer.attn.wv.weight, p + "self_attn.o_proj.weight": layer.attn.wo.weight,
            p + "mlp.gate_proj.weight": layer.ffn.w_gate.weight, p + "mlp.up_proj.weight": layer.ffn.w_up.weight,
            p + "mlp.down_proj.weight": layer.ffn.w_down.weight,
            p + "input_layernorm.weight": layer.attn_norm.weight, p + "post_attention_layernorm.weight": layer.ffn_norm.weight,
        })
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    return hf
