"""Test-time loop depth: a model trained at K run at K' (``LoopedLM.at_depth``).

The paper evaluates each model only "at the depth used during training" (Sec. 5, Figure 2);
this project also evaluates trained models at other depths. For every registered model, the
model at K' must be exactly the model its own equations define at K' with the same weights: a
model built fresh at K' and given those weights computes the same logits, and cached decoding at
K' equals the full forward at K'. Models whose parameters belong to particular iterations
(MeSH's per-step routers, Hyperloop's per-loop hyper-connections; each class declares them in
``per_iteration``) run at K' <= K only, and every refusal is one line. Nothing here names a model
but the tests of particular ones: a new model runs through the rest from its declarations.
"""

import dataclasses
import functools

import pytest
import torch

from stateloop.config import ConfigError
from stateloop.models.generate import greedy_generate
from stateloop.models.registry import MODELS, build_model, model_classes
from support.models import tiny_config

TRAINED_K = 3


def refusal(check, K):
    """The one-line refusal of depth K by ``check``, or None."""
    try:
        check(K)
    except ConfigError as err:
        return str(err)
    return None


def depths(name):
    """The depths with a meaning for the model (those its registry entry does not refuse): every K'
    for the shared-weight loops, K' <= K for the models with per-iteration parameters."""
    cfg = tiny_config(name, K=TRAINED_K)
    return [K for K in (1, 2, 4, 6) if refusal(lambda k: MODELS[name].check_depth(cfg, k), K) is None]


def fresh_at(trained, K, trained_state):
    """The model built from its config at K (``config_at``: no at_depth), given the trained weights:
    a parameter under an attribute the class declares per iteration (``LoopedLM.per_iteration``,
    iteration axis first) keeps its first iterations, whatever its shape (the entries of a module
    list, the rows of a tensor); every other parameter is the trained one."""
    model = build_model(trained.config_at(K)).eval()
    state = {}
    for key, value in model.state_dict().items():
        source = trained_state[key]
        if key.split(".")[0] in type(trained).per_iteration:
            source = source[tuple(slice(0, n) for n in value.shape)]
        assert source.shape == value.shape, (f"{key}: {tuple(value.shape)} at K={K}, {tuple(source.shape)} trained; a "
                                             f"parameter of particular iterations is declared in its class's per_iteration")
        state[key] = source
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_at_depth_equals_the_model_built_at_that_depth(name):
    torch.manual_seed(0)
    trained = build_model(tiny_config(name, K=TRAINED_K)).eval()
    state = {k: v.clone() for k, v in trained.state_dict().items()}
    idx = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        at_trained = trained(idx).logits
        for K in depths(name):
            ours = trained.at_depth(K)(idx).logits
            reference = fresh_at(trained, K, state)(idx).logits
            assert torch.allclose(ours, reference, rtol=0, atol=1e-6), (name, K)
            if K != TRAINED_K:  # the depth matters: another K gives other logits
                assert not torch.allclose(ours, at_trained, atol=1e-4), (name, K)
        # Back at the trained depth the model is the trained one again, bit for bit.
        assert torch.equal(trained.at_depth(TRAINED_K)(idx).logits, at_trained), name


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cached_decoding_at_another_depth_equals_the_full_forward(name):
    torch.manual_seed(1)
    model = build_model(tiny_config(name, K=TRAINED_K)).eval()
    K = max(depths(name))
    model.at_depth(K)
    prompt = torch.randint(0, 97, (2, 5))
    cached, cached_logits = greedy_generate(model, prompt, 6, use_cache=True, return_logits=True)
    recomputed, logits = greedy_generate(model, prompt, 6, use_cache=False, return_logits=True)
    assert torch.equal(cached, recomputed), name  # top-two logit margins >= 2e-5 against differences < 1e-7
    assert (cached_logits - logits).abs().max() < 1e-4, name


def test_stateloop_at_more_iterations_follows_the_equations():
    """By hand from Sec. 3 at K' = 5 for a model trained at K = 3: Z^0 = E, S^0 = 0;
    H^k = T(Z^k), S^{k+1} = Update(S^k, H^k); Z^{k+1} = H^k + W_{s->z} RMSNorm_s(S^{k+1}) for
    k < K' - 1; logits = W_o RMSNorm_f(H^{K'-1} + W_{s->out} RMSNorm_s(S^{K'})). Five states, four
    feedback reads and one terminal read: none of the trained depth's bookkeeping is left."""
    torch.manual_seed(2)
    model = build_model(tiny_config("stateloop", K=TRAINED_K)).eval().at_depth(5)
    idx = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        Z, rope = model.inputs(idx, None)
        S = None
        for k in range(5):
            H = model.backbone(Z, rope, None)
            S = model.cell(S, H)
            if k < 4:
                Z = H + model.W_sz(model.norm_s(S))
        expected = model.head(model.norm_f(H + model.W_sout(model.norm_s(S))))
        out = model(idx, return_states=True)
    assert len(out.states) == 5
    assert torch.allclose(out.logits, expected, atol=1e-6)


