"""Word and character error rates (jiwer underneath), as counts that add up across batches."""

from __future__ import annotations

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
        """Errors per reference unit (WER or CER as a fraction); 0 for an empty reference set."""
        return self.errors / self.reference_length if self.reference_length else 0.0

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_length + other.reference_length,
        )


def _counts(refs: Sequence[str], hyps: Sequence[str], chars: bool) -> ErrorCounts:
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    # jiwer refuses empty references: every unit of such a hypothesis is an insertion.
    pairs = [(r, h) for r, h in zip(refs, hyps) if r.strip()]
    empty = [h for r, h in zip(refs, hyps) if not r.strip()]
    extra = sum(len(h) if chars else len(h.split()) for h in empty)
    if not pairs:
        return ErrorCounts(insertions=extra)
    r, h = zip(*pairs)
    # jiwer also refuses empty hypotheses in a list of one; a single space behaves as empty.
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
