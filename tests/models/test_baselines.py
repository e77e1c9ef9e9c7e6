"""The paper's baselines: the equations of docs/baselines.md checked by hand on tiny tensors.

The generic checks (forward/backward with a gradient for every parameter, causality, cached
decoding == full forward) run for these models in test_models.py; the 1.4B counts in
test_param_counts.py."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from stateloop.config import ConfigError
from stateloop.models.baselines.mesh import write_then_read
from stateloop.models.baselines.parcae import StableInjection
from stateloop.models.baselines.pause_token import expand_with_pauses
from stateloop.models.registry import build_model, count_params
from support.models import tiny_config

# ----------------------------------------------------------------------------------------------
# Parcae


def _extreme_values(g: torch.Generator, d: int) -> torch.Tensor:
    """A mix of ordinary, huge and tiny magnitudes of both signs, up to float32's limits."""
    exponent = torch.empty(d).uniform_(-3, 38.5, generator=g)
    sign = torch.where(torch.rand(d, generator=g) < 0.5, -1.0, 1.0)
    return (sign * 10.0**exponent).clamp(-3.4e38, 3.4e38)


def test_parcae_decay_in_open_unit_interval_for_any_parameters():
    """a = exp(-softplus(dt_bias) exp(A_log)) lies in (0, 1), so ||diag(a)||_2 < 1 (property test)."""
    inj = StableInjection(64)
    g = torch.Generator().manual_seed(1)
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 88.0, -88.0, 1e4, -1e4])
    for trial in range(100):
        with torch.no_grad():
            if trial < len(specials) ** 2 // 4:  # every pair of special values, in slices
                i = torch.arange(64) + 64 * trial
                inj.A_log.copy_(specials[i % len(specials)])
                inj.dt_bias.copy_(specials[(i // len(specials)) % len(specials)])
            else:
                inj.A_log.copy_(_extreme_values(g, 64) if trial % 2 else torch.randn(64, generator=g) * 10)
                inj.dt_bias.copy_(_extreme_values(g, 64))
        a = inj.decay()
        assert torch.isfinite(a).all()
        assert ((a > 0) & (a < 1)).all(), (inj.A_log[(a <= 0) | (a >= 1)], inj.dt_bias[(a <= 0) | (a >= 1)])
        assert torch.linalg.matrix_norm(torch.diag(a), ord=2) < 1


def test_parcae_decay_matches_the_formula_and_init():
    inj = StableInjection(8)
    inj.reset_parameters(0.02)
    assert torch.allclose(inj.decay(), torch.full((8,), math.sqrt(1 / 5)), atol=1e-6)  # a = 0.447
    assert torch.allclose(F.softplus(inj.dt_bias), torch.full((8,), 0.5 * math.log(5)), atol=1e-6)  # Delta = 0.805
    assert torch.equal(inj.B.weight, torch.eye(8))
    with torch.no_grad():
        inj.A_log.copy_(torch.linspace(-3, 3, 8))
        inj.dt_bias.copy_(torch.linspace(2, -2, 8))
    naive = torch.exp(-F.softplus(inj.dt_bias) * torch.exp(inj.A_log))
    assert torch.allclose(inj.decay(), naive, rtol=1e-6)  # the clamp is inactive at ordinary values


def test_parcae_injection_by_hand():
    """u = a h + Delta (B e) on d = 2 with hand-picked parameters."""
    inj = StableInjection(2)
    with torch.no_grad():
        inj.A_log.copy_(torch.tensor([0.0, math.log(2.0)]))  # lambda = 1, 2
        inj.dt_bias.copy_(torch.tensor([math.log(math.e - 1), math.log(math.e**2 - 1)]))  # Delta = 1, 2
        inj.B.weight.copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    h = torch.tensor([[[2.0, 3.0]]])
    e = torch.tensor([[[1.0, -1.0]]])
    u = inj(h, inj.drive(e), inj.decay())
    a = torch.tensor([math.exp(-1.0), math.exp(-4.0)])
    expected = a * torch.tensor([2.0, 3.0]) + torch.tensor([1.0, 2.0]) * torch.tensor([-1.0, -1.0])  # B e = (-1, -1)
    assert torch.allclose(u[0, 0], expected, atol=1e-6)


def test_parcae_forward_is_the_spec_composition():
    model = build_model(tiny_config("parcae", options={"n_prelude": 1, "n_core": 1, "n_coda": 1, "state_init": "zero"})).eval()
    idx = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        x = model.embed(idx) * math.sqrt(32)
        rope = model.rotary(9, None, idx.device, x.dtype)
        e = model.norm_pre(model.prelude(x, rope))
        inj = model.injection
        a, delta = inj.decay(), F.softplus(inj.dt_bias)
        h = torch.zeros_like(e)
        for _ in range(model.cfg.K):
            h = model.backbone(a * h + delta * (e @ inj.B.weight.T), rope)
        manual = model.head(model.norm_f(model.coda(h @ inj.C.weight.T, rope)))
        assert (model(idx).logits - manual).abs().max() < 1e-5


def test_parcae_initial_state_random_in_training_fixed_per_position_in_eval():
    model = build_model(tiny_config("parcae"))
    like = torch.zeros(2, 300, 32)
    pos = torch.arange(300)
    model.train()
    a, b = model.initial_state(like, pos), model.initial_state(like, pos)
    assert not torch.equal(a, b) and not torch.equal(a[0], a[1])  # fresh per call and per sequence
    std = model.cfg.init_std * math.sqrt(32)
    assert a.abs().max() <= 3 * std + 1e-6 and 0.8 * std < a.std() < 1.0 * std  # truncated normal, +-3 sigma
    model.eval()
    full = model.initial_state(like, pos)
    assert torch.equal(full[0], full[1])  # the same for every sequence of a batch
    chunk = model.initial_state(torch.zeros(1, 50, 32), torch.arange(250, 300))
    assert torch.equal(chunk[0], full[0, 250:300])  # a function of the position only
    fresh = build_model(tiny_config("parcae")).eval()
    assert torch.equal(fresh.initial_state(like, pos), full)  # the same seed in every instance
    zero = build_model(tiny_config("parcae", options={"n_prelude": 1, "n_core": 1, "n_coda": 1, "state_init": "zero"}))
    assert torch.equal(zero.initial_state(like, pos), like)


# ----------------------------------------------------------------------------------------------
# PonderLM


def test_ponderlm_pondering_embedding_by_hand():
    """softmax(logits) @ E scaled by c = sqrt(d), on a vocabulary of three."""
    model = build_model(tiny_config("ponderlm", vocab_size=3, d_model=4, n_heads=1, head_dim=4))
    with torch.no_grad():
        model.embed.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 4.0, 8.0]]))
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)]]])  # p = (1/4, 1/4, 1/2)
    expected = 2.0 * torch.tensor([0.25, 0.25, 2.0, 4.0])  # c = sqrt(4) = 2
    assert torch.allclose(model.pondering_embedding(logits)[0, 0], expected, atol=1e-6)


