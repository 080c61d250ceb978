"""Numeric precision of a model's forward pass: fp32, or bf16 autocast.

bf16 autocast runs matmuls and convolutions in bfloat16 and keeps reductions (softmax,
log-softmax, normalisation) in float32, as `--trainer.precision bf16-mixed` does in training.
On CPUs with AVX-512 bf16 (or AMX) and on recent GPUs its matmuls run several times faster.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16")


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


KERNEL_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def keep_compiled_kernels(capacity: int = 4096) -> bool:
    """Let oneDNN keep `capacity` compiled kernels instead of its default 1024; True if set.

    On CPU, bf16 matmuls and convolutions run through oneDNN, which compiles a kernel for
    every new shape and keeps the last 1024 (LRU). The AN4 Transformer's batches from a fixed
    menu of shapes (``shape_grid``) need ~3,000 kernels, training and validation: at 1024 most
    are evicted before the next epoch asks for them again. Kept kernels cost ~0.3 MiB each
    (bench/RESULTS.md, session 22).

    Must run before the process's first bf16 matmul: oneDNN reads the capacity then. A no-op
    where the variable is set already (1024 restores the default, 0 disables the cache).
    """
    if capacity < 1:
        raise ValueError(f"kernel cache capacity must be >= 1, got {capacity}")
    if KERNEL_CACHE_VARIABLE in os.environ:
        return False
    os.environ[KERNEL_CACHE_VARIABLE] = str(capacity)
    return True
