"""Choosing the cross-attention maps whose DTW word times agree best with CTC forced alignment
(`asr choose-heads`): averaging every map mixes in maps that do not follow the audio."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from asr.audio import load_audio
from asr.data.manifest import some_of, validate_manifest
from asr.recognizer import Recognizer
from asr.results import Alignment
from asr.timing import attention_timestamps, boundary_error_ms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadChoice:
    """Boundary differences (ms) against CTC forced alignment, per utterance."""

    per_head: np.ndarray  # (U, K): each map alone
    all_heads: np.ndarray  # (U,): all maps averaged
    chosen: list[int]
    chosen_errors: np.ndarray  # (U,): the chosen maps averaged
    how: str = "chosen"  # or "given": maps named by the user, scored

    def table(self) -> str:
        """Markdown: mean and 90th percentile for all maps, the chosen ones, and each map."""
        rows = [("all maps", self.all_heads), (f"{self.how} {self.chosen}", self.chosen_errors)]
        rows += [(f"map {k}", self.per_head[:, k]) for k in range(self.per_head.shape[1])]
        lines = ["| maps | mean ms | p90 ms |", "|---|---|---|"]
        lines += [f"| {name} | {e.mean():.1f} | {np.percentile(e, 90):.1f} |" for name, e in rows]
        return "\n".join(lines) + "\n"


def boundary_errors(
    recognizer: Recognizer, alignment: Alignment, head_sets: Sequence[Sequence[int] | None]
) -> list[float]:
    """DTW vs CTC word boundary difference (ms) for each set of maps (None: all)."""
    out = []
    for heads in head_sets:
        times = attention_timestamps(alignment.attention, alignment.frame_seconds, heads)
        words = recognizer.timed_words(alignment.pieces, times[: len(alignment.tokens)],
                                       alignment.duration)  # fmt: skip
        out.append(boundary_error_ms(words, alignment.ctc_words))
    return out


def reference_alignments(
    recognizer: Recognizer,
    manifest: str | os.PathLike,
    progress: bool = True,
    failures: list[str] | None = None,
) -> list[Alignment]:
    """Teacher-forced alignments of the manifest's references that CTC can align too; manifest
    lines and audio that cannot be used are left out, and added to `failures`."""
    if recognizer.model.ctc is None:
        raise ValueError(f"{recognizer.checkpoint}: choosing maps needs a CTC head to compare with")
    out, left_out = [], Counter()
    report = validate_manifest(manifest, check_audio=True)
    utterances, unusable = report.good, [str(entry) for entry in report.bad]
    unfit: dict[str, list[str]] = {}  # ids of references CTC cannot align, by reason
    for utterance in tqdm(utterances, desc="align", disable=not progress):
        tokens = recognizer.tokenizer.encode(utterance.text)
        if not tokens or recognizer.tokenizer.unk_id in tokens:
            reason = "outside the vocabulary" if tokens else "no words"
            unfit.setdefault(reason, []).append(utterance.utt_id)
            left_out[reason] += 1
            continue
        try:
            wave = load_audio(utterance.audio_filepath, recognizer.sample_rate,
                              utterance.offset, utterance.duration)  # fmt: skip
            alignment = recognizer.align_tokens(wave, tokens)
        except ValueError as error:  # unreadable, or too short for the encoder
            reason = getattr(error, "reason", error)  # an AudioError names the file itself
            unusable.append(f"{utterance.audio_filepath} ({utterance.utt_id}): {reason}")
            continue
        if alignment.ctc_words and len(alignment.ctc_words) == len(alignment.words):
            out.append(alignment)
        else:
            unfit.setdefault("CTC could not align", []).append(utterance.utt_id)
            left_out["CTC could not align"] += 1
    if failures is not None:
        failures += unusable
    if unusable:
        left_out["unusable"] = len(unusable)
    reasons = ", ".join(
        f"{count} {reason}" + (f" ({some_of(unfit[reason])})" if reason in unfit else "")
        for reason, count in left_out.items()
    )
    if not out:
        named = "".join(f"\n  {line}" for line in unusable)
        raise ValueError(f"{manifest}: no utterance could be aligned ({reasons or 'none'}){named}")
    if left_out:
        logger.warning("%s: %d of %d utterances left out: %s", manifest, sum(left_out.values()),
                       len(out) + sum(left_out.values()), reasons)  # fmt: skip
    return out


def check_choosable(recognizer: Recognizer) -> None:
    """Raise ValueError unless the recognizer has several attention maps to choose from."""
    if recognizer.model.decoder.num_attention_maps < 2:
        raise ValueError(f"{recognizer.checkpoint}: one attention map, nothing to choose")


def choose_heads(recognizer: Recognizer, alignments: Sequence[Alignment]) -> HeadChoice:
    """Rank the maps by mean boundary difference and choose the best prefix of the ranking."""
    check_choosable(recognizer)
    per_head = _per_map_errors(recognizer, alignments)
    maps = per_head.shape[1]
    ranking = [int(k) for k in np.argsort(per_head.mean(0), kind="stable")]
    prefixes = [ranking[:n] for n in range(1, maps + 1)]
    by_prefix = np.array([boundary_errors(recognizer, a, prefixes) for a in alignments])
    best = int(np.argmin(by_prefix.mean(0)))
    all_heads = np.array([boundary_errors(recognizer, a, [None])[0] for a in alignments])
    return HeadChoice(per_head, all_heads, sorted(prefixes[best]), by_prefix[:, best])


def score_heads(
    recognizer: Recognizer, alignments: Sequence[Alignment], heads: Sequence[int]
) -> HeadChoice:
    """The boundary differences of given maps (e.g. chosen on dev, measured on test)."""
    check_maps(recognizer, heads)
    per_head = _per_map_errors(recognizer, alignments)
    both = np.array([boundary_errors(recognizer, a, [None, list(heads)]) for a in alignments])
    return HeadChoice(per_head, both[:, 0], sorted(heads), both[:, 1], "given")


def check_maps(recognizer: Recognizer, heads: Sequence[int]) -> None:
    """ValueError unless `heads` are distinct maps of the recognizer's decoder."""
    maps = recognizer.model.decoder.num_attention_maps
    outside = [h for h in heads if not 0 <= h < maps]
    if outside:
        raise ValueError(f"maps {outside}: this model's are 0 to {maps - 1} (layer * heads + head)")
    if len(set(heads)) < len(heads):
        raise ValueError(f"maps {list(heads)}: each map once")


def _per_map_errors(recognizer: Recognizer, alignments: Sequence[Alignment]) -> np.ndarray:
    """`(U, K)` the boundary difference of each map alone, per utterance."""
    maps = alignments[0].attention.size(0)
    return np.array([boundary_errors(recognizer, a, [[k] for k in range(maps)])
                     for a in alignments])  # fmt: skip
