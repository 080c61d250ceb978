"""asr.audio: formats, downmix, resampling, exact frame ranges, and errors naming the file."""

from __future__ import annotations

import math
import os
import re
import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional
from conftest import AN4_FIXTURE, encode_audio, without_sample_count

from asr.audio import (
    RESAMPLE_TERMS,
    AudioError,
    AudioInfo,
    as_waveform,
    audio_files,
    audio_info,
    load_audio,
    load_audio_with_rate,
    mono_samples,
    resample,
)


def sine(freq: float, sample_rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(sample_rate * seconds)) / sample_rate
    return (amplitude * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def peak_frequency(waveform: torch.Tensor, sample_rate: int) -> float:
    spectrum = torch.fft.rfft(
        waveform.double() * torch.hann_window(len(waveform), dtype=torch.double)
    )
    return float(spectrum.abs().argmax()) * sample_rate / len(waveform)


# (file suffix, soundfile format, subtype, max abs error of a round trip or None if lossy)
FORMATS = [
    ("wav", "WAV", "PCM_U8", 1 / 64),
    ("wav", "WAV", "PCM_16", 1e-4),
    ("wav", "WAV", "PCM_24", 1e-6),
    ("wav", "WAV", "FLOAT", 0.0),
    ("flac", "FLAC", "PCM_16", 1e-4),
    ("sph", "NIST", "PCM_16", 1e-4),
    ("ogg", "OGG", "VORBIS", None),
    ("mp3", "MP3", "MPEG_LAYER_III", None),
]


@pytest.mark.parametrize(("suffix", "fmt", "subtype", "tolerance"), FORMATS, ids=lambda v: str(v))
def test_every_format_loads_as_mono_float32(tmp_path, suffix, fmt, subtype, tolerance):
    signal = sine(440.0, 16000, 1.0)
    path = tmp_path / f"tone.{suffix}"
    try:
        soundfile.write(path, signal, 16000, format=fmt, subtype=subtype)
    except (soundfile.LibsndfileError, ValueError, TypeError) as error:
        pytest.skip(f"this libsndfile cannot write {fmt}/{subtype}: {error}")
    waveform = load_audio(path)
    assert waveform.dtype == torch.float32 and waveform.dim() == 1
    assert float(waveform.abs().max()) <= 1.0
    if tolerance is None:  # lossy codecs: the tone survives, the length roughly
        assert abs(len(waveform) - len(signal)) < 0.1 * len(signal)
        assert peak_frequency(waveform, 16000) == pytest.approx(440.0, abs=2.0)
    else:
        assert len(waveform) == len(signal)
        assert float((waveform - torch.from_numpy(signal)).abs().max()) <= tolerance


def test_audio_info_reads_the_header(tmp_path):
    path = tmp_path / "stereo.flac"
    soundfile.write(path, np.zeros((12345, 2), np.float32), 8000)
    info = audio_info(path)
    assert info == AudioInfo(sample_rate=8000, num_frames=12345, channels=2)
    assert info.duration == 12345 / 8000


def test_a_file_named_dash_is_that_file_not_stdin(tmp_path, monkeypatch):
    """libsndfile opens "-" as stdin: a library reads the file of that name, as open() does."""
    monkeypatch.chdir(tmp_path)
    wave = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    soundfile.write(tmp_path / "-", wave, 16000, format="WAV", subtype="FLOAT")
    soundfile.write(tmp_path / "other.wav", np.zeros(800, np.float32), 8000)
    with open(tmp_path / "other.wav", "rb") as other:  # what stdin holds
        saved = os.dup(0)
        os.dup2(other.fileno(), 0)
        try:
            assert audio_info("-") == AudioInfo(sample_rate=16000, num_frames=1600, channels=1)
            assert torch.equal(load_audio("-"), torch.from_numpy(wave))
        finally:
            os.dup2(saved, 0)
            os.close(saved)


@pytest.mark.parametrize("channels", [2, 6])
def test_downmix_is_the_channel_mean(tmp_path, channels):
    frames = np.stack(
        [sine(200.0 * (c + 1), 16000, 0.5, amplitude=0.9 / (c + 1)) for c in range(channels)], 1
    )
    path = tmp_path / f"{channels}ch.wav"
    soundfile.write(path, frames, 16000, subtype="FLOAT")
    waveform = load_audio(path)
    torch.testing.assert_close(waveform, torch.from_numpy(frames.mean(axis=1)), atol=1e-7, rtol=0)


@pytest.mark.parametrize("native_rate", [8000, 22050, 48000])
def test_resampling_gives_the_expected_length_and_keeps_the_pitch(tmp_path, native_rate):
    path = tmp_path / f"tone{native_rate}.wav"
    soundfile.write(path, sine(1000.0, native_rate, 1.3), native_rate, subtype="FLOAT")
    waveform, rate = load_audio_with_rate(path, sample_rate=16000)
    assert rate == 16000
    assert len(waveform) == math.ceil(round(native_rate * 1.3) * 16000 / native_rate)
    assert peak_frequency(waveform, 16000) == pytest.approx(1000.0, abs=1.0)


def test_sample_rate_none_keeps_the_native_rate(tmp_path):
    path = tmp_path / "tone.wav"
    signal = sine(300.0, 8000, 0.5)
    soundfile.write(path, signal, 8000, subtype="FLOAT")
    waveform, rate = load_audio_with_rate(path, sample_rate=None)
    assert rate == 8000
    torch.testing.assert_close(waveform, torch.from_numpy(signal), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("offset", "duration", "first", "stop"),
    [
        (0.25, 0.5, 4000, 12000),
        (0.0, None, 0, 16000),
        (0.5, None, 8000, 16000),
        (0.75, 9.0, 12000, 16000),
    ],
)
def test_offset_and_duration_select_exact_frames(tmp_path, offset, duration, first, stop):
    ramp = np.arange(16000, dtype=np.float32) / 16000  # every frame has its own value
    path = tmp_path / "ramp.wav"
    soundfile.write(path, ramp, 16000, subtype="FLOAT")
    waveform = load_audio(path, sample_rate=16000, offset=offset, duration=duration)
    torch.testing.assert_close(waveform, torch.from_numpy(ramp[first:stop]), atol=0, rtol=0)


def test_a_segment_resampled_equals_the_resampled_segment(tmp_path):
    path = tmp_path / "tone.wav"
    soundfile.write(path, sine(500.0, 8000, 1.0), 8000, subtype="FLOAT")
    segment = load_audio(path, sample_rate=None, offset=0.25, duration=0.5)
    resampled = load_audio(path, sample_rate=16000, offset=0.25, duration=0.5)
    torch.testing.assert_close(resampled, torchaudio.functional.resample(segment, 8000, 16000))


@pytest.mark.needs_corpus
def test_sphere_files_of_the_an4_tarball_equal_the_wav_corpus(tmp_path, mini_an4_tar, an4_dir):
    with tarfile.open(mini_an4_tar) as archive:
        archive.extractall(tmp_path, filter="data")
    spheres = sorted(tmp_path.rglob("*.sph"))
    assert len(spheres) == 8
    for sphere in spheres:
        wav = (
            an4_dir / "wav" / sphere.parent.parent.name / sphere.parent.name / f"{sphere.stem}.wav"
        )
        torch.testing.assert_close(load_audio(sphere), load_audio(wav), atol=0, rtol=0)


def write_nan_audio(path: Path) -> None:
    samples = np.zeros(1600, np.float32)
    samples[100] = np.nan
    soundfile.write(path, samples, 16000, subtype="FLOAT")


def write_empty_audio(path: Path) -> None:
    soundfile.write(path, np.zeros(0, np.float32), 16000)


def write_random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def test_an_audio_error_pickles_whole():
    """A worker process (concurrent.futures) hands its error back pickled: unpickling called
    AudioError(message) without its reason, and broke the whole pool."""
    import copy
    import pickle

    error = AudioError("a.wav", "file not found")
    for again in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert (again.path, again.reason, str(again)) == ("a.wav", "file not found", str(error))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (None, "not found"),
        (lambda p: p.mkdir(), "directory"),
        (write_empty_audio, "empty"),
        (write_random_bytes, "corrupt"),
        (write_nan_audio, "NaN"),
    ],
    ids=["missing", "directory", "empty", "random-bytes", "nan"],
)
def test_bad_audio_raises_audio_error_naming_the_file(tmp_path, make, reason):
    path = tmp_path / "bad_audio_4711.wav"
    if make is not None:
        make(path)
    with pytest.raises(AudioError, match=reason) as caught:
        load_audio(path)
    assert "bad_audio_4711.wav" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_an_empty_path_is_named_as_such_not_as_the_working_folder():
    """`Path("")` is the working folder: "" was called a directory, under a blank name."""
    with pytest.raises(AudioError, match=r"^'': an empty path names no audio file$"):
        load_audio("")


