"""Constructed eval.json sections for the report tests."""

from __future__ import annotations


def constructed_state(run, tokens: int, read_step: float = 0.0) -> dict:
    """eval.json's "state" section for a run, constructed (report tests): what the diagnostics
    hook records per state i for StateLoop's family; the GRU has no write rate, State only no reads."""
    n = run.K - 1 if run.model == "state_only" else run.K
    out = {"states": list(range(1, n + 1)), "tokens": tokens, "state_norm": [i + 0.1 * run.seed for i in range(1, n + 1)]}
    if run.model != "stateloop_gru":
        out["write_rate_mean"] = [0.1 * i + 0.01 * run.seed for i in range(1, n + 1)]
        out["write_rate_sd"] = [0.05] * n
    if run.model != "state_only":
        out["read_ratio"] = [0.2 + read_step * i for i in range(1, n + 1)]
    return out
