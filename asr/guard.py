"""Attention failures a recognizer can see in its own output, and what it does about them.

Attention decoders fail in three ways on long, noisy or silent input (Chiu et al. 2019;
Whisper's temperature fallback addresses the same): they loop (an n-gram repeated over and
over), run away (no eos before the length bound), or hallucinate words that the CTC
head, which is monotonic by construction, does not see. `failure` names which one a
hypothesis shows; `asr.decoding.decode_batch` then decodes that utterance again with
the CTC head weighted `REPAIR_CTC_WEIGHT` over every token (CTC prefix scores do not let a
hypothesis loop or outrun the audio; a pre-beam chosen by the failing attention would keep the
loop's tokens), or, without a CTC head, cuts a loop after its first copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from asr.text import BLANK_ID

MIN_REPEATS = 4  # an n-gram this many times in a row is a loop ("Q Q" in AN4 is 2)
REPAIR_CTC_WEIGHT = 0.9  # the CTC weight a failed hypothesis is decoded again with
# The attention hypothesis outruns the CTC head's greedy output where
# attention - ctc > CTC_LENGTH_SLACK + CTC_LENGTH_RATIO * ctc (in tokens).
CTC_LENGTH_RATIO = 0.5
CTC_LENGTH_SLACK = 3

REPETITION, RUNAWAY, CTC_MISMATCH = "repetition", "runaway", "ctc_length_mismatch"


def repeated_ngram(tokens: Sequence[int], min_repeats: int = MIN_REPEATS) -> tuple[int, int] | None:
    """`(start, n)` of the first n-gram that occurs `min_repeats` times in a row, the
    shortest such n at the earliest end; None where there is none.

    >>> repeated_ngram([5, 1, 2, 1, 2, 1, 2, 1, 2, 9])
    (1, 2)
    >>> repeated_ngram([1, 2, 1, 2, 1, 2]) is None
    True
    """
    size, found = len(tokens), None  # found: (end, n)
    for n in range(1, size // min_repeats + 1):
        run = 0  # positions in a row that repeat the token n before
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
    """Which attention failure the hypothesis `tokens` shows, None where it shows none.

    Args:
        tokens: the hypothesis, without eos.
        limit: the most tokens (eos included) its search allowed; reaching it is running away.
        ctc_length: `ctc_greedy_length` of the same audio, where the model has a CTC head.

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
    """`tokens` up to the end of the first copy of its first loop (`repeated_ngram`).

    >>> cut_loop([5, 1, 2, 1, 2, 1, 2, 1, 2, 9])
    [5, 1, 2]
    """
    found = repeated_ngram(tokens)
    if found is None:
        return list(tokens)
    start, n = found
    return list(tokens[: start + n])
