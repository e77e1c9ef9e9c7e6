"""Calibrated state replacement and freezing (paper, Sec. 5, eq. 15, Figure 4b).

Boundary i = 1..K is where iteration i-1 leaves its state S^i (models/looped.py). Calibration
(eq. 15): per channel, the mean mu_i and std sigma_i of S^i over a calibration sample's tokens;

    C_{i->j}(S) = sigma_j / (sigma_i + epsilon) * (S - mu_i) + mu_j,   epsilon = 1e-6 (the paper's),

so replacing S^j by C_{i->j}(S^i) changes what the state says, not its scale.

- **Single replacement** at i (i = 1..K-1): S^{i+1} <- C_{i->i+1}(S^i); the rest runs normally.
- **Freezing** at i: every later boundary j = i+1..K gets C_{i->j}(S^i).

Paper, 410M, K = 7: unmodified PPL 9.04; S^4 replaced by the calibrated S^3: 9.08; frozen at S^3:
18.41. The calibration sample must not be the evaluation data (analysis/common.py).
:func:`intervention_tree` computes all 2(K-1) interventions from one clean pass, sharing the
iterations they share, with the operations of looped.py's ``state_overrides`` hook (the NLLs are
the hook's; :func:`intervention_nll` is that reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stateloop.analysis.shapley import nll_sum
from stateloop.analysis.shards import Sums

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

    K, d_s = model.cfg.K, model.cfg.d_s
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
        sums["none"] += nll_sum(clean.logits, targets).double().item()
        for name, make in interventions.items():
            logits = model(idx, state_overrides=make(clean.states)).logits
            sums[name] += nll_sum(logits, targets).double().item()
        tokens += targets.numel()
    return {name: s / tokens for name, s in sums.items()}


def intervention_names(K: int) -> list[str]:
    """The names of the per-batch sums: the clean pass, then replacement and freezing at i = 1..K-1."""
    return ["none", *[f"{kind}_{i}" for i in range(1, K) for kind in ("replace", "freeze")]]


def intervention_tree(model, idx: torch.Tensor, targets: torch.Tensor, stats: StateStats):
    """Yield (name, the NLL summed over the batch's targets) for the clean pass and every single
    replacement and freezing, sharing what they share (module docstring): the overrides of
    :func:`replacement_overrides` and :func:`freezing_overrides`, applied as looped.py's
    ``state_overrides`` hook applies them."""
    K = model.cfg.K
    Z = model.embed_tokens(idx)
    rope = model.rotary(idx.shape[1], None, idx.device, Z.dtype)
    Hs, Ss, S = [], [], None  # the clean pass: Hs[k] = H^k, Ss[k] = S^{k+1}
    for k in range(K):
        H, S = model.step(k, Z, S, rope, None)
        Hs.append(H)
        Ss.append(S)
        if k < K - 1:
            Z = model.feedback(H, S)
    yield "none", nll_sum(model.lm_head(model.terminal(H, S)), targets)

    def override(i: int, j: int, S):  # S^j <- C_{i->j}(S^i), as the hook sets it
        return stats.calibrate(Ss[i - 1], i, j).to(S.dtype).expand_as(S)

    def rest(k0: int, H, S, frozen_at: int | None):
        """Iterations k0..K-1 from H^{k0-1} and S^{k0}, freezing at ``frozen_at``; the NLL."""
        for k in range(k0, K):
            H, S = model.step(k, model.feedback(H, S), S, rope, None)
            if frozen_at is not None:
                S = override(frozen_at, k + 1, S)
        return nll_sum(model.lm_head(model.terminal(H, S)), targets)

    for i in range(1, K):
        S_next = override(i, i + 1, Ss[i])  # S^{i+1} <- C_{i->i+1}(S^i): both interventions at i
        if i == K - 1:  # nothing follows S^K but the head: the two are one pass
            nll = nll_sum(model.lm_head(model.terminal(Hs[i], S_next)), targets)
            yield f"replace_{i}", nll
            yield f"freeze_{i}", nll
            continue
        H, S = model.step(i + 1, model.feedback(Hs[i], S_next), S_next, rope, None)  # H^{i+1}, S^{i+2}
        yield f"replace_{i}", rest(i + 2, H, S, None)
        yield f"freeze_{i}", rest(i + 2, H, override(i, i + 2, S), i)


@torch.no_grad()
def batch_sums(model, batch: torch.Tensor, stats: StateStats) -> tuple[dict[str, float], int]:
    """One batch of windows (B, T + 1) -> (each intervention's NLL summed over the batch, as
    float64; the batch's target count)."""
    idx, targets = batch[:, :-1], batch[:, 1:]
    return {name: nll.double().item() for name, nll in intervention_tree(model, idx, targets, stats)}, targets.numel()


def exact_sums(model, windows, stats: StateStats, batch_size: int = 8, device="cpu", progress: bool = True) -> Sums:
    """The exact sums (analysis/shards.py) of every intervention's NLL over all windows."""
    from tqdm import tqdm

    sums = Sums(intervention_names(model.cfg.K))
    for start in tqdm(range(0, len(windows), batch_size), desc=f"interventions: {2 * (model.cfg.K - 1)} + clean",
                      unit="batch", disable=not progress, dynamic_ncols=True):
        sums.add(*batch_sums(model, windows[start : start + batch_size].to(device), stats))
    return sums


def stats_digest(stats: StateStats) -> str:
    """A short hash of the calibration statistics: shards of one analysis must share them exactly."""
    import hashlib

    h = hashlib.sha256()
    for t in (stats.mean, stats.std):
        h.update(t.detach().cpu().to(torch.float64).contiguous().numpy().tobytes())
    h.update(str(int(stats.tokens)).encode())
    return h.hexdigest()[:16]


def intervention_result(K: int, sums: Sums, stats: StateStats) -> dict:
    """The result of the exact sums of every intervention's NLL (one run, or the merged shards)."""
    nll = {name: sums.mean(name) for name in sums.names}
    base = nll["none"]

    def entry(name: str, **extra) -> dict:
        return {**extra, "nll": nll[name], "ppl": math.exp(nll[name]), "delta_nll": nll[name] - base,
                "delta_ppl": math.exp(nll[name]) - math.exp(base)}

    return {
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
            "digest": stats_digest(stats),
        },
        "tokens": sums.tokens,
    }
