"""The frame-synchronous CTC prefix beam search and its endpoint rules."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from asr.ctc_beam import CTCPrefixBeam, EndpointOptions


def log_probs(frames: int, vocab: int, seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(size=(frames, vocab)) * 2
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def collapse(path: tuple[int, ...]) -> tuple[int, ...]:
    out = [t for k, t in enumerate(path) if t != 0 and (k == 0 or path[k - 1] != t)]
    return tuple(out)


def exact_prefix_probabilities(lp: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every labelling's probability, summed over all paths (feasible for tiny T and V)."""
    totals: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(lp.shape[1]), repeat=lp.shape[0]):
        p = math.exp(sum(lp[t, s] for t, s in enumerate(path)))
        totals[collapse(path)] = totals.get(collapse(path), 0.0) + p
    return totals


def test_a_wide_beam_gives_the_exact_labelling_probabilities() -> None:
    lp = log_probs(5, 3)
    search = CTCPrefixBeam(beam=100)
    search.advance(lp)
    exact = exact_prefix_probabilities(lp)
    for tokens, score in search.nbest():
        assert math.exp(score) == pytest.approx(exact[tuple(tokens)], rel=1e-9)
    best = max(exact, key=exact.get)
    assert tuple(search.best) == best


@pytest.mark.parametrize("splits", [[1], [3, 7], [5, 5, 5, 5, 2]])
def test_the_beam_does_not_depend_on_how_frames_are_split(splits: list[int]) -> None:
    lp = log_probs(22, 6, seed=1)
    whole = CTCPrefixBeam(beam=4)
    whole.advance(lp)
    parts, start = CTCPrefixBeam(beam=4), 0
    for size in itertools.cycle(splits):
        if start >= len(lp):
            break
        parts.advance(lp[start : start + size])
        start += size
    assert parts.nbest() == whole.nbest()


def test_repeats_need_a_blank_between_them() -> None:
    lp = np.log(np.array([[0.01, 0.98, 0.01], [0.01, 0.98, 0.01], [0.98, 0.01, 0.01],
                          [0.01, 0.98, 0.01]]))  # fmt: skip
    search = CTCPrefixBeam(beam=5)
    search.advance(lp)
    assert search.best == [1, 1]


def blanks(frames: int, token_at: list[int] = ()) -> CTCPrefixBeam:
    lp = np.full((frames, 3), math.log(0.01))
    lp[:, 0] = math.log(0.98)
    for t in token_at:
        lp[t] = [math.log(0.01), math.log(0.98), math.log(0.01)]
    search = CTCPrefixBeam(beam=3)
    search.advance(lp)
    return search


def test_endpoints_after_trailing_silence_following_speech() -> None:
    rule = EndpointOptions(trailing_silence=0.4, leading_silence=2.0, max_utterance=10.0)
    assert rule.reached(blanks(20, [5]), 0.04)  # 14 blank frames (0.56 s) after a token
    assert not rule.reached(blanks(12, [5]), 0.04)  # 6 (0.24 s)
    assert not rule.reached(blanks(40), 0.04)  # 1.6 s of nothing said yet
    assert rule.reached(blanks(60), 0.04)  # 2.4 s of nothing: the leading silence rule
    assert EndpointOptions(max_utterance=0.5).reached(blanks(20, [18]), 0.04)  # 0.8 s long


def test_a_token_no_frame_calls_best_is_speech_not_silence() -> None:
    """Blank is every frame's best symbol, yet the paths of one token sum to more than the
    empty prefix's: the beam's best gains that token, and the silence starts after it (an
    endpoint counted from the utterance's start closed it at once, in the middle of a word)."""
    search = CTCPrefixBeam(beam=4)
    search.advance(np.tile(np.log([0.45, 0.4, 0.15]), (5, 1)))
    assert search.best == [1]  # from the second frame on
    assert search.trailing_blanks == 3
    assert not EndpointOptions(trailing_silence=0.8).reached(search, 0.2)  # 0.6 s, not 1.0


def test_a_vads_silence_decides_where_given() -> None:
    rule = EndpointOptions(trailing_silence=0.4, leading_silence=2.0, silence_from="silero")
    assert not rule.reached(blanks(20, [5]), 0.04, silence=0.2)  # 0.56 s of blanks, in speech
    assert rule.reached(blanks(8, [7]), 0.04, silence=0.5)  # no blank yet, 0.5 s without speech
    assert not rule.reached(blanks(40), 0.04, silence=1.9)  # nothing said: the leading rule
    assert rule.reached(blanks(40), 0.04, silence=2.0)


def test_endpoint_options_are_checked() -> None:
    with pytest.raises(ValueError, match="trailing_silence"):
        EndpointOptions(trailing_silence=0)
    with pytest.raises(ValueError, match="silence_from must be 'ctc' or 'silero'"):
        EndpointOptions(silence_from="webrtc")
    with pytest.raises(ValueError, match="beam"):
        CTCPrefixBeam(beam=0)