def test_ponderlm_two_passes_by_hand():
    """K = 2 (one pondering step) on a vocabulary of five, computed with explicit loops."""
    model = build_model(tiny_config("ponderlm", K=2, vocab_size=5)).eval()
    idx = torch.tensor([[0, 3, 1, 4, 2, 2]])
    E, c = model.embed.weight, math.sqrt(32)
    with torch.no_grad():
        rope = model.rotary(6, None, idx.device, E.dtype)
        z0 = 1 * c * E[idx]  # s = 1: z^0 = s c E[x]
        p = torch.softmax(model.head(model.norm_f(model.backbone(z0, rope))), -1)
        ponder = torch.zeros_like(z0)
        for v in range(5):  # sum_v p_v E_v, one vocabulary entry at a time
            ponder += p[..., v : v + 1] * E[v]
        z1 = z0 + c * ponder
        manual = model.head(model.norm_f(model.backbone(z1, rope)))
        assert (model(idx).logits - manual).abs().max() < 1e-5


def test_ponderlm_first_input_is_multiplied_by_the_pondering_steps():
    model = build_model(tiny_config("ponderlm", K=4)).eval()
    seen = []
    hook = model.backbone.layers[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    idx = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        model(idx)
    hook.remove()
    assert len(seen) == 4  # four passes of the backbone
    assert torch.allclose(seen[0], 3 * math.sqrt(32) * model.embed.weight[idx], atol=1e-5)  # z^0 = s c E[x]
    plain = build_model(tiny_config("ponderlm", options={"scale_embeds": False, "multiply_pondering_steps": False}))
    assert plain.embed_scale == 1.0


# ----------------------------------------------------------------------------------------------
# MeSH


def test_mesh_write_then_read_by_hand():
    m = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])[None, None]  # (1, 1, S=3, d=2)
    h_new = torch.tensor([2.0, 4.0])[None, None]
    w_write = torch.tensor([0.0, 0.5, 0.5])[None, None]
    w_read = torch.tensor([0.5, 0.25, 0.25])[None, None]
    m2, read = write_then_read(m, h_new, w_write, w_read)
    assert torch.equal(m2[0, 0], torch.tensor([[1.0, 0.0], [1.0, 3.0], [1.0, 2.0]]))
    assert torch.allclose(read[0, 0], torch.tensor([0.5 + 0.25 + 0.25, 0.75 + 0.5]))


