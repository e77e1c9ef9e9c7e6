"""The lm-eval model: loglikelihood against the model's logits, against lm-eval's own HF backend,
rolling windows by hand, greedy generation with and without the KV cache."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

from stateloop.evaluate.lm import StateLoopEvalLM
from stateloop.fast import accelerate
from support.evaluation import EOS, sentences


def ll_requests(pairs):
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def direct_loglikelihood(model, tokenizer, eos, context, continuation, window):
    """log p(continuation | context) from one forward pass, computed without the adapter.
    lm-eval's request semantics: trailing spaces of the context belong to the continuation."""
    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped):] + continuation
    if context:
        ctx = tokenizer.encode(context, add_special_tokens=False).ids
        whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
        cont = whole[len(ctx):]
    else:
        ctx, cont = [eos], tokenizer.encode(continuation, add_special_tokens=False).ids
        whole = ctx + cont
    seq = whole[-(window + 1):]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([seq[:-1]])).logits[0].double(), -1)
    n = len(cont)
    rows = logp[len(seq) - 1 - n :]  # the positions that predict the continuation
    total = sum(float(rows[j, t]) for j, t in enumerate(cont))
    greedy = all(int(rows[j].argmax()) == t for j, t in enumerate(cont))
    return total, greedy


@pytest.mark.parametrize("name", ["vanilla_looped", "stateloop_mamba2"])
def test_loglikelihood_equals_direct_computation(make_run, tokenizer, name):
    run_dir, model = make_run(name)
    lm = StateLoopEvalLM(str(run_dir), batch_size=3, device="cpu")
    assert lm.model.cfg.name == name  # the variant comes from the folder
    long_context = " ".join(sentences(20, seed=3))  # longer than the 64-token window: truncated on the left
    pairs = [("the cat sat on the", " mat"), ("", "the dog ran."), ("a big red fox", " jumped over the lazy dog"),
             (long_context, " then it was"), ("one bird", " saw"), ("near the old house ", "tree")]
    got = lm.loglikelihood(ll_requests(pairs), disable_tqdm=True)
    eos = tokenizer.token_to_id(EOS)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        want, want_greedy = direct_loglikelihood(model, tokenizer, eos, ctx, cont, 64)
        assert ll == pytest.approx(want, abs=1e-4), (ctx[:20], cont)
        assert greedy == want_greedy
    # A continuation that is the model's own greedy choice is reported as greedy.
    ids = tokenizer.encode("the cat sat", add_special_tokens=False).ids
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    n_ctx = len(tokenizer.encode("the cat sat", add_special_tokens=False).ids)
    cont_text = tokenizer.decode(ids[n_ctx:])
    if tokenizer.encode("the cat sat" + cont_text, add_special_tokens=False).ids == ids:  # round-trips
        ((_, greedy),) = lm.loglikelihood(ll_requests([("the cat sat", cont_text)]), disable_tqdm=True)
        assert greedy


def test_results_come_back_in_request_order(make_run):
    run_dir, _ = make_run()
    lm = StateLoopEvalLM(str(run_dir), batch_size=2, device="cpu")
    pairs = [(" ".join(sentences(1, seed=i)), " the end") for i in range(9)]
    forward = lm.loglikelihood(ll_requests(pairs), disable_tqdm=True)
    order = list(range(9))
    random.Random(0).shuffle(order)
    shuffled = lm.loglikelihood(ll_requests([pairs[i] for i in order]), disable_tqdm=True)
    for k, i in enumerate(order):
        assert shuffled[k][0] == pytest.approx(forward[i][0], abs=1e-5)


def write_mc_task(folder, tokenizer_words, n=24):
    """A small multiple-choice task (absolute data paths, as lm-eval needs)."""
    rng = random.Random(7)
    rows = []
    for _ in range(n):
        q = " ".join(rng.choice(tokenizer_words) for _ in range(6))
        choices = [" ".join(rng.choice(tokenizer_words) for _ in range(rng.randint(1, 3))) for _ in range(3)]
        rows.append({"question": q, "choices": choices, "label": rng.randrange(3)})
    data = folder / "toy_mc.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "toy_mc.yaml").write_text(f"""task: toy_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
