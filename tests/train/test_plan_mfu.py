"""The plan's MFU follows the GPU records (ops/mfu.py): the newest record of the setting, smoke
records passed over, compiled entries for a compiled scale (eager ones with a note where none is
compiled), a constant only with a warning; ``stateloop plan`` names the record on its first line
and ``--mfu`` still wins."""

import json
from pathlib import Path

import pytest
import yaml

from stateloop.cli import main
from stateloop.ops import mfu as plan_mfu

ROOT = Path(__file__).resolve().parents[2]
H200 = "gpu_check_h200_2026-12-04.json"


def _entry(mfu, scale="410m", model="stateloop", compiled=False, precision="bf16-mixed"):
    return {"step": f"{'compile' if compiled else 'train'}_{scale}", "scale": scale, "model": model, "compile": compiled,
            "precision": precision, "mfu": mfu, "tokens_per_s": 1000.0, "peak_flops": 9.894e14}


def _record(folder: Path, name: str, date: str, entries, smoke=False, device="NVIDIA H100 80GB HBM3") -> Path:
    path = folder / name
    path.write_text(json.dumps({"device": device, "date": date, "commit": "abc1234", "torch": "2.13.0", "smoke": smoke,
                                "steps": {}, "mfu": entries}))
    return path


def test_the_newest_record_wins_and_smoke_records_are_passed_over(tmp_path):
    _record(tmp_path, "gpu_check_a.json", "2026-12-10", [_entry(0.20), _entry(0.30, model="vanilla_looped")])
    _record(tmp_path, "gpu_check_b.json", "2026-12-20", [_entry(0.40), _entry(0.50, model="vanilla_looped")])
    _record(tmp_path, "gpu_check_smoke.json", "2026-12-30", [_entry(0.90)], smoke=True)
    (tmp_path / "notes.json").write_text(json.dumps({"decode": [1, 2, 3]}))  # not a record: passed over
    got = plan_mfu.resolve({"410m": False}, tmp_path)
    assert got("410m") == pytest.approx(0.45)  # the mean of gpu_check_b's two eager entries
    assert "gpu_check_b.json" in got.source and "2026-12-20" in got.source and "H100" in got.source
    assert "smoke" not in got.source and not got.source.startswith("warning")


def test_a_compiled_scale_takes_compiled_entries_of_its_scale_else_any_scale(tmp_path):
    _record(tmp_path, "eager.json", "2026-12-20", [_entry(0.30), _entry(0.32, scale="1.4b")])
    _record(tmp_path, "compiled.json", "2026-12-10", [_entry(0.25), _entry(0.40, compiled=True),
                                                      _entry(0.44, compiled=True, model="vanilla_looped"),
                                                      _entry(0.60, compiled=True, precision="32-true")])
    got = plan_mfu.resolve({"410m": True, "1.4b": True, "small": False}, tmp_path)
    # compiled: the older record is the newest with compiled bf16-mixed entries; 1.4b has none of its own
    assert got("410m") == pytest.approx(0.42) and got("1.4b") == pytest.approx(0.42)
    # eager: the newer record; a scale without entries of its own takes all of the setting's
    assert got("small") == pytest.approx(0.31)
    assert "compiled.json" in got.source and "eager.json" in got.source


def test_a_compiled_scale_without_a_compiled_record_takes_the_eager_one_with_a_note(tmp_path):
    _record(tmp_path, "eager.json", "2026-12-20", [_entry(0.30), _entry(0.34, model="vanilla_looped")])
    got = plan_mfu.resolve({"410m": True}, tmp_path)
    assert got("410m") == pytest.approx(0.32)
    assert "note: no compiled record, so the eager one" in got.source and "eager.json" in got.source


@pytest.mark.parametrize("case", ["absent", "empty", "smoke only", "other precision"])
def test_no_record_falls_back_to_the_constant_with_a_warning(tmp_path, case):
    folder = tmp_path / "records"
    if case != "absent":
        folder.mkdir()
    if case == "smoke only":
        _record(folder, "s.json", "2026-12-20", [_entry(0.5)], smoke=True)
    if case == "other precision":
        _record(folder, "p.json", "2026-12-20", [_entry(0.5, precision="32-true")])
    got = plan_mfu.resolve({"410m": False}, folder)
    assert got("410m") == plan_mfu.FALLBACK_MFU
    assert got.source.startswith("warning: ") and str(folder) in got.source and "--mfu" in got.source


def test_the_repositorys_records_give_the_h200_records_eager_mean():
    """The 2026-12-04 record predates the "mfu" list: its train_410m_bf16 models are eager bf16-mixed 410m entries."""
    raw = json.loads((ROOT / "benchmarks" / "records" / H200).read_text())
    models = raw["steps"]["train_410m_bf16"]["models"]
    mean = sum(m["mfu"] for m in models.values()) / len(models)
    assert plan_mfu.records_dir() == ROOT / "benchmarks" / "records"
    got = plan_mfu.resolve({"410m": False, "1.4b": False})
    assert got("410m") == pytest.approx(mean) and got("1.4b") == pytest.approx(mean)
    assert f"benchmarks/records/{H200}" in got.source and "NVIDIA H200" in got.source and "2026-12-04" in got.source
    for model in models:
        assert model in got.source


def _tiny_plan_config(tmp_path, compiled: bool) -> Path:
    raw = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    for scale in raw["scales"].values():
        scale.setdefault("train", {})["compile"] = compiled
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_plan_names_the_record_on_its_first_line_and_mfu_wins(tmp_path, capsys, monkeypatch):
    records = tmp_path / "records"
    records.mkdir()
    _record(records, "gpu_check_h100_2026-12-20.json", "2026-12-20", [_entry(0.25, scale="tiny")])
    _record(records, "gpu_check_h100_2026-12-21.json", "2026-12-21", [_entry(0.35, scale="tiny", compiled=True)])
    monkeypatch.setenv(plan_mfu.RECORDS_ENV, str(records))
    config = _tiny_plan_config(tmp_path, compiled=True)
    assert main(["plan", "--config", str(config), "--experiments", "table1", "--out", str(tmp_path / "c.csv")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("MFU from the newest GPU record of compiled bf16-mixed")
    assert "gpu_check_h100_2026-12-21.json" in first and "0.350" in first
    compiled = [float(r) for r in _column(tmp_path / "c.csv", "mfu")]
    assert compiled and all(m == pytest.approx(0.35) for m in compiled)
    assert main(["plan", "--config", str(config), "--experiments", "table1", "--mfu", "0.5", "--out",
                 str(tmp_path / "m.csv")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "MFU 0.5 for every run (--mfu)"
    slower = dict(zip(_column(tmp_path / "c.csv", "run"), map(float, _column(tmp_path / "c.csv", "step_s"))))
    faster = dict(zip(_column(tmp_path / "m.csv", "run"), map(float, _column(tmp_path / "m.csv", "step_s"))))
    assert slower.keys() == faster.keys() and all(faster[r] < slower[r] for r in slower)
    monkeypatch.setenv(plan_mfu.RECORDS_ENV, str(tmp_path / "none"))
    assert main(["plan", "--config", str(config), "--experiments", "table1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("warning: MFU compiled bf16-mixed")
    assert main(["plan", "--config", str(config), "--experiments", "table1", "--records", str(records)]) == 0
    assert "gpu_check_h100_2026-12-21.json" in capsys.readouterr().out.splitlines()[0]  # --records over the variable


def _column(path: Path, name: str) -> list[str]:
    import csv

    return [row[name] for row in csv.DictReader(path.open())]