def test_mesh_writes_to_every_slot_by_default():
    """Baseline spec (MeSH): "m_b += w_w[b] h_p for all b": by default every slot, slot 0 (which
    starts as the embedding) included, receives a share of each write."""
    model = build_model(tiny_config("mesh")).eval()
    assert model.n_slots == model.cfg.K + 3
    h = torch.randn(2, 7, 32) * 5
    for router in model.routers:
        w_write, w_read = router(h)
        assert torch.allclose(w_write.sum(-1), torch.ones(2, 7)) and torch.allclose(w_read.sum(-1), torch.ones(2, 7))
        assert (w_write > 0).all() and (w_read > 0).all()
    idx = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        out = model(idx, return_buffers=True)
    h_emb = model.embed(idx) * math.sqrt(32)
    assert len(out.states) == model.cfg.K + 1  # the transitional cycle, then K core steps
    assert not torch.equal(out.states[-1][..., 0, :], h_emb)


def test_mesh_protected_slot0_holds_the_embedding():
    """The option ``protect_embedding_slot: true``: no write reaches slot 0, which keeps h_emb."""
    model = build_model(tiny_config("mesh", options={"n_prelude": 1, "n_core": 1, "n_coda": 1,
                                                     "protect_embedding_slot": True})).eval()
    for router in model.routers:
        w_write, _ = router(torch.randn(2, 7, 32) * 5)
        assert (w_write[..., 0] == 0).all() and (w_write[..., 1:] > 0).all()
    idx = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        out = model(idx, return_buffers=True)
    for m in out.states:
        assert torch.equal(m[..., 0, :], model.embed(idx) * math.sqrt(32))


@pytest.mark.parametrize("protect", [False, True])
def test_mesh_forward_is_the_spec_composition(protect):
    """Transitional cycle with router pair 0 on the prelude output; routers t+1 read the core input;
    writes to all slots ("m_b += w_w[b] h_p for all b"), or to slots 1.. with the option."""
    options = {"n_prelude": 1, "n_core": 1, "n_coda": 1, "protect_embedding_slot": protect}
    model = build_model(tiny_config("mesh", K=2, options=options)).eval()
    idx = torch.randint(0, 97, (1, 6))
    S = model.n_slots
    with torch.no_grad():
        h_emb = model.embed(idx) * math.sqrt(32)
        rope = model.rotary(6, None, idx.device, h_emb.dtype)
        slots = [h_emb] + [torch.zeros_like(h_emb) for _ in range(S - 1)]

        def weights(lin, h, protect):
            logits = lin(h)
            if protect:
                logits[..., 0] = -float("inf")
            return torch.softmax(logits, -1)

        def step(router, h_route, h_write):
            w_w, w_r = weights(router.write, h_route, protect), weights(router.read, h_route, False)
            for b in range(S):
                slots[b] = slots[b] + w_w[..., b : b + 1] * h_write
            return sum(w_r[..., b : b + 1] * slots[b] for b in range(S))

        h_p = model.prelude(h_emb, rope)
        h = step(model.routers[0], h_p, h_p)
        for t in range(2):
            h = step(model.routers[t + 1], h, model.backbone(h, rope))
        manual = model.head(model.norm_f(model.coda(h, rope)))
        assert (model(idx).logits - manual).abs().max() < 1e-5


# ----------------------------------------------------------------------------------------------
# Hyperloop