metadata: {{version: 1.0}}
""")
    return folder


def test_matches_lm_eval_hf_backend(make_run, data_dir, tmp_path):
    """A K=1 vanilla_looped copied into transformers' Llama: lm-eval's HF backend and ours give the
    same loglikelihoods and the same accuracy on a local task."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import PreTrainedTokenizerFast

    from support.evaluation import WORDS
    from support.models import to_transformers_llama

    run_dir, model = make_run("vanilla_looped", K=1)
    ours = StateLoopEvalLM(str(run_dir), batch_size=4, device="cpu")
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(data_dir / "tokenizer.json"), eos_token=EOS)
    theirs = HFLM(pretrained=to_transformers_llama(model), tokenizer=hf_tok, batch_size=4, max_length=64, device="cpu")

    pairs = [("the cat sat on the", " mat"), ("", "the dog"), ("a big red fox", " jumped over"),
             (" ".join(sentences(12, seed=4)), " and then"), ("it was", " green and blue")]
    a = ours.loglikelihood(ll_requests(pairs), disable_tqdm=True)
    b = theirs.loglikelihood(ll_requests(pairs), disable_tqdm=True)
    for (la, ga), (lb, gb) in zip(a, b):
        assert la == pytest.approx(lb, abs=1e-4)
        assert ga == gb

    tm = TaskManager(include_path=str(write_mc_task(tmp_path, WORDS)), include_defaults=False)
    kw = dict(tasks=["toy_mc"], num_fewshot=0, task_manager=tm, bootstrap_iters=0, log_samples=True)
    ra = lm_eval.simple_evaluate(model=ours, **kw)
    rb = lm_eval.simple_evaluate(model=theirs, **kw)
    assert ra["results"]["toy_mc"]["acc,none"] == rb["results"]["toy_mc"]["acc,none"]
    assert ra["results"]["toy_mc"]["acc_norm,none"] == rb["results"]["toy_mc"]["acc_norm,none"]
    for sa, sb in zip(ra["samples"]["toy_mc"], rb["samples"]["toy_mc"]):
        for (la, _), (lb, _) in zip([r[0] for r in sa["resps"]], [r[0] for r in sb["resps"]]):
            assert la == pytest.approx(lb, abs=1e-4)


def test_loglikelihood_rolling_sums_hand_made_windows(make_run, tokenizer):
    """A document of ~5 windows: the total is the sum of each token's log-probability, token i
    predicted from the window lm-eval assigns it (written out here without lm-eval's helpers)."""
    from lm_eval.utils import get_rolling_token_windows

    run_dir, model = make_run("stateloop")
    L = 16
    lm = StateLoopEvalLM(str(run_dir), batch_size=4, max_length=L, device="cpu")
    text = " ".join(sentences(12, seed=9))
    toks = tokenizer.encode(text, add_special_tokens=False).ids
    n, eos = len(toks), tokenizer.token_to_id(EOS)
    assert n > 4 * L + 3

    def logprobs(inp):
        with torch.no_grad():
            return F.log_softmax(model(torch.tensor([inp])).logits[0].double(), -1)

    # Window 1 predicts tokens 0..L-1 from [eos] + tokens[:L-1]; each later window predicts the
    # next (up to) L tokens from the L tokens that precede each of them.
    total, predicted, windows = 0.0, 0, []
    inp = [eos] + toks[: L - 1]
    lp = logprobs(inp)
    total += sum(float(lp[j, toks[j]]) for j in range(L))
    windows.append((inp, toks[:L]))
    predicted = L
    while predicted < n:
        end = min(predicted + L, n)
        inp = toks[end - L - 1 : end - 1]
        lp = logprobs(inp)
        m = end - predicted
        total += sum(float(lp[L - m + j, toks[predicted + j]]) for j in range(m))
        windows.append((inp, toks[predicted:end]))
        predicted = end
    assert [w for w in get_rolling_token_windows(toks, eos, L, 1)] == windows  # the same windows as lm-eval's
    assert sum(len(w[1]) for w in windows) == n  # every token predicted once

    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    assert got == pytest.approx(total, abs=1e-3)
    # A short document is one window: the same as the loglikelihood of the whole text after eos.
    short = "the cat sat on the mat."
    (r,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (short,), 0)], disable_tqdm=True)
    ((ll, _),) = lm.loglikelihood(ll_requests([("", short)]), disable_tqdm=True)
    assert r == pytest.approx(ll, abs=1e-4)


