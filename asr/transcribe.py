"""Transcribing recordings of any length, and writing transcripts as txt, json, srt and vtt.

An attention decoder trained on utterances of seconds loses its place over minutes, so long
audio is split on silence and the pieces are decoded as utterances:

1. analysis: RMS energy in dB of 10 ms frames, read `read_seconds` at a time, so an
   hour-long file is never held whole (`frame_energy_db`);
2. planning (`plan_segments`): a frame quieter than the loudest frame by more than
   `silence_threshold_db` is silent; runs of at least `min_silence_seconds` are silences
   (`silences`). A segment grows up to `max_segment_seconds` and ends inside the silence with
   the most frames in that window, preferring the window's second half, at the silence's
   quietest stretch (`quietest_point`); where there is none, fixed windows overlap by
   `window_overlap_seconds`. Segments without a frame above the threshold are dropped and
   edge silence beyond `edge_silence_seconds` is trimmed;
3. decoding (`transcribe_sources`): segments are read one at a time with
   `load_audio(offset=, duration=)`, sorted by length and decoded `batch_size` at a time;
   each segment's times are shifted by its start, and where two fixed windows overlap, each
   keeps the words whose centre lies on its side of the overlap's midpoint.

`Recognizer.transcribe` runs this for the Python API and `transcribe_files` for
`asr transcribe`, which writes `<stem>.<format>` per input and format.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
from torch import Tensor
from tqdm import tqdm

from asr.alignment import Word
from asr.audio import AudioError, audio_info, load_audio
from asr.inference import (
    TRANSCRIBE_BATCH_SIZE,
    AudioInput,
    Decoded,
    Recognizer,
    Segment,
    Transcript,
    as_waveform,
)
from asr.search import LanguageModel, SearchOptions
from asr.text import SPACE_PIECE, SPECIAL_PIECES, Tokenizer

FORMATS = ("txt", "json", "srt", "vtt")
MIN_SEGMENT_SECONDS = 0.2  # no cut leaves a segment shorter than this
ENERGY_FLOOR_DB = -100.0  # the energy of digital silence
SHORTEST_MAX_SEGMENT = 3  # the least `segment_seconds_for` gives (> 2 x the 1 s overlap)

Span = tuple[float, float]  # (start, end) seconds of a segment in its input
Run = tuple[int, int]  # [start, stop) energy frames
T = TypeVar("T")


@dataclass(frozen=True)
class SegmenterOptions:
    """How long audio is split before decoding (see the module docstring)."""

    # Audio up to this long is one segment; none is longer. `Recognizer.segmenter()` sets it to
    # the length of the model's training utterances (`segment_seconds_for`) where known.
    max_segment_seconds: float = 20.0
    min_silence_seconds: float = 0.3  # quieter stretches shorter than this are never cut
    silence_threshold_db: float = -35.0  # silent: frame RMS this many dB below the loudest
    window_overlap_seconds: float = 1.0  # overlap of fixed windows where no silence is found
    frame_seconds: float = 0.01  # energy analysis frame (frames do not overlap)
    read_seconds: float = 60.0  # audio read at a time during analysis
    drop_silent: bool = True  # skip segments with no frame above the threshold
    # Silence kept at the edges of a segment of split audio; longer edge silence is trimmed
    # (less to decode, and nothing for the decoder to hallucinate on). None: no trimming.
    edge_silence_seconds: float | None = 0.5

    def __post_init__(self) -> None:
        checks = {
            "max_segment_seconds must be >= 1": self.max_segment_seconds >= 1.0,
            "min_silence_seconds must be >= 0": self.min_silence_seconds >= 0.0,
            "silence_threshold_db must be < 0": self.silence_threshold_db < 0.0,
            "window_overlap_seconds must lie in [0, max_segment_seconds / 2)": 0.0
            <= self.window_overlap_seconds
            < self.max_segment_seconds / 2,
            "frame_seconds must be > 0": self.frame_seconds > 0.0,
            "read_seconds must be >= frame_seconds": self.read_seconds >= self.frame_seconds,
            "edge_silence_seconds must be None or >= 0": self.edge_silence_seconds is None
            or self.edge_silence_seconds >= 0,
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(f"SegmenterOptions: {message}: {self}")


# --------------------------------------------------------------------------- analysis


def frame_energy_db(wave: np.ndarray, frame_samples: int) -> np.ndarray:
    """RMS energy in dB (re full scale 1.0) of consecutive non-overlapping frames; a short
    last frame counts too. Digital silence gives `ENERGY_FLOOR_DB`.

    >>> frame_energy_db(np.array([1.0, -1.0, 0.1, 0.1, 0.0]), 2).round(1).tolist()
    [0.0, -20.0, -100.0]
    """
    whole = len(wave) // frame_samples * frame_samples
    frames = wave[:whole].reshape(-1, frame_samples)
    power = np.einsum("ij,ij->i", frames, frames) / frame_samples  # no squared copy
    if whole < len(wave):
        power = np.append(power, np.dot(wave[whole:], wave[whole:]) / (len(wave) - whole))
    return 10.0 * np.log10(power.astype(np.float64) + 10.0 ** (ENERGY_FLOOR_DB / 10))


class AudioSource(Protocol):
    """One input to transcribe: a file read in pieces, or a waveform in memory."""

    name: str

    @property
    def duration(self) -> float: ...

    def read(self, start: float, end: float) -> Tensor:
        """Samples of `[start, end)` seconds, `(S,)` float32 at the recognizer's rate."""
        ...

    def energy_db(self, frame_seconds: float, read_seconds: float) -> tuple[np.ndarray, float]:
        """`frame_energy_db` of the whole input and the frame length in seconds."""
        ...


