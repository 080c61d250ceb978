"""Audio loading: every format libsndfile reads, as mono float32, resampled on request.

soundfile (libsndfile) decodes WAV (integer and float), FLAC, NIST SPHERE, OGG and MP3;
torchaudio resamples. Only the requested frames are read from disk.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import torch
import torchaudio.functional
from torch import Tensor

PathLike = str | os.PathLike
AudioInput = str | os.PathLike | np.ndarray | Tensor  # a file, or a mono waveform (S,)


class AudioError(ValueError):
    """Audio that cannot be used. The message names the file and the reason."""

    def __init__(self, path: PathLike, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass(frozen=True)
class AudioInfo:
    """What an audio file's header says."""

    sample_rate: int  # frames per second
    num_frames: int  # samples per channel
    channels: int

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return self.num_frames / self.sample_rate


def audio_info(path: PathLike) -> AudioInfo:
    """Read an audio file's header (no decoding).

    Args:
        path: any file libsndfile reads.

    Returns:
        Its sample rate, frame count and channel count.

    Raises:
        AudioError: the file is missing, a directory, unreadable, 0 bytes, or not audio
            libsndfile knows.
    """
    try:
        info = soundfile.info(str(path))
    except Exception as error:  # libsndfile reports every failure alike; diagnose it here
        raise _open_error(path, error) from error
    return AudioInfo(sample_rate=info.samplerate, num_frames=info.frames, channels=info.channels)


def load_audio(
    path: PathLike,
    sample_rate: int | None = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> torch.Tensor:
    """Load (part of) an audio file as a mono waveform.

    Args:
        path: any file libsndfile reads (WAV, FLAC, NIST SPHERE, OGG, MP3, ...).
        sample_rate: resample to this rate; None keeps the file's own rate.
        offset: start, in seconds from the beginning of the file.
        duration: seconds to read from `offset`; None reads to the end.

    Returns:
        Waveform `(T,)` float32. Integer formats are scaled to [-1, 1); floating-point files
        are returned as stored. Channels are averaged.

    Raises:
        AudioError: unreadable file, nothing to read (empty, or offset past the end),
            or non-finite samples.
    """
    waveform, _ = load_audio_with_rate(path, sample_rate, offset, duration)
    return waveform


def load_audio_with_rate(
    path: PathLike,
    sample_rate: int | None = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> tuple[torch.Tensor, int]:
    """Like `load_audio`, also returning the waveform's sample rate.

    Args:
        path: any file libsndfile reads.
        sample_rate: resample to this rate; None keeps the file's own rate.
        offset: start, in seconds.
        duration: seconds to read; None reads to the end.

    Returns:
        Waveform `(T,)` float32 and its sample rate.
    """
    info = audio_info(path)
    start, stop = _frame_range(path, info, offset, duration)
    try:
        frames = soundfile.read(str(path), start=start, stop=stop, dtype="float32", always_2d=True)[
            0
        ]
    except Exception as error:
        raise _open_error(path, error) from error
    waveform = torch.from_numpy(frames).mean(dim=1)  # (T, C) -> (T,)
    if waveform.numel() == 0:
        raise AudioError(path, "no samples could be decoded")
    if not bool(torch.isfinite(waveform).all()):
        raise AudioError(path, "contains NaN or infinite samples")
    if sample_rate is None or sample_rate == info.sample_rate:
        return waveform, info.sample_rate
    return torchaudio.functional.resample(waveform, info.sample_rate, sample_rate), sample_rate


def _frame_range(
    path: PathLike, info: AudioInfo, offset: float, duration: float | None
) -> tuple[int, int | None]:
    """Frame indices [start, stop) for `offset` and `duration` seconds; stop None means end."""
    if not (math.isfinite(offset) and offset >= 0):
        raise AudioError(path, f"offset must be finite and >= 0, got {offset}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise AudioError(path, f"duration must be finite and > 0, got {duration}")
    if info.num_frames == 0:
        raise AudioError(path, "audio is empty (0 samples)")
    start = round(offset * info.sample_rate)
    if start >= info.num_frames:
        reason = f"offset {offset:.3f} s is at or beyond the end ({info.duration:.3f} s)"
        raise AudioError(path, reason)
    if duration is None:
        return start, None
    return start, min(info.num_frames, start + max(1, round(duration * info.sample_rate)))


def _open_error(path: PathLike, error: Exception) -> AudioError:
    """Turn a libsndfile failure into an AudioError that says why."""
    file = Path(path)
    if not file.exists():
        return AudioError(path, "file not found")
    if file.is_dir():
        return AudioError(path, "is a directory, not an audio file")
    if not os.access(file, os.R_OK):
        return AudioError(path, "permission denied")
    if file.stat().st_size == 0:
        return AudioError(path, "empty file (0 bytes)")
    detail = getattr(error, "error_string", None) or str(error)  # libsndfile's own words
    return AudioError(path, f"unreadable or corrupt audio ({detail})")


def as_waveform(audio: np.ndarray | Tensor, sample_rate: int, target_rate: int) -> Tensor:
    """A mono waveform `(S,)` (numpy or torch) as float32 at `target_rate`; integer samples
    are scaled to [-1, 1) as soundfile does.

    >>> as_waveform(np.array([16384, -32768], dtype=np.int16), 16000, 16000).tolist()
    [0.5, -1.0]
    """
    wave = torch.as_tensor(audio).detach().cpu()
    if wave.dim() != 1 or wave.numel() == 0:
        raise ValueError(f"audio must be a non-empty mono waveform (S,), got {tuple(wave.shape)}")
    if not wave.is_floating_point():
        wave = wave.double() / (torch.iinfo(wave.dtype).max + 1)
    wave = wave.float()
    if not bool(torch.isfinite(wave).all()):
        raise ValueError("audio contains NaN or infinite samples")
    if sample_rate == target_rate:
        return wave
    return torchaudio.functional.resample(wave, sample_rate, target_rate)
