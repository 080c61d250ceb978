"""Audio loading as mono float32: libsndfile first, FFmpeg (PyAV) for the rest (m4a, video,
WebM/Opus, AMR, ...), resampled by torchaudio on request."""

from __future__ import annotations

import collections
import itertools
import math
import numbers
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import soundfile

if TYPE_CHECKING:  # torch is imported where samples become tensors: `asr prepare` needs none
    import av
    import torch
    from torch import Tensor

PathLike = str | os.PathLike
AudioInput = "str | os.PathLike | np.ndarray | Tensor"  # a file, or a mono waveform (S,)

AUDIO_SUFFIXES = (
    ".wav", ".flac", ".sph", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".caf",
    ".m4a", ".mp4", ".aac", ".webm", ".weba", ".mkv", ".mka", ".mov", ".3gp", ".amr", ".wma",
)  # fmt: skip
# PCM integer samples -> [-1, 1): (x - offset) / scale; 8-bit unsigned PCM centres on 128
PCM_SCALE = {"int8": (0, 2**7), "uint8": (2**7, 2**7), "int16": (0, 2**15), "int32": (0, 2**31)}
LOUDEST_SAMPLE = 1000.0  # float audio lies within ±1; far beyond, features overflow
# Seconds decoded before a seek target and dropped: AAC, MP3 and Opus frames depend on the
# previous (an MP3 frame's bits may lie in the one before it).
SEEK_PREROLL_SECONDS = 0.5
PREROLL_SUBTYPES = ("MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III", "OPUS")  # libsndfile's
# libsndfile's seek into an Ogg Vorbis file's last page lands 384 samples late: FFmpeg reads spans
VORBIS_SEEK = "its Vorbis seek is not exact, so FFmpeg reads spans"
RESAMPLE_TERMS = 2000  # the largest denominator of a resampling ratio: 44100 -> 16000 is 40/441
HEAD_FRAMES = 4  # decoded after a seek, to place the first by the others' timestamps
SKIP_BLOCK = 1 << 20  # frames decoded at a time to reach an offset in a file that cannot seek
# Demuxers stating exact durations; other containers' frames are counted by decoding.
EXACT_DURATION_DEMUXERS = ("mov,mp4,m4a,3gp,3g2,mj2",)
SF_COUNT_MAX = 2**63 - 1  # libsndfile's sample count of a header that does not give one


def audio_files(
    folder: PathLike, suffixes: tuple[str, ...] = AUDIO_SUFFIXES, unlisted: list[str] | None = None
) -> list[Path]:
    """Every path below `folder` whose lower-case suffix is in `suffixes` (a folder so named
    too: callers say it is no audio), sorted. Linked folders are followed (each real folder
    once); hidden files and folders (`.name`, such as macOS's `._x.wav`) are left out, as
    shell globs leave them. A folder that cannot be listed goes to `unlisted` as `path: why`
    (without that list, it is refused): os.walk would pass over it unsaid."""
    found, seen = [], set()
    for root, folders, files in os.walk(folder, followlinks=True, onerror=unlistable(unlisted)):
        real = os.path.realpath(root)
        if real in seen:  # a link back up the tree, or a second link to one folder
            folders.clear()
            continue
        seen.add(real)
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [
            Path(root, name)
            for name in files + folders
            if not name.startswith(".") and os.path.splitext(name)[1].lower() in suffixes
        ]
    return sorted(found)


def unlistable(unlisted: list[str] | None) -> Callable[[OSError], None]:
    """An `os.walk` onerror that adds each folder it cannot list to `unlisted` (`path: why`),
    or, without that list, refuses it: what it holds would be left out unsaid."""

    def said(error: OSError) -> None:
        why = f"{error.filename}: cannot list this folder ({error.strerror})"
        if unlisted is None:
            raise ValueError(f"{why}: give it read permission, or move it out")
        unlisted.append(why)

    return said


class AudioError(ValueError):
    """Audio that cannot be used; the message names the file and the reason."""

    def __init__(self, path: PathLike, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path or repr(self.path)}: {reason}")  # '': an empty one

    def __reduce__(self):  # pickled whole: a worker process hands it back to its parent
        return type(self), (self.path, self.reason)


@dataclass(frozen=True)
class AudioInfo:
    """What an audio file's header says."""

    sample_rate: int
    num_frames: int  # samples per channel
    channels: int

    @property
    def duration(self) -> float:
        return self.num_frames / self.sample_rate