def test_read_mask_follows_the_new_depth():
    model = build_model(tiny_config("stateloop", K=TRAINED_K)).eval().at_depth(5)
    idx = torch.randint(0, 97, (1, 4))
    model(idx, read_mask=torch.ones(5))
    with pytest.raises(ValueError, match="K=5"):
        model(idx, read_mask=torch.ones(TRAINED_K))


def test_pause_token_depth_is_its_pause_count():
    """Pause Token spends its depth as K - 1 pauses per token: at K' it reads after K' - 1 pauses."""
    model = build_model(tiny_config("pause_token", K=TRAINED_K)).eval()
    assert model.n_pause == TRAINED_K - 1
    assert model.at_depth(6).n_pause == 5 and model.group == 6


@pytest.mark.parametrize("name, K, message", [
    ("mesh", TRAINED_K + 1, r"^eval\.K: mesh has no meaning at K=4: its routers are per step .*\(K <= 3 only\)$"),
    ("hyperloop", TRAINED_K + 1, r"^eval\.K: hyperloop has no meaning at K=4: .*\(K <= 3 only\)$"),
    ("stateloop", 0, r"^eval\.K: the loop depth must be a positive integer, got 0$"),
    ("vanilla_looped", True, r"^eval\.K: the loop depth must be a positive integer, got True$"),
])
def test_depths_without_a_meaning_are_refused_in_one_line(name, K, message):
    model = build_model(tiny_config(name, K=TRAINED_K))
    with pytest.raises(ConfigError, match=message):
        model.at_depth(K)
    assert model.cfg.K == TRAINED_K  # a refusal changes nothing


def test_pause_token_with_a_fixed_pause_count_has_no_depth():
    cfg = tiny_config("pause_token", K=TRAINED_K)
    model = build_model(dataclasses.replace(cfg, options={"n_pause": 2}))
    with pytest.raises(ConfigError, match=r"^eval\.K: pause_token has no depth K to change: model\.options\.n_pause = 2"):
        model.at_depth(5)


def per_iteration_models():
    return [name for name in sorted(MODELS) if model_classes()[MODELS[name].model].per_iteration]


def test_the_models_with_per_iteration_parameters_are_declared():
    """MeSH's per-step routers and Hyperloop's per-loop hyper-connections are declared (the list the
    tests above read), and each such model refuses a depth past its trained K: it has no parameters
    for the extra iterations."""
    assert {"hyperloop", "mesh"} <= set(per_iteration_models())
    for name in per_iteration_models():
        check = functools.partial(MODELS[name].check_depth, tiny_config(name, K=TRAINED_K))
        assert refusal(check, TRAINED_K + 1) is not None, (f"{name} declares per-iteration parameters but its registry "
                                                            f"entry runs it past its trained K: give it a depth check")
        model = build_model(tiny_config(name, K=TRAINED_K), device="meta")
        for attr in type(model).per_iteration:  # each names parameters, iteration axis first
            params = list(getattr(model, attr).parameters()) if isinstance(getattr(model, attr), torch.nn.Module) \
                else [getattr(model, attr)]
            assert params and len(getattr(model, attr)) >= TRAINED_K, (name, attr)


@pytest.mark.parametrize("name", per_iteration_models())
def test_the_limit_is_the_trained_depth_after_a_smaller_one(name):
    """A sweep runs one model at K' = 1, 2, ...: after a smaller K' the limit is still the trained K."""
    model = build_model(tiny_config(name, K=TRAINED_K))
    model.at_depth(1)
    with pytest.raises(ConfigError, match=rf"\(K <= {TRAINED_K} only\)$"):
        model.at_depth(TRAINED_K + 1)
    assert model.at_depth(TRAINED_K).cfg.K == TRAINED_K


@pytest.mark.parametrize("name", sorted(MODELS) + ["pause_token n_pause=2"])
def test_the_config_check_refuses_the_depths_the_model_refuses(name):
    """The config-time depth check (pipeline.check_depths) asks the registry spec, with no model
    built; a built model's at_depth refuses exactly the same depths, in the same words."""
    name, _, option = name.partition(" n_pause=")
    cfg = tiny_config(name, K=TRAINED_K)
    if option:
        cfg = dataclasses.replace(cfg, options={"n_pause": int(option)})
    model = build_model(cfg, device="meta")
    for K in range(1, 2 * TRAINED_K + 1):
        assert refusal(lambda k: MODELS[name].check_depth(cfg, k), K) == refusal(model.at_depth, K), (name, K)
