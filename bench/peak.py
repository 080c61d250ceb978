"""Machine limit: measured square-matmul throughput in fp32 and bf16 (GFLOP/s).

The best size's rate is the "peak" that model FLOPs utilisation (MFU) divides by: what this
machine's torch build reaches on the friendliest workload, with the same thread count the
other parts use.

On CPU, torch sends fp32 matmuls to MKL and bf16 ones to oneDNN. MKL may leave a CPU's
widest vector units unused (on AMD processors it runs its AVX2 code), so fp32 is also timed
through oneDNN (`onednn_fp32_matmul`); that rate counts towards the fp32 peak only where its
products are fp32-exact.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from bench.common import Settings, synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ONEDNN_FP32 = "fp32 via oneDNN"  # the rates' key for fp32 timed under `onednn_fp32_matmul`
EXACT = 1e-5  # largest relative difference from torch's own fp32 product that counts as fp32


@contextlib.contextmanager
def onednn_fp32_matmul() -> Iterator[None]:
    """CPU fp32 matmuls through oneDNN rather than MKL. torch routes them there when oneDNN
    may use bf16 arithmetic (`fp32_precision = "bf16"`); whether it did is for the caller to
    check (`onednn_fp32_error`; on the AVX-512 CPU of bench/RESULTS.md, without AMX, it
    computes in fp32)."""
    backend = torch.backends.mkldnn.matmul
    before = backend.fp32_precision
    backend.fp32_precision = "bf16"
    try:
        yield
    finally:
        backend.fp32_precision = before


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


def onednn_fp32_error(n: int) -> float:
    """Largest difference, relative to the largest entry, between an `(n, n) @ (n, n)` fp32
    product under `onednn_fp32_matmul` and torch's own (bf16 arithmetic: ~1e-3)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    reference = a @ b
    with onednn_fp32_matmul():
        routed = a @ b
    return float((routed - reference).abs().max() / reference.abs().max())


def run(settings: Settings) -> dict[str, Any]:
    """Rates per dtype (and, on CPU, fp32 through oneDNN) and size, and the peak per dtype."""
    sizes = settings.pick([256, 512, 1024], [256, 512, 1024, 2048, 4096])
    if settings.on_gpu and not settings.quick:
        sizes.append(8192)  # a GPU's matrix units fill only at the largest sizes
    min_seconds = settings.pick(0.3, 2.0)
    rates: dict[str, dict[int, float]] = {}
    for name, dtype in DTYPES.items():
        rates[name] = {n: matmul_gflops(n, dtype, settings.device, min_seconds) for n in sizes}
    error = None  # of fp32 through oneDNN, timed on CPU only
    if settings.device.type == "cpu":
        error = max(onednn_fp32_error(n) for n in sizes)
        with onednn_fp32_matmul():
            rates[ONEDNN_FP32] = {
                n: matmul_gflops(n, torch.float32, settings.device, min_seconds) for n in sizes
            }
    peaks = {name: max(rates[name].values()) for name in DTYPES}
    if error is not None and error <= EXACT:
        peaks["fp32"] = max(peaks["fp32"], *rates[ONEDNN_FP32].values())
    return {
        "sizes": sizes,
        "gflops": rates,
        "peak_gflops": peaks,
        "onednn_fp32_error": error,
        "threads": settings.threads,
    }