@pytest.mark.parametrize("suffix", ["wav", "flac"])
def test_a_file_whose_header_gives_no_sample_count_reads_whole(tmp_path, suffix):
    """A recorder stopped before it wrote its sizes leaves a WAV's sizes at 0, and FLAC written
    to a pipe states an unknown total: libsndfile gives no count (or SF_COUNT_MAX), FFmpeg
    reads the whole."""
    whole = (np.random.default_rng(0).normal(0, 0.1, 8000) * 32768).astype(np.int16)
    soundfile.write(tmp_path / f"whole.{suffix}", whole, 16000, subtype="PCM_16")
    unstated = tmp_path / f"unstated.{suffix}"
    unstated.write_bytes(without_sample_count(tmp_path / f"whole.{suffix}"))
    assert audio_info(unstated).num_frames == len(whole)
    np.testing.assert_array_equal(load_audio(unstated), whole / 32768)


@pytest.mark.parametrize(
    ("make", "reason"),
    [(None, "not found"), (lambda p: p.mkdir(), "directory"), (write_random_bytes, "corrupt")],
    ids=["missing", "directory", "random-bytes"],
)
def test_audio_info_errors_name_the_file(tmp_path, make, reason):
    path = tmp_path / "bad_header_4711.wav"
    if make is not None:
        make(path)
    with pytest.raises(AudioError, match=reason) as caught:
        audio_info(path)
    assert "bad_header_4711.wav" in str(caught.value)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_reported_as_permission_denied(tmp_path):
    path = tmp_path / "locked.wav"
    soundfile.write(path, sine(440.0, 16000, 0.1), 16000)
    path.chmod(0)
    with pytest.raises(AudioError, match="permission denied") as caught:
        audio_info(path)
    assert "locked.wav" in str(caught.value)


