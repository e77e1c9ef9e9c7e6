"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

With peak rate eta_max (``lr``), floor eta_min (``min_lr``), W warmup steps and S total steps,
the rate used by optimiser step s = 0 .. S-1 is

    eta(s) = eta_max * (s + 1) / W                                              s < W
    eta(s) = eta_min + (eta_max - eta_min) * (1 + cos(pi * (s - W) / (S - W))) / 2   s >= W

so the first step already moves (s + 1), the peak is reached at s = W - 1, and the last step
sits just above the floor. ``schedule: constant`` keeps eta_max after warmup. The rate is a pure
function of the step, so a resumed run needs only the step (the LambdaLR object is saved too).
"""

from __future__ import annotations

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, total_steps: int, schedule: str = "cosine") -> float:
    """eta(step) of the module docstring."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_lambda(cfg, total_steps: int):
    """The multiplier of ``cfg.lr`` that ``torch.optim.lr_scheduler.LambdaLR`` applies at each step."""
    return lambda step: lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, total_steps, cfg.schedule) / cfg.lr