class FileSource:
    """An audio file, read a stretch at a time (never whole)."""

    def __init__(self, path: str | os.PathLike, sample_rate: int) -> None:
        self.path, self.name, self.sample_rate = Path(path), str(path), sample_rate
        self.info = audio_info(path)
        if self.info.num_frames == 0:
            raise AudioError(path, "audio is empty (0 samples)")

    @property
    def duration(self) -> float:
        return self.info.duration

    def read(self, start: float, end: float) -> Tensor:
        return load_audio(self.path, self.sample_rate, offset=start, duration=end - start)

    def energy_db(self, frame_seconds: float, read_seconds: float) -> tuple[np.ndarray, float]:
        rate = self.info.sample_rate  # the file's own: no resampling for the analysis
        frame = max(1, round(rate * frame_seconds))
        chunk = frame * max(1, round(read_seconds / frame_seconds))  # whole frames per read
        parts = [
            frame_energy_db(load_audio(self.path, None, start / rate, chunk / rate).numpy(), frame)
            for start in range(0, self.info.num_frames, chunk)
        ]
        return np.concatenate(parts), frame / rate


class ArraySource:
    """A waveform `(S,)` already at the recognizer's rate."""

    def __init__(self, wave: Tensor, sample_rate: int, name: str = "<waveform>") -> None:
        self.wave, self.sample_rate, self.name = wave, sample_rate, name

    @property
    def duration(self) -> float:
        return len(self.wave) / self.sample_rate

    def read(self, start: float, end: float) -> Tensor:
        return self.wave[round(start * self.sample_rate) : round(end * self.sample_rate)]

    def energy_db(self, frame_seconds: float, read_seconds: float) -> tuple[np.ndarray, float]:
        frame = max(1, round(self.sample_rate * frame_seconds))
        return frame_energy_db(self.wave.numpy(), frame), frame / self.sample_rate


def open_source(audio: AudioInput, target_rate: int, sample_rate: int | None = None) -> AudioSource:
    """An `AudioSource` for a path or a waveform at `sample_rate` (None: `target_rate`).

    Raises:
        AudioError: the file cannot be read or is empty; the message names it.
    """
    if isinstance(audio, (str, os.PathLike)):
        return FileSource(audio, target_rate)
    return ArraySource(as_waveform(audio, sample_rate or target_rate, target_rate), target_rate)