@pytest.mark.parametrize(
    ("offset", "duration", "reason"),
    [
        (1.0, None, "beyond the end"),
        (5.0, 1.0, "beyond the end"),
        (-0.1, None, "offset"),
        (0.0, 0.0, "duration"),
    ],
)
def test_bad_offset_or_duration_names_the_file(tmp_path, offset, duration, reason):
    path = tmp_path / "short_4711.wav"
    soundfile.write(path, sine(440.0, 16000, 1.0), 16000)
    with pytest.raises(AudioError, match=reason) as caught:
        load_audio(path, offset=offset, duration=duration)
    assert "short_4711.wav" in str(caught.value)


# --------------------------------------------------------------------------- FFmpeg's containers

SPEECH = AN4_FIXTURE / "wav/an4_clstk/fash/an255-fash-b.wav"  # 2.6 s, 16 kHz
# (suffix, codec, its rate, with a video stream): what soundfile cannot read
CONTAINERS = [
    ("m4a", "aac", 16000, False),
    ("mp4", "aac", 16000, True),
    ("webm", "libopus", 48000, False),
]


def encoded(tmp_path: Path, suffix: str, codec: str, rate: int, video: bool = False) -> Path:
    """The fixture's speech encoded by FFmpeg into `tmp_path/speech.<suffix>`."""
    path = tmp_path / f"speech.{suffix}"
    return encode_audio(path, load_audio(SPEECH, rate).numpy(), rate, codec, video)


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.numpy(), b.numpy())[0, 1])


@pytest.mark.parametrize(("suffix", "codec", "rate", "video"), CONTAINERS, ids=lambda v: str(v))
def test_containers_ffmpeg_reads_load_as_the_wav_did(tmp_path, suffix, codec, rate, video):
    path = encoded(tmp_path, suffix, codec, rate, video)
    with pytest.raises(soundfile.LibsndfileError):
        soundfile.info(path)  # the fallback is what reads it
    wav = load_audio(SPEECH)
    info = audio_info(path)
    assert (info.sample_rate, info.channels) == (rate, 1)
    assert info.num_frames == len(wav) * rate // 16000  # encoder delay and padding dropped
    waveform = load_audio(path)
    assert waveform.dtype == torch.float32 and waveform.shape == wav.shape
    assert correlation(waveform, wav) > 0.99  # the codec's error is small