def test_hyperloop_identical_streams_and_uniform_read_give_the_begin_output():
    """At init b_pre = logit(1/n); with alpha_pre = 0 the read is exactly uniform, so the middle
    block's first input equals the begin block's output (the spec's initialisation argument)."""
    model = build_model(tiny_config("hyperloop")).eval()
    n = model.opts.n_streams
    hc = model.hyper[0]
    assert torch.allclose(torch.sigmoid(hc.b[0]), torch.full((n,), 1 / n))
    with torch.no_grad():
        hc.alpha[0] = 0.0
    begin_out, mid_in = [], []
    h1 = model.begin.register_forward_hook(lambda _m, _a, out: begin_out.append(out))
    h2 = model.backbone.register_forward_pre_hook(lambda _m, args: mid_in.append(args[0]))
    with torch.no_grad():
        model(torch.randint(0, 97, (2, 8)))
    h1.remove(), h2.remove()
    assert len(mid_in) == model.cfg.K
    assert torch.allclose(mid_in[0], begin_out[0], atol=1e-6)
    assert (mid_in[1] - begin_out[0]).abs().max() > 1e-3  # later loops read updated streams


def test_hyperloop_loop_by_hand():
    """One hyper-connection step with hand-set weights on n = 2 streams of width 2."""
    from stateloop.models.baselines.hyperloop import LoopHyperConnection

    hc = LoopHyperConnection(n=2, d=2, eps=0.0, alpha_init=1.0, res_bias=0.0)
    hc.reset_parameters(0.02)
    with torch.no_grad():
        hc.W.zero_()
        hc.W[0, 0, 0] = 1.0  # pre logit of stream 0 reads z[0]
        hc.b.copy_(torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)], [math.log(3.0), 0.0]]))
    Y = torch.tensor([[3.0, 4.0], [0.0, 0.0]])[None, None]  # flatten: (3, 4, 0, 0), RMS = 2.5
    h_pre, h_post, h_res = hc.weights(Y)
    z0 = 3.0 / 2.5
    assert torch.allclose(h_pre[0, 0], torch.tensor([1 / (1 + math.exp(-z0)), 0.5]))
    assert torch.allclose(h_post[0, 0], torch.tensor([1.0, 1.5]))  # 2 sigmoid(0), 2 sigmoid(log 3)
    assert torch.allclose(h_res[0, 0], torch.tensor([0.75, 0.5]))
    u = hc.read(Y, h_pre)
    assert torch.allclose(u[0, 0], h_pre[0, 0, 0] * torch.tensor([3.0, 4.0]))
    o = torch.tensor([1.0, -1.0])[None, None]
    Y2 = hc.write(Y, o, h_post, h_res)
    assert torch.allclose(Y2[0, 0], torch.tensor([[0.75 * 3 + 1, 0.75 * 4 - 1], [1.5, -1.5]]))


# ----------------------------------------------------------------------------------------------
# Pause tokens


def test_pause_expansion_and_labels_on_a_small_example():
    idx = torch.tensor([[5, 7, 9]])
    ids, labels = expand_with_pauses(idx, n_pause=3, pause_id=96)
    P, X = 96, -100
    assert ids.tolist() == [[5, P, P, P, 7, P, P, P, 9, P, P, P]]
    assert labels.tolist() == [[X, X, X, 7, X, X, X, 9, X, X, X, X]]
    _, labels_t = expand_with_pauses(idx, 3, 96, targets=torch.tensor([[7, 9, 11]]))
    assert labels_t.tolist() == [[X, X, X, 7, X, X, X, 9, X, X, X, 11]]
    assert ((labels_t != X).sum(1) == idx.shape[1]).all()  # exactly one target per real token


def test_pause_token_loss_counts_one_target_per_real_token():
    model = build_model(tiny_config("pause_token")).eval()
    assert (model.n_pause, model.pause_id) == (model.cfg.K - 1, 96)
    idx = torch.randint(0, 96, (2, 6))
    targets = torch.randint(0, 96, (2, 6))
    with torch.no_grad():
        logits = model(idx).logits  # (B, T, V): one read-out per real token
        full = model.expanded_logits(idx)  # (B, K T, V)
    assert logits.shape == (2, 6, 97) and full.shape == (2, 6 * model.cfg.K, 97)
    _, labels = expand_with_pauses(idx, model.n_pause, model.pause_id, targets)
    assert (labels != -100).sum() == idx.numel()
    masked = F.cross_entropy(full.flatten(0, 1), labels.flatten(), ignore_index=-100)
    plain = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert torch.allclose(masked, plain, atol=1e-6)
    assert torch.allclose(logits, full[:, model.cfg.K - 1 :: model.cfg.K], atol=1e-6)
    # The pause positions read the pause row of E (a padded id): no new parameters.
    assert count_params(tiny_config("pause_token")) == count_params(tiny_config("vanilla_looped"))


