"""Which rehearsals read the shared data (``../shared/data``, or ``$STATELOOP_SHARED/data``): the
tests' :func:`~support.rehearsals.needs_shared_data` and ``stateloop rehearse`` agree, so a clone
with nothing beside it runs the rehearsals that need none and skips the others, saying why.

Issue 53: on such a clone the four tests of the tiny rehearsal (tests/workflow/test_dag.py,
test_report.py) errored: the rehearsal wrote lm-eval's tasks, LAMBADA's from the shared data,
for Table 3's untrained ``decode`` scale, whose tasks no job reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from stateloop.config import load_yaml
from stateloop.ops.rehearse.run import prepare
from support.rehearsals import needs_shared_data

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # each prepares a rehearsal folder: its prefetch against the stand-in hub (~10 s)


@pytest.mark.parametrize("shared", ["absent", "present"])
def test_the_tiny_rehearsal_reads_no_shared_data(shared, tmp_path, monkeypatch, request):
    config = ROOT / "configs" / "tiny.yaml"
    assert not needs_shared_data(load_yaml(config))
    if shared == "absent":
        monkeypatch.setenv("STATELOOP_SHARED", str(tmp_path / "nothing"))
    else:
        request.getfixturevalue("shared_data")  # skips, saying why, where ../shared/data is not there
    written = prepare(config, tmp_path / "rehearsal")
    assert written == tmp_path / "rehearsal" / "config.yaml"
    assert not (tmp_path / "rehearsal" / "hub-tasks").exists()  # no dataset of an lm-eval task of the Hub's is written
    scales = load_yaml(written)["scales"]
    assert scales["tiny"]["eval"]["tasks"] == ["synth_mc", "synth_cloze"] and "task_dir" not in scales["decode"].get("eval", {})