# --------------------------------------------------------------------------- planning


def _runs(mask: np.ndarray) -> list[Run]:
    """`[start, stop)` of each run of True.

    >>> _runs(np.array([True, True, False, True]))
    [(0, 2), (3, 4)]
    """
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def silences(energy_db: np.ndarray, options: SegmenterOptions, frame_seconds: float) -> list[Run]:
    """Frame runs `[start, stop)` of at least `min_silence_seconds` whose frames are more
    than `silence_threshold_db` below the loudest frame.

    >>> energy = np.array([0.0] * 5 + [-60.0, -80.0, -70.0] + [0.0, -90.0] + [0.0] * 5)
    >>> silences(energy, SegmenterOptions(min_silence_seconds=0.2), 0.1)
    [(5, 8)]
    """
    silent = energy_db < energy_db.max() + options.silence_threshold_db
    width = _width(options, frame_seconds)
    return [(a, b) for a, b in _runs(silent) if b - a >= width]


def _width(options: SegmenterOptions, frame_seconds: float) -> int:
    """`min_silence_seconds` in frames (at least one)."""
    return max(1, math.ceil(options.min_silence_seconds / frame_seconds - 1e-9))


def quietest_point(energy_db: np.ndarray, start: int, stop: int, width: int) -> float:
    """Centre, in frames, of the quietest `width` frames (by mean energy) of `[start, stop)`;
    ties go to the one nearest the middle, which keeps cuts away from the soft edges of words.

    >>> quietest_point(np.array([0.0, -60.0, -80.0, -70.0, 0.0]), 1, 4, 2)
    3.0
    >>> quietest_point(np.full(10, -90.0), 0, 10, 2)
    5.0
    """
    means = np.convolve(energy_db[start:stop], np.ones(width) / width, mode="valid")
    candidates = np.flatnonzero(means <= means.min() + 1e-9)  # window starts
    middle = (stop - start - width) / 2
    return float(start + candidates[np.argmin(np.abs(candidates - middle))] + width / 2)


def segment_seconds_for(durations: Sequence[float]) -> float:
    """The longest segment to cut for a model trained on utterances of `durations` seconds:
    their 95th percentile, rounded up to whole seconds, at least `SHORTEST_MAX_SEGMENT`.
    Attention decoders fail on inputs much longer than they were trained on: the AN4
    Transformer (95 % of its training utterances under 4.8 s) gave WER 52.6 on 11.4 s of joined
    test utterances decoded whole, 10.5 cut into segments of at most 5 s (bench/RESULTS.md).

    >>> segment_seconds_for([1.0, 2.0, 2.5, 3.2, 4.8] * 4)
    5.0
    """
    if not durations:
        raise ValueError("segment_seconds_for: no durations")
    longest = np.quantile(durations, 0.95, method="lower")  # a duration of the set itself
    return float(max(SHORTEST_MAX_SEGMENT, math.ceil(longest)))


def plan_segments(
    energy_db: np.ndarray, frame_seconds: float, duration: float, options: SegmenterOptions
) -> list[Span]:
    """Split `[0, duration]` seconds into segments of at most `max_segment_seconds`.

    Args:
        energy_db: `(F,)` frame energies from `frame_energy_db`.
        frame_seconds: seconds per energy frame.
        duration: seconds of audio.
        options: the segmenter's settings.

    Returns:
        `(start, end)` spans in order. They meet at silence cuts (less trimmed edge
        silence) and overlap by `window_overlap_seconds` where fixed windows were used.

    >>> energy = np.zeros(400)
    >>> energy[180:200] = -80.0  # 0.2 s of silence at 1.8 s
    >>> plan_segments(energy, 0.01, 4.0, SegmenterOptions(3, min_silence_seconds=0.1))
    [(0.0, 1.9), (1.9, 4.0)]
    >>> plan_segments(np.zeros(400), 0.01, 4.0, SegmenterOptions(max_segment_seconds=3))
    [(0.0, 3.0), (2.0, 4.0)]
    """
    if duration <= options.max_segment_seconds:
        return [(0.0, duration)]
    spans = _grow_segments(energy_db, frame_seconds, duration, options)
    loud = energy_db >= energy_db.max() + options.silence_threshold_db
    if options.drop_silent:
        spans = [s for s in spans if loud[_frames(s, frame_seconds)].any()]
    if options.edge_silence_seconds is not None:
        spans = [_trimmed(s, loud, frame_seconds, options.edge_silence_seconds) for s in spans]
    return spans


