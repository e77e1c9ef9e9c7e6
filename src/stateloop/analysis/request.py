"""The requests of ``stateloop analyze`` (analysis/stage.py) and ``stateloop bench decode``
(ops/bench_decode.py) apart from their stages, which import torch: parsers are built without it."""

from __future__ import annotations

from dataclasses import field

from stateloop.analysis.common import CALIB_SEED, CALIB_SPLIT, CALIB_WINDOWS
from stateloop.config import Bool, Float, Int, StageRequest, Text, arg, whole
from stateloop.run_ids import RUN_HELP
from stateloop.runs import BENCH_FILE

SAVE_EVERY = 120.0  # seconds between two writes of a running shard's partial sums (--save-every)


class Request(StageRequest):
    """One analysis as asked for (``stateloop analyze``'s flags; None: the run's eval protocol)."""

    analysis: Text = field(metadata={"subcommand": True})  # shapley | interventions
    run: Text = arg(f"the trained run: {RUN_HELP}", positional=True, metavar="RUN")
    config: Text | None = arg("pipeline config whose scale's `eval:` section sets the held-out data (default: the config "
                             "the run was trained from, as `stateloop eval`)", None)
    seq_len: Int | None = arg("window length (default: eval.max_length, else the run's train.seq_len)", None)
    batch_size: Int | None = arg("windows per forward pass (default: eval.batch_size)", None)
    device: Text = arg("auto (cuda if available), cpu, cuda, cuda:N", "auto")
    dtype: Text = arg("auto (default): eval.precision, as the held-out PPL (32-true: float32; bf16-mixed: float32 weights "
                     "under bfloat16 autocast); bfloat16/float16: cast the weights", "auto",
                     choices=["auto", "float32", "bf16-mixed", "bfloat16", "float16"])
    out: Text | None = arg("result JSON (default: in the run folder)", None)
    no_mlflow: Bool = arg("do not log to MLflow", False)
    no_progress: Bool = arg("no progress bars", False)
    shard: Text | None = arg("evaluate only shard I of N (whole batches of the windows) into RUN_DIR/analysis_shards/", None, metavar="I/N")
    merge: Int | None = arg("merge the N finished shards in RUN_DIR/analysis_shards/ into the analysis JSON (exact sums)",
                            None, metavar="N")
    save_every: Float = arg(f"write the partial sums at most this often (default {SAVE_EVERY:g}; 0: after every batch); a "
                            f"rerun with the same settings continues from them", SAVE_EVERY, metavar="SECONDS")
    split: Text | None = arg("held-out split evaluated (default: eval.heldout_split, as the held-out PPL)", None, only="shapley")
    calib_split: Text = arg(f"split the state statistics come from (default: {CALIB_SPLIT}, disjoint from the held-out "
                           f"split)", CALIB_SPLIT, only="interventions")
    calib_windows: Int = arg(f"calibration windows, a seeded sample over the whole split (default {CALIB_WINDOWS}; 0: every "
                             f"window)", CALIB_WINDOWS, only="interventions")
    calib_seed: Int = arg(f"seed of the calibration sample (default {CALIB_SEED})", CALIB_SEED, only="interventions")
    calibrate_only: Bool = arg("write the calibration statistics (RUN_DIR/interventions_calibration.pt) and stop: the "
                               "shards of one analysis read them", False, only="interventions")
    eval_split: Text | None = arg("split the perplexities are measured on (default: eval.heldout_split)", None, only="interventions")
    max_windows: Int | None = arg("windows evaluated (default: eval.heldout_windows, as the held-out PPL; 0: the whole split)", None)


class DecodeRequest(StageRequest):
    """One benchmark as asked for (``stateloop bench decode``'s flags, defaults the paper's protocol)."""

    benchmark: Text = field(default="decode", metadata={"subcommand": True})
    runs: list[Text] = arg(f"trained runs to time, each {RUN_HELP}", [], nargs="+", metavar="RUN")
    models: list[Text] = arg("untrained models name[:K[:d_s]] (default without --runs: the --config's decoding experiment, "
                            "else Table 3's rows)", [], nargs="+", metavar="SPEC")
    config: Text | None = arg("pipeline config: its bench: section, its decoding experiment's shapes and scale", None)
    scale: Text | None = arg("scale of --config whose shape untrained models take (default: the decoding experiment's)", None)
    overrides: list[Text] = arg("shape overrides for untrained models", [], nargs="+", name="--set", metavar="model.KEY=VALUE")
    # BENCH_KEYS: None takes the config's bench section (pipeline.BenchConfig; its defaults without --config)
    prefill: Int | None = arg("prompt tokens P (paper: 1024)", None)
    tokens: Int | None = arg("generated tokens N (paper: 1024)", None)
    repeats: Int | None = arg("timed runs per model (paper: 5)", None)
    warmup: Int | None = arg("untimed warm-up runs per model (default 1)", None)
    dtype: Text | None = arg("auto (default: bfloat16 on CUDA, else float32), float32, bfloat16, float16", None)
    device: Text = arg("auto (cuda if available), cpu, cuda, cuda:N", "auto")
    threads: Int | None = arg("CPU threads for torch, >= 1 (default: torch's choice)", None, type=whole("threads"))
    interleave: Text | None = arg("run: whole runs round-robin across models (paper protocol); token (default): models decode "
                                 "in lockstep, one token each in turn, synced per step (robust ratios on a busy CPU)", None,
                                 choices=["run", "token"])
    reference: Text | None = arg("row label the relative latency is taken against (default: the first row)", None)
    seed: Int = arg("seed of the prompt and of untrained weights", 0)
    out: Text = arg("JSON result (written atomically)", f"results/{BENCH_FILE}")
    no_progress: Bool = arg("no progress bar", False)
