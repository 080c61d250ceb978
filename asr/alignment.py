"""Times and words of decoded hypotheses (DTW over cross-attention or CTC forced alignment),
and alignment of known transcripts; `Recognizer` binds these functions as methods."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from asr.decoding import teacher_forced
from asr.precision import autocast
from asr.results import Alignment, Alternative, Decoded, Segment, Transcript
from asr.timing import (
    TokenTimes,
    Word,
    attention_timestamps,
    ctc_forced_alignment,
    ctc_frames_needed,
    word_timestamps,
)

if TYPE_CHECKING:
    from asr.recognizer import Recognizer

log = logging.getLogger(__name__)

TIMESTAMP_METHODS = ("attention", "ctc")


def check_timestamps(method: str, name: str = "timestamps") -> None:
    if method not in TIMESTAMP_METHODS:
        raise ValueError(f"{name} must be one of {TIMESTAMP_METHODS}, got {method!r}")


def transcript(
    recognizer: Recognizer, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
) -> Transcript:
    """The `Transcript` of one decoded utterance, times from its start (arguments as
    `token_times`)."""
    hyp = decoded.hypothesis
    duration = decoded.num_samples / recognizer.sample_rate
    times = token_times(recognizer, decoded, timestamps, fallback)
    pieces = recognizer.tokenizer.pieces(hyp.tokens)
    text = recognizer.tokenizer.decode(hyp.tokens)
    probs = decoded.token_probs
    alternatives, said = [], {text}
    for h in decoded.alternatives:  # token sequences spelling one text (a leading space): once
        other = recognizer.tokenizer.decode(h.tokens)
        if other not in said:
            said.add(other)
            alternatives.append(Alternative(other, list(h.tokens), h.score))
    segment = Segment(
        0.0,
        duration,
        text,
        hyp.score,
        decoded.avg_logprob,
        decoded.no_speech_prob,
        alternatives,
        decoded.repaired,
    )
    words = timed_words(recognizer, pieces, times, duration, probs or None, decoded.token_ctc_probs)
    return Transcript(
        text=text,
        tokens=list(hyp.tokens),
        pieces=pieces,
        token_starts=np.minimum(times.start, duration).tolist(),
        token_ends=np.minimum(times.end, duration).tolist(),
        words=words,
        score=hyp.score,
        duration=duration,
        segments=[segment],
        token_probs=probs,
        avg_logprob=decoded.avg_logprob,
    )


def words(
    recognizer: Recognizer, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
) -> list[Word]:
    """Word times of a decoded hypothesis (arguments as `token_times`)."""
    pieces = recognizer.tokenizer.pieces(decoded.hypothesis.tokens)
    times = token_times(recognizer, decoded, timestamps, fallback)
    duration = decoded.num_samples / recognizer.sample_rate
    probs = decoded.token_probs or None
    return timed_words(recognizer, pieces, times, duration, probs, decoded.token_ctc_probs)


def token_times(
    recognizer: Recognizer, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
) -> TokenTimes:
    """Frame spans of a decoded hypothesis's tokens (eos excluded), by attention or CTC."""
    check_timestamps(timestamps)
    hyp = decoded.hypothesis
    if timestamps == "ctc":
        if decoded.ctc_log_probs is None:
            raise ValueError(f"{recognizer.checkpoint}: timestamps='ctc' needs a CTC head")
        try:
            return decoded.ctc_path().times(recognizer.frame_seconds)
        except ValueError as err:
            if not fallback:
                raise
            log.warning("CTC timestamps failed, using attention instead: %s", err)
    heads = recognizer.alignment_heads
    times = attention_timestamps(hyp.attention, recognizer.frame_seconds, heads)
    return times[: len(hyp.tokens)]


@torch.inference_mode()
def align_tokens(
    recognizer: Recognizer, wave: Tensor, tokens: Sequence[int], strict: bool = False
) -> Alignment:
    """Teacher-forced alignment of token ids to a waveform `(S,)` at `sample_rate`; `strict`
    raises ValueError where the tokens need more encoder frames than the audio gives."""
    model = recognizer.model
    waves, lens = recognizer.pad([wave])
    with autocast(recognizer.device, recognizer.precision):
        feats, feat_lens = model.frontend(waves, lens)
        enc, enc_lens = model.encoder(feats, feat_lens)
        frames, needed = int(enc_lens[0]), ctc_frames_needed(tokens)
        if strict and needed > frames:
            raise ValueError(
                f"text too long for the audio: its {len(tokens)} tokens need at least {needed} "
                f"encoder frames, {len(wave) / recognizer.sample_rate:.2f} s give {frames}"
            )
        token_logp, _, attention = teacher_forced(model.decoder, enc, enc_lens, [tokens])
        ctc = model.ctc(enc)[0].float().cpu() if model.ctc is not None else None
    attention = attention[0].float().cpu()  # (K, L + 1, T)
    pieces = recognizer.tokenizer.pieces(tokens)
    duration = len(wave) / recognizer.sample_rate
    frame_seconds = recognizer.frame_seconds
    times = attention_timestamps(attention, frame_seconds, recognizer.alignment_heads)
    times = times[: len(tokens)]
    ctc_words = None
    if ctc is not None:  # (T, V)
        try:
            ctc_times = ctc_forced_alignment(ctc, tokens, frame_seconds)
            ctc_words = timed_words(recognizer, pieces, ctc_times, duration)
        except ValueError as err:  # more tokens than the frames can hold
            log.warning("no CTC alignment: %s", err)
    return Alignment(
        tokens=list(tokens),
        pieces=pieces,
        attention=attention,
        features=feats[0, : int(feat_lens[0])].float().cpu(),
        words=timed_words(recognizer, pieces, times, duration),
        ctc_words=ctc_words,
        score=float(token_logp[0].sum()),
        duration=duration,
        frame_seconds=frame_seconds,
        feature_seconds=recognizer.feature_seconds,
    )


def timed_words(
    recognizer: Recognizer,
    pieces: list[str],
    times: TokenTimes,
    duration: float,
    probs: Sequence[float] | None = None,
    ctc_probs: Sequence[float] | None = None,
) -> list[Word]:
    """Words of token `pieces` timed by `times`, with probabilities and calibrated confidence."""
    scaling = recognizer.confidence_scaling
    out = []
    for word in word_timestamps(pieces, times, probs, ctc_probs):
        word = replace(word, start=min(word.start, duration), end=min(word.end, duration))
        if scaling is not None and word.probability is not None:
            word = replace(word, confidence=scaling(word.probability, word.ctc_probability))
        out.append(word)
    return out
