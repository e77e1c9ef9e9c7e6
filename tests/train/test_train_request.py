"""``train_stage`` called from Python with its typed request (train/stage.py: Request) trains the
run the command line trains, bit for bit."""

import pytest

from stateloop.commands import run_command
from stateloop.train.stage import Request, train_stage
from support.training import assert_bitwise_equal, weights

RUN = "t/stateloop/K2_ds32_seed1234"


@pytest.mark.slow
def test_the_stage_from_python_trains_what_the_command_trains(tiny_setup, tmp_path, capsys):
    cfg, data = tiny_setup
    over = ["train.max_steps=4", "train.val_every=0", "train.checkpoint_every=0"]
    request = Request(config=str(cfg), run=RUN, data_dir=str(data), out=str(tmp_path / "py"), overrides=over,
                      no_progress=True, verify_shards=True)
    assert train_stage(request) == 0
    assert run_command(["train", "--config", str(cfg), RUN, "--data-dir", str(data), "--out", str(tmp_path / "cli"),
                        "--set", *over, "--no-progress", "--verify-shards"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and printed[0].startswith(f"{RUN}: 4 steps") and printed[0].endswith(f"-> {tmp_path / 'py'}")
    assert_bitwise_equal(weights(tmp_path / "py"), weights(tmp_path / "cli"))
