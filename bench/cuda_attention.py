"""SDPA kernels on a GPU: torch's own choice against ours (`asr.models.transformer._sdpa_backend`,
every kernel but cuDNN's), in bf16 training steps of the peer-size Transformer (12/6, d=256,
4 heads: head dim 64, which cuDNN attention takes on Hopper).

Every batch first gets an fp32 step (cuBLAS, cuDNN convolutions and the allocator warm).
Then, per variant, each of 5 batches: its first bf16 step (the kernels' first sight of that
shape), and the fastest of 5 more. Ours runs first, so neither variant finds the other's
shapes planned; a repeated shape in the list shows as a cheap first step. A second run on
the same machine paid less than a fresh machine (0.26-0.32 s against 0.25-3.5 s per new
shape), presumably from a kernel cache that outlives the process.

    python -m bench.cuda_attention --device cuda    # ~1 min on an H200
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import asr.models.transformer as transformer
from bench.common import ROOT, Settings, timed, train_batches
from bench.peer import build_systems, features, training_step

BATCHES, STEADY = 5, 5


def torch_choice(query: torch.Tensor, key: torch.Tensor) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def first_and_steady(step: Callable, batches: list, device: torch.device) -> tuple[list, float]:
    """Each batch's first step, and the sum over batches of each one's fastest next step."""
    firsts = [timed(lambda b=b: step(b), device) for b in batches]
    steady = [min(timed(lambda b=b: step(b), device) for _ in range(STEADY)) for b in batches]
    return firsts, sum(steady)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cuda_attention")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data", type=Path, default=ROOT / "data/an4")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("SB_DISABLE_QUIRKS", "allow_tf32,disable_jit_profiling")
    warnings.filterwarnings("ignore", "Support for mismatched key_padding_mask")
    device = torch.device(args.device)
    settings = Settings(ROOT / "bench/results", False, device, torch.get_num_threads(),
                        args.data, None, args.seed)  # fmt: skip
    ours, _, frontend = build_systems(settings)
    raw = train_batches("transformer", settings, BATCHES)
    batches = [features(frontend, b.waves, b.wave_lens, b.tokens, b.token_lens) for b in raw]
    fp32, bf16 = training_step(ours, "fp32", settings), training_step(ours, "bf16", settings)
    for batch in batches:
        fp32(batch)
    shipped = transformer._sdpa_backend
    print("| SDPA kernels | first bf16 step of each batch, s | steady, 5 batches, s |")
    print("|---|---|---|")
    for name, choice in (("ours (no cuDNN)", shipped), ("torch's choice", torch_choice)):
        transformer._sdpa_backend = choice
        try:
            firsts, steady = first_and_steady(bf16, batches, device)
        finally:
            transformer._sdpa_backend = shipped
        print(f"| {name} | {' '.join(f'{s:.3f}' for s in firsts)} | {steady:.4f} |")
    print(f"\nbatch shapes (B, T, features): {[tuple(b.feats.shape) for b in batches]}")


if __name__ == "__main__":
    main()
