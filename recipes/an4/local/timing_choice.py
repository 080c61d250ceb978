"""How attention-DTW should read the cross-attention maps, measured against CTC.

Aligns each reference of a manifest by teacher forcing (`asr.heads.reference_alignments`)
and prints, for four ways of scoring the DTW, the mean and 90th percentile of the word
boundary difference (ms) against CTC forced alignment of the same words:

    z-score, median 7    each frame z-scored over the tokens, a median filter of 7 frames,
                         runs tiling the utterance (Whisper's recipe; `asr.timing` before)
    z-score              the same without the median filter
    weights              the maps' attention weights as they are, runs tiling the utterance
    weights, half peak   the same, each token's run cut to where its attention is at least
                         half its peak (`asr.timing.attention_timestamps`)

    python recipes/an4/local/timing_choice.py --checkpoint exp/an4/transformer/avg.ckpt \
        --manifest data/an4/dev.jsonl
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import Tensor

from asr.heads import reference_alignments
from asr.recognizer import Recognizer, load_model
from asr.results import Alignment
from asr.timing import TokenTimes, attention_timestamps, boundary_error_ms, dtw, median_filter


def frame_z_score(maps: Tensor) -> Tensor:
    std, mean = torch.std_mean(maps, dim=1, correction=0, keepdim=True)
    return ((maps - mean) / std.clamp(min=1e-8)).mean(0)


def tiling_times(scores: Tensor, seconds_per_frame: float) -> TokenTimes:
    """Each token from the first frame the DTW path reaches it to where the next starts."""
    tokens, frames = dtw(-scores.double().numpy())
    num_tokens, num_frames = scores.shape
    first = np.full(num_tokens, num_frames, dtype=np.int64)
    np.minimum.at(first, tokens, frames)
    ends = np.append(first[1:], num_frames)
    return TokenTimes(tuple(first.tolist()), tuple(ends.tolist()), num_frames, seconds_per_frame)


WAYS = {
    "z-score, median 7": lambda a: tiling_times(
        median_filter(frame_z_score(a.attention), 7), a.frame_seconds
    ),
    "z-score": lambda a: tiling_times(frame_z_score(a.attention), a.frame_seconds),
    "weights": lambda a: tiling_times(a.attention.mean(0), a.frame_seconds),
    "weights, half peak": lambda a: attention_timestamps(a.attention, a.frame_seconds),
}


def boundary_errors(recognizer: Recognizer, alignment: Alignment, way) -> float:
    times = way(alignment)[: len(alignment.tokens)]
    words = recognizer.timed_words(alignment.pieces, times, alignment.duration)
    return boundary_error_ms(words, alignment.ctc_words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True, help="JSONL manifest with references")
    args = parser.parse_args()
    recognizer = load_model(args.checkpoint)
    alignments = reference_alignments(recognizer, args.manifest)
    print(f"{len(alignments)} utterances, all {alignments[0].attention.size(0)} maps averaged")
    print("| DTW score | mean ms | p90 ms |\n|---|---|---|")
    for name, way in WAYS.items():
        errors = np.array([boundary_errors(recognizer, a, way) for a in alignments])
        print(f"| {name} | {errors.mean():.1f} | {np.percentile(errors, 90):.1f} |")


if __name__ == "__main__":
    main()
