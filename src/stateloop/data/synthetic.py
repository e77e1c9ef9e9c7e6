"""An offline synthetic corpus for the small scales: a looped model only has a reason to use more
iterations, and a persistent state something to carry, when the text asks for stepwise computation.

A document is 1 to 4 episodes (a context, then 1 to 3 ``Question: ...`` / ``Answer: ...`` pairs) of
the kinds ``bindings`` (multi-hop variable lookups), ``arithmetic`` (chained sums kept in 0..99),
``facts`` (people, towns, jobs, friend chains) and ``lists`` (reverse, sort, sum, count, parity),
drawn with the weights ``mix``. Document ``i`` of split ``s`` has its own ``random.Random`` seeded
with ``stateloop-synthetic/v1/{seed}/doc/{s}/{i}`` (stable across processes), so any document can
be made alone; splits are also disjoint by construction: each episode's BLAKE2b hash picks one of
16 buckets, ``train`` keeps 0-13, ``val`` 14, ``test`` 15. :func:`task_examples` draws
single-question items from ``.../task/{task}/{s}/{i}``: ``synth_mc`` (``question``, ``choices``
without leading space, ``label``; scored as ``question + "\\nAnswer:" + " " + choice``) and
``synth_cloze`` (``context`` ending in ``"Answer:"``, ``target`` with its leading space).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from stateloop.config.data import SYNTHETIC_KINDS, SyntheticConfig

VERSION = "v1"  # part of every seed string: bump when the generator's output changes
SPLITS = ("train", "val", "test")
TASKS = ("synth_mc", "synth_cloze")
N_BUCKETS = 16
_BUCKETS = {"train": frozenset(range(14)), "val": frozenset({14}), "test": frozenset({15})}

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PEOPLE = (
    "Ada Bram Cora Dane Edda Finn Gale Hugo Iris Jory Kira Lars Mira Nell Otto Pia Quin Rosa "
    "Soren Tess Ugo Vera Wren Xavi Yara Zeno Alma Bo Cyra Dov Elin Fern Gus Hana Ivo Juno Kai "
    "Lene Milo Nora Olin Penn Rhea Sven Tove Ulla Vik Wynn"
).split()
TOWNS = (
    "Ashford Brindle Calder Dunmore Elmstead Farrow Glenholt Harrowgate Ivybridge Juniper "
    "Kestrel Larkhill Marrow Northam Oakmere Pellham Quarry Redwater Stonebridge Thornby "
    "Umber Valewick Westholm Yarrow Zennor Aldmoor Brackwater Coldharbour Dewfield Eastmarch"
).split()
JOBS = (
    "baker carpenter weaver potter miller fisher tailor smith cooper mason brewer farmer "
    "shepherd glazier chandler tanner scribe herbalist sailor cobbler jeweler saddler thatcher printer"
).split()
ANIMALS = "goat cat dog hen horse donkey sheep rabbit pig duck goose parrot ferret pony crow owl".split()
PLACES = "the river,the market,the old mill,the harbour,the hill,the square,the library,the orchard".split(",")
TIMES = "Every morning,On Sundays,In the evening,Each spring,After supper,Twice a week".split(",")


@dataclass
class Episode:
    """A context and its questions; each question carries its answer and wrong answers."""

    kind: str
    context: str
    qas: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (question, answer, distractors)

    @property
    def text(self) -> str:
        return self.context + "".join(f"\nQuestion: {q}\nAnswer: {a}" for q, a, _ in self.qas)


def bucket(text: str) -> int:
    """The episode's hash bucket in 0..15 (decides which split may contain it)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % N_BUCKETS


# ----------------------------------------------------------------------------------------------
# Episode kinds. Each takes an RNG, the settings and a number of questions, and returns an Episode.


def _bindings(rng: random.Random, cfg: SyntheticConfig, n_q: int) -> Episode:
    n_chains = rng.randint(2, 3)
    lengths = [rng.randint(0, cfg.max_hops) for _ in range(n_chains)]
    names = rng.sample(LETTERS, sum(lengths) + n_chains)
    values = rng.sample(range(10), n_chains)  # distinct roots: every variable has one answer
    statements, variables = [], []  # variables: (name, value, hops from its root)
    pos = 0
    for length, value in zip(lengths, values):
        chain = names[pos : pos + length + 1]
        pos += length + 1
        statements.append(f"Let {chain[0]} = {value}.")
        variables.append((chain[0], value, 0))
        for hop in range(1, length + 1):
            statements.append(f"Let {chain[hop]} = {chain[hop - 1]}.")
            variables.append((chain[hop], value, hop))
    rng.shuffle(statements)
    # Prefer the deepest variables: they need the most lookups.
    variables.sort(key=lambda v: -v[2])
    deep = variables[: max(n_q, 3)]
    asked = rng.sample(deep, min(n_q, len(deep)))
    qas = []
    for name, value, _ in asked:
        wrong = [str(v) for v in values if v != value]
        wrong += [str(d) for d in rng.sample(range(10), 10) if d not in values]
        qas.append((f"What is {name}?", str(value), wrong[:3]))
    return Episode("bindings", " ".join(statements), qas)


