"""``tokenize_stage`` called from Python with its typed request (data/stage.py: Request) writes the
shards the command line writes; with config and scale it loads the scale itself."""

import pytest

from stateloop.cli import main as cli
from stateloop.config.data import DataError
from stateloop.data.shards import ShardSet, read_meta
from stateloop.data.stage import Request, tokenize_stage

SETTINGS = ["data.synthetic={train_docs: 20, val_docs: 2, test_docs: 1}", "data.vocab_size=300", "data.workers=0"]


def _tokens(folder) -> dict:
    return {split: ShardSet(folder, split).window(0, len(ShardSet(folder, split))).tolist() for split in ("train", "val")}


def test_the_stage_from_python_writes_what_the_command_writes(tmp_path, capsys):
    assert tokenize_stage(Request(out=str(tmp_path / "py"), no_progress=True, overrides=SETTINGS)) == 0
    assert cli(["tokenize", "--out", str(tmp_path / "cli"), "--no-progress", "--set", *SETTINGS]) == 0
    meta = read_meta(tmp_path / "py")
    assert meta["splits"]["train"]["documents"] == 20 and meta["splits"] == read_meta(tmp_path / "cli")["splits"]
    assert _tokens(tmp_path / "py") == _tokens(tmp_path / "cli")


def test_the_stage_loads_the_scale_its_request_names(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    scale = ("scales:\n  small:\n    model: {{vocab_size: 320}}\n    train: {{seq_len: {}}}\n"
             "    data: {{vocab_size: 300, workers: 0, synthetic: {{train_docs: 20, val_docs: 2, test_docs: 0}}}}\n")
    request = Request(config=str(cfg), scale="small", out=str(tmp_path / "o"), overrides=["data.vocab_size=280"],
                      no_progress=True)
    cfg.write_text(scale.format(16384))
    # the scale's train.seq_len came with it: its window is longer than the corpus, which is refused
    with pytest.raises(DataError, match=r"fewer than one training window of train.seq_len \+ 1 = 16385 \(scales.small.train\)"):
        tokenize_stage(request)
    assert not (tmp_path / "o").exists()
    cfg.write_text(scale.format(16))
    assert tokenize_stage(request) == 0
    meta = read_meta(tmp_path / "o")
    assert meta["splits"]["train"]["documents"] == 20 and meta["vocab_size"] == 280  # the override over the scale's 300