def audio_info(path: PathLike) -> AudioInfo:
    """Sample rate, exact frame count and channels of a file's (first) audio stream."""
    info = _libsndfile_info(path)
    if isinstance(info, AudioInfo):
        return info
    with _container(path, info) as (container, stream):
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
        frames = _stated_frames(container, stream)
        if frames is None:
            frames = sum(frame.samples for frame in container.decode(stream))
    return AudioInfo(sample_rate=rate, num_frames=frames, channels=channels)


def load_audio(
    path: PathLike,
    sample_rate: int | None = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> torch.Tensor:
    """`duration` seconds (None: all) from `offset` of a file as mono float32 `(T,)`."""
    waveform, _ = load_audio_with_rate(path, sample_rate, offset, duration)
    return waveform


def load_audio_with_rate(
    path: PathLike,
    sample_rate: int | None = 16000,
    offset: float = 0.0,
    duration: float | None = None,
) -> tuple[torch.Tensor, int]:
    """`load_audio`'s waveform `(T,)` and its sample rate (None: the file's own)."""
    info = _libsndfile_info(path)
    if isinstance(info, AudioInfo):
        frames, rate = _read_libsndfile(path, info, offset, duration), info.sample_rate
    else:
        frames, rate = _read_container(path, info, offset, duration)
    import torch

    waveform = torch.from_numpy(frames)
    if waveform.numel() == 0:
        raise AudioError(path, "audio is empty (no samples could be decoded)")
    problem = sample_problem(waveform)
    if problem is not None:
        raise AudioError(path, problem)
    if sample_rate is None or sample_rate == rate:
        return waveform, rate
    return resample(waveform, rate, sample_rate), sample_rate


def resample(wave: Tensor, rate: int, target_rate: int) -> Tensor:
    """`wave` `(..., S)` at `rate` Hz, resampled to `target_rate`. Rates that share almost no
    factor (44101 and 16000) make the sinc kernel rate x target large (GBs): their ratio is
    taken with a denominator of at most `RESAMPLE_TERMS` instead (within 0.025 %, mostly far
    less: the speech is as good as unchanged), and the result cut or padded to the exact
    ratio's length. Times within it drift by as much: long files are read in segments, each
    resampled alone; an array resampled whole at 8001 Hz drifts 0.45 s over an hour.

    >>> import torch
    >>> resample(torch.zeros(44101), 44101, 16000).shape
    torch.Size([16000])
    """
    import torch
    import torchaudio.functional

    ratio = Fraction(target_rate, rate)
    if max(ratio.numerator, ratio.denominator) <= RESAMPLE_TERMS:
        return torchaudio.functional.resample(wave, ratio.denominator, ratio.numerator)
    near = ratio.limit_denominator(RESAMPLE_TERMS)
    out = torchaudio.functional.resample(wave, near.denominator, near.numerator)
    length = math.ceil(wave.size(-1) * ratio)  # as the exact ratio gives it
    if out.size(-1) < length:
        out = torch.nn.functional.pad(out, (0, length - out.size(-1)))
    return out[..., :length]


def can_seek(path: PathLike) -> bool:
    """Whether a stretch of the file is read without decoding what comes before it: False for
    the formats libsndfile cannot seek (GSM 6.10, G.72x, NMS ADPCM); FFmpeg's seek."""
    try:
        with soundfile.SoundFile(_sndfile_name(path)) as file:
            return file.seekable()
    except Exception:  # not for libsndfile: FFmpeg seeks, with a pre-roll
        return True


def _libsndfile_info(path: PathLike) -> AudioInfo | str:
    """The header as libsndfile reads it, or its reason for not reading (then FFmpeg may)."""
    try:
        info = soundfile.info(_sndfile_name(path))
    except Exception as error:  # libsndfile reports every failure alike; diagnose it here
        problem = _file_problem(path)
        if problem:
            raise AudioError(path, problem) from error
        return _libsndfile_reason(error)
    # a recorder stopped, or FLAC written to a pipe: FFmpeg reads on
    if not states_frames(info.frames):
        return "its header states no sample count"
    # An MP3's first frame states the length of the file as encoded: of the first part of files
    # joined by `cat`, beyond the end of one cut short. FFmpeg decodes to count and reads on.
    if info.format == "MP3":
        return "an MP3 header's sample count is not the file's"
    return AudioInfo(sample_rate=info.samplerate, num_frames=info.frames, channels=info.channels)


def _sndfile_name(path: PathLike) -> str:
    """`path` as libsndfile is to open it: it reads "-" as stdin, which here is a file."""
    name = os.fspath(path)
    return os.path.join(os.curdir, name) if name == "-" else name


def states_frames(frames: int) -> bool:
    """Whether a sample count libsndfile read from a header is one: 0 where the header was
    never finished, SF_COUNT_MAX where it says "unknown" (FLAC written to a pipe)."""
    return 0 < frames < SF_COUNT_MAX


def _read_libsndfile(
    path: PathLike, info: AudioInfo, offset: float, duration: float | None
) -> np.ndarray:
    """Mono frames of the span (of an Ogg Vorbis span past the start, FFmpeg's, held to the
    length libsndfile gives the file)."""
    start, stop = frame_range(path, info.num_frames, info.sample_rate, offset, duration)
    try:
        with soundfile.SoundFile(_sndfile_name(path)) as file:
            vorbis = start > 0 and file.subtype == "VORBIS"
            if not vorbis:
                frames = _read_open(file, start, stop, info.sample_rate)
    except Exception as error:
        reason = f"unreadable or corrupt audio ({_libsndfile_reason(error)})"
        raise AudioError(path, reason) from error
    if vorbis:
        seconds = (stop - start) / info.sample_rate
        return _read_container(path, VORBIS_SEEK, offset, seconds)[0][: stop - start]
    return frames.mean(axis=1, dtype=np.float32)  # (T, C) -> (T,)


def _read_open(file: soundfile.SoundFile, start: int, stop: int, rate: int) -> np.ndarray:
    """Frames `[start, stop)` `(T, C)` of an open file."""
    lead = 0
    if file.seekable():
        if file.subtype in PREROLL_SUBTYPES:
            lead = min(start, round(SEEK_PREROLL_SECONDS * rate))
        file.seek(start - lead)
    else:  # GSM 6.10, G.72x, NMS ADPCM: decoded from the start, what comes before dropped
        for skipped in range(0, start, SKIP_BLOCK):
            file.read(min(SKIP_BLOCK, start - skipped), dtype="float32")
    return file.read(stop - start + lead, dtype="float32", always_2d=True)[lead:]


def _libsndfile_reason(error: Exception) -> str:
    return (getattr(error, "error_string", None) or str(error)).rstrip(".")


@contextmanager
def _container(
    path: PathLike, libsndfile_reason: str
) -> Iterator[tuple[av.container.InputContainer, av.AudioStream]]:
    """The file opened by FFmpeg and its first audio stream; FFmpeg's errors as AudioError."""
    import av  # here: `import asr.audio` stays light

    try:
        container = av.open(str(path))
    except av.error.FFmpegError as error:
        reason = f"libsndfile: {libsndfile_reason}; FFmpeg: {error.strerror or error}"
        raise AudioError(path, f"unreadable or corrupt audio ({reason})") from error
    try:
        if not container.streams.audio:
            raise AudioError(path, f"no audio stream in this {container.format.name} file")
        stream = container.streams.audio[0]
        if not stream.codec_context.sample_rate:
            raise AudioError(path, "the audio stream states no sample rate")
        yield container, stream
    except av.error.FFmpegError as error:
        reason = f"unreadable or corrupt audio (FFmpeg: {error.strerror or error})"
        raise AudioError(path, reason) from error
    finally:
        container.close()


def _stated_frames(container: av.container.InputContainer, stream: av.AudioStream) -> int | None:
    if container.format.name not in EXACT_DURATION_DEMUXERS or not stream.duration:
        return None
    return round(stream.duration * stream.time_base * stream.codec_context.sample_rate)


def _read_container(
    path: PathLike, libsndfile_reason: str, offset: float, duration: float | None
) -> tuple[np.ndarray, int]:
    with _container(path, libsndfile_reason) as (container, stream):
        rate = stream.codec_context.sample_rate
        stated = _stated_frames(container, stream)
        start, stop = frame_range(path, stated, rate, offset, duration)
        frames = _decode_range(container, stream, start, stop, seek=True)
    if frames is None:  # the seek failed or overshot: decode from the start instead
        with _container(path, libsndfile_reason) as (container, stream):
            frames = _decode_range(container, stream, start, stop, seek=False)
    if len(frames):
        return frames, rate
    if start > 0:
        raise AudioError(path, f"offset {offset:.3f} s is at or beyond the end")
    return np.zeros(0, np.float32), rate


def _decode_range(
    container: av.container.InputContainer,
    stream: av.AudioStream,
    start: int,
    stop: int | None,
    seek: bool,
) -> np.ndarray | None:
    """Mono frames `[start, stop)` of the stream; None where the seek went wrong."""
    frames = container.decode(stream)
    head = list(itertools.islice(frames, HEAD_FRAMES))
    position = 0
    preroll = SEEK_PREROLL_SECONDS * stream.codec_context.sample_rate
    origin = _first_sample(head, stream) if seek and start > preroll else None
    if origin is not None:
        sought = _seek(container, stream, origin, start - preroll)
        if sought is None or not 0 <= sought[2] <= start:
            return None
        head, frames, position = sought
    parts = []
    for frame in itertools.chain(head, frames):
        samples = _mono(frame)
        end = position + len(samples)
        if end > start:
            parts.append(
                samples[max(0, start - position) : None if stop is None else stop - position]
            )
        position = end
        if stop is not None and position >= stop:
            break
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _seek(
    container: av.container.InputContainer,
    stream: av.AudioStream,
    origin: Fraction,
    target: float,
) -> tuple[list[av.AudioFrame], Iterator[av.AudioFrame], int] | None:
    """Seek to at most `target` samples past the stream's first (at `origin`): the frames
    decoded there first, the rest, and the position."""
    import av

    try:
        container.seek(
            int((origin + target) / stream.codec_context.sample_rate / stream.time_base),
            stream=stream,
        )
    except av.error.FFmpegError:  # no index to seek by
        return None
    frames = container.decode(stream)
    head = list(itertools.islice(frames, HEAD_FRAMES))
    first = _first_sample(head, stream)
    return None if first is None else (head, frames, round(first - origin))


def _first_sample(head: list[av.AudioFrame], stream: av.AudioStream) -> Fraction | None:
    """Where the first decoded frame's samples start, by the later frames' timestamps and the
    samples before them: not by its own, as a decoder may drop samples of the first packet
    (Opus pre-skip). The most common answer (the earliest of a tie): FFmpeg stamps a Vorbis
    frame between block sizes a part of a block late. None without two stamped frames."""
    counts: collections.Counter[Fraction] = collections.Counter()
    before = 0
    for previous, frame in itertools.pairwise(head):
        before += previous.samples
        if frame.pts is not None:
            counts[_samples_at(frame.pts, stream) - before] += 1
    if not counts:
        return None
    return min(counts, key=lambda first: (-counts[first], first))


def _samples_at(pts: int, stream: av.AudioStream) -> Fraction:
    return pts * stream.time_base * stream.codec_context.sample_rate


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """A decoded frame's samples `(S,)` float32: channels averaged, integers scaled."""
    samples = frame.to_ndarray()  # planar: (C, S); packed: (1, S * C)
    if not frame.format.is_planar:
        samples = samples.reshape(-1, frame.layout.nb_channels).T
    if samples.dtype == np.uint8:  # 8-bit PCM is offset binary
        samples = samples.astype(np.float32) - 128
        return samples.mean(axis=0) / 128
    if samples.dtype.kind == "i":
        scale = np.iinfo(samples.dtype).max + 1
        return (samples.mean(axis=0, dtype=np.float64) / scale).astype(np.float32)
    return samples.astype(np.float32, copy=False).mean(axis=0)


def frame_range(
    path: PathLike, num_frames: int | None, rate: int, offset: float, duration: float | None
) -> tuple[int, int | None]:
    """Frame indices [start, stop) for `offset` and `duration` seconds; stop None: the end."""
    if not (math.isfinite(offset) and offset >= 0):
        raise AudioError(path, f"offset must be finite and >= 0, got {offset}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise AudioError(path, f"duration must be finite and > 0, got {duration}")
    if num_frames == 0:
        raise AudioError(path, "audio is empty (0 samples)")
    start = round(offset * rate)
    if num_frames is not None and start >= num_frames:
        reason = f"offset {offset:.3f} s is at or beyond the end ({num_frames / rate:.3f} s)"
        raise AudioError(path, reason)
    stop = None if duration is None else start + max(1, round(duration * rate))
    if num_frames is not None:
        stop = num_frames if stop is None else min(stop, num_frames)
    return start, stop


def _file_problem(path: PathLike) -> str | None:
    if os.fspath(path) == "":  # Path("") is the working folder
        return "an empty path names no audio file"
    file = Path(path)
    if not file.exists():
        return "file not found"
    if file.is_dir():
        return "is a directory, not an audio file"
    if not os.access(file, os.R_OK):
        return "permission denied"
    if file.stat().st_size == 0:
        return "empty file (0 bytes)"
    return None


def as_waveform(audio: np.ndarray | Tensor, sample_rate: int | None, target_rate: int) -> Tensor:
    """A mono waveform (`mono_samples`) at `sample_rate` (None: `target_rate`) as float32 at
    `target_rate`, integers scaled.

    >>> as_waveform(np.array([16384, -32768], dtype=np.int16), None, 16000).tolist()
    [0.5, -1.0]
    """
    import torch

    if not isinstance(audio, (np.ndarray, torch.Tensor)):  # its callers read paths first
        raise ValueError(
            f"audio must be a file path, a numpy array or a tensor, got {type(audio).__name__}"
        )
    sample_rate = target_rate if sample_rate is None else sample_rate
    check_sample_rate(sample_rate)
    wave = mono_samples(audio)
    if not wave.numel():
        raise ValueError("audio must be a non-empty mono waveform, got no samples")
    if sample_rate == target_rate:
        return wave
    return resample(wave, sample_rate, target_rate)


def check_sample_rate(sample_rate: Any) -> None:
    """ValueError unless `sample_rate` is a whole number of Hz."""
    if (
        isinstance(sample_rate, bool)
        or not isinstance(sample_rate, numbers.Integral)
        or sample_rate < 1
    ):
        raise ValueError(f"sample_rate must be a whole number of Hz, got {sample_rate!r}")


def from_home(path: str | os.PathLike) -> str | os.PathLike:
    """`path` with `~` read as a shell reads it (`~/a.wav`, as `load_model` takes a model),
    where only that names a file: a file or folder really named `~` is read as given, and a
    missing one is named as given."""
    expanded = os.path.expanduser(path)
    return expanded if not os.path.exists(path) and os.path.exists(expanded) else path


def mono_samples(audio: np.ndarray | Tensor) -> Tensor:
    """Mono samples `(S,)`, or `(S, 1)` as audio APIs give one channel (numpy or torch), or
    `(1, S)` as torchaudio does, as a float32 `(S,)` tensor; 8, 16 and 32-bit PCM integers
    scaled to [-1, 1). A `(1, 2)` array is thus 2 samples, not one frame of 2 channels.

    >>> mono_samples(np.array([[16384], [-32768]], dtype=np.int16)).tolist()
    [0.5, -1.0]
    """
    import torch

    if isinstance(audio, np.ndarray):  # torch takes neither a flipped view nor big-endian
        audio = np.ascontiguousarray(audio, dtype=audio.dtype.newbyteorder("="))
        if not audio.flags.writeable:  # np.frombuffer(pcm_bytes): torch would warn
            audio = audio.copy()
    elif not isinstance(audio, torch.Tensor):
        raise ValueError(f"samples must be a numpy array or a tensor, got {type(audio).__name__}")
    try:
        wave = torch.as_tensor(audio).detach().cpu()
    except TypeError:  # a numpy type torch has none of (longdouble, object...)
        raise ValueError(
            f"audio samples must be floats or 8/16/32-bit PCM, got {audio.dtype}"
        ) from None
    kind = str(wave.dtype).removeprefix("torch.")
    if kind not in PCM_SCALE and not wave.is_floating_point():
        why = (
            " (numpy's type for Python ints: make them int16, or floats)" if kind == "int64" else ""
        )
        raise ValueError(f"audio samples must be floats or 8/16/32-bit PCM, got {kind}{why}")
    if wave.dim() == 2 and 1 in wave.shape:
        wave = wave.reshape(-1)
    if wave.dim() != 1:
        why = "mix the channels or pick one" if wave.dim() else "one sample: pass a sequence"
        raise ValueError(
            f"audio must be a mono waveform (S,), (S, 1) or (1, S), got {tuple(wave.shape)}: {why}"
        )
    if not wave.is_floating_point():
        offset, scale = PCM_SCALE[kind]
        wave = (wave.double() - offset) / scale
    wave = wave.float()
    problem = sample_problem(wave)
    if problem is not None:
        hint = " (16-bit values as floats: divide them by 32768)" if "±1" in problem else ""
        raise ValueError(f"audio {problem}{hint}")
    return wave


def sample_problem(wave: torch.Tensor) -> str | None:
    """What makes decoded float samples unusable: NaN or infinite ones, or ones so far past
    ±1 that features overflow to NaN (a float file's glitch); None where they are fine."""
    import torch

    if not bool(torch.isfinite(wave).all()):
        return "contains NaN or infinite samples"
    loudest = float(wave.abs().max()) if wave.numel() else 0.0
    if loudest > LOUDEST_SAMPLE:
        return f"float samples lie within ±1, got {loudest:g}"
    return None