@pytest.mark.parametrize(("suffix", "codec", "rate", "video"), CONTAINERS, ids=lambda v: str(v))
def test_offsets_into_containers_select_the_same_samples(tmp_path, suffix, codec, rate, video):
    whole = load_audio(encoded(tmp_path, suffix, codec, rate, video), None)
    path = tmp_path / f"speech.{suffix}"
    for offset, duration in [(0.1, 0.3), (1.2, 0.8), (2.0, None)]:  # past 0.5 s: a seek
        part = load_audio(path, None, offset, duration)
        first = round(offset * rate)
        expected = whole[first : len(whole) if duration is None else first + len(part)]
        assert len(part) == (len(expected) if duration is None else round(duration * rate))
        assert correlation(part, expected) > 0.999  # AAC adds its own noise after a seek
    with pytest.raises(AudioError, match="beyond the end") as caught:
        load_audio(path, offset=3.0)
    assert f"speech.{suffix}" in str(caught.value)


def test_stereo_m4a_is_the_channel_mean(tmp_path):
    import av

    left, right = sine(300.0, 16000, 1.0), sine(700.0, 16000, 1.0, amplitude=0.2)
    path = tmp_path / "stereo.m4a"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([left, right]), format="fltp", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = 16000, 0, Fraction(1, 16000)
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    assert audio_info(path).channels == 2
    mean = torch.from_numpy((left + right) / 2)
    assert correlation(load_audio(path), mean) > 0.99


def write_video_only(path: Path) -> None:
    import av

    with av.open(str(path), "w") as container:
        film = container.add_stream("mpeg4", rate=10)
        film.width, film.height, film.pix_fmt = 16, 16, "yuv420p"
        picture = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), "rgb24")
        container.mux(film.encode(picture))
        container.mux(film.encode(None))


def write_truncated_m4a(path: Path) -> None:
    encoded(path.parent, "m4a", "aac", 16000).rename(path)
    path.write_bytes(path.read_bytes()[:1500])  # the index at the end is gone


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (write_random_bytes, r"unreadable or corrupt audio \(libsndfile: .+; FFmpeg: .+\)"),
        (write_truncated_m4a, "unreadable or corrupt audio"),
        (write_video_only, "no audio stream in this mov,mp4"),
    ],
    ids=["random-bytes", "truncated", "video-only"],
)
def test_bad_containers_raise_audio_error_naming_the_file(tmp_path, make, reason):
    path = tmp_path / "bad_4711.m4a"
    make(path)
    for read in (audio_info, load_audio):
        with pytest.raises(AudioError, match=reason) as caught:
            read(path)
        assert "bad_4711.m4a" in str(caught.value)


def test_lengths_that_a_container_only_estimates_are_counted(tmp_path):
    path = encoded(tmp_path, "webm", "libopus", 48000)  # WebM's duration is rounded, if any
    assert audio_info(path).num_frames == len(load_audio(path, None))


def test_mp3s_joined_or_cut_short_are_as_long_as_they_decode(tmp_path):
    """An MP3's first frame states the length encoded: `cat a.mp3 b.mp3` kept only a.mp3's
    second, and a file cut short kept the whole file's length."""
    tones = [sine(440.0, 16000, 1.0), sine(880.0, 16000, 2.0)]
    for name, tone in zip("ab", tones, strict=True):
        soundfile.write(tmp_path / f"{name}.mp3", tone, 16000, format="MP3")
    encoded = [(tmp_path / f"{name}.mp3").read_bytes() for name in "ab"]
    (tmp_path / "joined.mp3").write_bytes(b"".join(encoded))
    (tmp_path / "cut.mp3").write_bytes(encoded[1][: len(encoded[1]) // 2])

    joined = load_audio(tmp_path / "joined.mp3")
    assert audio_info(tmp_path / "joined.mp3").num_frames == len(joined)
    assert len(joined) > 2.9 * 16000  # both, with b's encoder delay between them
    assert peak_frequency(joined[20000:44000], 16000) == pytest.approx(880.0, abs=2.0)
    cut = load_audio(tmp_path / "cut.mp3")
    assert audio_info(tmp_path / "cut.mp3").num_frames == len(cut) < 1.2 * 16000
    with pytest.raises(AudioError, match="offset 1.500 s is at or beyond the end"):
        load_audio(tmp_path / "cut.mp3", offset=1.5)


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        (np.array([-128, 0, 64], dtype=np.int8), [-1.0, 0.0, 0.5]),
        (np.array([0, 128, 192], dtype=np.uint8), [-1.0, 0.0, 0.5]),  # offset binary, as WAV
        (np.array([-32768, 16384], dtype=np.int16), [-1.0, 0.5]),
        (np.array([-(2**31), 2**30], dtype=np.int32), [-1.0, 0.5]),
        (np.array([0.5, 0.25], dtype=">f4"), [0.5, 0.25]),  # big-endian
        (np.array([0.25, 0.5], dtype=np.float64)[::-1], [0.5, 0.25]),  # a reversed view
        (torch.tensor([[0.5], [0.25]]), [0.5, 0.25]),
    ],
)
def test_arrays_of_every_pcm_and_float_kind_become_float_samples(samples, expected) -> None:
    assert mono_samples(samples).tolist() == expected


