"""Cutting long audio on silence into segments an attention decoder decodes as utterances:
trained on seconds, it loses its place over minutes."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
from torch import Tensor

from asr.audio import (
    AudioError,
    AudioInput,
    as_waveform,
    audio_info,
    can_seek,
    frame_range,
    from_home,
    load_audio,
    resample,
)
from asr.data.manifest import DURATION_TOLERANCE
from asr.levels import (
    ENERGY_FLOOR_DB,
    SILENT_DB,
    frame_energy_db,
    local_loud_levels,
    loud_level,
)

MIN_SEGMENT_SECONDS = 0.2  # no cut leaves a segment shorter than this
SHORTEST_MAX_SEGMENT = 3  # the least `segment_seconds_for` gives (> 2 x the 1 s overlap)
DEFAULT_SEGMENT_SECONDS = 20.0  # the longest segment of a model that does not know its own

Span = tuple[float, float]  # (start, end) seconds of a segment in its input
Run = tuple[int, int]  # [start, stop) energy frames


@dataclass(frozen=True)
class SegmenterOptions:
    """How long audio is split on silence before decoding.

    A segment grows up to `max_segment_seconds` and ends at the quietest point of the longest
    silence in it, preferring its second half; without a silence, fixed windows overlap.
    """

    # No segment is longer. None: the recognizer's own (its training utterances' length,
    # `segment_seconds_for`), DEFAULT_SEGMENT_SECONDS where it has none.
    max_segment_seconds: float | None = None
    min_silence_seconds: float = 0.3  # quieter stretches shorter than this are never cut
    silence_threshold_db: float = -35.0  # silent: frame RMS this many dB below the loudest
    # ... 0.1 s within half this either side (in whole seconds); None: of the whole input
    level_window_seconds: float | None = 10.0
    window_overlap_seconds: float = 1.0  # overlap of fixed windows where no silence is found
    frame_seconds: float = 0.01  # energy analysis frame (frames do not overlap)
    read_seconds: float = 60.0  # audio read at a time during analysis
    drop_silent: bool = True  # skip segments with no frame above the threshold
    # Edge silence kept; more is trimmed, leaving nothing to hallucinate on. None: no trimming
    edge_silence_seconds: float | None = 0.5
    vad: str = "energy"  # what finds speech: frame "energy" or "silero" (`asr.vad`)
    vad_threshold: float = 0.5  # silero: frames at least this likely speech are speech

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"SegmenterOptions: {name} must be finite, got {value!r}")
        checks = {
            "max_segment_seconds must be None or >= 1": self.max_segment_seconds is None
            or self.max_segment_seconds >= 1.0,
            "min_silence_seconds must be >= 0": self.min_silence_seconds >= 0.0,
            f"silence_threshold_db must lie in ({ENERGY_FLOOR_DB:g}, 0)": ENERGY_FLOOR_DB
            < self.silence_threshold_db
            < 0.0,
            "level_window_seconds must be None or >= 1": self.level_window_seconds is None
            or self.level_window_seconds >= 1.0,
            "window_overlap_seconds must lie in [0, max_segment_seconds / 2) (lower it with "
            "segments of 2 s or less)": 0.0 <= self.window_overlap_seconds < self.longest / 2,
            "frame_seconds must be > 0": self.frame_seconds > 0.0,
            "read_seconds must be >= frame_seconds": self.read_seconds >= self.frame_seconds,
            "edge_silence_seconds must be None or >= 0": self.edge_silence_seconds is None
            or self.edge_silence_seconds >= 0,
            "vad must be 'energy' or 'silero'": self.vad in ("energy", "silero"),
            "vad_threshold must lie in (0, 1)": 0.0 < self.vad_threshold < 1.0,
        }
        for message, ok in checks.items():
            if not ok:
                field = message.split()[0]  # the field it checks
                got = f", got {getattr(self, field)!r}" if hasattr(self, field) else ""
                raise ValueError(f"SegmenterOptions: {message}{got}")

    @property
    def longest(self) -> float:
        """`max_segment_seconds`, or DEFAULT_SEGMENT_SECONDS when it is None."""
        return (
            DEFAULT_SEGMENT_SECONDS
            if self.max_segment_seconds is None
            else self.max_segment_seconds
        )


class AudioSource(Protocol):
    """One input to transcribe: a file read in pieces, or a waveform in memory."""

    name: str
    sample_rate: int

    @property
    def duration(self) -> float: ...

    def read(self, start: float, end: float) -> Tensor:
        """Samples of `[start, end)` seconds, `(S,)` float32 at the recognizer's rate."""
        ...

    def energy_db(self, frame_seconds: float, read_seconds: float) -> tuple[np.ndarray, float]:
        """`frame_energy_db` of the whole input and the frame length in seconds."""
        ...


