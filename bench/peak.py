"""Machine limit: measured square-matmul throughput in fp32 and bf16 (GFLOP/s).

The best size's rate is the "peak" that model FLOPs utilisation (MFU) divides by: what this
machine's torch build reaches on the friendliest workload, with the same thread count the
other parts use.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench.common import Settings, synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_gflops(n: int, dtype: torch.dtype, device: torch.device, min_seconds: float) -> float:
    """GFLOP/s of `(n, n) @ (n, n)` (`2 n^3` FLOPs), best of repeated timings after a warm-up.

    Each timing repeats the product until `min_seconds` pass, so small sizes are not
    dominated by the timer.
    """
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: kernels chosen, pages touched
    best = 0.0
    for _ in range(3):
        synchronize(device)
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < min_seconds / 3 or calls == 0:
            torch.matmul(a, b, out=out)
            calls += 1
            synchronize(device)
        seconds = time.perf_counter() - start
        best = max(best, 2 * n**3 * calls / seconds / 1e9)
    return best


def run(settings: Settings) -> dict[str, Any]:
    """Rates per dtype and size, and the peak per dtype."""
    sizes = settings.pick([256, 512, 1024], [256, 512, 1024, 2048, 4096])
    if settings.on_gpu and not settings.quick:
        sizes.append(8192)  # a GPU's matrix units fill only at the largest sizes
    min_seconds = settings.pick(0.3, 2.0)
    rates: dict[str, dict[int, float]] = {}
    for name, dtype in DTYPES.items():
        rates[name] = {n: matmul_gflops(n, dtype, settings.device, min_seconds) for n in sizes}
    return {
        "sizes": sizes,
        "gflops": rates,
        "peak_gflops": {name: max(by_size.values()) for name, by_size in rates.items()},
        "threads": settings.threads,
    }
