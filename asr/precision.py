"""Numeric precision of a model's forward pass: fp32, or bf16 autocast.

bf16 autocast runs matmuls and convolutions in bfloat16 and keeps reductions (softmax,
log-softmax, normalisation) in float32, as `--trainer.precision bf16-mixed` does in training.
On CPUs with AVX-512 bf16 (or AMX) and on recent GPUs its matmuls run several times faster.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16")
# Search steps run in bf16 from this many rows (batch x beam) on: below it, small bf16 matmuls
# cost more than they save on CPUs.
BF16_STEP_ROWS = 128


def check_precision(precision: str) -> str:
    """`precision` if it is one of `PRECISIONS`, else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` for "bf16"; nothing for "fp32"."""
    import torch  # here, so that the CLI reads PRECISIONS without importing torch

    check_precision(precision)
    return torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16")
