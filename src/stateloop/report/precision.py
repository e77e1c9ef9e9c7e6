"""The precision A/B: does StateLoop's verdict against Vanilla Looped move under the paper runs'
precision (``bf16-mixed``: docs/choices.md, "training precision") rather than the float32 every
CPU result was trained in?

The project's own question, not a claim of the paper. The experiment ``precision_bf16``
(configs/decide.yaml) trains StateLoop and Vanilla Looped at a scale that differs from another of
the config only in ``train.precision``; the float32 side is that scale's runs of the same models,
loop counts, widths and seeds (decide's: the lr bracket's ``lr_2``, nothing retrained). For each K:

- the row's effect: StateLoop's held-out PPL change against Vanilla Looped under bf16-mixed,
  paired by seed, and the verdict of the paper's claim;
- the note: the float32 gap on the same seeds; the change of the gap, bf16-mixed minus float32,
  paired by seed (does the precision move the verdict?); and each model's own PPL under
  bf16-mixed against float32, paired by seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stateloop.experiments import Run, expand_runs
from stateloop.report import stats
from stateloop.report.lr import MODEL, PAPER_SIGN, REFERENCE
from stateloop.report.stats import Estimate, paired, relative_pct
from stateloop.report.tables import heldout_ppl

EXPERIMENT = "precision_bf16"
MODELS = (MODEL, REFERENCE)


def runs(cfg) -> list[Run]:
    if EXPERIMENT not in cfg.experiments or not cfg.experiments[EXPERIMENT].trained:
        return []
    return [r for r in expand_runs(cfg, [EXPERIMENT]) if r.model in MODELS]


def loop_counts(cfg) -> list[int]:
    return sorted({r.K for r in runs(cfg) if r.model == MODEL})


def float32_scale(cfg, scale: str) -> str:
    """The config's scale that is ``scale`` with train.precision 32-true and nothing else changed."""
    mixed = cfg.scales[scale]
    for name, other in cfg.scales.items():
        if other.train.precision == "32-true" and other == dataclasses.replace(
                mixed, train=dataclasses.replace(mixed.train, precision="32-true")):
            return name
    raise KeyError(f"experiments.{EXPERIMENT}: no scale of the config equals {scale} in float32 "
                   f"(train.precision 32-true, nothing else changed): the A/B has no float32 side")


def ppl(cfg, results: Path, K: int) -> dict[tuple[str, str], dict[int, float]]:
    """{(precision, model): {seed: held-out PPL}} at loop count K, both precisions on the same run ids
    but for the scale."""
    mine = [r for r in runs(cfg) if r.K == K]
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in mine:
        twin = dataclasses.replace(r, scale=float32_scale(cfg, r.scale))
        out.setdefault(("bf16-mixed", r.model), {})[r.seed] = heldout_ppl(results, r)
        out.setdefault(("32-true", r.model), {})[r.seed] = heldout_ppl(results, twin)
    return out


def gaps(p: dict, precision: str) -> dict[int, float]:
    """StateLoop's PPL change against Vanilla Looped per seed (%), under ``precision``."""
    sl, v = p[precision, MODEL], p[precision, REFERENCE]
    return {s: relative_pct(sl[s], v[s]) for s in sorted(set(sl) & set(v))}


def measure(cfg, results: Path, K: int) -> tuple[Estimate, str, str] | None:
    """(the gap under bf16-mixed, a note with the float32 gap, the change and each model's own, the verdict)."""
    if K not in loop_counts(cfg):
        return None
    p = ppl(cfg, results, K)
    bf16 = paired(p["bf16-mixed", MODEL], p["bf16-mixed", REFERENCE], relative_pct)
    f32 = paired(p["32-true", MODEL], p["32-true", REFERENCE], relative_pct)
    shift = paired(gaps(p, "bf16-mixed"), gaps(p, "32-true"))
    own = "; ".join(f"{name} {paired(p['bf16-mixed', m], p['32-true', m], relative_pct).format()}%"
                    for m, name in ((REFERENCE, "Vanilla Looped"), (MODEL, "StateLoop")))
    note = (f"float32 on the same seeds: {f32.format()}% ({stats.verdict(f32, PAPER_SIGN)}); the gap's change, "
            f"bf16-mixed minus float32: {shift.format()} points; each model's PPL under bf16-mixed against float32: {own}")
    return bf16, note, stats.verdict(bf16, PAPER_SIGN)
