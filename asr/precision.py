"""Numeric precision of a model's forward pass: fp32, or bf16 autocast."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

PRECISIONS = ("fp32", "bf16")
# Below this many rows (batch x beam), small bf16 matmuls cost more than they save on CPUs.
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


def input_dtype(module: nn.Module) -> torch.dtype:
    """The floating type a module's inputs take: its weights' (float64 for a `double()`
    model), float32 at least (half-precision weights still read float32 audio and features)."""
    import torch

    tensors = (*module.parameters(), *module.buffers())
    weights = next((t for t in tensors if t.is_floating_point()), None)
    return torch.float32 if weights is None else torch.promote_types(weights.dtype, torch.float32)