def _grow_segments(
    energy_db: np.ndarray, frame_seconds: float, duration: float, options: SegmenterOptions
) -> list[Span]:
    runs = silences(energy_db, options, frame_seconds)
    longest, overlap = options.max_segment_seconds, options.window_overlap_seconds
    spans, start = [], 0.0
    while duration - start > longest:
        limit = min(start + longest, duration - MIN_SEGMENT_SECONDS)
        end = _best_cut(energy_db, runs, frame_seconds, start, limit, options)
        if end is not None:
            spans.append((start, end))
            start = end
        else:  # no silence: a fixed window, the next one overlapping it
            spans.append((start, limit))
            start = limit - overlap
    spans.append((start, duration))
    return spans


def _best_cut(
    energy_db: np.ndarray,
    runs: list[Run],
    frame_seconds: float,
    start: float,
    limit: float,
    options: SegmenterOptions,
) -> float | None:
    """Where to end a segment starting at `start`: the quietest point of the silence with
    the most frames inside `(start, limit]`, preferring silences in the window's second half
    (then the latest); None if no silence fits."""
    width = _width(options, frame_seconds)
    low = math.ceil((start + MIN_SEGMENT_SECONDS) / frame_seconds - 1e-9)
    high = math.floor(limit / frame_seconds + 1e-9)
    half = start + options.max_segment_seconds / 2
    best: tuple[bool, int, float] | None = None  # (in the second half, frames, cut time)
    for run_start, run_stop in runs:
        a, b = max(run_start, low), min(run_stop, high)  # the part inside the window
        if b - a < width:
            continue
        cut = round(quietest_point(energy_db, a, b, width) * frame_seconds, 6)
        key = (cut >= half, b - a, cut)
        best = key if best is None or key > best else best
    return None if best is None else best[2]


def _frames(span: Span, frame_seconds: float) -> slice:
    """The energy frames a span overlaps."""
    first = int(span[0] / frame_seconds + 1e-9)
    return slice(first, max(first + 1, math.ceil(span[1] / frame_seconds - 1e-9)))


def _trimmed(span: Span, loud: np.ndarray, frame_seconds: float, keep: float) -> Span:
    """The span without edge silence beyond `keep` seconds (unchanged if all silent).

    >>> _trimmed((0.0, 1.0), np.array([False] * 4 + [True] * 2 + [False] * 4), 0.1, 0.1)
    (0.3, 0.7)
    """
    frames = _frames(span, frame_seconds)
    found = np.flatnonzero(loud[frames])
    if not len(found):
        return span
    first, last = frames.start + found[0], frames.start + found[-1] + 1
    start = max(span[0], round(float(first * frame_seconds - keep), 6))
    return start, min(span[1], round(float(last * frame_seconds + keep), 6))


def segment_source(source: AudioSource, options: SegmenterOptions) -> list[Span]:
    """The segments of one input (one span for audio no longer than the maximum)."""
    if source.duration <= options.max_segment_seconds:
        return [(0.0, source.duration)]
    energy, frame_seconds = source.energy_db(options.frame_seconds, options.read_seconds)
    return plan_segments(energy, frame_seconds, source.duration, options)


