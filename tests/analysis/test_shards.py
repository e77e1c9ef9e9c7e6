"""Sharded and resumed analyses (analysis/shards.py): N shards and their merge give the unsharded
numbers bit for bit, a merge that lacks a shard or mixes settings is refused, an interrupted shard
continues where its partial sums stopped, and the interventions' shared-prefix tree computes what
looped.py's state_overrides hook computes."""

import json
import random
from fractions import Fraction

import pytest
import torch

from stateloop.analysis import interventions, shapley, shards
from stateloop.analysis.shards import Shard, Sums
from stateloop.cli import main
from support.analysis import run_windows

QUIET = ["--no-mlflow", "--no-progress"]
RESULT_KEYS = {  # what the analysis measured: everything but the settings, paths and versions
    "shapley": ("shapley", "share_pct", "masks", "nll_none_masked", "nll_all_masked", "tokens", "heldout"),
    "interventions": ("unmodified", "replacement", "freezing", "calibration", "tokens", "heldout"),
}


def _analyze(analysis, run_dir, *flags):
    return main(["analyze", analysis, str(run_dir), *QUIET, "--batch-size", "3", *flags])


def _measured(path, analysis):
    res = json.loads(path.read_text())
    return {k: res[k] for k in RESULT_KEYS[analysis]}


def test_shards_cover_every_batch_once():
    for n in range(0, 40):
        for count in range(1, 12):
            covered = [b for i in range(1, count + 1) for b in range(*Shard(i, count).batches(n))]
            assert covered == list(range(n)), (n, count)
    assert Shard.parse("3/8") == Shard(3, 8) and Shard(3, 8).stem == "3of8"
    for bad in ("0/3", "4/3", "3", "a/b", "1/2/3"):
        with pytest.raises(Exception, match="--shard: expected I/N"):
            Shard.parse(bad)


def test_exact_sums_do_not_depend_on_order_or_grouping():
    """float64 addition does (the reason for exact sums): the same values in another order and in
    other groups give other floats, the exact sums do not."""
    rng = random.Random(0)
    values = [rng.uniform(0, 1e4) * 10 ** rng.randint(-8, 8) for _ in range(500)]
    one = Sums(["x"])
    for v in values:
        one.add({"x": v}, 1)
    shuffled = values[:]
    rng.shuffle(shuffled)
    parts = [Sums(["x"]) for _ in range(7)]
    for i, v in enumerate(shuffled):
        parts[i % 7].add({"x": v}, 1)
    grouped = Sums(["x"])
    for p in parts:
        grouped += p
    assert grouped.values == one.values and grouped.tokens == one.tokens == 500
    assert one.total("x") == float(sum(Fraction(v) for v in values))
    assert sum(values) != sum(shuffled) or sum(values[::-1]) != sum(values)  # float sums do depend on order
    assert Sums.from_json(one.to_json(), ["x"], "here").values == one.values


@pytest.mark.parametrize("count", [3, 5])  # 3 batches of 3 windows (3, 3, 2): one each; 5 shards: two are empty
def test_sharded_shapley_equals_the_unsharded_analysis_bit_for_bit(tiny_run, tmp_path, count, capsys):
    run_dir, model = tiny_run
    whole = tmp_path / "whole.json"
    assert _analyze("shapley", run_dir, "--out", str(whole)) == 0
    for i in range(1, count + 1):
        assert _analyze("shapley", run_dir, "--shard", f"{i}/{count}") == 0
    assert _analyze("shapley", run_dir, "--merge", str(count)) == 0
    merged = json.loads((run_dir / "shapley.json").read_text())
    assert _measured(run_dir / "shapley.json", "shapley") == _measured(whole, "shapley")  # ==, not approx
    assert merged["settings"]["shards"] == count and len(merged["shards"]) == count
    assert not list((run_dir / shards.SHARDS_DIR).glob("*.partial.json"))  # finished shards leave no partial sums

    # The equality has teeth: the sums of all shards but one are other numbers.
    names = shapley.sum_names(model.cfg.K)
    docs = [json.loads(shards.shard_file(run_dir, "shapley", Shard(i, count)).read_text()) for i in range(1, count + 1)]
    for drop in range(count):
        if docs[drop]["tokens"] == 0:
            continue
        partial = Sums(names)
        for i, doc in enumerate(docs):
            if i != drop:
                partial += Sums.from_json(doc, names, "shard")
        assert shapley.shapley_result(model.cfg.K, partial)["shapley"] != merged["shapley"], drop

    # A missing shard is refused, naming its file and the command that makes it.
    shards.shard_file(run_dir, "shapley", Shard(2, count)).unlink()
    capsys.readouterr()
    assert _analyze("shapley", run_dir, "--merge", str(count)) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert err.startswith("stateloop analyze: error: ") and f"shapley_2of{count}.json: shard 2/{count} of shapley is missing" in err