# ----------------------------------------------------------------------------------------------
# Shapes, counts and options


def _tiny_extra(name, **options):
    base = count_params(tiny_config("vanilla_looped", n_layers=3))
    return count_params(tiny_config(name, options={**tiny_config(name).options, **options})) - base


def test_extra_parameters_follow_the_spec_formulas_at_tiny_shape():
    d, K = 32, 3
    n = 3  # TINY_OPTIONS: 1/1/1 layers, so the unique layers match a 3-layer vanilla model
    assert _tiny_extra("hyperloop") == K * (3 * n * n * d + 3 * n + 3 + d)
    S = K + 3
    assert _tiny_extra("mesh") == (K + 1) * 2 * (d + 1) * S
    assert _tiny_extra("parcae") == 2 * d * d + 3 * d


@pytest.mark.parametrize("name,K,paper", [
    ("hyperloop", 4, 407.10), ("mesh", 10, 407.19), ("parcae", 10, 409.00), ("ponderlm", 4, 406.90), ("pause_token", 4, 406.90),
])
def test_410m_counts_from_the_spec(name, K, paper):
    from pathlib import Path

    from stateloop.experiments import load_pipeline, run_model_config

    cfg = load_pipeline(Path(__file__).resolve().parents[2] / "configs/paper.yaml")
    assert round(count_params(run_model_config(cfg.scales["410m"], name, K, 0)) / 1e6, 2) == paper


def test_layer_applications_per_token_at_1_4b():
    from stateloop.config.model import ModelConfig

    expected = {"hyperloop": (4, 60), "mesh": (10, 96), "parcae": (10, 96), "ponderlm": (4, 96), "pause_token": (4, 24)}
    for name, (K, n) in expected.items():
        assert build_model(ModelConfig(name=name, K=K), device="meta").n_layer_applications == n, name


def test_bad_options_name_the_key():
    def build(name, **kw):
        return build_model(tiny_config(name, **kw))

    with pytest.raises(ConfigError, match=r"model\.options\.state_init: must be random or zero"):
        build("parcae", options={"state_init": "ones"})
    with pytest.raises(ConfigError, match=r"model\.options\.n_prelude: mesh cannot split n_layers=2"):
        build("mesh", options={})
    with pytest.raises(ConfigError, match=r"model\.options\.n_core: parcae needs at least 1"):
        build("parcae", options={"n_prelude": 1, "n_core": 0, "n_coda": 1})
    with pytest.raises(ConfigError, match=r"model\.options\.pause_id"):
        build("pause_token", options={"pause_id": 97})
    with pytest.raises(ConfigError, match=r"model\.options\.n_streams"):
        build("hyperloop", options={"n_begin": 1, "n_middle": 1, "n_end": 1, "n_streams": 0})
    # Defaults split n_layers: 6/12/6 and 8/8/8 at 24 layers.
    cfg = dataclasses.replace(tiny_config("hyperloop"), n_layers=24, options={})
    assert build_model(cfg, device="meta").n_begin == 6 and build_model(cfg, device="meta").n_middle == 12


def test_table1_runs_use_each_models_own_loop_count(tmp_path):
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline

    cfg = load_pipeline(Path(__file__).resolve().parents[2] / "configs/paper.yaml")
    runs = {r.model: r for r in expand_runs(cfg, ["table1"])}
    assert len(runs) == 10
    assert {m: r.K for m, r in runs.items() if r.K != 4} == {"mesh": 10, "parcae": 10}
    assert runs["mesh"].id == "1.4b/mesh/K10_ds0_seed1234" and runs["pause_token"].id == "1.4b/pause_token/K4_ds0_seed1234"
    bad = tmp_path / "bad.yaml"
    bad.write_text("scales: {s: {}}\nexperiments: {e: {scale: s, models: [mesh], K_by_model: {meshh: [3]}}}\n")
    with pytest.raises(ConfigError, match="unknown model 'meshh'"):
        load_pipeline(bad)
