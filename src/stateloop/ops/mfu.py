"""The MFU ``stateloop plan`` assumes, read from the newest GPU record of the setting, so that the
plan's hours follow what a GPU measured rather than a constant copied by hand.

A record is a JSON file in the repository's ``benchmarks/records/`` (``$STATELOOP_RECORDS`` or
``--records`` elsewhere) written by benchmarks/gpu_check.py: ``device``, ``date`` (YYYY-MM-DD),
``commit``, ``torch``, ``smoke`` and ``mfu``, a list of flat entries ``{"step", "scale", "model",
"compile", "precision", "mfu", ...}``. Records written before that list existed
(gpu_check_h200_2026-12-04.json) are read from ``steps.train_410m_bf16.models.<model>.mfu`` as eager
``bf16-mixed`` entries of that step's scale, dated by the date in the file's name. Smoke records
and files that are not such records (decode timings, notes) are passed over.

[choice] How entries become a run's MFU (docs/choices.md): per setting (eager or compiled, as the
scale's ``train.compile``; always ``bf16-mixed``, the rate the plan's peak is of) the newest
record with an entry of that setting (by date, then file name); of it the entries of the run's
scale where there are any, else all of its entries of the setting; their mean over models. A
compiled scale with no compiled record takes the eager record's, with a note; no record at all
(a pip install has no benchmarks/ folder) takes :data:`FALLBACK_MFU`, with a warning.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

FALLBACK_MFU = 0.30  # the 2026-12-04 H200 record's rounded eager figure, where no record is found
PRECISION = "bf16-mixed"
RECORDS_ENV = "STATELOOP_RECORDS"
LEGACY_STEP = "train_410m_bf16"  # the step records before the "mfu" list kept their MFU under
REPO_RECORDS = Path(__file__).resolve().parents[3] / "benchmarks" / "records"  # in a checkout of the repository
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def records_dir() -> Path:
    """``$STATELOOP_RECORDS``, else benchmarks/records/ of the source tree this module is in."""
    env = os.environ.get(RECORDS_ENV)
    if env:
        return Path(env)
    return REPO_RECORDS


@dataclass(frozen=True)
class Entry:
    step: str
    scale: str
    model: str
    compile: bool
    precision: str
    mfu: float


@dataclass(frozen=True)
class Record:
    path: Path
    device: str
    date: str
    entries: tuple[Entry, ...]

    def of(self, compiled: bool) -> list[Entry]:
        return [e for e in self.entries if e.compile == compiled and e.precision == PRECISION]


def _entry(raw: dict) -> Entry | None:
    try:
        mfu = float(raw["mfu"])
        entry = Entry(str(raw["step"]), str(raw["scale"]), str(raw["model"]), bool(raw["compile"]),
                      str(raw["precision"]), mfu)
    except (KeyError, TypeError, ValueError):
        return None
    return entry if 0 < mfu <= 1 else None


def read_record(path: Path) -> Record | None:
    """The record in ``path``; None where it is no GPU record with MFU entries, or a smoke one."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("smoke"):
        return None
    name_date = _DATE.search(path.name)
    date = raw.get("date") or (name_date.group(1) if name_date else None)
    if not isinstance(date, str) or not _DATE.fullmatch(date):
        return None
    if isinstance(raw.get("mfu"), list):
        entries = [_entry(e) for e in raw["mfu"] if isinstance(e, dict)]
    else:
        step = (raw.get("steps") or {}).get(LEGACY_STEP) or {}
        entries = [_entry({"step": LEGACY_STEP, "scale": step.get("scale"), "model": model, "compile": False,
                           "precision": PRECISION, "mfu": m.get("mfu")})
                   for model, m in (step.get("models") or {}).items() if isinstance(m, dict)]
    entries = [e for e in entries if e is not None]
    if not entries:
        return None
    return Record(path, str(raw.get("device", "unknown device")), date, tuple(entries))


def read_records(folder: Path) -> list[Record]:
    """Every record in ``folder``, newest first (by date, then file name)."""
    found = [r for p in sorted(folder.glob("*.json")) if (r := read_record(p)) is not None] if folder.is_dir() else []
    return sorted(found, key=lambda r: (r.date, r.path.name), reverse=True)


def _setting(compiled: bool) -> str:
    return f"{'compiled' if compiled else 'eager'} {PRECISION}"


@dataclass(frozen=True)
class PlanMfu:
    """The MFU of each scale and the sentence saying where it came from (the plan's first line)."""

    by_scale: dict[str, float]
    source: str

    def __call__(self, scale: str) -> float:
        return self.by_scale[scale]


def _name(path: Path) -> str:
    """The record as the repository names it (benchmarks/records/NAME), elsewhere its whole path."""
    return f"benchmarks/records/{path.name}" if path.resolve().parent == REPO_RECORDS else str(path)


def resolve(compile_by_scale: dict[str, bool], folder: Path | None = None) -> PlanMfu:
    """Each scale's MFU (module docstring's [choice]) for scales training as ``compile_by_scale``."""
    folder = records_dir() if folder is None else folder
    if not compile_by_scale:
        return PlanMfu({}, "MFU: no trained runs to plan")
    records = read_records(folder)
    by_scale: dict[str, float] = {}
    parts: list[str] = []
    warned = False
    for compiled in sorted(set(compile_by_scale.values())):
        scales = sorted(s for s, c in compile_by_scale.items() if c == compiled)
        record = next((r for r in records if r.of(compiled)), None)
        note = ""
        used = compiled
        if record is None and compiled:
            record = next((r for r in records if r.of(False)), None)
            used = False
            if record is not None:
                note = " (note: no compiled record, so the eager one)"
        if record is None:
            warned = True
            by_scale.update(dict.fromkeys(scales, FALLBACK_MFU))
            parts.append(f"{_setting(compiled)} ({'/'.join(scales)} runs): {FALLBACK_MFU:.2f}, a constant: no "
                         f"GPU record of the setting in {folder} (--mfu sets one)")
            continue
        entries = record.of(used)
        groups: dict[tuple[Entry, ...], list[str]] = {}
        for scale in scales:
            chosen = tuple(e for e in entries if e.scale == scale) or tuple(entries)
            groups.setdefault(chosen, []).append(scale)
        described = []
        for chosen, group in groups.items():
            mfu = sum(e.mfu for e in chosen) / len(chosen)
            by_scale.update(dict.fromkeys(group, mfu))
            steps = ", ".join(sorted({e.step for e in chosen}))
            models = ", ".join(e.model for e in chosen)
            entry_scales = ", ".join(sorted({e.scale for e in chosen}))
            described.append(f"{'/'.join(group)} runs at {mfu:.3f}, the mean of its {len(chosen)} "
                             f"{entry_scales} entries ({steps}: {models})")
        parts.append(f"{_setting(compiled)}{note}: " + " and ".join(described)
                     + f", in {_name(record.path)} ({record.device}, {record.date})")
    head = "warning: MFU" if warned else "MFU from the newest GPU record of"
    return PlanMfu(by_scale, head + " " + "; ".join(parts))


def explicit(mfu: float, scales) -> PlanMfu:
    """``--mfu``: the same figure for every scale."""
    return PlanMfu(dict.fromkeys(scales, mfu), f"MFU {mfu:g} for every run (--mfu)")


__all__ = ["FALLBACK_MFU", "RECORDS_ENV", "Entry", "PlanMfu", "Record", "explicit", "read_record", "read_records",
           "records_dir", "resolve"]
