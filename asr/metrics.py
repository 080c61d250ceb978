"""Word and character error rates (jiwer underneath), as counts that add up across batches."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import jiwer


@dataclass(frozen=True)
class ErrorCounts:
    """Edit counts of hypotheses against references; `+` adds them up.

    >>> c = word_errors(["a b c"], ["a x c d"])
    >>> (c.substitutions, c.deletions, c.insertions, c.reference_length, c.rate)
    (1, 0, 1, 3, 0.6666666666666666)
    """

    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    reference_length: int = 0  # words (or characters) in the references

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """Errors per reference unit (WER or CER as a fraction); without references, 0 or,
        where something was inserted, inf (no score looks perfect then)."""
        if not self.reference_length:
            return math.inf if self.errors else 0.0
        return self.errors / self.reference_length

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_length + other.reference_length,
        )


def _spaced(text: str) -> str:
    """`text`'s words between single spaces: jiwer splits words at spaces alone, and a tab or
    a no-break space would join two of them."""
    return " ".join(text.split())


def _counts(refs: Sequence[str], hyps: Sequence[str], chars: bool) -> ErrorCounts:
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    refs, hyps = [_spaced(r) for r in refs], [_spaced(h) for h in hyps]
    # jiwer refuses empty references: every unit of such a hypothesis is an insertion.
    pairs = [(r, h) for r, h in zip(refs, hyps) if r.strip()]
    empty = [h for r, h in zip(refs, hyps) if not r.strip()]
    extra = sum(len(" ".join(h.split())) if chars else len(h.split()) for h in empty)
    if not pairs:
        return ErrorCounts(insertions=extra)
    r, h = zip(*pairs)
    # jiwer refuses an empty hypothesis in a list of one; a space behaves as empty.
    h = [x if x.strip() else " " for x in h]
    out = (jiwer.process_characters if chars else jiwer.process_words)(list(r), list(h))
    ref_len = out.hits + out.substitutions + out.deletions
    return ErrorCounts(out.substitutions, out.deletions, out.insertions + extra, ref_len)


def word_errors(refs: Sequence[str], hyps: Sequence[str]) -> ErrorCounts:
    """Word-level edit counts (WER = `.rate`)."""
    return _counts(refs, hyps, chars=False)


def char_errors(refs: Sequence[str], hyps: Sequence[str]) -> ErrorCounts:
    """Character-level edit counts, spaces included as jiwer does (CER = `.rate`)."""
    return _counts(refs, hyps, chars=True)


@dataclass(frozen=True)
class ConfidenceBin:
    """Words whose confidence lies in `[lower, upper)` (the last bin includes 1)."""

    lower: float
    upper: float
    words: int
    mean_confidence: float | None
    accuracy: float | None  # the share of them that are right


@dataclass(frozen=True)
class Calibration:
    """How well word confidences predict which words are right (`word_calibration`)."""

    words: int
    accuracy: float  # the share of all words that are right
    ece: float  # expected calibration error: |accuracy - confidence| per bin, word-weighted
    auc: float | None  # ROC area telling right words from wrong; None without both kinds
    bins: list[ConfidenceBin]


def word_alignment(ref: str, hyp: str) -> list[jiwer.AlignmentChunk]:
    """jiwer's word alignment of one utterance; with an empty reference, all insertions."""
    ref, hyp = _spaced(ref), _spaced(hyp)
    if ref.split():
        return jiwer.process_words(ref, hyp if hyp.split() else " ").alignments[0]
    words = len(hyp.split())
    return [jiwer.AlignmentChunk("insert", 0, 0, 0, words)] if words else []


@dataclass(frozen=True)
class WordAlignment:
    """One utterance's word alignment: its edit counts, deleted and correct words.

    >>> a = WordAlignment.of("a b c d e f", "a x c e f g")
    >>> (a.errors.substitutions, a.errors.deletions, a.errors.insertions)
    (1, 1, 1)
    >>> a.reference_deleted
    [False, False, False, True, False, False]
    >>> a.hypothesis_correct
    [True, False, True, True, True, False]
    """

    ref: list[str]
    hyp: list[str]
    chunks: list[jiwer.AlignmentChunk]

    @classmethod
    def of(cls, ref: str, hyp: str) -> WordAlignment:
        return cls(ref.split(), hyp.split(), word_alignment(ref, hyp))

    @property
    def errors(self) -> ErrorCounts:
        edits = {"substitute": 0, "delete": 0, "insert": 0, "equal": 0}
        for chunk in self.chunks:
            if chunk.type == "insert":
                edits["insert"] += chunk.hyp_end_idx - chunk.hyp_start_idx
            else:
                edits[chunk.type] += chunk.ref_end_idx - chunk.ref_start_idx
        return ErrorCounts(edits["substitute"], edits["delete"], edits["insert"], len(self.ref))

    @property
    def reference_deleted(self) -> list[bool]:
        return self._marks("delete", on_reference=True)

    @property
    def hypothesis_correct(self) -> list[bool]:
        return self._marks("equal", on_reference=False)

    def _marks(self, kind: str, on_reference: bool) -> list[bool]:
        marks = [False] * len(self.ref if on_reference else self.hyp)
        for chunk in self.chunks:
            if chunk.type == kind:
                if on_reference:
                    start, end = chunk.ref_start_idx, chunk.ref_end_idx
                else:
                    start, end = chunk.hyp_start_idx, chunk.hyp_end_idx
                marks[start:end] = [True] * (end - start)
        return marks


