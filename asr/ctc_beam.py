"""Frame-synchronous CTC prefix beam search that advances chunk by chunk (the live pass of a
streaming recognizer), and endpoint detection from its blanks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asr.search import option_number

NEG_INF = float("-inf")


def _logaddexp(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    high, low = (a, b) if a > b else (b, a)
    return high + math.log1p(math.exp(low - high))


class CTCPrefixBeam:
    """Prefix beam search over CTC log-probabilities given a chunk of frames at a time.

    Each prefix keeps the log-probabilities of its paths ending in blank and in its last
    token (Graves 2012; the live pass of WeNet's U2). Feeding the frames in any split gives
    the same beam as feeding them at once.

    Args:
        beam: prefixes kept after every frame.
        token_beam: tokens tried per frame, the most probable (None: `beam`).
        blank: the blank id.
    """

    def __init__(self, beam: int = 10, token_beam: int | None = None, blank: int = 0) -> None:
        if beam < 1:
            raise ValueError(f"beam must be at least 1, got {beam}")
        self.beam, self.token_beam, self.blank = beam, token_beam or beam, blank
        # prefix -> [log P(paths ending in blank), log P(paths ending in its last token)]
        self.prefixes: dict[tuple[int, ...], list[float]] = {(): [0.0, NEG_INF]}
        self.frames = 0
        # frames since the last one whose best symbol was not blank, or that changed the best
        # prefix (a token the beam's summed paths found, though no frame's best: speech)
        self.trailing_blanks = 0
        self._best: tuple[int, ...] = ()

    def advance(self, log_probs: np.ndarray) -> None:
        """Extend the beam by frames `(T, V)` of CTC log-probabilities."""
        for frame in np.asarray(log_probs, dtype=np.float64):
            self._frame(frame)

    def _frame(self, frame: np.ndarray) -> None:
        k = min(self.token_beam, frame.size)
        tokens = np.argpartition(-frame, k - 1)[:k]
        blank_lp = float(frame[self.blank])
        self.frames += 1
        self.trailing_blanks = self.trailing_blanks + 1 if frame.argmax() == self.blank else 0
        nxt: dict[tuple[int, ...], list[float]] = {}

        def slot(prefix: tuple[int, ...]) -> list[float]:
            if prefix not in nxt:
                nxt[prefix] = [NEG_INF, NEG_INF]
            return nxt[prefix]

        for prefix, (pb, pnb) in self.prefixes.items():
            total = _logaddexp(pb, pnb)
            same = slot(prefix)
            same[0] = _logaddexp(same[0], total + blank_lp)
            for token in tokens.tolist():
                if token == self.blank:
                    continue
                lp = float(frame[token])
                longer = slot((*prefix, token))
                if prefix and token == prefix[-1]:
                    same[1] = _logaddexp(same[1], pnb + lp)  # the token repeated, not emitted
                    longer[1] = _logaddexp(longer[1], pb + lp)  # emitted again after a blank
                else:
                    longer[1] = _logaddexp(longer[1], total + lp)
        scored = [(-_logaddexp(*scores), prefix) for prefix, scores in nxt.items()]
        ranked = sorted((s, p) for s, p in scored if s != -NEG_INF)[: self.beam]
        self.prefixes = {p: nxt[p] for _, p in ranked}
        if ranked and ranked[0][1] != self._best:
            self._best, self.trailing_blanks = ranked[0][1], 0

    def nbest(self, n: int | None = None) -> list[tuple[list[int], float]]:
        """The best prefixes and their CTC log-probabilities, best first."""
        ranked = sorted(
            ((list(p), _logaddexp(*scores)) for p, scores in self.prefixes.items()),
            key=lambda item: -item[1],
        )
        return ranked[:n] if n else ranked

    @property
    def best(self) -> list[int]:
        return self.nbest(1)[0][0]


@dataclass(frozen=True)
class EndpointOptions:
    """When a live stream's utterance ends (WeNet's rules), silence heard as CTC blanks or by
    Silero VAD.

    An endpoint closes the utterance: its final is decoded and the next starts afresh.
    """

    trailing_silence: float = 0.8  # seconds of silence after some speech
    leading_silence: float = 5.0  # seconds of silence with no speech yet: dropped
    max_utterance: float = 20.0  # seconds of one utterance at most
    silence_from: str = "ctc"  # "ctc": the blank frames; "silero": Silero VAD's probabilities

    def __post_init__(self) -> None:
        for name in ("trailing_silence", "leading_silence", "max_utterance"):
            value = option_number(f"EndpointOptions.{name}", getattr(self, name))
            if not 0 < value < math.inf:  # nan turned the rule off
                raise ValueError(f"EndpointOptions.{name} must be positive and finite")
            object.__setattr__(self, name, value)
        if self.silence_from not in ("ctc", "silero"):
            raise ValueError(f"silence_from must be 'ctc' or 'silero', got {self.silence_from!r}")

    def reached(
        self, search: CTCPrefixBeam, frame_seconds: float, silence: float | None = None
    ) -> bool:
        """Whether the utterance `search` has read ends here; `silence` (seconds, the VAD's)
        replaces the trailing blanks where given."""
        if silence is None:
            silence = search.trailing_blanks * frame_seconds
        if search.frames * frame_seconds >= self.max_utterance:
            return True
        if search.best:
            return silence >= self.trailing_silence
        return silence >= self.leading_silence
