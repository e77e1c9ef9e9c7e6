"""What the state does: per-iteration diagnostics of the StateLoop family, from the forward's
``diagnostics`` hook (models/looped.py), over the windows of a validation or an evaluation.

The hook sums, for each state S^i (i = 1..K) a forward makes, over its tokens; :func:`summarise`
turns those sums into means over every token of every window (the project's own measures, not the
paper's; [choice] each is a mean over tokens of a per-token quantity):

- ``write_rate_mean``, ``write_rate_sd``, ``write_rate_min``, ``write_rate_max``: the write rate
  eta^{i-1} = 1 - g^{i-1} of eq. (6) (g^k = exp(-lambda Delta^k), the retention) of each channel,
  averaged over tokens, then its mean, standard deviation (population), minimum and maximum over
  the d_s channels: near 0 the state keeps its value, near 1 it is overwritten every iteration;
- ``read_ratio``: ||R_i|| / ||H^{i-1}||, the norm of the read against that of the backbone output
  it is added to (Z^i = H^{i-1} + R_i; i = K is the terminal read, ``terminal_read_ratio``): near
  0 the state barely reaches the residual stream;
- ``state_norm``: ||S^i|| (L2 over the d_s channels).

Which quantities a model has: eq. (6)'s cell has a write rate (the GRU ablation has none), a model
with reads has read ratios (state-only has none; its states are X^1..X^{K-1}).
"""

from __future__ import annotations

from stateloop.models.looped import StateLoopLM

QUANTITIES = ("write_rate_mean", "write_rate_sd", "write_rate_min", "write_rate_max", "read_ratio", "state_norm")


def supports(model) -> bool:
    """Whether ``model`` (unwrapped) takes the ``diagnostics`` hook: the StateLoop family."""
    return isinstance(model, StateLoopLM)


def all_reduce(sums: dict, reduce) -> dict:
    """The sums of every rank: ``reduce`` (a tensor -> its sum over ranks) applied to each."""
    return {i: {name: reduce(value) for name, value in entry.items()} for i, entry in sorted(sums.items())}


def summarise(sums: dict) -> dict:
    """The hook's sums -> {"states": [1..K], "tokens": n, quantity: [one value per state], ...,
    "terminal_read_ratio": R_K's ratio (models with reads)}; quantities a model lacks are absent."""
    out: dict = {"states": sorted(sums)}
    if not sums:
        return out
    first = sums[out["states"][0]]
    out["tokens"] = int(first["tokens"])
    columns: dict[str, list[float]] = {}
    for i in out["states"]:
        entry = sums[i]
        n = float(entry["tokens"])
        if "write_rate" in entry:
            per_channel = entry["write_rate"].double() / n
            columns.setdefault("write_rate_mean", []).append(float(per_channel.mean()))
            columns.setdefault("write_rate_sd", []).append(float(per_channel.std(unbiased=False)))
            columns.setdefault("write_rate_min", []).append(float(per_channel.min()))
            columns.setdefault("write_rate_max", []).append(float(per_channel.max()))
        if "read_ratio" in entry:
            columns.setdefault("read_ratio", []).append(float(entry["read_ratio"]) / n)
        columns.setdefault("state_norm", []).append(float(entry["state_norm"]) / n)
    out.update(columns)
    if "read_ratio" in columns:
        out["terminal_read_ratio"] = columns["read_ratio"][-1]
    return out


def curves(summary: dict) -> dict[str, list[tuple[int, float]]]:
    """MLflow curves of a summary: ``state/<quantity>`` with the state index i as its step."""
    return {f"state/{q}": list(zip(summary["states"], summary[q])) for q in QUANTITIES if q in summary}


def step_metrics(summary: dict, prefix: str = "val/state") -> dict[str, float]:
    """A summary as metrics of one training step: ``{prefix}/<quantity>_<i>`` (one curve per state
    over training)."""
    return {f"{prefix}/{q}_{i}": v for q in QUANTITIES if q in summary for i, v in zip(summary["states"], summary[q])}