@pytest.mark.parametrize(
    ("samples", "said"),
    [
        (np.array([1000, -1000]), "got int64 (numpy's type for Python ints"),
        (np.array([True, False]), "got bool"),
        (np.array([1j]), "got complex128"),
        (np.array([0.5, 0.25], dtype=object), "got object"),  # no torch type: a TypeError
        (None, "samples must be a numpy array or a tensor, got NoneType"),
        (b"\x00\x01", "got bytes"),
        # features of samples this loud overflow to inf, and decoding stops in attention
        (np.array([0.5, 1e19]), "float samples lie within ±1, got 1e+19 (16-bit values as"),
        (np.array([2000.0], dtype=np.float32), "float samples lie within ±1, got 2000"),
        (torch.tensor(0.5), "got (): one sample: pass a sequence"),
        (np.zeros((2, 3)), "got (2, 3): mix the channels or pick one"),
    ],
)
def test_arrays_that_are_no_audio_are_refused_by_kind(samples, said) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        mono_samples(samples)


def test_what_takes_a_path_too_says_so_of_what_is_no_audio() -> None:
    with pytest.raises(ValueError, match="audio must be a file path, a numpy array or a tensor"):
        as_waveform([0.1, 0.2], None, 16000)


@pytest.mark.parametrize("rate", [0, -8000, 22050.5, True])
def test_a_sample_rate_is_a_positive_whole_number(rate) -> None:
    with pytest.raises(ValueError, match="sample_rate must be a whole number of Hz"):
        as_waveform(np.zeros(100, dtype=np.float32), rate, 16000)
    assert as_waveform(np.zeros(100, dtype=np.float32), np.int64(8000), 16000).numel() == 200


def test_audio_files_follow_linked_folders_once_and_skip_hidden_ones(tmp_path) -> None:
    real = tmp_path / "recordings" / "alice"
    real.mkdir(parents=True)
    for name in ("001.wav", "002.FLAC", "._001.wav", "notes.txt"):
        (real / name).write_bytes(b"")
    (real / ".cache").mkdir()
    (real / ".cache" / "x.wav").write_bytes(b"")
    (real / "folder.wav").mkdir()  # named like audio: listed for callers to refuse
    scan = tmp_path / "scan"
    scan.mkdir()
    (scan / "alice").symlink_to(real)
    (scan / "again").symlink_to(real)  # a second link to the same folder
    (real / "up").symlink_to(scan)  # a loop
    found = [p.relative_to(scan).as_posix() for p in audio_files(scan)]
    assert sorted(Path(p).name for p in found) == ["001.wav", "002.FLAC", "folder.wav"]


@pytest.mark.parametrize("subtype", ["GSM610", "G721_32"])
def test_formats_that_cannot_seek_are_read_at_an_offset(tmp_path, subtype):
    """libsndfile seeks no GSM 6.10 or G.721 file: a span is decoded from the start, what comes
    before it dropped, as the whole file's samples there (long audio reads spans so)."""
    rng = np.random.default_rng(0)
    path = tmp_path / ("a.wav" if subtype == "GSM610" else "a.au")
    soundfile.write(path, 0.3 * rng.standard_normal(48000).astype(np.float32), 16000,
                    subtype=subtype)  # fmt: skip
    whole = load_audio(path)
    span = load_audio(path, offset=1.25, duration=0.5)
    assert torch.equal(span, whole[20000:28000])


