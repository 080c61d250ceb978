"""Attention failures a recognizer sees in its own output (loops, runaways, outrunning CTC;
Chiu et al. 2019), which it decodes again with CTC weight or cuts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from asr.text import BLANK_ID

MIN_REPEATS = 4  # an n-gram this many times in a row is a loop ("Q Q" in AN4 is 2)
REPAIR_CTC_WEIGHT = 0.9  # CTC prefix scores let no hypothesis loop or outrun the audio
# Outrunning CTC: attention - ctc > CTC_LENGTH_SLACK + CTC_LENGTH_RATIO * ctc tokens.
CTC_LENGTH_RATIO = 0.5
CTC_LENGTH_SLACK = 3

REPETITION, RUNAWAY, CTC_MISMATCH = "repetition", "runaway", "ctc_length_mismatch"


def repeated_ngram(tokens: Sequence[int], min_repeats: int = MIN_REPEATS) -> tuple[int, int] | None:
    """`(start, n)` of the earliest-ending n-gram repeated `min_repeats` times in a row, or None.

    >>> repeated_ngram([5, 1, 2, 1, 2, 1, 2, 1, 2, 9])
    (1, 2)
    >>> repeated_ngram([1, 2, 1, 2, 1, 2]) is None
    True
    """
    size, found = len(tokens), None  # found: (end, n)
    for n in range(1, size // min_repeats + 1):
        run = 0
        for i in range(n, size):
            run = run + 1 if tokens[i] == tokens[i - n] else 0
            if run == n * (min_repeats - 1):
                if found is None or i < found[0]:
                    found = (i, n)
                break
    if found is None:
        return None
    end, n = found
    return end - n * min_repeats + 1, n


def ctc_greedy_length(log_probs: Tensor) -> int:
    """Tokens in the CTC head's best path `(T, V)`: repeats merged, blanks dropped.

    >>> lp = torch.tensor([[0.0, -9, -9], [-9, 0.0, -9], [-9, 0.0, -9], [0.0, -9, -9],
    ...                    [-9, 0.0, -9], [-9, -9, 0.0]])
    >>> ctc_greedy_length(lp)  # _ a a _ a b -> a a b
    3
    """
    best = log_probs.argmax(-1)
    if best.numel() == 0:
        return 0
    changed = torch.ones_like(best, dtype=torch.bool)
    changed[1:] = best[1:] != best[:-1]
    return int((changed & (best != BLANK_ID)).sum())


def failure(tokens: Sequence[int], limit: int, ctc_length: int | None = None) -> str | None:
    """Which failure `tokens` (no eos) shows, given the search's length `limit`, or None.

    >>> failure([7, 7, 7, 7, 7], limit=20), failure([1, 2, 3], limit=4)
    ('repetition', 'runaway')
    >>> failure(list(range(1, 13)), limit=20, ctc_length=1)
    'ctc_length_mismatch'
    >>> failure([1, 2, 3], limit=9, ctc_length=3) is None
    True
    """
    if repeated_ngram(tokens) is not None:
        return REPETITION
    if len(tokens) + 1 >= limit:
        return RUNAWAY
    if ctc_length is not None:  # longer only: in noise, the CTC path is the one that runs on
        if len(tokens) - ctc_length > CTC_LENGTH_SLACK + CTC_LENGTH_RATIO * ctc_length:
            return CTC_MISMATCH
    return None


def cut_loop(tokens: Sequence[int]) -> list[int]:
    """`tokens` up to the end of the first copy of its first loop.

    >>> cut_loop([5, 1, 2, 1, 2, 1, 2, 1, 2, 9])
    [5, 1, 2]
    """
    found = repeated_ngram(tokens)
    if found is None:
        return list(tokens)
    start, n = found
    return list(tokens[: start + n])
