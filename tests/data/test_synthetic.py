"""The synthetic corpus: determinism, disjoint held-out splits, and evaluation items whose
answers an independent solver (written here from the documented formats) agrees with."""

from __future__ import annotations

import re

import pytest

from stateloop.config.data import SyntheticConfig
from stateloop.data import synthetic


def episodes(doc: str) -> list[str]:
    return doc.split("\n\n")


# ----------------------------------------------------------------------------------------------
# An independent solver for the four episode kinds, from the formats in the module docstring.


def solve(context: str, question: str) -> str:
    if context.startswith("Let "):
        env = dict(re.findall(r"Let (\w) = (\w)\.", context))
        name = re.fullmatch(r"What is (\w)\?", question).group(1)
        value, hops = env[name], 0
        while not value.isdigit():  # follow the bindings
            value, hops = env[value], hops + 1
            assert hops < 30, "cyclic bindings"
        return value
    if context.startswith("Set "):
        vals: dict[str, int] = {}
        for name, expr in re.findall(r"Set (\w) = ([^.]+)\.", context):
            terms = expr.split()
            val = vals[terms[0]] if terms[0] in vals else int(terms[0])
            for op, arg in zip(terms[1::2], terms[2::2]):
                x = vals[arg] if arg in vals else int(arg)
                val = val + x if op == "+" else val - x
            vals[name] = val
        return str(vals[re.fullmatch(r"What is (\w)\?", question).group(1)])
    if context.startswith("The bits are "):
        bits = context[len("The bits are ") : -1].split()
        return "odd" if bits.count("1") % 2 else "even"
    if context.startswith("The list is "):
        xs = [int(x) for x in context[len("The list is ") : -1].split()]
        show = lambda v: " ".join(map(str, v))  # noqa: E731
        if question == "What is the list reversed?":
            return show(xs[::-1])
        if question == "What is the list sorted?":
            return show(sorted(xs))
        if question == "What is the sum of the list?":
            return str(sum(xs))
        d = int(re.fullmatch(r"How many times does (\d) appear in the list\?", question).group(1))
        return str(xs.count(d))
    # facts: parse every template into relations
    town, job, animal, friend = {}, {}, {}, {}
    for pat, table in [
        (r"(\w+) lives in (\w+)\.", town), (r"(\w+) has a house in (\w+)\.", town), (r"The home of (\w+) is in (\w+)\.", town),
        (r"(\w+) works as a (\w+)\.", job), (r"(\w+) is a (\w+) by trade\.", job), (r"By day, (\w+) is a (\w+)\.", job),
        (r"(\w+) keeps a (\w+)\.", animal), (r"(\w+) owns a (\w+)\.", animal), (r", (\w+) feeds the (\w+)\.", animal),
        (r"The friend of (\w+) is (\w+)\.", friend), (r"(\w+) counts (\w+) as a friend\.", friend), (r"(\w+)'s friend is (\w+)\.", friend),
    ]:
        for a, b in re.findall(pat, context):
            assert table.get(a, b) == b, f"two values for {a}"
            table[a] = b
    m = re.fullmatch(r"(Where does|What does|Which animal does) ((?:the friend of )*)(\w+) (live|work as|keep)\?", question)
    assert m, question
    person = m.group(3)
    for _ in range(m.group(2).count("the friend of")):
        person = friend[person]
    return {"live": town, "work as": job, "keep": animal}[m.group(4)][person]


def kind(context: str) -> str:
    if context.startswith("Let "):
        return "bindings"
    if context.startswith("Set "):
        return "arithmetic"
    if context.startswith(("The list is ", "The bits are ")):
        return "lists"
    return "facts"


def qa_pairs(episode: str):
    context, *rest = episode.split("\nQuestion: ")
    for block in rest:
        q, a = block.split("\nAnswer: ")
        yield context, q, a


# ----------------------------------------------------------------------------------------------


def test_documents_are_deterministic_and_prefix_stable():
    a = list(synthetic.iter_documents("train", 40, seed=3))
    assert a == list(synthetic.iter_documents("train", 40, seed=3))
    assert a[:10] == list(synthetic.iter_documents("train", 10, seed=3))
    assert a != list(synthetic.iter_documents("train", 40, seed=4))
    assert len(set(a)) == len(a)


def test_every_answer_in_documents_is_what_the_context_determines():
    kinds = set()
    for doc in synthetic.iter_documents("train", 300):
        for ep in episodes(doc):
            for context, q, a in qa_pairs(ep):
                assert solve(context, q) == a, (context, q, a)
                kinds.add(kind(context))
    assert kinds == set(synthetic.SYNTHETIC_KINDS)


def test_heldout_splits_are_disjoint_from_train():
    train_eps = {ep for doc in synthetic.iter_documents("train", 1500) for ep in episodes(doc)}
    assert all(synthetic.bucket(ep) < 14 for ep in train_eps)
    for split, b in (("val", 14), ("test", 15)):
        eps = [ep for doc in synthetic.iter_documents(split, 60) for ep in episodes(doc)]
        assert all(synthetic.bucket(ep) == b for ep in eps)
        assert not set(eps) & train_eps
    # Evaluation items of the test split never occur verbatim in the training text.
    train_text = "\n\n".join(train_eps)
    for ex in synthetic.task_examples("synth_cloze", "test", 100):
        assert ex["context"] + ex["target"] not in train_text


@pytest.mark.parametrize("split", ["train", "test"])
def test_task_examples_format_and_answers(split):
    mc = synthetic.task_examples("synth_mc", split, 120, seed=1)
    assert mc == synthetic.task_examples("synth_mc", split, 120, seed=1)
    assert mc != synthetic.task_examples("synth_mc", split, 120, seed=2)
    labels = set()
    for ex in mc:
        assert set(ex) == {"question", "choices", "label"}
        assert 2 <= len(ex["choices"]) <= 4 and len(set(ex["choices"])) == len(ex["choices"])
        assert all(c and not c.startswith(" ") for c in ex["choices"])
        context, q = ex["question"].split("\nQuestion: ")
        assert ex["choices"][ex["label"]] == solve(context, q)
        labels.add(ex["label"])
    assert labels == {0, 1, 2, 3}  # the answer's position is shuffled
    cloze = synthetic.task_examples("synth_cloze", split, 120, seed=1)
    for ex in cloze:
        assert set(ex) == {"context", "target"}
        assert ex["target"].startswith(" ") and ex["context"].endswith("\nAnswer:")
        context, q = ex["context"][: -len("\nAnswer:")].split("\nQuestion: ")
        assert ex["target"] == " " + solve(context, q)


def test_settings_change_the_corpus():
    cfg = SyntheticConfig(mix={"bindings": 1.0, "arithmetic": 0.0, "facts": 0.0, "lists": 0.0}, max_hops=7)
    docs = list(synthetic.iter_documents("train", 50, config=cfg))
    assert all(ep.startswith("Let ") for d in docs for ep in episodes(d))
    # Long chains occur: the default max_hops=4 caps an episode at 3 chains x 5 statements = 15.
    assert max(ep.count("=") for d in docs for ep in episodes(d)) > 15


def test_bad_arguments():
    with pytest.raises(ValueError, match="split 'dev'"):
        list(synthetic.iter_documents("dev", 1))
    with pytest.raises(ValueError, match="task 'synth_qa'"):
        synthetic.task_examples("synth_qa", "test", 1)
