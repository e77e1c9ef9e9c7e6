"""FLOP counts (models/flops.py) against counts written out by hand from each model's equations.

The analytic counts below multiply out every matmul and attention product of one
training step (forward, and a backward of twice the forward: each product's two gradients),
from the config alone. Attention is counted dense (QK^T and AV over all T x T pairs), as the
FLOP counter and the usual MFU convention count it. Two shapes each: a grouped Mamba-2 (two
groups of heads), the chunk length dividing T or not (padding), d_s below d or equal to it.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from stateloop.models.flops import DECODE_MIXERS, compute_profile, counted_decode_flops, decode_flops_per_token
from stateloop.models.looped import matched_ffn_width
from stateloop.models.registry import MODELS
from support import example
from support.models import tiny_config

SPLIT = {"n_begin": 1, "n_middle": 1, "n_end": 1}
SHAPES = {
    "A": dict(T=16, shape=dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, head_dim=8, K=3, d_s=16, vocab_size=97,
                               mixer_heads=2, mixer_head_dim=8, mamba_d_state=8, mamba_head_dim=8, mamba_n_groups=2,
                               mamba_chunk_size=8)),
    "B": dict(T=20, shape=dict(n_layers=1, d_model=48, d_ff=96, n_heads=2, head_dim=16, K=2, d_s=48, vocab_size=101,
                               mixer_heads=3, mixer_head_dim=16, mamba_d_state=4, mamba_head_dim=12, mamba_n_groups=1,
                               mamba_chunk_size=8)),
}
OPTIONS = {"hyperloop": {**SPLIT, "n_streams": 3}, "mesh": {"n_prelude": 1, "n_core": 1, "n_coda": 1},
           "parcae": {"n_prelude": 1, "n_core": 1, "n_coda": 1}}


def config(name: str, shape: dict):
    shape = dict(shape)
    if not MODELS[name].has_state:
        shape["d_s"] = 0
    elif name == "state_only":
        shape["d_s"] = shape["d_model"]
    return tiny_config(name, **shape, options=dict(OPTIONS.get(name, {})), max_seq_len=64)


def layer(c, T: int, ctx: int, d_ff: int | None = None) -> int:
    """One decoder layer over T positions attending to ctx keys: q, k, v, o; SwiGLU; QK^T and AV."""
    d, inner, f = c.d_model, c.n_heads * c.head_dim, d_ff or c.d_ff
    return 2 * T * (4 * d * inner + 3 * d * f) + 4 * T * ctx * inner


def mamba2(c, T: int) -> int:
    """The Mamba-2 mixer over T tokens: in_proj, chunked SSD, out_proj. Its depthwise causal
    convolution and the carry of states from chunk to chunk are elementwise multiply-adds in the
    twin, not matmuls, and uncounted like the norms (models/flops.py)."""
    d_s, d_in = c.d_s, c.mamba_expand * c.d_s
    G, N, P = c.mamba_n_groups, c.mamba_d_state, c.mamba_head_dim
    H, q = d_in // P, c.mamba_chunk_size
    chunks = math.ceil(T / q)
    L = chunks * q  # padded length
    ssd = (2 * L * q * G * N  # C_i . B_j inside each chunk, once per group
           + 2 * L * q * H * P  # scores times dt x
           + 2 * L * H * P * N  # chunk-final states
           + (2 * L * H * P * N if chunks > 1 else 0))  # the entering state read by each output (none with one chunk)
    return 2 * T * d_s * (2 * d_in + 2 * G * N + H) + ssd + 2 * T * d_in * d_s


def analytic_forward(name: str, c, T: int) -> int:
    d, V, K, L, d_s = c.d_model, c.vocab_size, c.K, c.n_layers, c.d_s
    head = 2 * T * d * V
    backbone = K * L * layer(c, T, T)
    cell = 2 * T * d * 2 * d_s  # W_u and W_Delta
    reads = K * 2 * T * d_s * d  # K - 1 feedback reads and the terminal read
    if name == "vanilla_looped":
        return backbone + head
    if name == "vanilla_looped_ffn":
        return K * L * layer(c, T, T, matched_ffn_width(c)) + head
    if name in ("stateloop", "reset_state"):
        return backbone + head + K * cell + reads
    if name == "stateloop_attn":
        inner = c.mixer_heads * c.mixer_head_dim
        return backbone + head + K * cell + reads + K * (2 * T * 4 * d_s * inner + 4 * T * T * inner)
    if name == "stateloop_mamba2":
        return backbone + head + K * cell + reads + K * mamba2(c, T)
    if name == "state_only":  # K - 1 cell updates at width d, no reads
        return backbone + head + (K - 1) * cell
    if name == "stateloop_gru":  # W_u, then the GRU's input and hidden products (3 gates each)
        return backbone + head + K * (2 * T * d * d_s + 2 * 2 * T * 3 * d_s * d_s) + reads
    if name == "hyperloop":  # begin + K middle + end; per loop the weights z W^T (3n of n d) and the read
        n = OPTIONS["hyperloop"]["n_streams"]
        return (2 + K) * layer(c, T, T) + head + K * (2 * T * n * d * 3 * n + 2 * T * n * d)
    if name == "mesh":  # prelude + K core + coda; K + 1 routers (write, read) and buffer reads over K + 3 slots
        S = K + 3
        return (2 + K) * layer(c, T, T) + head + (K + 1) * (2 * T * d * 2 * S + 2 * T * S * d)
    if name == "parcae":  # prelude + K core + coda; the injection's B once, its C once
        return (2 + K) * layer(c, T, T) + head + 2 * 2 * T * d * d
    if name == "ponderlm":  # K passes, each read by the head; K - 1 pondering embeddings p E
        return backbone + K * head + (K - 1) * 2 * T * V * d
    if name == "pause_token":  # one pass over K positions per token; the head at the T read-outs
        return L * layer(c, K * T, K * T) + head
    return own_count(name)(c, T)


def own_count(name: str):
    """A model added after the paper's 13 writes its count by hand in its own test file:
    ``analytic_forward(c, T)`` in tests/models/test_<name>.py (docs/adding-a-model.md), with this
    file's ``layer`` and ``mamba2`` to import (docs/adding-a-model.md's example: the page's test block)."""
    path = Path(__file__).with_name(f"test_{name}.py")
    found = getattr(example.TEST_MODULE, "analytic_forward", None) if name == example.NAME else None
    if found is None and path.is_file():
        spec = importlib.util.spec_from_file_location(f"own_flops_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found = getattr(module, "analytic_forward", None)
    if found is None:
        raise AssertionError(f"no analytic FLOP count for {name}: write analytic_forward(c, T) in tests/models/{path.name}")
    return found


def backward_extra(name: str, c, T: int) -> int:
    """Gradients that are not computed: the GRU's first hidden state is the zero tensor, so its
    hidden product has a weight gradient only."""
    if name == "stateloop_gru":
        return -2 * T * 3 * c.d_s * c.d_s
    return 0


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow
def test_training_flops_equal_the_analytic_count(name, shape):
    """Every model's training step (forward and backward) as models/flops.py counts it, within 1%
    of the count by hand."""
    T, c = SHAPES[shape]["T"], config(name, SHAPES[shape]["shape"])
    expected = 3 * analytic_forward(name, c, T) + backward_extra(name, c, T)
    counted = compute_profile(c, T).flops_per_token * T
    assert counted == pytest.approx(expected, rel=0.01), f"{name}: counted {counted:.4g}, by hand {expected:.4g}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", DECODE_MIXERS)