@dataclass(frozen=True)
class Clip:
    """A stretch of an audio file: `duration` seconds from `offset` (a manifest line)."""

    path: str | os.PathLike
    offset: float = 0.0
    duration: float | None = None  # seconds from `offset`; None: to the end


class FileSource:
    """An audio file, or a stretch of one from `offset`, read a stretch at a time."""

    def __init__(
        self,
        path: str | os.PathLike,
        sample_rate: int,
        offset: float = 0.0,
        duration: float | None = None,
    ) -> None:
        self.path, self.name, self.sample_rate = Path(path), str(path), sample_rate
        self.info = audio_info(path)
        if self.info.num_frames == 0:
            raise AudioError(path, "audio is empty (0 samples)")
        if not (math.isfinite(offset) and 0 <= offset < self.info.duration):
            reason = f"offset {offset} s is not within the audio (0 to {self.info.duration:.3f} s)"
            raise AudioError(path, reason)
        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise AudioError(path, f"duration must be finite and > 0, got {duration}")
        if duration is not None and offset + duration > self.info.duration + DURATION_TOLERANCE:
            reason = (f"duration {duration:.3f} s from offset {offset:.3f} s exceeds the audio "
                      f"({self.info.duration:.3f} s)")  # fmt: skip
            raise AudioError(path, reason)  # as manifests' checks say it
        self.offset = offset
        self._duration = self.info.duration - offset
        if duration is not None:
            self._duration = min(self._duration, duration)
        first, stop = self._sample_span()
        if stop <= first:
            reason = (f"the span from offset {offset} s holds no whole sample (the audio is "
                      f"{self.info.duration:.3f} s at {self.info.sample_rate} Hz)")  # fmt: skip
            raise AudioError(path, reason)
        self._whole: Tensor | None = None  # a file that cannot seek, decoded once
        self._seeks = can_seek(path)

    @property
    def duration(self) -> float:
        return self._duration

    def _sample_span(self) -> tuple[int, int]:
        """The span's first sample and the one after its last, at the file's own rate."""
        rate = self.info.sample_rate
        first = round(self.offset * rate)
        return first, min(self.info.num_frames, first + round(self._duration * rate))

    def read(self, start: float, end: float) -> Tensor:
        return self._load(self.offset + start, end - start, self.sample_rate)

    def _load(self, offset: float, duration: float, rate: int | None) -> Tensor:
        """`duration` seconds from `offset` in the file, at `rate` (None: the file's own). A
        file that cannot seek is decoded once and cut: each stretch would decode from its start
        to get there."""
        if self._seeks:
            return load_audio(self.path, rate, offset=offset, duration=duration)
        if self._whole is None:
            self._whole = load_audio(self.path, None)
        own = self.info.sample_rate
        start, stop = frame_range(self.path, len(self._whole), own, offset, duration)
        piece = self._whole[start:stop]
        return piece if rate in (None, own) else resample(piece, own, rate)

    def energy_db(self, frame_seconds: float, read_seconds: float) -> tuple[np.ndarray, float]:
        rate = self.info.sample_rate  # the file's own: no resampling for the analysis
        frame = max(1, round(rate * frame_seconds))
        chunk = frame * max(1, round(read_seconds / frame_seconds))
        first, stop = self._sample_span()
        parts = [
            frame_energy_db(
                self._load(start / rate, min(chunk, stop - start) / rate, None).numpy(), frame
            )
            for start in range(first, stop, chunk)
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


def open_source(
    audio: AudioInput | Clip, target_rate: int, sample_rate: int | None = None
) -> AudioSource:
    """An `AudioSource` for a path, a `Clip`, or a waveform at `sample_rate` or `target_rate`."""
    if isinstance(audio, Clip):
        return FileSource(audio.path, target_rate, audio.offset, audio.duration)
    if isinstance(audio, (str, os.PathLike)):
        return FileSource(from_home(audio), target_rate)
    return ArraySource(as_waveform(audio, sample_rate, target_rate), target_rate)


def _runs(mask: np.ndarray) -> list[Run]:
    """`[start, stop)` of each run of True.

    >>> _runs(np.array([True, True, False, True]))
    [(0, 2), (3, 4)]
    """
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def silences(loud: np.ndarray, options: SegmenterOptions, frame_seconds: float) -> list[Run]:
    """Runs `[start, stop)` of frames not `loud` (`loud_frames`) of at least
    `min_silence_seconds`.

    >>> energy = np.array([0.0] * 5 + [-60.0, -80.0, -70.0] + [0.0, -90.0] + [0.0] * 5)
    >>> options = SegmenterOptions(min_silence_seconds=0.2)
    >>> silences(loud_frames(energy, 0.1, options), options, 0.1)
    [(5, 8)]
    """
    width = _width(options, frame_seconds)
    return [(a, b) for a, b in _runs(~loud) if b - a >= width]


def loud_frames(
    energy_db: np.ndarray, frame_seconds: float, options: SegmenterOptions
) -> np.ndarray:
    """The frames at most `silence_threshold_db` below the loudest near them
    (`level_window_seconds`) but for digital silence (within 1 dB of ENERGY_FLOOR_DB); none
    where the loudest near them is below SILENT_DB.

    >>> loud_frames(np.array([-80.0, -100.0, -95.0]), 0.1, SegmenterOptions()).tolist()
    [True, False, True]
    >>> loud_frames(np.full(3, -95.0), 0.1, SegmenterOptions()).any()
    np.False_
    """
    window = options.level_window_seconds
    level = (
        loud_level(energy_db, frame_seconds)
        if window is None
        else local_loud_levels(energy_db, frame_seconds, window)
    )
    loud = (energy_db >= level + options.silence_threshold_db) & (level >= SILENT_DB)
    return loud & (energy_db > ENERGY_FLOOR_DB + 1)


def _width(options: SegmenterOptions, frame_seconds: float) -> int:
    return max(1, math.ceil(options.min_silence_seconds / frame_seconds - 1e-9))


def quietest_point(energy_db: np.ndarray, start: int, stop: int, width: int) -> float:
    """Centre of the quietest `width` frames of `[start, stop)`; ties go nearest the middle.

    >>> quietest_point(np.array([0.0, -60.0, -80.0, -70.0, 0.0]), 1, 4, 2)
    3.0
    >>> quietest_point(np.full(10, -90.0), 0, 10, 2)
    5.0
    """
    means = np.convolve(energy_db[start:stop], np.ones(width) / width, mode="valid")
    candidates = np.flatnonzero(means <= means.min() + 1e-9)
    middle = (stop - start - width) / 2
    return float(start + candidates[np.argmin(np.abs(candidates - middle))] + width / 2)


def segment_seconds_for(durations: Sequence[float]) -> float:
    """The longest segment for a model trained on `durations`: their 95th percentile, rounded up.

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
    """`(start, end)` spans of at most `max_segment_seconds` covering `[0, duration]` seconds.

    >>> energy = np.zeros(400)
    >>> energy[180:200] = -80.0  # 0.2 s of silence at 1.8 s
    >>> plan_segments(energy, 0.01, 4.0, SegmenterOptions(3, min_silence_seconds=0.1))
    [(0.0, 1.9), (1.9, 4.0)]
    >>> plan_segments(np.zeros(400), 0.01, 4.0, SegmenterOptions(max_segment_seconds=3))
    [(0.0, 3.0), (2.0, 4.0)]
    >>> plan_segments(np.full(200, -120.0), 0.01, 2.0, SegmenterOptions())  # silent: none
    []
    """
    loud = loud_frames(energy_db, frame_seconds, options)
    if options.drop_silent and not loud.any():
        return []
    if duration <= options.longest:
        return [(0.0, duration)]
    spans = _grow_segments(energy_db, loud, frame_seconds, duration, options)
    if options.drop_silent:
        spans = [s for s in spans if loud[_frames(s, frame_seconds)].any()]
    if options.edge_silence_seconds is not None:
        spans = [_trimmed(s, loud, frame_seconds, options.edge_silence_seconds) for s in spans]
    return spans


def _grow_segments(
    energy_db: np.ndarray,
    loud: np.ndarray,
    frame_seconds: float,
    duration: float,
    options: SegmenterOptions,
) -> list[Span]:
    runs = silences(loud, options, frame_seconds)
    longest, overlap = options.longest, options.window_overlap_seconds
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
    """Where to end a segment starting at `start`, or None where no silence fits."""
    width = _width(options, frame_seconds)
    low = math.ceil((start + MIN_SEGMENT_SECONDS) / frame_seconds - 1e-9)
    high = math.floor(limit / frame_seconds + 1e-9)
    half = start + options.longest / 2
    best: tuple[bool, int, float] | None = None  # (in the second half, frames, cut time)
    for run_start, run_stop in runs:
        a, b = max(run_start, low), min(run_stop, high)
        if b - a < width:
            continue
        cut = round(quietest_point(energy_db, a, b, width) * frame_seconds, 6)
        key = (cut >= half, b - a, cut)
        best = key if best is None or key > best else best
    return None if best is None else best[2]


def _frames(span: Span, frame_seconds: float) -> slice:
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
    """The segments of one input; none where Silero VAD finds no speech."""
    if options.vad == "silero":
        from asr.vad import SPEECH_DB, speech_probabilities, speech_track

        probs, frame_seconds = speech_probabilities(source, options.read_seconds)
        track = speech_track(probs, options.vad_threshold)
        if not (track >= SPEECH_DB).any():
            return []
        # a track of probabilities, not levels: silence is far below speech anywhere
        whole = replace(options, level_window_seconds=None)
        return plan_segments(track, frame_seconds, source.duration, whole)
    energy, frame_seconds = source.energy_db(options.frame_seconds, options.read_seconds)
    return plan_segments(energy, frame_seconds, source.duration, options)
