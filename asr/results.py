"""What a `Recognizer` returns: decoded hypotheses, transcripts with times, alignments."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from asr.audio import AudioError
from asr.search import Hypothesis
from asr.timing import Word


@dataclass
class Segment:
    """A stretch of audio decoded as one utterance, in seconds of the input's timeline."""

    start: float
    end: float
    text: str
    score: float  # the search score of its hypothesis


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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, times rounded to milliseconds."""
        spans = zip(self.tokens, self.pieces, self.token_starts, self.token_ends, strict=True)
        return {
            "text": self.text,
            "duration": _ms(self.duration),
            "score": _finite(self.score),
            "segments": [
                {
                    "start": _ms(s.start),
                    "end": _ms(s.end),
                    "text": s.text,
                    "score": _finite(s.score),
                }
                for s in self.segments
            ],
            "words": [
                {"word": w.text, "start": _ms(w.start), "end": _ms(w.end)} for w in self.words
            ],
            "tokens": [
                {"id": i, "piece": p, "start": _ms(start), "end": _ms(end)}
                for i, p, start, end in spans
            ],
        }


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


@dataclass
class Decoded:
    """One utterance out of `Recognizer.search`: the best hypothesis and what timing needs."""

    hypothesis: Hypothesis  # its attention is `(K, L+1, T_enc)`, cut to the valid frames
    ctc_log_probs: Tensor | None  # `(T_enc, V)` on the CPU, when the model has a CTC head
    num_samples: int  # samples of the decoded audio, at the recognizer's rate


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