def _arithmetic(rng: random.Random, cfg: SyntheticConfig, n_q: int) -> Episode:
    steps = rng.randint(1, cfg.max_steps)
    names = rng.sample(LETTERS, steps + 1)
    values = [rng.randint(0, 20)]
    statements = [f"Set {names[0]} = {values[0]}."]
    for i in range(1, steps + 1):
        prev = values[i - 1]
        for _ in range(20):
            op = rng.choice("+-")
            if i >= 2 and rng.random() < 0.3:
                j = rng.randrange(0, i - 1)  # an earlier variable (not the previous one)
                operand, operand_text = values[j], names[j]
            else:
                operand = rng.randint(1, 9)
                operand_text = str(operand)
            result = prev + operand if op == "+" else prev - operand
            if 0 <= result <= 99:
                break
        else:  # no in-range choice found: add a constant that always fits
            op, operand, operand_text = ("-", 1, "1") if prev > 0 else ("+", 1, "1")
            result = prev + operand if op == "+" else prev - operand
        values.append(result)
        statements.append(f"Set {names[i]} = {names[i - 1]} {op} {operand_text}.")
    # Mostly the last variable (depends on every step); sometimes an intermediate one.
    candidates = [steps] + [i for i in range(1, steps) if rng.random() < 0.5]
    asked = list(dict.fromkeys(candidates))[:n_q]
    qas = []
    for i in asked:
        answer = values[i]
        wrong = {values[j] for j in range(len(values)) if values[j] != answer}
        wrong = [str(w) for w in sorted(wrong)]
        rng.shuffle(wrong)
        while len(wrong) < 3:
            cand = str(max(0, answer + rng.choice([-1, 1]) * rng.randint(1, 10)))
            if cand != str(answer) and cand not in wrong:
                wrong.append(cand)
        qas.append((f"What is {names[i]}?", str(answer), wrong[:3]))
    return Episode("arithmetic", " ".join(statements), qas)


def _facts(rng: random.Random, cfg: SyntheticConfig, n_q: int) -> Episode:
    n = rng.randint(3, 6)
    people = rng.sample(PEOPLE, n)
    towns = dict(zip(people, rng.sample(TOWNS, n)))
    jobs = dict(zip(people, rng.sample(JOBS, n)))
    animals = dict(zip(people, rng.sample(ANIMALS, n)))
    # friend: a random map with no fixed points (the i-th person names one of the others)
    friend = {p: people[(i + rng.randrange(1, n)) % n] for i, p in enumerate(people)}
    sentences = []
    for p in people:
        facts = [
            rng.choice(["{p} lives in {t}.", "{p} has a house in {t}.", "The home of {p} is in {t}."]),
            rng.choice(["{p} works as a {j}.", "{p} is a {j} by trade.", "By day, {p} is a {j}."]),
            rng.choice(["{p} keeps a {a}.", "{p} owns a {a}.", "{tm}, {p} feeds the {a}."]),
            rng.choice(["The friend of {p} is {f}.", "{p} counts {f} as a friend.", "{p}'s friend is {f}."]),
        ]
        if rng.random() < 0.5:
            facts.append(rng.choice(["{tm}, {p} walks to {pl}.", "{p} is often seen at {pl}.", "{tm}, {p} visits {pl}."]))
        rng.shuffle(facts)
        slots = dict(p=p, t=towns[p], j=jobs[p], a=animals[p], f=friend[p], tm=rng.choice(TIMES), pl=rng.choice(PLACES))
        sentences += [s.format_map(slots) for s in facts]
    qas = []
    for _ in range(n_q):
        p = rng.choice(people)
        hops = rng.randint(0, cfg.max_hops - 1)
        target, phrase = p, p
        for _ in range(hops):
            target = friend[target]
            phrase = "the friend of " + phrase
        attr = rng.choice(["town", "job", "animal"])
        table = {"town": towns, "job": jobs, "animal": animals}[attr]
        question = {
            "town": f"Where does {phrase} live?",
            "job": f"What does {phrase} work as?",
            "animal": f"Which animal does {phrase} keep?",
        }[attr]
        answer = table[target]
        wrong = [table[q] for q in people if q != target]
        rng.shuffle(wrong)
        qas.append((question[0].upper() + question[1:], answer, wrong[:3]))
    return Episode("facts", " ".join(sentences), qas)


