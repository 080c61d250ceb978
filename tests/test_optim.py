"""Learning-rate schedules: values out of range are refused when the schedule is built."""

from __future__ import annotations

import pytest
import torch

from asr.optim import NoamLR, WarmupCosineLR


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)


@pytest.mark.parametrize(
    ("schedule", "said"),
    [
        (lambda o: NoamLR(o, warmup_steps=-5), "NoamLR warmup_steps must be at least 0"),
        (lambda o: WarmupCosineLR(o, min_ratio=-1.0), r"min_ratio must be in \[0, 1\], got -1"),
        (lambda o: WarmupCosineLR(o, min_ratio=1.5), r"min_ratio must be in \[0, 1\], got 1.5"),
        (lambda o: WarmupCosineLR(o, total_steps=0), "total_steps past them, got 1000 and 0"),
        (lambda o: WarmupCosineLR(o, warmup_steps=10, total_steps=5), "got 10 and 5"),
    ],
)
def test_schedules_refuse_what_would_give_a_negative_or_no_learning_rate(schedule, said):
    """A negative min_ratio ascended the loss; a negative warmup failed in math.sqrt."""
    with pytest.raises(ValueError, match=said):
        schedule(_optimizer())


def test_a_cosine_schedule_ends_at_its_floor():
    optimizer = _optimizer()
    schedule = WarmupCosineLR(optimizer, warmup_steps=2, total_steps=6, min_ratio=0.1)
    rates = []
    for _ in range(8):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[1] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-4)
    assert min(rates) >= 1e-4 - 1e-12
