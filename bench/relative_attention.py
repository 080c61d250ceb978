"""Relative-position self-attention in CPU fp32 inference: the explicit path that `asr` runs
there (`asr.models.transformer._explicit_attention`: the content-score matmul adds itself to
the positional bias in place) against SDPA given the same bias as a float mask. Since session
29 the SDPA arm also scales the positional scores after their matmul (one more pass), as the
layer does off the explicit path; before, both arms pre-scaled the queries.

    .venv/bin/python -m bench.relative_attention [--passes 15] [--threads 2]

One `RelPositionMultiHeadAttention` of the AN4 config's size (d=144, 4 heads), random weights
and inputs, keys padded to random lengths, at decoding shapes (B utterances x T frames after
subsampling; 1425 frames is 57 s). Per shape: milliseconds per call, each the fastest of
`--passes` timings with the two paths alternating, their ratio and the largest difference
between their outputs. Not part of `bench all` (~5 s on the 2-core CPU).
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

import asr.models.transformer as transformer
from asr.malloc import retain_freed_memory
from bench.common import timed

SHAPES = ((1, 50), (32, 75), (32, 150), (1, 285), (1, 1425))  # (B, T)
D_MODEL, HEADS = 144, 4
CALL_FRAMES = 3000  # calls per timing: about this many B x T frames in all
CPU = torch.device("cpu")


def _inputs(batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features `(B, T, D)`, relative positions and a key mask with random lengths >= T / 2."""
    x = torch.randn(batch, frames, D_MODEL)
    lengths = torch.randint(frames // 2, frames + 1, (batch,))
    lengths[0] = frames
    mask = (torch.arange(frames)[None] < lengths[:, None])[:, None, None, :]
    return x, transformer.relative_positions(frames, D_MODEL, x.device), mask


@torch.inference_mode()
def compare(batch: int, frames: int, passes: int) -> dict[str, float]:
    """Milliseconds per call of both paths, and the largest difference of their outputs."""
    attention = transformer.RelPositionMultiHeadAttention(D_MODEL, HEADS).eval()
    x, pos, mask = _inputs(batch, frames)
    paths = {
        "explicit": mock.patch.object(transformer, "_explicit_attention", return_value=True),
        "sdpa": mock.patch.object(transformer, "_explicit_attention", return_value=False),
    }
    repeats = max(1, CALL_FRAMES // (batch * frames))

    def calls() -> None:  # each output dropped before the next call, as in a decode
        for _ in range(repeats):
            attention(x, pos, mask)

    times: dict[str, list[float]] = {name: [] for name in paths}
    outputs = {}
    for index in range(passes):
        for name in paths if index % 2 == 0 else reversed(paths):
            with paths[name]:
                outputs[name] = attention(x, pos, mask)[0]  # also the warm-up
                times[name].append(timed(calls, CPU) / repeats)
    explicit, sdpa = min(times["explicit"]), min(times["sdpa"])
    return {
        "explicit_ms": 1e3 * explicit,
        "sdpa_ms": 1e3 * sdpa,
        "speedup": sdpa / explicit,
        "max_difference": float((outputs["explicit"] - outputs["sdpa"]).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=15, help="timings per path and shape")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    retain_freed_memory()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| B x T | explicit ms | SDPA ms | speed-up | max difference |")
    print("|---|---|---|---|---|")
    for batch, frames in SHAPES:
        row = compare(batch, frames, args.passes)
        print(
            f"| {batch} x {frames} | {row['explicit_ms']:.3f} | {row['sdpa_ms']:.3f} | "
            f"{row['speedup']:.2f}x | {row['max_difference']:.1e} |"
        )


if __name__ == "__main__":
    main()
