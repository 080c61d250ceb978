"""What a `Recognizer` returns: decoded hypotheses, transcripts with times, alignments."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torch import Tensor

from asr.audio import AudioError
from asr.search import Hypothesis
from asr.timing import CtcPath, Word, ctc_path


@dataclass(frozen=True)
class Alternative:
    """A hypothesis of the n-best list other than the best."""

    text: str
    tokens: list[int]
    score: float  # the search score, as the best hypothesis's


@dataclass
class Segment:
    """A stretch of audio decoded as one utterance, in seconds of the input's timeline."""

    start: float
    end: float
    text: str
    score: float  # the search score of its hypothesis
    # The mean log-probability the decoder gives its tokens and eos (Whisper's avg_logprob).
    avg_logprob: float | None = None
    no_speech_prob: float | None = None  # see `Decoded.no_speech_prob`
    alternatives: list[Alternative] = field(default_factory=list)  # n-best, after the best
    repaired: str | None = None  # see `Decoded.repaired`


@dataclass
class Transcript:
    """What `Recognizer.transcribe` returns for one input.

    Times are seconds from the start of the input. Long inputs are decoded in segments
    (`asr.segment`); `tokens` then lists every segment's tokens in order, with no
    separator between segments, while `text` joins the segment texts with a space.
    """

    text: str
    tokens: list[int]  # output ids, without sos/eos
    pieces: list[str]  # the tokens' pieces, `▁` marking a space
    token_starts: list[float]  # one per token, non-decreasing
    token_ends: list[float]
    words: list[Word]  # word spans, from `token_starts`/`token_ends`
    score: float  # the search score, summed over segments
    duration: float  # seconds of audio in the input
    segments: list[Segment]
    # The decoder's probability of each token given those before it; empty where not computed.
    token_probs: list[float] = field(default_factory=list)
    avg_logprob: float | None = None  # over all segments' tokens and eos

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, times rounded to milliseconds, probabilities to 4 decimals."""
        probs = self.token_probs or [None] * len(self.tokens)
        spans = zip(
            self.tokens, self.pieces, self.token_starts, self.token_ends, probs, strict=True
        )
        return {
            "text": self.text,
            "duration": _ms(self.duration),
            "score": _finite(self.score),
            "avg_logprob": _rounded(self.avg_logprob),
            "segments": [_segment_dict(s) for s in self.segments],
            "words": [
                {"word": w.text, "start": _ms(w.start), "end": _ms(w.end)}
                | {"probability": _rounded(w.probability), "confidence": _rounded(w.confidence)}
                | {"ctc_probability": _rounded(w.ctc_probability)}
                for w in self.words
            ],
            "tokens": [
                {"id": i, "piece": p, "start": _ms(start), "end": _ms(end)}
                | {"probability": _rounded(prob)}
                for i, p, start, end, prob in spans
            ],
        }


def _segment_dict(segment: Segment) -> dict[str, Any]:
    out = {
        "start": _ms(segment.start),
        "end": _ms(segment.end),
        "text": segment.text,
        "score": _finite(segment.score),
        "avg_logprob": _rounded(segment.avg_logprob),
        "no_speech_prob": _rounded(segment.no_speech_prob),
    }
    if segment.repaired is not None:
        out["repaired"] = segment.repaired
    if segment.alternatives:
        out["alternatives"] = [
            {"text": a.text, "score": _finite(a.score)} for a in segment.alternatives
        ]
    return out


@dataclass(frozen=True)
class BatchResult:
    """One input's outcome in `Recognizer.transcribe_batch`: its transcript, or the error that
    stopped it while the other inputs went on.

        for result in recognizer.transcribe_batch(["a.wav", "b.m4a"]):
            if result.error is None:
                print(result.name, result.transcript.text)
            else:
                print(result.name, "failed:", result.error.reason)
    """

    name: str  # the input: its path, or `<waveform i>` for the i-th input (from 0) as an array
    transcript: Transcript | None  # None where the input failed
    # Why it failed (unreadable, corrupt, not a mono waveform, too short to encode): `reason`
    # says why, and its message names the input. None where it was transcribed.
    error: AudioError | None = None

    def transcript_or_raise(self) -> Transcript:
        """The transcript; raises `error` where the input failed."""
        if self.error is not None:
            raise self.error
        assert self.transcript is not None
        return self.transcript


def _ms(seconds: float) -> float:
    return round(float(seconds), 3)


def _finite(value: float) -> float | None:
    """JSON has no infinities (a hypothesis that never ended scores -inf)."""
    return value if math.isfinite(value) else None


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 4)


@dataclass
class Decoded:
    """One utterance out of `Recognizer.search`: the best hypothesis and what timing needs."""

    hypothesis: Hypothesis  # its attention is `(K, L+1, T_enc)`, cut to the valid frames
    ctc_log_probs: Tensor | None  # `(T_enc, V)` on the CPU, when the model has a CTC head
    num_samples: int  # samples of the decoded audio, at the recognizer's rate
    # `(L+1,)` the decoder's log-probability of each token given those before it, then of eos
    # (teacher forced); None where not computed.
    token_log_probs: Tensor | None = None
    # The probability that the audio holds no speech: that of the empty transcript, by the
    # CTC head where the model has one (the product of its blank posteriors), else by the
    # decoder (eos first). Models learn it only from training data with silence.
    no_speech_prob: float | None = None
    alternatives: list[Hypothesis] = field(default_factory=list)  # the n-best after the best
    # The attention failure (`asr.guard`) found in the first hypothesis and repaired by
    # decoding again; None where there was none, or decoding again changed nothing.
    repaired: str | None = None

    @property
    def avg_logprob(self) -> float | None:
        """Mean of `token_log_probs` (eos included)."""
        lp = self.token_log_probs
        return None if lp is None else float(lp.mean())

    @property
    def token_probs(self) -> list[float]:
        """The tokens' probabilities (eos left out); empty without `token_log_probs`."""
        lp = self.token_log_probs
        return [] if lp is None else lp[:-1].exp().tolist()

    @cached_property
    def _ctc_path_or_reason(self) -> tuple[CtcPath | None, str]:
        if self.ctc_log_probs is None:
            return None, "the model has no CTC head"
        try:
            return ctc_path(self.ctc_log_probs, self.hypothesis.tokens), ""
        except ValueError as err:  # more tokens than the frames hold
            return None, str(err)

    def ctc_path(self) -> CtcPath:
        """The hypothesis' Viterbi CTC path (`asr.timing.ctc_path`), aligned once and kept
        for both CTC times and `token_ctc_probs`.

        Raises:
            ValueError: without a CTC head, or where CTC cannot align the hypothesis.
        """
        path, reason = self._ctc_path_or_reason
        if path is None:
            raise ValueError(reason)
        return path

    @property
    def token_ctc_probs(self) -> list[float] | None:
        """The tokens' CTC posteriors on the CTC path of the hypothesis (`ctc_path`); None
        without a CTC head or where CTC cannot align the hypothesis."""
        path, _ = self._ctc_path_or_reason
        return None if path is None else list(path.probs)


@dataclass
class Alignment:
    """A transcript aligned to audio by teacher forcing (`Recognizer.align`)."""

    tokens: list[int]
    pieces: list[str]
    attention: Tensor  # (K, L+1, T_enc) cross-attention, the eos step last
    features: Tensor  # (T_feat, D) the frontend's features, for plots
    words: list[Word]  # from the attention (DTW)
    ctc_words: list[Word] | None  # from CTC forced alignment, when the model has a CTC head
    score: float  # teacher-forced log-probability of `tokens + [eos]`
    duration: float  # seconds of audio
    frame_seconds: float  # seconds per encoder frame
    feature_seconds: float  # seconds per feature frame

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)
