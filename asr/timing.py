"""Token and word timestamps: DTW over cross-attention, CTC forced alignment.

Times come from encoder frames: frame `j` covers `[j, j + 1) * seconds_per_frame`, where
`seconds_per_frame = encoder_frame_seconds(frame_shift, subsampling)`. Two aligners give
`TokenTimes` (integer frame spans per token), which `word_timestamps` groups into words:

- `attention_timestamps`: cross-attention maps -> monotonic DTW path (as Whisper's timing)
  that gives each token a run of frames, the runs covering the utterance; a token's span is
  the part of its run where its attention is at least half its peak there, so the pause
  before a word, which the tiling hands to it, is not counted as the word.
- `ctc_forced_alignment`: CTC posteriors -> Viterbi path (`ctc_path`, torchaudio). Its spans
  hold only the frames that emit the token; blank frames between tokens belong to none. The
  same path gives each token's mean posterior, a confidence (`ctc_token_probabilities`).

A decoded `Hypothesis` has one
attention row per token plus the eos step; keep the eos row in the DTW (it bounds the last
token) and drop it before grouping words:

    times = attention_timestamps(hyp.attention, encoder_frame_seconds(0.01, 4))
    pieces = tokenizer.pieces(hyp.tokens)
    words = word_timestamps(pieces, times[: len(pieces)])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F
import torchaudio.functional as AF
from torch import Tensor

from asr.text import SPACE_PIECE, SPECIAL_PIECES

# --------------------------------------------------------------------------- frame times


def encoder_frame_seconds(frame_shift: float, subsampling: int | Sequence[int] = 1) -> float:
    """Seconds per encoder frame: the feature frame shift times the encoder's subsampling.

    Args:
        frame_shift: seconds between feature frames, e.g. 0.01.
        subsampling: the encoder's total factor (4 for the Transformer's conv x4) or its
            per-stage factors (e.g. an RNN encoder's `subsampling_factors`), multiplied.

    >>> round(encoder_frame_seconds(0.01, 4), 6)
    0.04
    >>> round(encoder_frame_seconds(0.01, [2, 1, 2, 2]), 6)
    0.08
    """
    factors = [subsampling] if isinstance(subsampling, int) else list(subsampling)
    if frame_shift <= 0 or not factors or min(factors) < 1:
        raise ValueError(
            f"encoder_frame_seconds: need frame_shift > 0 and factors >= 1, "
            f"got frame_shift={frame_shift}, subsampling={subsampling!r}"
        )
    return frame_shift * math.prod(factors)


@dataclass(frozen=True)
class TokenTimes:
    """Per-token frame spans `[start_frames[i], end_frames[i])` of one utterance.

    Starts and ends are each non-decreasing and lie in `[0, num_frames]`; `start`/`end`
    give seconds. Slicing (`times[:n]`) keeps the frame grid.
    """

    start_frames: tuple[int, ...]
    end_frames: tuple[int, ...]
    num_frames: int  # encoder frames of the utterance; the duration is num_frames * spf
    seconds_per_frame: float

    def __post_init__(self) -> None:
        starts, ends = np.asarray(self.start_frames), np.asarray(self.end_frames)
        if len(starts) != len(ends):
            raise ValueError(f"TokenTimes: {len(starts)} starts but {len(ends)} ends")
        inside = np.all((starts >= 0) & (starts <= ends) & (ends <= self.num_frames))
        if not inside or np.any(np.diff(starts) < 0) or np.any(np.diff(ends) < 0):
            spans = list(zip(self.start_frames, self.end_frames, strict=True))[:8]
            raise ValueError(
                "TokenTimes: spans must be monotone with 0 <= start <= end <= "
                f"num_frames={self.num_frames}, got {spans}"
            )

    def __len__(self) -> int:
        return len(self.start_frames)

    def __getitem__(self, index: slice) -> TokenTimes:
        if not isinstance(index, slice):
            raise TypeError("TokenTimes supports slices only; use .start[i] and .end[i]")
        starts, ends = self.start_frames[index], self.end_frames[index]
        return TokenTimes(starts, ends, self.num_frames, self.seconds_per_frame)

    @property
    def start(self) -> np.ndarray:
        """`(L,)` start times in seconds."""
        return np.asarray(self.start_frames, dtype=np.float64) * self.seconds_per_frame

    @property
    def end(self) -> np.ndarray:
        """`(L,)` end times in seconds."""
        return np.asarray(self.end_frames, dtype=np.float64) * self.seconds_per_frame

    @property
    def duration(self) -> float:
        return self.num_frames * self.seconds_per_frame


@dataclass(frozen=True)
class Word:
    """One word, its time span in seconds, and how sure the recognizer is of it."""

    text: str
    start: float
    end: float
    # The product of its tokens' probabilities (the decoder's, given the tokens before them):
    # the probability that the whole word is right. None where not computed (alignments).
    probability: float | None = None
    # `probability` read as the chance the word is right: mapped by the recognizer's
    # `asr.confidence.PlattScaling` where it has one (`asr calibrate`), else the same.
    confidence: float | None = None
    # The product of its tokens' CTC posteriors on the CTC path of the hypothesis
    # (`ctc_token_probabilities`); None without a CTC head or where CTC cannot align it.
    ctc_probability: float | None = None


# --------------------------------------------------------------------------- attention + DTW


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotone path through a `(L, T)` cost matrix, from `(0, 0)` to `(L-1, T-1)`.

    Steps are diagonal `(+1, +1)`, down `(+1, 0)` (next token, same frame) or right `(0, +1)`
    (same token, next frame); a path's cost is the sum of the cells it visits. Row `i` of the
    accumulated cost is `D[i, j] = C[i, j] + min(D[i-1, j-1], D[i-1, j], D[i, j-1])`; the
    in-row term is a running minimum over prefix sums, so each row is one numpy pass.

    Args:
        cost: `(L, T)` finite costs.

    Returns:
        `(token_index, frame_index)`, each `(N,)` int64 with `max(L, T) <= N <= L + T - 1`.

    >>> dtw(np.array([[0.0, 0.0, 9.0], [9.0, 9.0, 0.0]]))
    (array([0, 0, 1]), array([0, 1, 2]))
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or cost.size == 0 or not np.all(np.isfinite(cost)):
        raise ValueError(f"dtw: need a non-empty finite (L, T) matrix, got shape {cost.shape}")
    acc = _accumulated_cost(cost)
    return _backtrack(acc)


def _accumulated_cost(cost: np.ndarray) -> np.ndarray:
    """`(L, T)` accumulated costs `D` of `dtw`."""
    num_tokens, num_frames = cost.shape
    acc = np.empty_like(cost)
    entry = np.full(num_frames, np.inf)  # best cost of entering row i at frame j from above
    entry[0] = 0.0
    for i in range(num_tokens):
        prefix = np.cumsum(cost[i])  # prefix[j] = C[i, 0] + ... + C[i, j]
        before = np.concatenate(([0.0], prefix[:-1]))  # prefix[j - 1]
        # D[i, j] = min over entry frames k <= j of entry[k] + C[i, k] + ... + C[i, j]
        acc[i] = prefix + np.minimum.accumulate(entry - before)
        entry = np.concatenate(([acc[i, 0]], np.minimum(acc[i, :-1], acc[i, 1:])))
    return acc


def _backtrack(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walk back from the last cell to `(0, 0)`, taking the cheapest predecessor."""
    i, j = acc.shape[0] - 1, acc.shape[1] - 1
    tokens, frames = [i], [j]
    while i > 0 or j > 0:
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:  # ties prefer the diagonal, then staying on the token
            step = int(np.argmin([acc[i - 1, j - 1], acc[i, j - 1], acc[i - 1, j]]))
            i, j = (i - 1, j - 1) if step == 0 else (i, j - 1) if step == 1 else (i - 1, j)
        tokens.append(i)
        frames.append(j)
    return np.array(tokens[::-1], dtype=np.int64), np.array(frames[::-1], dtype=np.int64)


def attention_matrix(
    attention: Tensor, heads: Sequence[int] | None = None, median_filter_width: int = 1
) -> Tensor:
    """The `(L, T)` alignment score that `attention_timestamps` runs DTW on (higher = aligned):
    the selected maps' attention weights averaged, optionally median-filtered along time.

    The weights are used as they are. Whisper z-scores each frame over the tokens, which
    here made word boundaries worse on every model measured (recipes/an4/RESULTS.md, "Word
    times"): at frames no token attends to (pauses, silence), the z-score blows noise up to
    the size of real peaks, and a token whose attention is spread thin drags the path.
    For the same reason there is no median filter by default: with 40 ms encoder frames, one
    of 7 frames blurs word edges by more than it removes.

    Args:
        attention: `(K, L, T)` cross-attention maps (or one `(L, T)` map).
        heads: indices into K of the maps to use (e.g. `layer * num_heads + head`);
            None uses all.
        median_filter_width: odd filter width in frames; 1 disables filtering.

    Returns:
        `(L, T)` float32 scores.
    """
    return median_filter(_selected_maps(attention, heads).mean(0), median_filter_width)


def _selected_maps(attention: Tensor, heads: Sequence[int] | None) -> Tensor:
    maps = attention[None] if attention.dim() == 2 else attention
    if maps.dim() != 3 or 0 in maps.shape:
        raise ValueError(
            f"attention: expected a non-empty (K, L, T) tensor, got {tuple(attention.shape)}"
        )
    if heads is not None:
        if not heads or not all(0 <= h < maps.size(0) for h in heads):
            raise ValueError(f"heads={list(heads)} must be non-empty indices into K={maps.size(0)}")
        maps = maps[list(heads)]
    maps = maps.detach().float().cpu()
    if not torch.isfinite(maps).all():
        raise ValueError("attention: weights must be finite")
    return maps


def median_filter(x: Tensor, width: int) -> Tensor:
    """Median over a sliding window of `width` frames along the last dimension, the edges
    padded by repeating the end frames.

    >>> median_filter(torch.tensor([[0.0, 9.0, 0.0, 1.0, 1.0]]), 3).tolist()
    [[0.0, 0.0, 1.0, 1.0, 1.0]]
    """
    if width < 1 or width % 2 == 0:
        raise ValueError(f"median_filter_width must be odd and >= 1, got {width}")
    if width == 1:
        return x
    rows = x.reshape(-1, 1, x.size(-1))  # (N, 1, T)
    padded = F.pad(rows, (width // 2, width // 2), mode="replicate")  # (N, 1, T + w - 1)
    return padded.unfold(-1, width, 1).median(-1).values.reshape(x.shape)  # (..., T)


def attention_timestamps(
    attention: Tensor,
    seconds_per_frame: float,
    heads: Sequence[int] | None = None,
    median_filter_width: int = 1,
) -> TokenTimes:
    """Token times from cross-attention: DTW on the negated `attention_matrix` gives each
    token the run of frames the path spends on it (the runs cover `[0, T)`; neighbours share
    a frame where the path steps to the next token without moving on); the token's span is
    then the part of its run from the first to the last frame where its score is at least
    half the run's peak.

    The runs alone hand each word the pause before it (and the first word the leading
    silence); the half-peak span keeps the frames the token is attended on.

    Args:
        attention: `(K, L, T)` maps of one utterance (or `(L, T)`), cut to its valid frames.
        seconds_per_frame: seconds per encoder frame (`encoder_frame_seconds`).
        heads: maps to use, as in `attention_matrix`; None uses all.
        median_filter_width: odd width in frames, as in `attention_matrix`.

    Returns:
        `TokenTimes` with L spans over `T` frames.
    """
    check_seconds_per_frame(seconds_per_frame)
    scores = attention_matrix(attention, heads, median_filter_width)  # (L, T)
    tokens, frames = dtw(-scores.double().numpy())
    num_tokens, num_frames = scores.shape
    first = np.full(num_tokens, num_frames, dtype=np.int64)
    last = np.zeros(num_tokens, dtype=np.int64)
    np.minimum.at(first, tokens, frames)  # each token's frames on the path
    np.maximum.at(last, tokens, frames)
    starts, ends = _half_peak_spans(scores.numpy(), first, last + 1)
    return TokenTimes(tuple(starts), tuple(ends), num_frames, seconds_per_frame)


def _half_peak_spans(
    scores: np.ndarray, run_starts: np.ndarray, run_ends: np.ndarray
) -> tuple[list[int], list[int]]:
    """Within each token's run `[run_starts[i], run_ends[i])`, the frames from the first to
    the last where its score is at least half the run's maximum. Neighbouring runs share a
    frame where the path steps down; a span that still starts inside the one before it
    starts where that one ends, so one-frame tokens keep their frame."""
    starts, ends = run_starts.tolist(), run_ends.tolist()
    for i, (start, end) in enumerate(zip(starts, ends)):
        if end - start > 1:
            run = scores[i, start:end]
            strong = np.flatnonzero(run >= 0.5 * run.max())
            starts[i], ends[i] = start + int(strong[0]), start + int(strong[-1]) + 1
    for i in range(1, len(starts)):
        starts[i] = max(starts[i], ends[i - 1])
        ends[i] = max(ends[i], starts[i])
    return starts, ends


def check_seconds_per_frame(seconds_per_frame: float) -> None:
    """ValueError unless `seconds_per_frame` is positive."""
    if not seconds_per_frame > 0:
        raise ValueError(f"seconds_per_frame must be > 0, got {seconds_per_frame}")


# --------------------------------------------------------------------------- CTC


@dataclass(frozen=True)
class CtcPath:
    """The Viterbi CTC path of a known transcript: the frames that emit each token (blanks
    excluded) and their mean posterior. One forced alignment serves both times and
    confidences."""

    start_frames: tuple[int, ...]
    end_frames: tuple[int, ...]
    probs: tuple[float, ...]  # each token's mean posterior over its emitting frames
    num_frames: int

    def times(self, seconds_per_frame: float) -> TokenTimes:
        """The tokens' `TokenTimes` on a grid of `seconds_per_frame`."""
        check_seconds_per_frame(seconds_per_frame)
        return TokenTimes(self.start_frames, self.end_frames, self.num_frames, seconds_per_frame)


def ctc_path(ctc_log_probs: Tensor, token_ids: Sequence[int], blank: int = 0) -> CtcPath:
    """The Viterbi CTC path of `token_ids` (`torchaudio.functional.forced_align`, then
    `merge_tokens`).

    Args:
        ctc_log_probs: `(T, V)` log-probabilities of one utterance, cut to its valid frames.
        token_ids: the transcript's ids (no blank, sos or eos).
        blank: the blank id.

    Raises:
        ValueError: a shape or id the alignment cannot take, or more tokens (and repeats)
            than frames.
    """
    if ctc_log_probs.dim() != 2 or ctc_log_probs.size(0) == 0:
        raise ValueError(f"ctc_log_probs: expected (T, V), got {tuple(ctc_log_probs.shape)}")
    num_frames, vocab = ctc_log_probs.shape
    ids = [int(i) for i in token_ids]
    _check_ctc_targets(ids, num_frames, vocab, blank)
    if not ids:
        return CtcPath((), (), (), num_frames)
    log_probs = ctc_log_probs.detach().float().cpu()[None]  # (1, T, V)
    path, scores = AF.forced_align(log_probs, torch.tensor([ids]), blank=blank)  # (1, T) each
    spans = AF.merge_tokens(path[0], scores[0].exp(), blank=blank)
    return CtcPath(
        tuple(s.start for s in spans),
        tuple(s.end for s in spans),
        tuple(float(s.score) for s in spans),
        num_frames,
    )


def ctc_forced_alignment(
    ctc_log_probs: Tensor, token_ids: Sequence[int], seconds_per_frame: float, blank: int = 0
) -> TokenTimes:
    """Token times from the Viterbi CTC path of a known transcript (`ctc_path`): each
    token's span of emitting frames (blanks excluded), on a grid of `seconds_per_frame`."""
    return ctc_path(ctc_log_probs, token_ids, blank).times(seconds_per_frame)


def ctc_token_probabilities(
    ctc_log_probs: Tensor, token_ids: Sequence[int], blank: int = 0
) -> list[float]:
    """Each token's CTC posterior: the mean probability of the frames that emit it on the
    Viterbi CTC path of `token_ids` (`ctc_path`). A word's product of these tells right
    words from wrong ones about as well as the decoder's probability, and partly
    independently of it (`asr.confidence`).

    >>> logp = torch.tensor([[0.1, 0.9], [0.6, 0.4], [0.2, 0.8]]).log()  # blank 0, token 1
    >>> [round(p, 2) for p in ctc_token_probabilities(logp, [1, 1])]
    [0.9, 0.8]
    """
    return list(ctc_path(ctc_log_probs, token_ids, blank).probs)


def _check_ctc_targets(ids: list[int], num_frames: int, vocab: int, blank: int) -> None:
    bad = [i for i in ids if i == blank or not 0 <= i < vocab]
    if bad:
        raise ValueError(f"token_ids: {bad[:5]} are blank ({blank}) or outside 0..{vocab - 1}")
    repeats = sum(a == b for a, b in pairwise(ids))  # each needs a blank between
    if len(ids) + repeats > num_frames:
        raise ValueError(
            f"CTC alignment impossible: {len(ids)} tokens with {repeats} repeats need at least "
            f"{len(ids) + repeats} frames, got {num_frames}"
        )


# --------------------------------------------------------------------------- words


def word_index(pieces: Sequence[str]) -> list[int | None]:
    """The word each token piece belongs to; None for bare spaces and special tokens.

    A piece starting with `▁` starts a new word (SentencePiece); a bare `▁` piece (the char
    tokenizer's space) only separates words; special pieces (`<unk>`) belong to no word.

    >>> word_index(["A", "B", "\u2581", "C", "<unk>", "\u2581D"])
    [0, 0, None, 1, None, 2]
    """
    index: list[int | None] = []
    current, in_word = -1, False
    for piece in pieces:
        if piece.startswith(SPACE_PIECE):
            in_word, piece = False, piece.lstrip(SPACE_PIECE)
        if not piece or piece in SPECIAL_PIECES:
            index.append(None)
            continue
        if not in_word:
            current, in_word = current + 1, True
        index.append(current)
    return index


def word_timestamps(
    pieces: Sequence[str],
    token_times: TokenTimes,
    token_probs: Sequence[float] | None = None,
    token_ctc_probs: Sequence[float] | None = None,
) -> list[Word]:
    """Group token pieces into words (`word_index`) and time each word by its tokens: from
    its first token's start to its last token's end.

    Args:
        pieces: one piece per token, e.g. `tokenizer.pieces(ids)` (no eos).
        token_times: times of the same tokens.
        token_probs: probabilities of the same tokens; a word's is the product of its
            tokens'. None: words without probability.
        token_ctc_probs: the same tokens' CTC posteriors (`ctc_token_probabilities`),
            multiplied likewise into `Word.ctc_probability`; None: without.

    Returns:
        The words in order.

    >>> times = TokenTimes((0, 1, 2, 3), (1, 2, 3, 4), 4, 0.5)
    >>> [(w.text, w.start, w.end) for w in word_timestamps(["A", "B", "\u2581", "C"], times)]
    [('AB', 0.0, 1.0), ('C', 1.5, 2.0)]
    >>> words = word_timestamps(["A", "B", "\u2581", "C"], times, [0.5, 0.5, 1.0, 0.9])
    >>> [w.probability for w in words]
    [0.25, 0.9]
    """
    if len(pieces) != len(token_times):
        raise ValueError(f"{len(pieces)} pieces but {len(token_times)} token times")
    for probs in (token_probs, token_ctc_probs):
        if probs is not None and len(probs) != len(pieces):
            raise ValueError(f"{len(pieces)} pieces but {len(probs)} token probabilities")
    words = word_tokens(pieces)
    probs, ctc_probs = (
        [None] * len(words) if p is None else word_products(words, p)
        for p in (token_probs, token_ctc_probs)
    )
    return [
        _word(pieces, token_times, tokens, prob, ctc_prob)
        for tokens, prob, ctc_prob in zip(words, probs, ctc_probs, strict=True)
    ]


def word_tokens(pieces: Sequence[str]) -> list[list[int]]:
    """The token indices of each word, in order (`word_index`'s grouping).

    >>> word_tokens(["A", "B", "\u2581", "C", "<unk>", "\u2581D"])
    [[0, 1], [3], [5]]
    """
    groups: dict[int, list[int]] = {}
    for token, word in enumerate(word_index(pieces)):
        if word is not None:
            groups.setdefault(word, []).append(token)
    return list(groups.values())


def word_products(words: Sequence[Sequence[int]], token_values: Sequence[float]) -> list[float]:
    """Per word (its token indices, as `word_tokens` gives them), the product of its tokens'
    values: how a word's probability follows from its tokens'.

    >>> word_products([[0, 1], [3]], [0.5, 0.5, 1.0, 0.9])
    [0.25, 0.9]
    """
    return [math.prod(float(token_values[t]) for t in tokens) for tokens in words]


def _word(
    pieces: Sequence[str],
    times: TokenTimes,
    tokens: Sequence[int],
    probability: float | None,
    ctc_probability: float | None,
) -> Word:
    """The word of `tokens` (indices of consecutive pieces of one word)."""
    text = "".join(pieces[t].lstrip(SPACE_PIECE) for t in tokens)
    start, end = float(times.start[tokens[0]]), float(times.end[tokens[-1]])
    return Word(text, start, end, probability, probability, ctc_probability)


def boundary_error_ms(words_a: Sequence[Word], words_b: Sequence[Word]) -> float:
    """Mean absolute difference of word starts and ends, in milliseconds, between two
    alignments of the same words (the mean over all 2N boundaries).

    >>> boundary_error_ms([Word("A", 0.0, 0.5)], [Word("A", 0.25, 0.5)])
    125.0
    """
    if len(words_a) != len(words_b) or not words_a:
        raise ValueError(
            f"boundary_error_ms: need the same non-empty word list, got {len(words_a)} "
            f"and {len(words_b)} words"
        )
    for index, (a, b) in enumerate(zip(words_a, words_b, strict=True)):
        if a.text != b.text:
            raise ValueError(f"boundary_error_ms: word {index} differs: {a.text!r} vs {b.text!r}")
    pairs = zip(words_a, words_b, strict=True)
    total = sum(abs(a.start - b.start) + abs(a.end - b.end) for a, b in pairs)
    return 1000.0 * total / (2 * len(words_a))