# --------------------------------------------------------------------------- decoding


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def transcribe_sources(
    recognizer: Recognizer,
    audios: Sequence[AudioInput],
    sample_rate: int | None = None,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    progress: bool = False,
) -> list[Transcript | AudioError]:
    """Segment every input, decode all segments in length-sorted batches, join per input.

    Args:
        recognizer: the model.
        audios: file paths, or mono waveforms `(S,)` at `sample_rate`.
        sample_rate: rate of waveform inputs; None: the recognizer's.
        options: search settings (see `Recognizer.transcribe`).
        lm: language model for shallow fusion.
        timestamps: "attention" or "ctc".
        batch_size: segments decoded together.
        segmenter: how long audio is split; None: `recognizer.segmenter()`.
        progress: show a tqdm bar over segments.

    Returns:
        Per input, in order, its `Transcript`, or the `AudioError` that stopped it (the other
        inputs still decode).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    segmenter = segmenter or recognizer.segmenter()
    recognizer.check_options(options, lm, timestamps)  # before any file, not once per file
    results: list[Transcript | AudioError | None] = [None] * len(audios)
    sources: dict[int, AudioSource] = {}
    work: list[tuple[int, Span]] = []
    for i, audio in enumerate(audios):
        try:
            sources[i] = open_source(audio, recognizer.sample_rate, sample_rate)
            work.extend((i, span) for span in segment_source(sources[i], segmenter))
        except AudioError as err:
            results[i] = err
    work.sort(key=lambda item: item[1][1] - item[1][0], reverse=True)  # less padding
    parts: dict[int, list[tuple[Span, Transcript]]] = {i: [] for i in sources}
    with tqdm(total=len(work), desc="segments", disable=not progress, leave=False) as bar:
        for batch in _batches(work, batch_size):
            todo, waves = [], []
            for i, span in batch:
                if results[i] is None:
                    try:
                        waves.append(sources[i].read(*span))
                        todo.append((i, span))
                    except AudioError as err:
                        results[i] = err
            for (i, span), decoded in zip(todo, search_or_errors(recognizer, waves, options, lm)):
                if isinstance(decoded, ValueError):
                    results[i] = AudioError(sources[i].name, f"cannot be decoded: {decoded}")
                else:
                    parts[i].append((span, recognizer.transcript(decoded, timestamps)))
            bar.update(len(batch))
    for i, source in sources.items():
        if results[i] is None:
            results[i] = join_segments(recognizer.tokenizer, parts[i], source.duration)
    return results


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


def word_index(pieces: Sequence[str]) -> list[int | None]:
    """The word each piece belongs to, as `asr.alignment.word_timestamps` groups them; None
    for bare spaces and special tokens.

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
    for k, (span, part) in enumerate(parts):
        low, high = _kept_range(spans, k)
        keep = _kept_tokens(part, span[0], low, high)
        tokens = [t for t, kept in zip(part.tokens, keep) if kept]
        text = part.text if all(keep) else tokenizer.decode(tokens)
        out.tokens += tokens
        out.pieces += [p for p, kept in zip(part.pieces, keep) if kept]
        out.token_starts += [span[0] + s for s, kept in zip(part.token_starts, keep) if kept]
        out.token_ends += [span[0] + e for e, kept in zip(part.token_ends, keep) if kept]
        out.words += [
            Word(w.text, span[0] + w.start, span[0] + w.end)
            for w in part.words
            if low <= span[0] + (w.start + w.end) / 2 < high
        ]
        out.segments.append(Segment(max(span[0], low), min(span[1], high), text, part.score))
        out.score += part.score
    out.text = " ".join(s.text for s in out.segments if s.text)
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


