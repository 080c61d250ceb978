"""Token and word timestamps: DTW over cross-attention (as Whisper) and CTC forced alignment."""

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


def encoder_frame_seconds(frame_shift: float, subsampling: int | Sequence[int] = 1) -> float:
    """Seconds per encoder frame: the feature frame shift times the total subsampling.

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
    """Monotone per-token frame spans `[start_frames[i], end_frames[i])` of one utterance."""

    start_frames: tuple[int, ...]
    end_frames: tuple[int, ...]
    num_frames: int
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
        return np.asarray(self.start_frames, dtype=np.float64) * self.seconds_per_frame

    @property
    def end(self) -> np.ndarray:
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
    probability: float | None = None  # product of its tokens' decoder probabilities
    confidence: float | None = None  # `probability` calibrated (`asr.confidence`)
    ctc_probability: float | None = None  # product of its tokens' CTC posteriors


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheapest monotone path `(token_index, frame_index)` through a `(L, T)` cost matrix.

    >>> dtw(np.array([[0.0, 0.0, 9.0], [9.0, 9.0, 0.0]]))
    (array([0, 0, 1]), array([0, 1, 2]))
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or cost.size == 0 or not np.all(np.isfinite(cost)):
        raise ValueError(f"dtw: need a non-empty finite (L, T) matrix, got shape {cost.shape}")
    acc = _accumulated_cost(cost)
    return _backtrack(acc)


def _accumulated_cost(cost: np.ndarray) -> np.ndarray:
    num_tokens, num_frames = cost.shape
    acc = np.empty_like(cost)
    entry = np.full(num_frames, np.inf)  # best cost of entering row i at frame j from above
    entry[0] = 0.0
    for i in range(num_tokens):
        prefix = np.cumsum(cost[i])
        before = np.concatenate(([0.0], prefix[:-1]))
        # The in-row minimum is a running minimum over prefix sums: one numpy pass per row.
        acc[i] = prefix + np.minimum.accumulate(entry - before)
        entry = np.concatenate(([acc[i, 0]], np.minimum(acc[i, :-1], acc[i, 1:])))
    return acc


def _backtrack(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    """`(L, T)` mean of the selected `(K, L, T)` attention maps, optionally median-filtered."""
    # No z-scoring per frame (as Whisper does): it blows noise at pauses up to peak size.
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
    """Median over `width` frames along the last dimension, edges padded by repetition.

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
    """Token times from `(K, L, T)` cross-attention, eos row included: DTW runs cut at half peak."""
    check_seconds_per_frame(seconds_per_frame)
    scores = attention_matrix(attention, heads, median_filter_width)
    tokens, frames = dtw(-scores.double().numpy())
    num_tokens, num_frames = scores.shape
    first = np.full(num_tokens, num_frames, dtype=np.int64)
    last = np.zeros(num_tokens, dtype=np.int64)
    np.minimum.at(first, tokens, frames)
    np.maximum.at(last, tokens, frames)
    starts, ends = _half_peak_spans(scores.numpy(), first, last + 1)
    return TokenTimes(tuple(starts), tuple(ends), num_frames, seconds_per_frame)


def _half_peak_spans(
    scores: np.ndarray, run_starts: np.ndarray, run_ends: np.ndarray
) -> tuple[list[int], list[int]]:
    """Each run cut to the frames scoring at least half its peak, so pauses go to no word (a
    first token given frame 0 alone, not heard there, goes right before the next); a token
    whose frames all went to the one before takes the next frame while one is free,
    else the last of the one before; tokens still without one (several on one frame) push
    those after them on, into the first with frames to spare."""
    starts, ends = run_starts.tolist(), run_ends.tolist()
    for i, (start, end) in enumerate(zip(starts, ends)):
        if end - start > 1:
            run = scores[i, start:end]
            strong = np.flatnonzero(run >= 0.5 * run.max())
            starts[i], ends[i] = start + int(strong[0]), start + int(strong[-1]) + 1
    first_heard = scores[0, 0] >= 0.5 * scores[0].max()
    if run_ends[0] == 1 and len(starts) > 1 and not first_heard:
        # The path starts at frame 0 whatever is heard there: a first token not heard there is
        # put right before the next, not at the start of a pause before it.
        starts[0] = ends[0] = max(min(starts[1], ends[1] - 1), 0)
    for i in range(1, len(starts)):  # runs share a frame where the path steps down
        starts[i] = max(starts[i], ends[i - 1])
        ends[i] = max(ends[i], starts[i])
    for i, (start, end) in enumerate(zip(starts, ends)):  # a frame for those left none
        following = starts[i + 1] if i + 1 < len(starts) else scores.shape[1]
        if start == end and start < following:  # a free frame: taking it moves no other
            ends[i] = start + 1
        elif start == end and i and ends[i - 1] == start and ends[i - 1] - starts[i - 1] > 1:
            ends[i - 1] = starts[i] = start - 1  # the last of the one before, which has more
    if all(start < end for start, end in zip(starts, ends)):
        return starts, ends
    # the way that moves the tokens with frames least: on into the frames after, or back (the
    # same on the mirrored spans) into those before
    frames = scores.shape[1]
    on = _pushed_on(starts, ends, frames)
    back_ends, back_starts = _pushed_on([frames - e for e in ends[::-1]],
                                        [frames - s for s in starts[::-1]], frames)  # fmt: skip
    back = [frames - e for e in back_starts[::-1]], [frames - s for s in back_ends[::-1]]
    return min(on, back, key=lambda spans: _moved(spans, (starts, ends)))