def _lists(rng: random.Random, cfg: SyntheticConfig, n_q: int) -> Episode:
    if rng.random() < 0.2:  # parity of a bit string: a running XOR, one step per bit
        bits = [rng.randint(0, 1) for _ in range(rng.randint(6, 12))]
        answer = "odd" if sum(bits) % 2 else "even"
        text = " ".join(map(str, bits))
        q = f"Is the number of ones in {text} odd or even?"
        return Episode("lists", f"The bits are {text}.", [(q, answer, ["even" if answer == "odd" else "odd"])])
    xs = [rng.randint(0, 9) for _ in range(rng.randint(6, 9))]
    show = lambda v: " ".join(map(str, v))  # noqa: E731
    ops = rng.sample(["reverse", "sort", "sum", "count"], min(n_q, 4))
    qas = []
    for op in ops:
        if op == "reverse":
            answer = show(xs[::-1])
            wrong = [show(xs), show(sorted(xs)), show(sorted(xs, reverse=True))]
            qas.append(("What is the list reversed?", answer, wrong))
        elif op == "sort":
            answer = show(sorted(xs))
            wrong = [show(xs), show(xs[::-1]), show(sorted(xs, reverse=True))]
            qas.append(("What is the list sorted?", answer, wrong))
        elif op == "sum":
            answer = str(sum(xs))
            wrong = [str(sum(xs) + d) for d in rng.sample([-3, -2, -1, 1, 2, 3], 3)]
            qas.append(("What is the sum of the list?", answer, wrong))
        else:
            d = rng.choice(xs)
            answer = str(xs.count(d))
            wrong = [str(c) for c in range(0, len(xs) + 1) if c != xs.count(d)]
            rng.shuffle(wrong)
            qas.append((f"How many times does {d} appear in the list?", answer, wrong))
    for i, (q, a, wrong) in enumerate(qas):  # distractors: distinct and different from the answer
        qas[i] = (q, a, [w for w in dict.fromkeys(wrong) if w != a][:3])
    return Episode("lists", f"The list is {show(xs)}.", qas)


_KINDS = {"bindings": _bindings, "arithmetic": _arithmetic, "facts": _facts, "lists": _lists}
assert tuple(_KINDS) == SYNTHETIC_KINDS


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"synthetic split {split!r}: must be one of {', '.join(SPLITS)}")


def _episode(rng: random.Random, cfg: SyntheticConfig, split: str, n_q: int | None) -> Episode:
    """One episode of a kind drawn by ``cfg.mix``, resampled until its bucket belongs to ``split``."""
    kinds = [k for k in SYNTHETIC_KINDS if cfg.mix.get(k, 0) > 0]
    weights = [cfg.mix[k] for k in kinds]
    while True:
        kind = rng.choices(kinds, weights)[0]
        ep = _KINDS[kind](rng, cfg, n_q if n_q is not None else rng.randint(1, 3))
        if ep.qas and bucket(ep.text) in _BUCKETS[split]:
            return ep


def document(split: str, index: int, seed: int = 0, config: SyntheticConfig | None = None) -> str:
    """Document ``index`` of ``split`` (independent of every other document)."""
    _check_split(split)
    cfg = config or SyntheticConfig()
    rng = random.Random(f"stateloop-synthetic/{VERSION}/{seed}/doc/{split}/{index}")
    return "\n\n".join(_episode(rng, cfg, split, None).text for _ in range(rng.randint(1, 4)))


def iter_documents(split: str, n_docs: int, seed: int = 0, config: SyntheticConfig | None = None) -> Iterator[str]:
    """The first ``n_docs`` documents of ``split`` ("train", "val" or "test"). Deterministic:
    equal arguments give equal documents, and a longer stream extends a shorter one."""
    _check_split(split)
    for i in range(n_docs):
        yield document(split, i, seed, config)


def task_examples(task: str, split: str, n: int, seed: int = 0, config: SyntheticConfig | None = None) -> list[dict]:
    """``n`` evaluation items of ``task`` from ``split`` (see the module docstring for the format).

    ``synth_mc``: {"question": str, "choices": [str, ...], "label": int}, with 2-4 choices.
    ``synth_cloze``: {"context": str, "target": str}, target starting with a space.
    """
    _check_split(split)
    if task not in TASKS:
        raise ValueError(f"synthetic task {task!r}: must be one of {', '.join(TASKS)}")
    cfg = config or SyntheticConfig()
    out = []
    for i in range(n):
        rng = random.Random(f"stateloop-synthetic/{VERSION}/{seed}/task/{task}/{split}/{i}")
        ep = _episode(rng, cfg, split, 1)
        question, answer, wrong = ep.qas[0]
        if task == "synth_mc":
            choices = [answer] + wrong[:3]
            rng.shuffle(choices)
            out.append({"question": f"{ep.context}\nQuestion: {question}", "choices": choices, "label": choices.index(answer)})
        else:
            out.append({"context": f"{ep.context}\nQuestion: {question}\nAnswer:", "target": " " + answer})
    return out
