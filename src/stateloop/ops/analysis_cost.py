"""What the jobs after training cost: per job of a pipeline config's DAG that evaluates or analyses a
trained run (workflow/rules/eval.smk, analysis.smk), its FLOPs, its hours on one GPU at an assumed
MFU, its time limit and whether it fits. ``eval``'s lm-eval tasks are bounded from above (each
request of :data:`LM_EVAL_REQUESTS` as a forward pass of a whole window; a task of unknown size is
named and not counted); ``eval_depth`` is a forward pass per window at each K'; ``shapley`` and
``interventions`` are their prefix-shared trees (analysis/shapley.py, interventions.py), sharded
as analysis/jobs.py says (a merge costs no FLOPs).

FLOPs are counted, not modelled: the pieces of one window's forward (each iteration, each read, the
head) run on the meta device under models/flops.py's counter and are combined as the analysis code
combines them (tests/analysis/test_cost.py checks each against the counter over the analysis's own
code). Hours = FLOPs / (MFU x peak), the MFU the training step's (ops/cost.py). The held-out split's
size comes from the tokenized data where it exists, else :data:`ASSUMED_SPLIT_TOKENS`; a scale
without either has no estimate unless ``eval.heldout_windows`` caps it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from stateloop.analysis import jobs
from stateloop.analysis.common import CALIB_WINDOWS
from stateloop.analysis.shapley import nll_sum
from stateloop.analysis.shards import Shard, n_batches
from stateloop.data.stage import data_homes
from stateloop.experiments import expand_runs
from stateloop.models.flops import counter, meta_model
from stateloop.ops import measured
from stateloop.ops.cost import run_mfu

# [assume] The held-out split's size before it is tokenized, by (data.source, data.val_split). The
# Pile's validation split is 1.4 GB of JSON lines (EleutherAI/pile_val_test's card); the paper's
# GPT-NeoX-20B tokenizer gives about 0.29 tokens per byte on the Pile, so at most about 0.41e9
# tokens; the uncopyrighted mirror the paper config reads drops some subsets (Books3 among them),
# so fewer. Planned at 4.0e8, the upper end: a job that fits at it fits the real split; the real
# count replaces it once data/<scale>/meta.json exists.
ASSUMED_SPLIT_TOKENS = {("monology/pile-uncopyrighted", "validation"): 400_000_000}

# [assume] Requests of an lm-eval task at one few-shot count: the documents of the split lm-eval
# scores (the datasets' cards) x the continuations each is scored over (ARC's 3-5 choices taken
# as 4; RACE: the last question of each article, 4 choices; Winogrande: its 2 partial contexts).
LM_EVAL_REQUESTS = {"lambada_openai": 5153, "arc_easy": 2376 * 4, "arc_challenge": 1172 * 4, "winogrande": 1267 * 2,
                    "piqa": 1838 * 2, "hellaswag": 10042 * 4, "sciq": 1000 * 4, "race": 1045 * 4}
# [assume] Perplexity tasks, scored once (no shots) in rolling windows of the context: their test
# documents' tokens (wikitext-2's 62 test articles, about 245,000 words: 3e5 GPT-NeoX tokens).
LM_EVAL_ROLLING = {"wikitext": (62, 300_000)}


def task_windows(tasks, shots, max_length: int) -> tuple[int, list[str]]:
    """(an upper bound on the forward passes of whole ``max_length`` windows that scoring
    ``tasks`` at every count of ``shots`` takes, the tasks of unknown size)."""
    total, unknown = 0, []
    for task in tasks:
        if task in LM_EVAL_REQUESTS:
            total += LM_EVAL_REQUESTS[task] * max(1, len(shots))
        elif task in LM_EVAL_ROLLING:
            docs, tokens = LM_EVAL_ROLLING[task]
            total += docs + -(-tokens // max_length)  # every document's last partial window, and the whole ones
        else:
            unknown.append(task)
    return total, unknown


@dataclasses.dataclass(frozen=True)
class Heldout:
    """A scale's held-out windows as the plan sees them."""

    windows: int | None  # None: unknown (no size for the split)
    seq_len: int
    batch_size: int
    source: str  # where the count comes from


def heldout(cfg, scale_name: str, data_root="data") -> Heldout:
    """The held-out windows of a scale's runs (module docstring)."""
    scale = cfg.scales[scale_name]
    ev, model, train = scale.eval, scale.model, scale.train
    seq_len = int(ev.max_length or min(train.seq_len, model.max_seq_len))

    home = data_homes(cfg.scales, list(cfg.scales)).get(scale_name, scale_name)  # a scale may read another's folder
    meta = Path(data_root) / home / "meta.json"
    tokens, source = None, None
    if meta.is_file():
        try:
            tokens = int(json.loads(meta.read_text())["splits"][ev.heldout_split]["tokens"])
            source = f"{meta} (split {ev.heldout_split}: {tokens} tokens)"
        except (OSError, ValueError, KeyError, TypeError):
            tokens = None
    assumed = ASSUMED_SPLIT_TOKENS.get((scale.data.source, scale.data.val_split))
    if tokens is None and assumed is not None:
        tokens = assumed
        source = f"assumed: {scale.data.source} {scale.data.val_split} = {assumed:.3g} tokens (ops/analysis_cost.py)"
    whole = None if tokens is None else (tokens - 1) // seq_len
    if ev.heldout_windows is not None:
        windows = ev.heldout_windows if whole is None else min(whole, ev.heldout_windows)
        source = f"eval.heldout_windows = {ev.heldout_windows}" + (f"; {source}" if source else " (at most)")
        return Heldout(windows, seq_len, ev.batch_size, source)
    return Heldout(whole, seq_len, ev.batch_size, source or f"unknown: {meta} not found and no size assumed")