def test_decode_flops_equal_the_counted_step(name, shape):
    """Table 3's rows: the decoded token's count written out from the config (models/flops.py) is
    what the FLOP counter sees in a real cached step, exactly, and linear in the context."""
    c = config(name, SHAPES[shape]["shape"])
    assert decode_flops_per_token(c, 24) == counted_decode_flops(c, 24)
    assert decode_flops_per_token(c, 24.5) == (decode_flops_per_token(c, 24) + decode_flops_per_token(c, 25)) / 2
    if name in ("vanilla_looped", "stateloop"):  # and by hand: no mixer, one layer application's keys
        d, K, L, d_s = c.d_model, c.K, c.n_layers, c.d_s
        expected = K * L * layer(c, 1, 25) + 2 * d * c.vocab_size + K * (2 * d * 2 * d_s + 2 * d_s * d)
        assert decode_flops_per_token(c, 24) == expected


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Counts kept in this test's own folder, none in memory: nothing counted before is reused."""
    from stateloop.models import counted

    monkeypatch.setenv("STATELOOP_CACHE", str(tmp_path))
    monkeypatch.setattr(counted, "PROFILES", {})
    return tmp_path


@pytest.mark.parametrize("name", MODELS)
def test_stand_ins_count_what_the_whole_model_counts(name):
    """models/flops.py counts one decoder-layer application per shape on its own and adds it at
    every application: the same total, exactly, as the whole model under the counter, for every
    model at both shapes (Pause Token's longer sequences, the baselines' unique stacks, the
    mixers outside the layers); and the layer applications per token are the same."""
    from stateloop.models.flops import _count_profile

    for shape in SHAPES.values():
        c = config(name, shape["shape"])
        assert _count_profile(c, shape["T"]) == _count_profile(c, shape["T"], stand_ins=False)


