"""Transcribing recordings of any length with a `Recognizer`.

Each input is cut into segments (`asr.segment`); segments are read one at a time with
`load_audio(offset=, duration=)`, sorted by length and decoded `batch_size` at a time; each
segment's times are shifted by its start, and where two fixed windows overlap, each keeps the
words whose centre lies on its side of the overlap's midpoint. `Recognizer.transcribe` runs
this; `asr transcribe` runs it over files (`asr.cli.inputs`). The recognizer is named here
only for type checking, so the import points one way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from torch import Tensor
from tqdm import tqdm

from asr.audio import AudioError, AudioInput, as_waveform
from asr.results import BatchResult, Decoded, Segment, Transcript
from asr.search import LanguageModel, SearchOptions
from asr.segment import (
    ArraySource,
    AudioSource,
    Clip,
    SegmenterOptions,
    Span,
    open_source,
    segment_source,
)
from asr.text import Tokenizer
from asr.timing import word_index

if TYPE_CHECKING:
    from asr.recognizer import Recognizer

# Segments decoded together by `transcribe`: more costs memory faster than it saves time.
TRANSCRIBE_BATCH_SIZE = 4

T = TypeVar("T")


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def transcribe_sources(
    recognizer: Recognizer,
    audios: Sequence[AudioInput | Clip],
    *,
    sample_rate: int | None = None,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    progress: bool = False,
) -> list[BatchResult]:
    """Segment every input, decode all segments in length-sorted batches, join per input.

    Args:
        recognizer: the model.
        audios: file paths, `Clip`s of files, or mono waveforms `(S,)` at `sample_rate`.
        sample_rate: rate of waveform inputs; None: the recognizer's.
        options: search settings; None: `recognizer.default_options`.
        lm: language model for shallow fusion.
        timestamps: "attention" or "ctc" (`Recognizer.transcribe`'s `word_timestamps`).
        batch_size: segments decoded together.
        segmenter: how long audio is split; None: `recognizer.segmenter()`.
        progress: show a tqdm bar over segments.

    Returns:
        Per input, in order, a `BatchResult`: its `Transcript`, or the `AudioError` that
        stopped it (the other inputs still decode).

    Raises:
        ValueError: settings the recognizer cannot decode with (before any input is read).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    segmenter = segmenter or recognizer.segmenter()
    recognizer.check_options(options, lm, timestamps)  # before any file, not once per file
    names = [_input_name(audio, i) for i, audio in enumerate(audios)]
    results: list[Transcript | AudioError | None] = [None] * len(audios)
    sources: dict[int, AudioSource] = {}
    work: list[tuple[int, Span]] = []
    for i, audio in enumerate(audios):
        try:
            sources[i] = _open(audio, names[i], recognizer.sample_rate, sample_rate)
            work.extend((i, span) for span in segment_source(sources[i], segmenter))
        except AudioError as err:
            results[i] = err
    work.sort(key=lambda item: item[1][1] - item[1][0], reverse=True)  # less padding
    parts: dict[int, list[tuple[Span, Transcript]]] = {i: [] for i in sources}
    with tqdm(total=len(work), desc="segments", disable=not progress, leave=False) as bar:
        for batch in batches(work, batch_size):
            todo, waves = [], []
            for i, span in batch:
                if results[i] is None:
                    try:
                        wave = sources[i].read(*span)
                    except AudioError as err:
                        results[i] = err
                        continue
                    if len(wave) < recognizer.shortest_input:  # too short to hold speech
                        parts[i].append((span, _nothing(len(wave) / recognizer.sample_rate)))
                    else:
                        waves.append(wave)
                        todo.append((i, span))
            for (i, span), decoded in zip(todo, search_or_errors(recognizer, waves, options, lm)):
                if isinstance(decoded, ValueError):
                    results[i] = AudioError(sources[i].name, f"cannot be decoded: {decoded}")
                else:
                    parts[i].append((span, recognizer.transcript(decoded, timestamps)))
            bar.update(len(batch))
    for i, source in sources.items():
        if results[i] is None:
            results[i] = join_segments(recognizer.tokenizer, parts[i], source.duration)
    return [
        BatchResult(name, None, r) if isinstance(r, AudioError) else BatchResult(name, r)
        for name, r in zip(names, results)
    ]


def _nothing(duration: float) -> Transcript:
    """The transcript of audio too short to encode: no words."""
    segment = Segment(0.0, duration, "", 0.0, no_speech_prob=1.0)
    return Transcript("", [], [], [], [], [], 0.0, duration, [segment])


def _input_name(audio: AudioInput | Clip, index: int) -> str:
    """How an input is named in its result and errors: its path, or `<waveform i>`."""
    if isinstance(audio, Clip):
        return audio.path
    if isinstance(audio, (str, os.PathLike)):
        return str(audio)
    return f"<waveform {index}>"


def _open(audio: AudioInput | Clip, name: str, rate: int, sample_rate: int | None) -> AudioSource:
    """`open_source`, a waveform named `name` and refused by an `AudioError` naming it.

    Raises:
        AudioError: the file cannot be read, or the array is no mono waveform of finite samples.
    """
    if isinstance(audio, (Clip, str, os.PathLike)):
        return open_source(audio, rate)
    try:
        return ArraySource(as_waveform(audio, sample_rate or rate, rate), rate, name)
    except ValueError as err:
        raise AudioError(name, str(err)) from None


def search_or_errors(
    recognizer: Recognizer,
    waves: list[Tensor],
    options: SearchOptions | None,
    lm: LanguageModel | None,
) -> list[Decoded | ValueError]:
    """`recognizer.search`, or where the batch fails on its input (audio shorter than the
    encoder needs), each wave alone: the result holds the ValueError of each bad one."""
    try:
        return recognizer.search(waves, options, lm)
    except ValueError as err:
        if len(waves) == 1:
            return [err]
    results: list[Decoded | ValueError] = []
    for wave in waves:
        try:
            results += recognizer.search([wave], options, lm)
        except ValueError as err:
            results.append(err)
    return results


def join_segments(
    tokenizer: Tokenizer, parts: Sequence[tuple[Span, Transcript]], duration: float
) -> Transcript:
    """One `Transcript` from segment transcripts (times relative to their span's start).

    Times are shifted into the input's timeline. Where two spans overlap, the earlier one
    keeps the words whose centre lies before the overlap's midpoint and the later one the
    rest; the segments reported are cut at that midpoint too.

    Args:
        tokenizer: decodes the tokens a segment keeps.
        parts: `(span, transcript)` per segment, in any order.
        duration: seconds of the whole input.
    """
    parts = sorted(parts, key=lambda part: part[0][0])
    spans = [span for span, _ in parts]
    out = Transcript("", [], [], [], [], [], 0.0, duration, [])
    logprob_sum, logprob_count = 0.0, 0  # over whole segments: tokens and eos
    for k, (span, part) in enumerate(parts):
        low, high = _kept_range(spans, k)
        keep = _kept_tokens(part, span[0], low, high)
        tokens = [t for t, kept in zip(part.tokens, keep) if kept]
        text = part.text if all(keep) else tokenizer.decode(tokens)
        out.tokens += tokens
        out.pieces += [p for p, kept in zip(part.pieces, keep) if kept]
        out.token_starts += [span[0] + s for s, kept in zip(part.token_starts, keep) if kept]
        out.token_ends += [span[0] + e for e, kept in zip(part.token_ends, keep) if kept]
        out.token_probs += [p for p, kept in zip(part.token_probs, keep) if kept]
        out.words += [
            replace(w, start=span[0] + w.start, end=span[0] + w.end)
            for w in part.words
            if low <= span[0] + (w.start + w.end) / 2 < high
        ]
        [whole] = part.segments
        start, end = max(span[0], low), min(span[1], high)
        out.segments.append(replace(whole, start=start, end=end, text=text))
        out.score += part.score
        if part.avg_logprob is not None:
            logprob_sum += part.avg_logprob * (len(part.tokens) + 1)
            logprob_count += len(part.tokens) + 1
    out.text = " ".join(s.text for s in out.segments if s.text)
    out.avg_logprob = logprob_sum / logprob_count if logprob_count else None
    return out


def _kept_range(spans: Sequence[Span], k: int) -> tuple[float, float]:
    """Where span `k`'s words may lie: its overlaps with its neighbours cut at the middle."""
    low, high = -math.inf, math.inf
    if k > 0 and spans[k - 1][1] > spans[k][0]:
        low = (spans[k - 1][1] + spans[k][0]) / 2
    if k + 1 < len(spans) and spans[k + 1][0] < spans[k][1]:
        high = (spans[k][1] + spans[k + 1][0]) / 2
    return low, high


def _kept_tokens(part: Transcript, offset: float, low: float, high: float) -> list[bool]:
    """Which tokens stay: those of kept words; a token outside words (a space) stays when the
    words on both sides of it (where there are any) stay."""
    if low == -math.inf and high == math.inf:
        return [True] * len(part.tokens)
    kept_words = [low <= offset + (w.start + w.end) / 2 < high for w in part.words]
    index = word_index(part.pieces)
    keep = []
    for j, word in enumerate(index):
        if word is not None:
            keep.append(kept_words[word])
            continue
        before = next((w for w in reversed(index[:j]) if w is not None), None)
        after = next((w for w in index[j + 1 :] if w is not None), None)
        keep.append(all(kept_words[w] for w in (before, after) if w is not None))
    return keep