def _pushed_on(starts: list[int], ends: list[int], num_frames: int) -> tuple[list[int], list[int]]:
    """A frame for each token, as far as there are frames: each pushes the next on, and where
    that runs past the last frame, the tokens are pulled back from the end."""
    starts, ends = list(starts), list(ends)
    for i in range(len(starts)):
        starts[i] = max(starts[i], ends[i - 1]) if i else starts[i]
        ends[i] = max(ends[i], starts[i] + 1)
    limit = num_frames
    for i in reversed(range(len(starts))):
        ends[i] = min(ends[i], limit)
        starts[i] = max(min(starts[i], ends[i] - 1), 0)
        limit = starts[i]
    return starts, ends


def _moved(spans: tuple[list[int], list[int]], was: tuple[list[int], list[int]]) -> int:
    """How far the bounds of the tokens that had frames moved, in frames."""
    moves = zip(*spans, *was)
    return sum(abs(s - s0) + abs(e - e0) for s, e, s0, e0 in moves if s0 < e0)


def check_seconds_per_frame(seconds_per_frame: float) -> None:
    if not seconds_per_frame > 0:
        raise ValueError(f"seconds_per_frame must be > 0, got {seconds_per_frame}")


@dataclass(frozen=True)
class CtcPath:
    """The Viterbi CTC path of a transcript: each token's emitting frames and mean posterior."""

    start_frames: tuple[int, ...]
    end_frames: tuple[int, ...]
    probs: tuple[float, ...]
    num_frames: int

    def times(self, seconds_per_frame: float) -> TokenTimes:
        check_seconds_per_frame(seconds_per_frame)
        return TokenTimes(self.start_frames, self.end_frames, self.num_frames, seconds_per_frame)


def ctc_path(ctc_log_probs: Tensor, token_ids: Sequence[int], blank: int = 0) -> CtcPath:
    """The Viterbi CTC path of `token_ids` through `(T, V)` log-probabilities (torchaudio)."""
    if ctc_log_probs.dim() != 2 or ctc_log_probs.size(0) == 0:
        raise ValueError(f"ctc_log_probs: expected (T, V), got {tuple(ctc_log_probs.shape)}")
    num_frames, vocab = ctc_log_probs.shape
    ids = [int(i) for i in token_ids]
    _check_ctc_targets(ids, num_frames, vocab, blank)
    if not ids:
        return CtcPath((), (), (), num_frames)
    log_probs = ctc_log_probs.detach().float().cpu()[None]  # (1, T, V)
    path, scores = AF.forced_align(log_probs, torch.tensor([ids]), blank=blank)
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
    """Token times from the Viterbi CTC path of a known transcript (blank frames excluded)."""
    return ctc_path(ctc_log_probs, token_ids, blank).times(seconds_per_frame)


def ctc_token_probabilities(
    ctc_log_probs: Tensor, token_ids: Sequence[int], blank: int = 0
) -> list[float]:
    """Each token's mean posterior over its emitting frames on the Viterbi CTC path.

    >>> logp = torch.tensor([[0.1, 0.9], [0.6, 0.4], [0.2, 0.8]]).log()  # blank 0, token 1
    >>> [round(p, 2) for p in ctc_token_probabilities(logp, [1, 1])]
    [0.9, 0.8]
    """
    return list(ctc_path(ctc_log_probs, token_ids, blank).probs)


def _check_ctc_targets(ids: list[int], num_frames: int, vocab: int, blank: int) -> None:
    bad = [i for i in ids if i == blank or not 0 <= i < vocab]
    if bad:
        raise ValueError(f"token_ids: {bad[:5]} are blank ({blank}) or outside 0..{vocab - 1}")
    needed = ctc_frames_needed(ids)
    if needed > num_frames:
        raise ValueError(
            f"CTC alignment impossible: {len(ids)} tokens with {needed - len(ids)} repeats need "
            f"at least {needed} frames, got {num_frames}"
        )


def ctc_frames_needed(ids: Sequence[int]) -> int:
    """The fewest frames a CTC path of `ids` takes: one per token, a blank between repeats.

    >>> ctc_frames_needed([5, 5, 6])
    4
    """
    return len(ids) + sum(a == b for a, b in pairwise(ids))


def word_index(pieces: Sequence[str]) -> list[int | None]:
    """The word of each piece (`▁` starts one); None for bare spaces and special pieces.

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
    """Words of `pieces` (no eos), timed from their first token's start to last token's end.

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
    """The token indices of each word, in order.

    >>> word_tokens(["A", "B", "\u2581", "C", "<unk>", "\u2581D"])
    [[0, 1], [3], [5]]
    """
    groups: dict[int, list[int]] = {}
    for token, word in enumerate(word_index(pieces)):
        if word is not None:
            groups.setdefault(word, []).append(token)
    return list(groups.values())


def word_products(words: Sequence[Sequence[int]], token_values: Sequence[float]) -> list[float]:
    """Per word (its token indices), the product of its tokens' values.

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
    text = "".join(pieces[t].lstrip(SPACE_PIECE) for t in tokens)
    start, end = float(times.start[tokens[0]]), float(times.end[tokens[-1]])
    return Word(text, start, end, probability, probability, ctc_probability)


def boundary_error_ms(words_a: Sequence[Word], words_b: Sequence[Word]) -> float:
    """Mean absolute difference in ms of the starts and ends of two alignments of the same words.

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