def test_sharded_interventions_share_one_calibration_and_equal_the_unsharded_analysis(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    calib = ["--calib-windows", "5"]
    whole = tmp_path / "whole.json"
    assert _analyze("interventions", run_dir, "--out", str(whole), *calib) == 0
    (run_dir / "interventions_calibration.pt").unlink()
    assert _analyze("interventions", run_dir, "--shard", "1/2", *calib) == 2  # shards need the calibration file first
    assert "--calibrate-only" in capsys.readouterr().err
    assert _analyze("interventions", run_dir, "--calibrate-only", *calib) == 0
    for i in (1, 2):
        assert _analyze("interventions", run_dir, "--shard", f"{i}/2", *calib) == 0
    assert _analyze("interventions", run_dir, "--merge", "2", *calib) == 0
    assert _measured(run_dir / "interventions.json", "interventions") == _measured(whole, "interventions")
    # another calibration sample than the shards were made with: refused, naming the setting
    capsys.readouterr()
    assert _analyze("interventions", run_dir, "--merge", "2", "--calib-windows", "4") == 2
    assert "made for requested_windows 5, here 4" in capsys.readouterr().err


def test_merge_refuses_shards_made_for_other_settings(tiny_run, capsys):
    run_dir, _ = tiny_run
    assert _analyze("shapley", run_dir, "--shard", "1/2") == 0
    assert main(["analyze", "shapley", str(run_dir), *QUIET, "--batch-size", "4", "--shard", "2/2"]) == 0
    capsys.readouterr()
    assert _analyze("shapley", run_dir, "--merge", "2") == 2  # shard 2 evaluated batches of 4 windows
    assert "shapley_2of2.json: made for other settings (batch_size 4, here 3)" in capsys.readouterr().err
    assert _analyze("shapley", run_dir, "--merge", "2", "--shard", "1/2") == 2
    assert "--merge: not together with --shard" in capsys.readouterr().err


class Stop(Exception):
    """The job's end at its time limit, as far as the analysis can tell: it stops between batches."""


@pytest.mark.parametrize("analysis", ["shapley", "interventions"])
def test_an_interrupted_analysis_continues_where_it_stopped(tiny_run, tmp_path, monkeypatch, analysis, capsys):
    """8 windows in 3 batches: stopped in its third batch, the analysis has written the partial
    sums of two (--save-every 0); run again it evaluates the third only, and its numbers are the
    uninterrupted analysis's."""
    run_dir, _ = tiny_run
    module = shapley if analysis == "shapley" else interventions
    real, calls = module.batch_sums, []

    def stopping(*args):
        calls.append(len(args[1]))
        if len(calls) == 3:
            raise Stop
        return real(*args)

    whole = tmp_path / "whole.json"
    assert _analyze(analysis, run_dir, "--out", str(whole)) == 0
    monkeypatch.setattr(module, "batch_sums", stopping)
    with pytest.raises(Stop):
        _analyze(analysis, run_dir, "--save-every", "0")
    partial = shards.partial_file(run_dir, analysis, Shard(1, 1))
    assert json.loads(partial.read_text())["next_batch"] == 2
    calls.clear()
    capsys.readouterr()
    assert _analyze(analysis, run_dir, "--save-every", "0") == 0
    assert calls == [2]  # the third batch only: windows 6 and 7
    assert "continuing shard 1/1 at batch 2" in capsys.readouterr().err
    assert _measured(run_dir / f"{analysis}.json", analysis) == _measured(whole, analysis)
    assert not partial.exists()


def test_partial_sums_of_other_settings_are_not_continued(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    whole = tmp_path / "whole.json"
    assert _analyze("shapley", run_dir, "--out", str(whole)) == 0
    partial = shards.partial_file(run_dir, "shapley", Shard(1, 1))
    partial.parent.mkdir(parents=True, exist_ok=True)
    # partial sums of the same shard made with another batch size (and absurd numbers)
    doc = {"format": shards.FORMAT, "analysis": "shapley", "key": {"batch_size": 4}, "shard": {}, "next_batch": 2,
           "complete": False, "sums": {}, "tokens": 999}
    partial.write_text(json.dumps(doc))
    assert _analyze("shapley", run_dir) == 0
    assert "not continued, made for other settings" in capsys.readouterr().err
    assert _measured(run_dir / "shapley.json", "shapley") == _measured(whole, "shapley")


def test_the_intervention_tree_is_the_hooks_forward_passes(tiny_run):
    """Every NLL of the shared-prefix tree equals a whole forward pass with the same overrides
    through looped.py's state_overrides hook (exactly, on the CPU); freezing at K-1 is replacement
    at K-1."""
    run_dir, model = tiny_run
    windows = run_windows(run_dir, "test")
    stats = interventions.state_statistics(model, run_windows(run_dir, "val"), batch_size=4, progress=False)
    K = model.cfg.K
    hooks = {}
    for i in range(1, K):
        hooks[f"replace_{i}"] = lambda states, i=i: interventions.replacement_overrides(states, stats, i)
        hooks[f"freeze_{i}"] = lambda states, i=i: interventions.freezing_overrides(states, stats, i)
    reference = interventions.intervention_nll(model, windows, hooks, batch_size=len(windows), progress=False)
    sums = interventions.exact_sums(model, windows, stats, batch_size=len(windows), progress=False)
    tree = {name: sums.mean(name) for name in sums.names}
    assert list(tree) == ["none", *hooks] == interventions.intervention_names(K)
    for name in tree:
        assert tree[name] == reference[name], name
    assert tree[f"freeze_{K - 1}"] == tree[f"replace_{K - 1}"]
    assert len({round(v, 9) for v in tree.values()}) > K  # the interventions do change the NLL


def test_the_shapley_tree_counts_2K_minus_1_backbone_applications(tiny_run):
    run_dir, model = tiny_run
    calls = []
    real = model.step
    model.step = lambda k, *a: calls.append(k) or real(k, *a)
    batch = run_windows(run_dir, "test")[:2]
    values, tokens = shapley.batch_sums(model, batch)
    K = model.cfg.K
    assert len(calls) == 2**K - 1 and sorted(calls) == sorted(k for k in range(K) for _ in range(2**k))
    assert set(values) == set(shapley.sum_names(K)) and tokens == batch[:, 1:].numel()
    calls.clear()
    stats = interventions.StateStats(torch.zeros(K, model.cfg.d_s).double(), torch.ones(K, model.cfg.d_s).double(), 1)
    interventions.batch_sums(model, batch, stats)
    assert len(calls) == K + sum(1 + 2 * (K - 2 - i) for i in range(1, K - 1))  # clean pass, then the pairs (module docstring)


def test_the_parsers_default_save_interval_is_the_stages():
    from stateloop.analysis.request import SAVE_EVERY, Request
    from stateloop.commands import build_parser

    args = Request.of(build_parser().parse_args(["analyze", "shapley", "r"]))
    assert args.save_every == SAVE_EVERY and args.shard is None and args.merge is None