@pytest.mark.parametrize(
    ("suffix", "fmt", "subtype"),
    [("mp3", "MP3", None), ("wav", "MP3 in WAV", None), ("ogg", "OGG", "VORBIS")],
)
def test_spans_of_compressed_files_are_the_whole_files_samples_there(
    tmp_path, suffix, fmt, subtype
):
    """A span read at an offset equals the whole decode cut there: an MP3 frame's bits may lie
    in the frame before it (read from a pre-roll, in a WAV file too), and libsndfile's seek
    into a Vorbis file's last page lands late (FFmpeg reads those spans)."""
    seconds = np.arange(12 * 16000) / 16000
    chirp = (0.3 * np.sin(2 * np.pi * (200 + 30 * seconds) * seconds)).astype(np.float32)
    path = tmp_path / f"chirp.{suffix}"
    if fmt == "MP3 in WAV":
        encode_audio(path, chirp, 16000, "libmp3lame")
        assert soundfile.info(path).subtype == "MPEG_LAYER_III"
    else:
        soundfile.write(path, chirp, 16000, format=fmt, subtype=subtype)
    whole = load_audio(path)
    for offset in (0.5, 2.0, 11.0):
        span = load_audio(path, offset=offset, duration=0.25)
        start = round(offset * 16000)
        torch.testing.assert_close(span, whole[start : start + 4000], atol=1e-6, rtol=0)


def test_vorbis_spans_between_block_sizes_are_the_whole_files_samples_there(tmp_path):
    """Bursts switch Vorbis between block sizes, and FFmpeg stamps some frames between them a
    part of a block late: a span placed by such a stamp came 128 samples early."""
    rng = np.random.default_rng(0)
    bursts = np.zeros(8 * 16000, np.float32)
    start = 0
    while start < len(bursts):
        length = rng.integers(200, 4000)
        bursts[start : start + length] = 0.6 * rng.standard_normal(length)[: len(bursts) - start]
        start += length + rng.integers(200, 4000)
    path = tmp_path / "bursts.ogg"
    soundfile.write(path, bursts, 16000, format="OGG", subtype="VORBIS")
    whole = load_audio(path)
    for offset in np.arange(0.55, 7.5, 0.1):
        span = load_audio(path, offset=offset, duration=0.25)
        start = round(offset * 16000)
        torch.testing.assert_close(span, whole[start : start + 4000], atol=1e-6, rtol=0)


def test_a_long_file_that_cannot_seek_is_decoded_once_for_its_stretches(tmp_path, monkeypatch):
    """Each stretch of a GSM file decoded from the file's start made long audio quadratic: a
    source decodes it once and cuts its stretches, the samples a read at each offset gives."""
    import asr.segment
    from asr.segment import FileSource

    path = tmp_path / "a.wav"
    wave = 0.3 * np.random.default_rng(0).standard_normal(8000 * 6).astype(np.float32)
    soundfile.write(path, wave, 8000, subtype="GSM610")
    expected = [load_audio(path, 16000, offset=k, duration=1.5) for k in range(4)]
    reads = []
    monkeypatch.setattr(
        asr.segment, "load_audio", lambda *a, **k: reads.append(a) or load_audio(*a, **k)
    )
    source = FileSource(path, 16000)
    for k in range(4):
        assert torch.equal(source.read(k, k + 1.5), expected[k])
    energy, _ = source.energy_db(0.01, 2.0)
    assert len(reads) == 1 and len(energy) == 600


@pytest.mark.parametrize("rate", [44101, 11127, 8001])
def test_rates_sharing_no_factor_with_the_models_resample_to_the_same_speech(rate, monkeypatch):
    """44101 -> 16000 exactly needs a sinc kernel of 16000 x 44135 taps (GBs, tens of seconds):
    a near ratio of small terms gives the same tone, at the exact length."""
    seconds = np.arange(rate // 2) / rate
    tone = torch.from_numpy(0.5 * np.sin(2 * np.pi * 440 * seconds)).float()
    asked = []
    exact = torchaudio.functional.resample
    monkeypatch.setattr(torchaudio.functional, "resample",
                        lambda wave, a, b: asked.append((a, b)) or exact(wave, a, b))  # fmt: skip
    out = resample(tone, rate, 16000)
    assert asked and max(asked[0]) <= 2 * RESAMPLE_TERMS, "a kernel of small terms"
    assert out.shape == (math.ceil(len(tone) * 16000 / rate),)
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(len(out)) / 16000)
    inner = slice(200, -200)  # the filter's edges
    assert float(out.pow(2).mean().sqrt()) == pytest.approx(0.5 / math.sqrt(2), rel=0.01)
    if rate != 8001:  # 2/1 for 16000/8001: 0.0125 % slower, drifting in phase
        assert np.abs(out.numpy()[inner] - expected[inner]).max() < 0.01
