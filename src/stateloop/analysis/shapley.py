"""Exact Shapley values of the state reads R_1..R_K (paper, Sec. 5, Figure 4a).

The players are the K reads of a StateLoop model (models/looped.py): the feedback reads
R_1..R_{K-1} and the terminal read R_K. A coalition M is a set of *masked* reads (looped.py's
``read_mask``), and its value is the held-out NLL increase it causes,

    v(M) = NLL(M masked) - NLL(nothing masked),      v(∅) = 0,

    phi_i = sum_{M ⊆ N \\ {i}}  |M|! (K - |M| - 1)! / K!  [v(M ∪ {i}) - v(M)].

Shares are phi_i / sum_j phi_j (paper, K = 7: the six feedback reads together 63.70%, the terminal
read 36.30%), on "the full Pile validation set" (analysis/common.py). Iteration k depends only on
the masks of R_1..R_k, so the 2^K masked passes form a binary tree, evaluated depth first: 2^K - 1
backbone applications per batch instead of K 2^K (127 instead of 896 at K = 7), the fewest an
exact evaluation can do.
"""

from __future__ import annotations

import math
from itertools import combinations

import torch
import torch.nn.functional as F

from stateloop.analysis.shards import Sums


def mask_bits(m: int, K: int) -> list[int]:
    """Mask index m -> [b_1..b_K], b_k = 1 when read R_k is masked (bit k-1 of m)."""
    return [(m >> k) & 1 for k in range(K)]


def keep_vector(m: int, K: int) -> list[float]:
    """The ``read_mask`` of looped.py for mask index m: 1 keeps a read, 0 zeroes it."""
    return [1.0 - b for b in mask_bits(m, K)]


def sum_names(K: int) -> list[str]:
    """The names of the per-batch sums: the mask indices 0 .. 2^K - 1, as strings (JSON keys)."""
    return [str(m) for m in range(2**K)]


def mask_tree(model, idx: torch.Tensor, targets: torch.Tensor):
    """Yield (mask index, the NLL summed over the batch's targets) for all 2^K read masks of one
    batch: the prefix-shared tree, depth first (module docstring)."""
    h = model.embed_tokens(idx)
    rope = model.rotary(idx.shape[1], None, idx.device, h.dtype)
    yield from _descend(model, 0, h, None, 0, rope, targets)  # Z^0 = E, S^0 = 0, nothing masked


def _descend(model, k: int, Z, S, m: int, rope, targets):
    """Iteration k (0-based) given the masks of R_1..R_k (bits of m); then both settings of
    R_{k+1}, the read of the state S^{k+1} it makes."""
    K = model.cfg.K
    H, S = model.step(k, Z, S, rope, None)  # H^k, S^{k+1}
    bit = 1 << k  # R_{k+1}
    if k < K - 1:
        yield from _descend(model, k + 1, model.feedback(H, S), S, m, rope, targets)  # R_{k+1} kept: Z^{k+1} = H^k + R_{k+1}
        yield from _descend(model, k + 1, H, S, m | bit, rope, targets)  # R_{k+1} masked: Z^{k+1} = H^k
        return
    for out, leaf in ((model.terminal(H, S), m), (H, m | bit)):  # R_K kept (H^{K-1} + R_K) / masked
        yield leaf, nll_sum(model.lm_head(out), targets)


def nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The NLL summed over every target of a batch (float32 logits, as the held-out PPL)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")


@torch.no_grad()
def batch_sums(model, batch: torch.Tensor) -> tuple[dict[str, float], int]:
    """One batch of windows (B, T + 1) -> (each mask's NLL summed over the batch, as float64; the
    batch's target count)."""
    idx, targets = batch[:, :-1], batch[:, 1:]
    return {str(m): nll.double().item() for m, nll in mask_tree(model, idx, targets)}, targets.numel()


def exact_sums(model, windows, batch_size: int = 8, device="cpu", progress: bool = True) -> Sums:
    """The exact sums (analysis/shards.py) of every mask's NLL over all windows, batch by batch."""
    from tqdm import tqdm

    K = model.cfg.K
    sums = Sums(sum_names(K))
    batches = range(0, len(windows), batch_size)
    for start in tqdm(batches, desc=f"shapley: {2**K} masks", unit="batch", disable=not progress, dynamic_ncols=True):
        sums.add(*batch_sums(model, windows[start : start + batch_size].to(device)))
    return sums


def masked_nll_sums(model, windows, batch_size: int = 8, device="cpu", progress: bool = True) -> torch.Tensor:
    """Summed NLL of every read mask over all windows: a (2^K, 2) float64 tensor
    [sum_nll, n_tokens], row m = mask index m (bit k-1 set: R_k masked)."""
    sums = exact_sums(model, windows, batch_size, device, progress)
    return torch.tensor([[sums.total(name), float(sums.tokens)] for name in sums.names], dtype=torch.float64)


def shapley_values(values: list[float] | torch.Tensor, K: int) -> list[float]:
    """Exact Shapley values of K players from the 2^K coalition values, indexed by bitmask
    (bit i-1 set: player i in the coalition)."""
    v = [float(x) for x in values]
    if len(v) != 2**K:
        raise ValueError(f"need 2^K = {2**K} coalition values, got {len(v)}")
    weight = [math.factorial(s) * math.factorial(K - s - 1) / math.factorial(K) for s in range(K)]
    phi = []
    for i in range(K):
        others = [j for j in range(K) if j != i]
        total = 0.0
        for s in range(K):
            for coalition in combinations(others, s):
                m = sum(1 << j for j in coalition)
                total += weight[s] * (v[m | (1 << i)] - v[m])
        phi.append(total)
    return phi


def shapley_result(K: int, sums: Sums) -> dict:
    """The result of the exact sums of every mask's NLL (one run, or the merged shards)."""
    nll = [sums.mean(name) for name in sum_names(K)]
    v = [x - nll[0] for x in nll]  # v(M) = NLL(M) - NLL(∅)
    phi = shapley_values(v, K)
    total = sum(phi)
    shares = [p / total if total != 0 else float("nan") for p in phi]
    return {
        "K": K,
        "reads": [f"R{k}" for k in range(1, K + 1)],
        "nll_none_masked": nll[0],
        "nll_all_masked": nll[-1],
        "ppl_none_masked": math.exp(nll[0]),
        "shapley": phi,
        "shapley_sum": total,
        "share_pct": [100.0 * s for s in shares],
        "feedback_share_pct": 100.0 * sum(shares[:-1]),
        "terminal_share_pct": 100.0 * shares[-1],
        "masks": [{"index": m, "masked": mask_bits(m, K), "nll": nll[m], "ppl": math.exp(nll[m])} for m in range(2**K)],
        "tokens": sums.tokens,
        "backbone_applications_per_batch": 2**K - 1,
    }