LENGTH_EDGES = (8.0, 14.0)
TAIL_SHARE = 0.2  # "the end of an utterance": its last fifth of reference words


@dataclass(frozen=True)
class LengthBucket:
    """Errors of the utterances in one duration range, and where their deletions fall."""

    name: str
    utterances: int
    errors: ErrorCounts
    tail_words: int  # reference words in the last `TAIL_SHARE` of each utterance
    tail_deletions: int

    @property
    def tail_deletion_rate(self) -> float:
        """Share of the final words deleted; well above `deletion_rate`, decoding stops early."""
        return self.tail_deletions / self.tail_words if self.tail_words else 0.0

    @property
    def deletion_rate(self) -> float:
        return self.errors.deletions / max(self.errors.reference_length, 1)


def errors_by_length(
    durations: Sequence[float],
    alignments: Sequence[WordAlignment],
    edges: Sequence[float] = LENGTH_EDGES,
) -> list[LengthBucket]:
    """Word errors and tail deletions per utterance duration bucket (`edges` in seconds).

    >>> aligned = [WordAlignment.of("a", "a"), WordAlignment.of("b c", "b")]
    >>> [b.name for b in errors_by_length([3.0, 9.0], aligned)]
    ['< 8 s', '8-14 s', '>= 14 s']
    """
    if len(durations) != len(alignments):
        raise ValueError(f"{len(durations)} durations but {len(alignments)} alignments")
    names = [f"< {edges[0]:g} s"]
    names += [f"{lo:g}-{hi:g} s" for lo, hi in zip(edges, edges[1:])]
    names += [f">= {edges[-1]:g} s"]
    members: list[list[WordAlignment]] = [[] for _ in names]
    for duration, alignment in zip(durations, alignments):
        members[bisect.bisect_right(edges, duration)].append(alignment)
    buckets = []
    for name, chosen in zip(names, members):
        tail_words = tail_deletions = 0
        errors = ErrorCounts()
        for alignment in chosen:
            deleted = alignment.reference_deleted
            tail = deleted[len(deleted) - math.ceil(TAIL_SHARE * len(deleted)) :]
            tail_words, tail_deletions = tail_words + len(tail), tail_deletions + sum(tail)
            errors += alignment.errors
        buckets.append(LengthBucket(name, len(chosen), errors, tail_words, tail_deletions))
    return buckets


def roc_auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """Area under the ROC curve (ties count half); None without both classes.

    >>> roc_auc([0.9, 0.8, 0.3, 0.8], [True, True, False, False])
    0.875
    """
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return None
    ranked = sorted(neg)
    wins = 0.0
    for s in pos:
        below = bisect.bisect_left(ranked, s)
        ties = bisect.bisect_right(ranked, s) - below
        wins += below + 0.5 * ties
    return wins / (len(pos) * len(neg))


def word_calibration(
    confidences: Sequence[float], correct: Sequence[bool], num_bins: int = 10
) -> Calibration:
    """Reliability of word confidences in `num_bins` equal-width bins over [0, 1].

    >>> c = word_calibration([0.95, 0.9, 0.2, 0.1], [True, True, False, True], num_bins=2)
    >>> (c.accuracy, round(c.ece, 3), c.auc, [b.words for b in c.bins])
    (0.75, 0.212, 0.6666666666666666, [2, 2])
    """
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences but {len(correct)} labels")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    members: list[list[int]] = [[] for _ in range(num_bins)]
    for i, c in enumerate(confidences):
        members[min(int(c * num_bins), num_bins - 1)].append(i)
    bins, ece, total = [], 0.0, len(confidences)
    for k, idx in enumerate(members):
        conf = sum(confidences[i] for i in idx) / len(idx) if idx else None
        acc = sum(bool(correct[i]) for i in idx) / len(idx) if idx else None
        if idx:
            ece += len(idx) / total * abs(acc - conf)
        bins.append(ConfidenceBin(k / num_bins, (k + 1) / num_bins, len(idx), conf, acc))
    accuracy = sum(map(bool, correct)) / total if total else 0.0
    return Calibration(total, accuracy, ece, roc_auc(confidences, correct), bins)


def wer_difference_interval(
    words: Sequence[int],
    errors_a: Sequence[int],
    errors_b: Sequence[int],
    resamples: int = 2000,
    seed: int = 0,
    words_b: Sequence[int] | None = None,
) -> tuple[float, float]:
    """95 % interval of WER(B) - WER(A) in points, two decodes' word errors on the same
    utterances (with their reference word counts; `words_b`: B's, where its references are
    others), by a paired bootstrap: utterances drawn with replacement, both decodes' errors
    from each draw, so what is hard for both cancels."""
    import numpy as np

    words_, a, b = (np.asarray(x, dtype=np.float64) for x in (words, errors_a, errors_b))
    if not len(words_):
        return (math.nan, math.nan)
    draws = np.random.default_rng(seed).integers(0, len(words_), (resamples, len(words_)))
    ours = words_[draws].sum(1)
    theirs = ours if words_b is None else np.asarray(words_b, float)[draws].sum(1)
    scored = (ours > 0) & (theirs > 0)  # a draw of references without words has no rate
    if not scored.any():
        return (math.nan, math.nan)
    draws, ours, theirs = draws[scored], ours[scored], theirs[scored]
    difference = 100 * (b[draws].sum(1) / theirs - a[draws].sum(1) / ours)
    low, high = np.percentile(difference, [2.5, 97.5])
    return float(low), float(high)