def test_counts_are_kept_on_disk_by_config_and_code(own_cache, monkeypatch):
    """Where a command keeps the counts on disk (ops/measured.py: keep_flop_counts; models/ reads no
    cache itself), a count is read back by a later process (the in-memory table emptied) without
    counting; a change to the code that counts (the digest of models/, models/flops.py among them)
    names another file, so a stale count is never read."""
    from stateloop.models import counted, flops
    from stateloop.ops import measured

    c = config("stateloop", SHAPES["A"]["shape"])
    first = flops.compute_profile(c, 16)
    assert not (own_cache / "flops").exists()  # not kept: in this process only
    measured.keep_flop_counts()
    assert flops.compute_profile(c, 16) == first and isinstance(counted.PROFILES, measured.Kept)
    assert not (own_cache / "flops").exists()  # the count already held is not written again
    monkeypatch.setattr(counted, "PROFILES", {})
    measured.keep_flop_counts()
    first = flops.compute_profile(c, 16)
    assert len(list((own_cache / "flops").glob("*.json"))) == 1
    monkeypatch.setattr(counted, "PROFILES", {})
    measured.keep_flop_counts()
    monkeypatch.setattr(flops, "_count_profile", lambda *a: pytest.fail("counted again"))
    assert flops.compute_profile(c, 16) == first
    monkeypatch.setattr(counted, "PROFILES", {})
    measured.keep_flop_counts()
    monkeypatch.setattr(measured, "code_digest", lambda *m: "another version of the code")
    with pytest.raises(pytest.fail.Exception, match="counted again"):
        flops.compute_profile(c, 16)


def test_a_shape_is_counted_once_per_process_and_each_shape_apart(own_cache, monkeypatch):
    """`stateloop plan` counts every run of a config, and its seeds repeat shapes: a repeated
    (config, seq_len) reuses the count, while a changed K, width or sequence length is counted
    anew and gives its own figure (a cache keyed on too little would hand one shape's count to
    another)."""
    from stateloop.models import flops

    calls = []
    count = flops._count_profile
    monkeypatch.setattr(flops, "_count_profile", lambda cfg, T: calls.append((cfg.K, cfg.d_s, T)) or count(cfg, T))
    base = config("stateloop", SHAPES["A"]["shape"])
    first = flops.compute_profile(base, 16)
    assert flops.compute_profile(config("stateloop", SHAPES["A"]["shape"]), 16) == first and len(calls) == 1
    deeper = flops.compute_profile(config("stateloop", {**SHAPES["A"]["shape"], "K": 4}), 16)
    wider = flops.compute_profile(config("stateloop", {**SHAPES["A"]["shape"], "d_s": 32}), 16)
    longer = flops.compute_profile(base, 24)
    assert calls == [(3, 16, 16), (4, 16, 16), (3, 32, 16), (3, 16, 24)]
    assert deeper.flops_per_token > first.flops_per_token and wider.flops_per_token > first.flops_per_token
    assert longer.flops_per_token > first.flops_per_token  # attention's T x T grows per token
    assert first == count(base, 16)


@pytest.mark.parametrize("name", ["vanilla_looped", "stateloop_attn", "stateloop_mamba2"])
def test_a_training_step_on_cpu_tensors_counts_what_the_meta_count_does(name):
    """On CPU tensors attention runs torch's CPU flash kernel, which torch's counter has no formula
    for; models/flops.py gives it one (forward QK^T and AV, backward twice that), so the benchmark
    scripts, which count real CPU steps (bench_state_branch.py pieces and train), count the attention
    products compute_profile counts on the meta device."""
    import torch

    from stateloop.models.flops import counter
    from stateloop.models.registry import build_model

    cfg, T = tiny_config(name), 16
    model = build_model(cfg)
    with counter() as c:
        model(torch.zeros(1, T, dtype=torch.long)).logits.float().sum().backward()
    assert c.get_total_flops() / T == compute_profile(cfg, T).flops_per_token
