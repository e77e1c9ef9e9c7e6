"""Calibrated state replacement and freezing (paper, Sec. 5, eq. 15, Figure 4b).

Does the state carry iteration-specific information, or would any state of the right scale do?
Two interventions at the iteration boundaries of a trained StateLoop model answer it. In the
paper's notation (models/looped.py) boundary i = 1..K is where iteration i-1 leaves its state
S^i, which the read R_i sees and iteration i updates.

Calibration (eq. 15). Per channel c, the mean mu_i[c] and standard deviation sigma_i[c] of S^i
over every token of a calibration sample. A state taken at boundary i is moved to the statistics
of boundary j by

    C_{i->j}(S) = sigma_j / (sigma_i + epsilon) * (S - mu_i) + mu_j,   epsilon = 1e-6 (the paper's),

the same scale and offset for every token of a channel, so replacing S^j by C_{i->j}(S^i) changes
what the state says, not its scale. C_{i->i} is the identity up to epsilon / sigma_i.

- **Single replacement** at i (i = 1..K-1): S^{i+1} is replaced by C_{i->i+1}(S^i), the state one
  iteration earlier; the read R_{i+1} and the later iterations proceed normally from it.
- **Freezing** at i (i = 1..K-1): the state stops evolving after boundary i: every later boundary
  j = i+1..K gets C_{i->j}(S^i), the saved S^i recalibrated to boundary j. (Freezing at K-1 is the
  single replacement at K-1.)

Paper, 410M, K = 7: unmodified PPL 9.04; S^4 replaced by the calibrated S^3: 9.08; frozen at S^3:
18.41. The calibration sample must not be the evaluation data. ``stateloop analyze
interventions`` (analysis/stage.py, analysis/common.py) measures the perplexities on the
held-out set of the run's held-out PPL (``eval.heldout_split``, default "val", and
``eval.heldout_windows`` of its scale: Table 4's set, so the unmodified PPL is Table 4's number)
and takes the statistics from a seeded sample of 64 windows of the ``train`` split, which is
disjoint from any held-out split by construction.

Both interventions use the ``state_overrides`` hook of looped.py: a clean pass returns
S^1..S^K (which no later override can change, since S^i depends only on iterations 0..i-1), and
each intervention is one more pass with the overrides built from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

EPSILON = 1e-6  # eq. (15)'s epsilon: "ensures numerical stability"


@dataclass
class StateStats:
    """Per-channel mean and standard deviation of S^1..S^K: tensors (K, d_s), float64."""

    mean: torch.Tensor
    std: torch.Tensor
    tokens: int

    def calibrate(self, S: torch.Tensor, i: int, j: int) -> torch.Tensor:
        """C_{i->j}(S) of eq. (15), boundaries 1-based."""
        return calibrate(S, self.mean[i - 1], self.std[i - 1], self.mean[j - 1], self.std[j - 1])


def calibrate(S: torch.Tensor, mu_src, sigma_src, mu_dst, sigma_dst) -> torch.Tensor:
    """Eq. (15): sigma_dst / (sigma_src + epsilon) * (S - mu_src) + mu_dst, per channel (last
    axis), computed in float64 and returned in S's dtype."""
    dev = S.device
    mu_src, mu_dst = mu_src.to(dev, torch.float64), mu_dst.to(dev, torch.float64)
    scale = sigma_dst.to(dev, torch.float64) / (sigma_src.to(dev, torch.float64) + EPSILON)
    return (scale * (S.double() - mu_src) + mu_dst).to(S.dtype)


@torch.no_grad()
def state_statistics(model, windows: torch.Tensor, batch_size: int = 8, device="cpu", progress: bool = True) -> StateStats:
    """Per-channel mean and std (population) of S^k at every boundary, over all tokens of the
    windows' inputs; sums accumulated in float64."""
    from tqdm import tqdm

    K, d_s = model.cfg.K, model.cfg.d_state
    s1 = torch.zeros(K, d_s, dtype=torch.float64)
    s2 = torch.zeros(K, d_s, dtype=torch.float64)
    n = 0
    for start in tqdm(range(0, len(windows), batch_size), desc="calibration", unit="batch", disable=not progress,
                      dynamic_ncols=True):
        idx = windows[start : start + batch_size, :-1].to(device)
        states = model(idx, return_states=True).states
        for k, S in enumerate(states):
            flat = S.reshape(-1, d_s).double()
            s1[k] += flat.sum(0).cpu()
            s2[k] += flat.pow(2).sum(0).cpu()
        n += idx.numel()
    mean = s1 / n
    var = (s2 / n - mean.pow(2)).clamp_min(0.0)
    return StateStats(mean, var.sqrt(), n)