# -- FLOPs of one window ---------------------------------------------------------------------------

_PIECES: dict[tuple[str, int], dict] = {}


def _key(cfg, seq_len: int) -> tuple[str, int]:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=repr), seq_len


def pieces(cfg, seq_len: int) -> dict:
    """The FLOPs of one window's forward pass of a StateLoop model, piece by piece, counted on the
    meta device: ``step[k]`` (iteration k: the backbone and the state update), ``feedback[k]`` (the
    read after iteration k < K-1), ``terminal`` (the last read), ``head`` (final norm, LM head, loss)."""
    key = _key(cfg, seq_len)
    if key in _PIECES:
        return _PIECES[key]
    import torch

    model = meta_model(cfg)
    idx = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    out = {"step": [], "feedback": []}

    def counted(fn, *args):
        with counter() as c:
            value = fn(*args)
        return value, c.get_total_flops()

    with torch.no_grad():
        Z = model.embed_tokens(idx)
        rope = model.rotary(seq_len, None, idx.device, Z.dtype)
        S = None
        for k in range(cfg.K):
            (H, S), flops = counted(model.step, k, Z, S, rope, None)
            out["step"].append(flops)
            if k < cfg.K - 1:
                Z, flops = counted(model.feedback, H, S)
                out["feedback"].append(flops)
        Y, out["terminal"] = counted(model.terminal, H, S)
        _, out["head"] = counted(lambda y: nll_sum(model.lm_head(y), idx), Y)
    _PIECES[key] = out
    return out


def shapley_flops(cfg, seq_len: int) -> float:
    """One window's FLOPs of the Shapley tree: 2^k applications of iteration k and of the read after
    it, 2^(K-1) terminal reads, 2^K heads (analysis/shapley.py)."""
    p, K = pieces(cfg, seq_len), cfg.K
    return float(sum(2**k * p["step"][k] for k in range(K)) + sum(2**k * p["feedback"][k] for k in range(K - 1))
                 + 2 ** (K - 1) * p["terminal"] + 2**K * p["head"])


def clean_flops(cfg, seq_len: int) -> float:
    """One window's FLOPs of the unmodified forward pass (the calibration's, the clean pass's)."""
    p = pieces(cfg, seq_len)
    return float(sum(p["step"]) + sum(p["feedback"]) + p["terminal"] + p["head"])


def interventions_flops(cfg, seq_len: int) -> float:
    """One window's FLOPs of the interventions' tree (analysis/interventions.py): the clean pass;
    for each i < K-1 the read and iteration i+1 the pair shares, then twice the rest; at K-1 one head."""
    p, K = pieces(cfg, seq_len), cfg.K
    total = clean_flops(cfg, seq_len)
    end = p["terminal"] + p["head"]
    for i in range(1, K - 1):
        rest = sum(p["feedback"][k - 1] + p["step"][k] for k in range(i + 2, K)) + end
        total += p["feedback"][i] + p["step"][i + 1] + 2 * rest
    return float(total + end)


_FORWARD: dict[tuple[str, int], float] = {}


def forward_flops(cfg, seq_len: int) -> float:
    """One window's FLOPs of the model's forward pass (any model; the held-out PPL's). Counted once
    per (config, seq_len) and this module's and the models' code, and kept on disk
    (ops/measured.py, with models/flops.py's counts), so ``stateloop plan --analyses`` called
    again counts no model's forward."""
    key = _key(cfg, seq_len)
    if key not in _FORWARD:
        name = measured.key("forward", *key, measured.code_digest("ops/analysis_cost.py"))
        found = measured.load("flops", name)
        if found is None:
            import torch

            model = meta_model(cfg)
            with torch.no_grad(), counter() as c:
                model(torch.zeros(1, seq_len, dtype=torch.long, device="meta"))
            found = float(c.get_total_flops())
            measured.store("flops", name, found)
        _FORWARD[key] = float(found)
    return _FORWARD[key]


# -- the jobs --------------------------------------------------------------------------------------

