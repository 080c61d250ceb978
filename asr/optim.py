"""Learning-rate schedules stepped per optimizer step (Lightning `interval: step`)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def noam_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup to a peak of 1, then inverse square-root decay (Vaswani et al. 2017).

    >>> [round(noam_factor(s, 4), 3) for s in (0, 1, 3, 15)]
    [0.25, 0.5, 1.0, 0.5]
    """
    step = step + 1
    return min(step / warmup_steps, math.sqrt(warmup_steps / step)) if warmup_steps else 1.0


def cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup, then cosine decay from 1 to `min_ratio` at `total_steps`.

    >>> [round(cosine_factor(s, 2, 10, 0.0), 3) for s in (0, 1, 2, 6, 10, 20)]
    [0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class NoamLR(LambdaLR):
    """Warmup + inverse-sqrt ("Noam") schedule peaking at the optimizer's lr (as ESPnet)."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int = 25000):
        if warmup_steps < 0:
            raise ValueError(f"NoamLR warmup_steps must be at least 0, got {warmup_steps}")
        super().__init__(optimizer, lambda s: noam_factor(s, warmup_steps))


class WarmupCosineLR(LambdaLR):
    """Linear warmup, then cosine decay to `min_ratio` of the peak lr at `total_steps`."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int = 1000,
        total_steps: int = 100000,
        min_ratio: float = 0.0,
    ):
        if warmup_steps < 0 or total_steps <= warmup_steps:  # else the peak drops in a step
            raise ValueError(
                f"WarmupCosineLR warmup_steps must be at least 0 and total_steps past them, "
                f"got {warmup_steps} and {total_steps}"
            )
        if not 0.0 <= min_ratio <= 1.0:  # a negative lr ascends the loss
            raise ValueError(f"WarmupCosineLR min_ratio must be in [0, 1], got {min_ratio}")
        super().__init__(
            optimizer, lambda s: cosine_factor(s, warmup_steps, total_steps, min_ratio)
        )