@pytest.mark.parametrize("name", ["vanilla_looped", "stateloop_attn"])
def test_generate_until_cached_equals_recomputed_and_hand_greedy(make_run, tokenizer, name):
    run_dir, model = make_run(name)
    cached = StateLoopEvalLM(str(run_dir), batch_size=3, device="cpu")
    plain = StateLoopEvalLM(str(run_dir), batch_size=3, device="cpu", use_cache=False)
    assert cached.use_cache and not plain.use_cache
    contexts = ["the cat sat", "the dog ran", "a fox", "one bird saw the", "big red"]
    reqs = [Instance("generate_until", {}, (c, {"until": ["<<STOP>>"], "max_gen_toks": 12}), i) for i, c in enumerate(contexts)]
    a = cached.generate_until(reqs, disable_tqdm=True)
    b = plain.generate_until(reqs, disable_tqdm=True)
    assert a == b
    eos, V = tokenizer.token_to_id(EOS), tokenizer.get_vocab_size()
    for ctx, got in zip(contexts, a):  # greedy by hand, one full forward per token
        ids = tokenizer.encode(ctx, add_special_tokens=False).ids
        out = []
        with torch.no_grad():
            for _ in range(12):
                t = int(model(torch.tensor([ids + out])).logits[0, -1, :V].argmax())
                if t == eos:
                    break
                out.append(t)
        assert got == tokenizer.decode(out)
    # A stop string cuts the text before its first occurrence: take an ASCII piece of the greedy
    # output (bytes before an ASCII character decode the same in any prefix).
    import re

    i = next((k for k, a_i in enumerate(a) if re.search(r"[A-Za-z0-9]{1,2}", a_i[1:])), None)
    assert i is not None, a
    stop = re.search(r"[A-Za-z0-9]{1,2}", a[i][1:]).group()
    (cut,) = cached.generate_until(
        [Instance("generate_until", {}, (contexts[i], {"until": ["<<STOP>>", stop], "max_gen_toks": 12}), 0)], disable_tqdm=True)
    assert cut == a[i][: a[i].index(stop)]


def test_continuation_longer_than_the_window_is_a_one_line_error(make_run):
    from stateloop.config import ConfigError

    run_dir, _ = make_run()
    lm = StateLoopEvalLM(str(run_dir), batch_size=2, device="cpu", max_length=8)
    with pytest.raises(ConfigError, match="longer than the model's context window"):
        lm.loglikelihood(ll_requests([("the cat", " sat on the mat and then the dog sat on the cat again")]),
                         disable_tqdm=True)


@pytest.mark.parametrize("name", ["stateloop", "stateloop_mamba2", "state_only"])
def test_bf16_mixed_evaluates_under_autocast_on_the_cpu(make_run, tokenizer, name):
    """``eval.precision: bf16-mixed`` (configs/paper.yaml, configs/gpu.yaml) runs under bf16
    autocast wherever it runs, the CPU included: log-likelihoods are the autocast forward's, a
    bf16 rounding away from float32's, and not float32's (so the setting is not silently dropped)."""
    run_dir, model = make_run(name)
    pairs = [("the cat sat on the", " mat"), ("a big red fox", " jumped over the lazy dog")]
    fp32 = StateLoopEvalLM(str(run_dir), batch_size=2, device="cpu")
    bf16 = StateLoopEvalLM(str(run_dir), batch_size=2, device="cpu", precision="bf16-mixed")
    got32 = [ll for ll, _ in fp32.loglikelihood(ll_requests(pairs), disable_tqdm=True)]
    got16 = [ll for ll, _ in bf16.loglikelihood(ll_requests(pairs), disable_tqdm=True)]
    eos = tokenizer.token_to_id(EOS)
    accelerate(model)  # as load_run accelerates the run's model (stateloop/fast.py): the same bf16 products
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want16 = [direct_loglikelihood(model, tokenizer, eos, c, x, 64)[0] for c, x in pairs]
    for a, b, w in zip(got32, got16, want16):
        assert b == pytest.approx(w, abs=1e-3)
        assert a != b and abs(a - b) < 0.05 * abs(a)