def analysis_plan_rows(cfg, mfu=0.30, peak_tflops: float = 989.0, data_root="data") -> list[dict]:
    """One row per evaluation or analysis job the DAG runs for the pipeline config ``cfg`` (module
    docstring): ``job`` (the rule), ``run``, ``shard`` ("I/N" or ""), ``windows``, ``tokens``,
    ``flops``, ``hours`` (at ``mfu``, or ``mfu(scale)``, of ``peak_tflops`` per GPU), ``limit_min`` (the job's runtime
    from the scale's resources), ``fits`` (hours within the limit), ``gpus``, ``heldout_from`` (where
    the window count comes from) and ``note``. ``flops``, ``hours`` and ``fits`` are None where the
    held-out split's size is unknown."""
    made = {name for name, e in cfg.experiments.items() if e.trained}
    rows = []

    def row(job, run, windows, tokens, flops, res, source, shard="", note=""):
        hours = None if flops is None else flops / (run_mfu(mfu, run.scale) * peak_tflops * 1e12) / 3600
        limit = int(res["runtime"])
        rows.append({"job": job, "run": run.id, "shard": shard, "windows": windows, "tokens": tokens, "flops": flops,
                     "hours": hours, "limit_min": limit, "fits": None if hours is None else hours * 60 <= limit,
                     "gpus": int(res["gpus"]), "heldout_from": source, "note": note})

    def resources(stage) -> dict:
        return {"runtime": stage.runtime, "gpus": stage.gpus}

    for run in expand_runs(cfg):
        scale = cfg.scales[run.scale]
        h = heldout(cfg, run.scale, data_root)
        known = h.windows is not None
        tokens = h.windows * h.seq_len if known else None
        cfg_run = run.model_config
        per = forward_flops(cfg_run, h.seq_len)
        flops, note = per * h.windows if known else None, "held-out PPL"
        if run.scores_tasks():
            windows, unknown = task_windows(scale.eval.tasks, scale.eval.shots, h.seq_len)
            flops = None if flops is None else flops + per * windows
            note += f" + lm-eval tasks (at most {windows} windows)"
            if unknown:
                note += f"; not counted: {', '.join(unknown)} (size unknown)"
        row("eval", run, h.windows, tokens, flops, resources(scale.resources.eval), h.source, note=note)
        if "test_time_depth" in run.experiments and "test_time_depth" in made and run.test_time_K:
            per = sum(forward_flops(dataclasses.replace(cfg_run, K=K), h.seq_len) for K in run.test_time_K)
            row("eval_depth", run, h.windows, tokens, per * h.windows if known else None,
                resources(scale.resources.eval), h.source, note=f"held-out PPL at K' = {run.test_time_K}")
        if "state_analysis" not in run.experiments or "state_analysis" not in made:
            continue
        stage = jobs.stage_job(cfg, run.scale)
        final = {a: jobs.final_job(cfg, run.scale, a) for a in jobs.ANALYSES}
        for analysis, per_window in (("shapley", shapley_flops), ("interventions", interventions_flops)):
            count = jobs.shard_count(cfg, run.scale, analysis)
            per = per_window(cfg_run, h.seq_len)
            if count == 1:
                flops = per * h.windows if known else None
                if analysis == "interventions" and flops is not None:
                    flops += CALIB_WINDOWS * clean_flops(cfg_run, h.seq_len)
                row(analysis, run, h.windows, tokens, flops, final[analysis], h.source, note="one job")
                continue
            if analysis == "interventions":
                row("interventions_calibration", run, CALIB_WINDOWS, CALIB_WINDOWS * h.seq_len,
                    CALIB_WINDOWS * clean_flops(cfg_run, h.seq_len), stage,
                    f"{CALIB_WINDOWS} windows of the train split", note="calibration statistics")
            for i in range(1, count + 1):
                windows = None
                if known:
                    lo, hi = Shard(i, count).batches(n_batches(h.windows, h.batch_size))
                    windows = min(hi * h.batch_size, h.windows) - min(lo * h.batch_size, h.windows)
                row(f"{analysis}_shard", run, windows, None if windows is None else windows * h.seq_len,
                    None if windows is None else per * windows, stage, h.source, shard=f"{i}/{count}")
            row(analysis, run, h.windows, tokens, 0.0, final[analysis], h.source, note=f"merge of {count} shards")
    return rows


def print_analysis_plan(rows: list[dict], mfu: float, peak_tflops: float) -> None:
    """The rows as a table (for ``stateloop plan``)."""
    print(f"{'job':<26}{'run':<36}{'shard':>6}{'tokens (M)':>12}{'FLOPs':>11}{'hours':>8}{'limit h':>8}  fits")
    for r in rows:
        tokens = "?" if r["tokens"] is None else f"{r['tokens'] / 1e6:.1f}"
        flops = "?" if r["flops"] is None else f"{r['flops']:.2e}"
        hours = "?" if r["hours"] is None else f"{r['hours']:.2f}"
        fits = "?" if r["fits"] is None else ("yes" if r["fits"] else "NO")
        note = f"  ({r['note']})" if "lm-eval" in r["note"] else ""
        print(f"{r['job']:<26}{r['run']:<36}{r['shard']:>6}{tokens:>12}{flops:>11}{hours:>8}"
              f"{r['limit_min'] / 60:>8.1f}  {fits}{note}")
    at = "the MFU above" if callable(mfu) else f"MFU {mfu:.0%}"
    print(f"(one GPU per job at {at} of {peak_tflops:g} TFLOP/s; held-out windows: "
          f"{'; '.join(sorted({r['heldout_from'] for r in rows}))})")