def replacement_overrides(states: list[torch.Tensor], stats: StateStats, i: int) -> dict:
    """Single replacement at i: {i+1: C_{i->i+1}(S^i)}."""
    return {i + 1: stats.calibrate(states[i - 1], i, i + 1)}


def freezing_overrides(states: list[torch.Tensor], stats: StateStats, i: int) -> dict:
    """Freezing at i: {j: C_{i->j}(S^i) for j = i+1..K}."""
    K = len(states)
    return {j: stats.calibrate(states[i - 1], i, j) for j in range(i + 1, K + 1)}


@torch.no_grad()
def intervention_nll(model, windows: torch.Tensor, interventions: dict, batch_size: int = 8, device="cpu",
                     progress: bool = True) -> dict:
    """Mean held-out NLL without intervention (key ``"none"``) and under each intervention.

    ``interventions`` maps a name to a function ``(states [S^1..S^K] of the clean pass) ->
    state_overrides``; each is evaluated on the same windows."""
    from tqdm import tqdm

    sums = {name: 0.0 for name in ["none", *interventions]}
    tokens = 0
    for start in tqdm(range(0, len(windows), batch_size), desc=f"interventions: {len(interventions)} + clean",
                      unit="batch", disable=not progress, dynamic_ncols=True):
        batch = windows[start : start + batch_size].to(device)
        idx, targets = batch[:, :-1], batch[:, 1:]
        clean = model(idx, return_states=True)
        sums["none"] += _nll_sum(clean.logits, targets)
        for name, make in interventions.items():
            logits = model(idx, state_overrides=make(clean.states)).logits
            sums[name] += _nll_sum(logits, targets)
        tokens += targets.numel()
    return {name: s / tokens for name, s in sums.items()}


def _nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum").double().item()


def intervention_analysis(model, calib_windows: torch.Tensor, eval_windows: torch.Tensor, batch_size: int = 8,
                          device="cpu", progress: bool = True) -> tuple[dict, StateStats]:
    """Calibrate on ``calib_windows``, then evaluate every single replacement and freezing on
    ``eval_windows``. Returns (result dict, the calibration statistics)."""
    K = model.cfg.K
    stats = state_statistics(model, calib_windows, batch_size, device, progress)
    interventions = {}
    for i in range(1, K):
        interventions[f"replace_{i}"] = lambda states, i=i: replacement_overrides(states, stats, i)
        interventions[f"freeze_{i}"] = lambda states, i=i: freezing_overrides(states, stats, i)
    nll = intervention_nll(model, eval_windows, interventions, batch_size, device, progress)
    base = nll["none"]

    def entry(name: str, **extra) -> dict:
        return {**extra, "nll": nll[name], "ppl": math.exp(nll[name]), "delta_nll": nll[name] - base,
                "delta_ppl": math.exp(nll[name]) - math.exp(base)}

    result = {
        "K": K,
        "unmodified": {"nll": base, "ppl": math.exp(base)},
        "replacement": [entry(f"replace_{i}", i=i, replaced=i + 1, description=f"S^{i + 1} <- C_{i}->{i + 1}(S^{i})")
                        for i in range(1, K)],
        "freezing": [entry(f"freeze_{i}", i=i, boundaries=list(range(i + 1, K + 1)),
                           description=f"S^j <- C_{i}->j(S^{i}) for j = {i + 1}..{K}") for i in range(1, K)],
        "calibration": {
            "tokens": stats.tokens,
            "channel_mean_of_mu": stats.mean.mean(1).tolist(),  # per boundary, averaged over channels
            "channel_mean_of_sigma": stats.std.mean(1).tolist(),
        },
    }
    return result, stats
