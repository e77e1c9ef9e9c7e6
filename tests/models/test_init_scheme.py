"""model.init_scheme: the backbone's init where the paper gives only the cell's (models/init.py).

"plain" is the authors' own recipe: their public PonderLM-2 configs are transformers'
LlamaForCausalLM configs (``llama_config/1.4b/config.json``: ``"initializer_range": 0.01``;
410m: 0.02), whose ``_init_weights`` draws every Linear and Embedding weight from
N(0, initializer_range), residual-output projections included. "depth_scaled" (the default,
GPT-2's rule over the unrolled loop) draws those from N(0, init_std / sqrt(2 K L))."""

import dataclasses
import math

import pytest
import torch
import yaml

from stateloop.config import ConfigError
from stateloop.models.init import init_weights
from stateloop.models.registry import MODELS, build_model
from support.models import tiny_config

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SHAPE = dict(K=7, d_model=64, n_heads=4, head_dim=16, d_ff=256, n_layers=2)


def _stds(scheme: str, name: str = "stateloop", std: float = 0.02) -> dict[str, float]:
    cfg = dataclasses.replace(tiny_config(name, d_s=64 if name == "stateloop" else 0, **SHAPE),
                              init_scheme=scheme, init_std=std)
    torch.manual_seed(0)
    model = build_model(cfg)
    blocks = model.backbone.layers[0]
    out = {"embed": model.embed.weight.std().item(), "W_o": blocks.attn.wo.weight.std().item(),
           "W_down": blocks.ffn.w_down.weight.std().item(), "W_q": blocks.attn.wq.weight.std().item()}
    if name == "stateloop":
        out.update(W_sz=model.W_sz.weight.std().item(), W_sout=model.W_sout.weight.std().item(),
                   W_u=model.cell.W_u.weight.std().item(), W_delta=model.cell.W_delta.weight.abs().max().item())
    return out


@pytest.mark.parametrize("std", [0.01, 0.02])
def test_plain_draws_every_weight_from_one_normal(std):
    """Under "plain" the residual outputs (W_o, W_down) and the reads (read_init "residual": like
    the residual outputs) are drawn as the input projections: N(0, init_std). The cell keeps the
    paper's init (W_Delta = 0) under either scheme."""
    s = _stds("plain", std=std)
    for key in ("embed", "W_q", "W_o", "W_down", "W_sz", "W_sout", "W_u"):
        assert math.isclose(s[key], std, rel_tol=0.06), (key, s[key])
    assert s["W_delta"] == 0


def test_depth_scaled_divides_the_residual_outputs_by_the_unrolled_depth():
    """The default: W_o, W_down and the reads N(0, 0.02 / sqrt(2 K L)), K L = 14 layer applications
    (a 5.3-fold smaller std than plain: telling the two schemes apart is what this test checks)."""
    s = _stds("depth_scaled")
    small = 0.02 / math.sqrt(2 * 7 * 2)
    for key in ("W_o", "W_down", "W_sz", "W_sout"):
        assert math.isclose(s[key], small, rel_tol=0.06), (key, s[key])
    for key in ("embed", "W_q", "W_u"):
        assert math.isclose(s[key], 0.02, rel_tol=0.06), (key, s[key])


def test_the_default_scheme_is_unchanged():
    """The default stays depth-scaled: every run trained before the option (and the golden losses)
    keeps its init."""
    assert tiny_config().init_scheme == "depth_scaled"
    assert _stds("depth_scaled", name="vanilla_looped") == _stds(tiny_config().init_scheme, name="vanilla_looped")


def test_an_unknown_scheme_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"model\.init_scheme: must be one of depth_scaled, plain; got 'xavier'"):
        tiny_config(init_scheme="xavier")


def test_paper_yaml_follows_the_authors_where_the_paper_is_silent():
    """paper.yaml at each scale: the authors' initializer_range (1.4B 0.01, 410M 0.02) with the plain
    scheme, their warmup_ratio 0.02 (rounded up, as transformers' get_warmup_steps), their weight
    decay (1.4B script 0.1, 410M script 0.01), lr floor 0.1 x peak, AdamW (0.9, 0.95); and the
    paper's own peak lrs ("peak learning rate 2 x 10^-4" at 1.4B, "3 x 10^-4" at 410M)."""
    scales = yaml.safe_load((ROOT / "configs/paper.yaml").read_text())["scales"]
    expect = {"1.4b": (0.01, 2e-4, 0.1), "410m": (0.02, 3e-4, 0.01)}
    for name, (std, lr, wd) in expect.items():
        model, train = scales[name]["model"], scales[name]["train"]
        assert (model["init_scheme"], model["init_std"]) == ("plain", std), name
        steps = train["max_tokens"] // (train["global_batch"] * train["seq_len"])
        assert train["warmup_steps"] == math.ceil(0.02 * steps), (name, steps)
        assert (train["lr"], train["weight_decay"], train["betas"]) == (lr, wd, [0.9, 0.95])
        assert math.isclose(train["min_lr"], 0.1 * lr), name


def untouched_by_init(model) -> list[str]:
    """The parameters models/init.py leaves unwritten: every parameter set to NaN, then
    ``init_weights``; a parameter (or part of one) still NaN was written by no rule and no
    ``reset_parameters``."""
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    init_weights(model)
    return [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_init_writes_every_parameter(name):
    untouched = untouched_by_init(build_model(tiny_config(name), init=False))
    assert not untouched, (f"{name}: no init writes {untouched}; give it a reset_parameters(std) on its module "
                           f"(models/init.py, docs/adding-a-model.md)")


def test_a_parameter_no_init_writes_is_named():
    """As a raw ``nn.Parameter(torch.empty(K, d))`` on a model without a reset_parameters for it (issue 59)."""
    model = build_model(tiny_config("vanilla_looped"), init=False)
    model.iter_emb = torch.nn.Parameter(torch.empty(3, 32))
    assert untouched_by_init(model) == ["iter_emb"]

