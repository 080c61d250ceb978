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
    score: float


@dataclass
class Segment:
    """A stretch of audio decoded as one utterance, in seconds of the input's timeline."""

    start: float
    end: float
    text: str
    score: float
    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    repaired: str | None = None


@dataclass
class Transcript:
    """What `Recognizer.transcribe` returns for one input, times in seconds from its start."""

    text: str  # the segment texts joined by spaces
    tokens: list[int]  # output ids of all segments, without sos/eos (a space token between)
    pieces: list[str]  # the tokens' pieces, `▁` marking a space
    token_starts: list[float]  # one per token, non-decreasing
    token_ends: list[float]  # one per token
    words: list[Word]  # word spans, from `token_starts`/`token_ends`
    score: float  # the search score, summed over segments
    duration: float  # seconds of audio in the input
    segments: list[Segment]  # the decoded stretches, in order
    token_probs: list[float] = field(default_factory=list)  # decoder's; may be empty, NaN: none
    avg_logprob: float | None = None  # over all segments' tokens and eos

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, times rounded to milliseconds, probabilities to 4 decimals."""
        probs = self.token_probs or [None] * len(self.tokens)
        spans = zip(
            self.tokens, self.pieces, self.token_starts, self.token_ends, probs, strict=True
        )
        return {
            "text": self.text,
            "duration": round_ms(self.duration),
            "score": _finite(self.score),
            "avg_logprob": _rounded(self.avg_logprob),
            "segments": [_segment_dict(s) for s in self.segments],
            "words": [
                {"word": w.text, "start": round_ms(w.start), "end": round_ms(w.end)}
                | {"probability": _rounded(w.probability), "confidence": _rounded(w.confidence)}
                | {"ctc_probability": _rounded(w.ctc_probability)}
                for w in self.words
            ],
            "tokens": [
                {"id": i, "piece": p, "start": round_ms(start), "end": round_ms(end)}
                | {"probability": _rounded(prob)}
                for i, p, start, end, prob in spans
            ],
        }


def _segment_dict(segment: Segment) -> dict[str, Any]:
    out = {
        "start": round_ms(segment.start),
        "end": round_ms(segment.end),
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
    """One input's outcome in `Recognizer.transcribe_batch`: its transcript, or its error."""

    name: str  # the input's path, or `<waveform i>` for the i-th array input
    transcript: Transcript | None  # None where the input failed
    error: AudioError | None = None  # why it failed (see `reason`); None on success

    def transcript_or_raise(self) -> Transcript:
        """The transcript; raises `error` where the input failed."""
        if self.error is not None:
            raise self.error
        assert self.transcript is not None
        return self.transcript


def round_ms(seconds: float) -> float:
    """Seconds to the millisecond, as transcripts give times."""
    return round(float(seconds), 3)


def _finite(value: float) -> float | None:
    """JSON has no infinities (an unfinished hypothesis scores -inf)."""
    return value if math.isfinite(value) else None


def _rounded(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 4)


@dataclass
class Decoded:
    """One utterance out of `Recognizer.search`: the best hypothesis and what timing needs."""

    hypothesis: Hypothesis  # attention `(K, L+1, T_enc)`, cut to the valid frames
    ctc_log_probs: Tensor | None  # `(T_enc, V)`
    num_samples: int
    token_log_probs: Tensor | None = None  # `(L+1,)` teacher-forced, eos last
    no_speech_prob: float | None = None
    alternatives: list[Hypothesis] = field(default_factory=list)
    repaired: str | None = None  # the attention failure (`asr.guard`) decoding again fixed

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
        """The hypothesis' Viterbi CTC path; ValueError where there is none."""
        path, reason = self._ctc_path_or_reason
        if path is None:
            raise ValueError(reason)
        return path

    @property
    def token_ctc_probs(self) -> list[float] | None:
        """The tokens' CTC posteriors on `ctc_path`; None where there is no path."""
        path, _ = self._ctc_path_or_reason
        return None if path is None else list(path.probs)


@dataclass
class Alignment:
    """A transcript aligned to audio by teacher forcing (`Recognizer.align`)."""

    tokens: list[int]
    pieces: list[str]
    attention: Tensor  # (K, L+1, T_enc) cross-attention, the eos step last
    features: Tensor  # (T_feat, D)
    words: list[Word]  # from the attention (DTW)
    ctc_words: list[Word] | None
    score: float  # teacher-forced log-probability of `tokens + [eos]`
    duration: float
    frame_seconds: float
    feature_seconds: float

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)