# --------------------------------------------------------------------------- output


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """`HH:MM:SS,mmm` (SRT; WebVTT uses "." as the marker).

    >>> format_timestamp(3725.5), format_timestamp(0.0004, ".")
    ('01:02:05,500', '00:00:00.000')
    """
    millis = round(max(seconds, 0.0) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def subtitle_cues(transcript: Transcript, words_per_cue: int = 0) -> list[tuple[float, float, str]]:
    """Subtitle cues `(start, end, text)`: one per segment, or per `words_per_cue` words of a
    segment when > 0, timed by the first and last word. Segments without words give none.
    """
    if words_per_cue < 0:
        raise ValueError(f"words_per_cue must be >= 0, got {words_per_cue}")
    groups: list[list[Word]] = [[] for _ in transcript.segments]
    starts = [s.start for s in transcript.segments]
    for word in transcript.words:  # to the last segment starting before the word's centre
        k = max(0, int(np.searchsorted(starts, (word.start + word.end) / 2, side="right")) - 1)
        groups[k].append(word)
    cues = []
    for words in groups:
        size = words_per_cue or len(words)
        for first in range(0, len(words), max(size, 1)):
            chunk = words[first : first + size]
            cues.append((chunk[0].start, chunk[-1].end, " ".join(w.text for w in chunk)))
    return cues


def to_srt(cues: Sequence[tuple[float, float, str]]) -> str:
    """SubRip text of the cues.

    >>> print(to_srt([(0.5, 1.25, "YES")]), end="")
    1
    00:00:00,500 --> 00:00:01,250
    YES
    <BLANKLINE>
    """
    return "".join(
        f"{n}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n\n"
        for n, (start, end, text) in enumerate(cues, 1)
    )


def to_vtt(cues: Sequence[tuple[float, float, str]]) -> str:
    """WebVTT text of the cues."""
    body = "".join(
        f"{format_timestamp(start, '.')} --> {format_timestamp(end, '.')}\n{text}\n\n"
        for start, end, text in cues
    )
    return "WEBVTT\n\n" + body


def render(transcript: Transcript, fmt: str, audio: str = "", words_per_cue: int = 0) -> str:
    """The transcript as the text of an output file of format `fmt` (one of `FORMATS`)."""
    if fmt == "txt":
        return transcript.text + "\n"
    if fmt == "json":
        return json.dumps({"audio": audio, **transcript.to_dict()}, indent=1, ensure_ascii=False)
    if fmt == "srt":
        return to_srt(subtitle_cues(transcript, words_per_cue))
    if fmt == "vtt":
        return to_vtt(subtitle_cues(transcript, words_per_cue))
    raise ValueError(f"unknown output format {fmt!r}; choose from {FORMATS}")


def output_stems(paths: Sequence[str | os.PathLike], out_dir: Path) -> list[Path]:
    """`out_dir/<stem>` per input; two inputs with one stem would overwrite each other.

    Raises:
        ValueError: two inputs share a file stem (both are named).
    """
    seen: dict[str, str] = {}
    for path in paths:
        stem = Path(path).stem
        if stem in seen:
            raise ValueError(f"{seen[stem]} and {path} would write the same output files")
        seen[stem] = str(path)
    return [out_dir / Path(p).stem for p in paths]


def transcribe_files(
    recognizer: Recognizer,
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    formats: Sequence[str] = ("txt",),
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    words_per_cue: int = 0,
    progress: bool = True,
) -> list[str]:
    """Transcribe files into `out_dir/<stem>.<format>`, `batch_size` files at a time.

    Each transcript's text goes to stdout as `path<TAB>text`; a file that cannot be read is
    reported on stderr (named, with the reason) and the others go on.

    Returns:
        The paths that failed.
    """
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"unknown output formats {unknown}; choose from {FORMATS}")
    out_dir = Path(out_dir)
    stems = output_stems(paths, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    with tqdm(total=len(paths), desc="files", unit="file", disable=not progress) as bar:
        for first in range(0, len(paths), batch_size):
            group = list(paths[first : first + batch_size])
            results = transcribe_sources(
                recognizer, group, None, options, lm, timestamps, batch_size, segmenter, progress
            )
            for path, stem, result in zip(group, stems[first:], results):
                if isinstance(result, AudioError):
                    print(f"asr transcribe: error: {result}", file=sys.stderr)
                    failed.append(str(path))
                    continue
                for fmt in formats:
                    text = render(result, fmt, str(path), words_per_cue)
                    stem.with_name(f"{stem.name}.{fmt}").write_text(text, encoding="utf-8")
                print(f"{path}\t{result.text}", flush=True)
            bar.update(len(group))
    return failed
