"""Keep freed memory in the process instead of handing it back to the OS (glibc only).

glibc's malloc serves blocks above its mmap threshold with fresh `mmap`s and unmaps them on
`free`, and trims the top of its heap when more than its trim threshold is free. A training
step frees most of its activations and the next one allocates them again, so on CPU every
step touches hundreds of MB of new pages: 80-110k minor page faults per 8 bf16 steps of the
25 M-parameter peer-size Transformer (`bench/peer.py`), ~6-10k with this setting, and 8-12 %
more audio per second over whole passes, for SpeechBrain's model too (`python -m
bench.allocator`, bench/RESULTS.md).

`retain_freed_memory` raises the mmap threshold to its maximum (32 MiB on 64-bit) and stops
trimming, so freed blocks are reused as tcmalloc or jemalloc would reuse them. The process
keeps its high-water mark of memory, which training reaches every epoch anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt parameters from glibc's <malloc.h>
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
NO_TRIM = (1 << 31) - 1  # an int for mallopt: trim only past 2 GiB free at the heap top
OPT_OUT = "ASR_KEEP_MALLOC_DEFAULTS"


def retain_freed_memory() -> bool:
    """Tune glibc's malloc as above; True when it was tuned.

    A no-op off Linux, under another C library, when `ASR_KEEP_MALLOC_DEFAULTS` is set, or
    when the user has chosen glibc's thresholds through its `MALLOC_*_` variables already.
    """
    if sys.platform != "linux" or os.environ.get(OPT_OUT):
        return False
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: not glibc's thresholds
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM)
    )
