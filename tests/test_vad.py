"""`vad="silero"`: segments where Silero VAD hears speech, nothing where it hears none."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile
import torch
from conftest import REPO
from test_transcribe import GREEDY, RATE, WAV, _overfit_recognizer, make_three_minutes

from asr.audio import load_audio
from asr.levels import frame_energy_db, loud_level
from asr.segment import (
    ArraySource,
    FileSource,
    SegmenterOptions,
    segment_source,
)
from asr.vad import StreamingVAD, speech_probabilities

SILERO = SegmenterOptions(vad="silero")


@pytest.fixture(scope="module")
def three_minutes(tmp_path_factory) -> dict:
    return make_three_minutes(tmp_path_factory.mktemp("long"))


def test_silero_segments_hold_every_utterance_and_cut_in_the_gaps(three_minutes):
    spans = segment_source(FileSource(three_minutes["path"], RATE), SILERO)
    assert all(0 < end - start <= SILERO.longest for start, end in spans)
    for start, end in three_minutes["spans"]:  # each utterance inside one segment
        assert any(s <= start + 0.1 and end - 0.1 <= e for s, e in spans), (start, end)
    for s, e in spans:  # segments start and end in the 2 s gaps (or the file's edges)
        for t in (s, e):
            assert any(g0 - 0.1 <= t <= g1 + 0.1 for g0, g1 in three_minutes["gaps"]), t
    assert spans[0][0] > three_minutes["gaps"][0][1] - 0.6  # edge silence trimmed to 0.5 s
    assert spans[-1][1] < three_minutes["gaps"][-1][0] + 0.6


def test_reading_in_pieces_gives_the_probabilities_of_the_whole(three_minutes):
    source = FileSource(three_minutes["path"], RATE)
    whole, frame = speech_probabilities(source, read_seconds=1000.0)
    pieces, _ = speech_probabilities(source, read_seconds=7.3)
    assert frame == 0.032 and len(whole) == len(pieces)
    np.testing.assert_allclose(pieces, whole, atol=1e-4)


@pytest.mark.parametrize("kind", ["silence", "white noise", "faint white noise"])
def test_no_speech_gives_no_segments(kind):
    """Faint noise (-70 dBFS) is raised to a normal level too, and is still no speech."""
    rng = np.random.default_rng(0)
    scale = {"silence": 0.0, "white noise": 0.05, "faint white noise": 10 ** (-70 / 20)}[kind]
    wave = torch.from_numpy((scale * rng.standard_normal(10 * RATE)).astype(np.float32))
    assert segment_source(ArraySource(wave, RATE), SILERO) == []
    live = StreamingVAD(RATE)
    assert (live.push(wave.numpy()) < live.threshold).all()
    energy = segment_source(ArraySource(wave, RATE), SegmenterOptions())
    assert (energy == []) == (kind == "silence"), "energy keeps the noise, not digital silence"


def test_eight_khz_audio_is_read_at_its_rate_and_other_rates_resampled(three_minutes):
    audio = torch.from_numpy(three_minutes["audio"][: 30 * RATE])
    spans16 = segment_source(ArraySource(audio, RATE), SILERO)
    for rate in (8000, 22050):
        resampled = torch.from_numpy(load_audio(three_minutes["path"], rate).numpy()[: 30 * rate])
        spans = segment_source(ArraySource(resampled, rate), SILERO)
        assert len(spans) == len(spans16)
        for (s, e), (s16, e16) in zip(spans, spans16):
            assert abs(s - s16) < 0.3 and abs(e - e16) < 0.3


def test_quiet_speech_is_heard_as_at_a_normal_level(three_minutes):
    """Silero misses speech far below a normal level, which the energy splitter (its levels are
    relative) and the model (it normalises its own) take: quiet input is raised first. Input
    whose loudest 0.1 s is under -90 dBFS holds no speech, as for the energy splitter."""
    audio = three_minutes["audio"][: 30 * RATE]
    spans = segment_source(ArraySource(torch.from_numpy(audio), RATE), SILERO)
    for quieter in (audio * 1e-3, audio * 3e-3 + 3e-3):  # -80 dB; -70 dB over a DC offset
        quiet = segment_source(ArraySource(torch.from_numpy(quieter), RATE), SILERO)
        assert len(quiet) == len(spans)
        for (s, e), (s1, e1) in zip(quiet, spans):
            assert abs(s - s1) < 0.1 and abs(e - e1) < 0.1
    live = StreamingVAD(RATE)  # the level heard so far: each utterance louder than -90 dBFS
    live.push(audio * 3e-3)
    for start, end in [span for span in three_minutes["spans"] if span[1] <= 30]:
        assert live.silence(end, since=start) < 0.5, (start, end)  # its end heard as speech
    silent = torch.from_numpy(audio * 1e-4)
    assert loud_level(frame_energy_db(silent.numpy(), 160), 0.01) < -90
    assert segment_source(ArraySource(silent, RATE), SILERO) == []


def test_transcribe_with_silero_vad(tmp_path):
    recognizer, _ = _overfit_recognizer(str(WAV))
    noise = tmp_path / "noise.wav"
    hiss = 0.05 * np.random.default_rng(0).standard_normal(3 * RATE)
    soundfile.write(noise, hiss.astype(np.float32), RATE)
    speech = WAV / "an4_clstk/fash/an251-fash-b.wav"
    energy = recognizer.transcribe(speech, options=GREEDY)
    assert recognizer.transcribe(speech, options=GREEDY, vad="silero").text == energy.text
    assert len(recognizer.transcribe(noise, options=GREEDY).segments) == 1  # decoded
    nothing = recognizer.transcribe(noise, options=GREEDY, vad="silero")
    assert nothing.text == "" and nothing.segments == []  # not even decoded
    with pytest.raises(ValueError, match="vad must be 'energy' or 'silero'"):
        recognizer.transcribe(noise, vad="webrtc")


def test_a_live_vad_hears_the_same_in_any_pieces_as_the_offline_track(three_minutes):
    """Offline, Silero's gain comes from the whole input's level; live, from the level heard
    so far (louder at first): the same speech all the same."""
    audio = three_minutes["audio"][: 20 * RATE + 300]
    whole = StreamingVAD(RATE).push(audio)
    vad, parts, start = StreamingVAD(RATE), [], 0
    for size in np.random.default_rng(0).integers(1, 4000, size=len(audio)):
        parts.append(vad.push(audio[start : start + size]))
        start += size
        if start >= len(audio):
            break
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    offline, frame = speech_probabilities(ArraySource(torch.from_numpy(audio), RATE))
    level = loud_level(frame_energy_db(audio, 160), 0.01)
    known = StreamingVAD(RATE, level_db=level).push(audio)
    assert len(offline) == len(known) + 1  # the last, incomplete chunk padded
    np.testing.assert_array_equal(offline[: len(known)], known)
    assert frame == 0.032
    assert ((offline[: len(whole)] >= 0.5) == (whole >= 0.5)).mean() > 0.98


def test_audio_read_ahead_does_not_hide_a_pause(three_minutes):
    """Two utterances pushed in one piece: at the end of the first one's pause the VAD has
    heard the second, but the pause is silence all the same, as in small pieces."""
    gap_end = three_minutes["gaps"][1][1]
    audio, until = three_minutes["audio"], gap_end - 0.1
    ahead, step = StreamingVAD(RATE), StreamingVAD(RATE)
    ahead.push(audio[: round((gap_end + 3) * RATE)])  # the second utterance's start too
    step.push(audio[: round(until * RATE)])
    assert ahead.speech_end > gap_end
    assert ahead.silence(until) == step.silence(until) >= 1.5


def test_a_live_vad_times_the_silence_since_speech(three_minutes):
    (start, end), (gap_start, gap_end) = three_minutes["spans"][0], three_minutes["gaps"][1]
    vad = StreamingVAD(RATE)
    vad.push(three_minutes["audio"][: round(gap_end * RATE)])
    assert start < vad.speech_end <= end + 0.1 and gap_start == end
    assert vad.silence(gap_end) >= 1.9  # the 2 s gap after the utterance
    assert vad.silence(gap_end, since=gap_end - 0.5) == pytest.approx(0.5)
    assert vad.silence((start + end) / 2) <= 0.5  # within the utterance: a word-long pause
    with pytest.raises(ValueError, match="16000 or 8000 Hz"):
        StreamingVAD(22050)


def test_loading_silero_leaves_torchs_thread_count_alone():
    """The silero-vad package sets torch's threads to 1 on import (`--threads` then meant
    nothing): its graph is loaded without importing it. In a process of its own, where the
    package is not imported yet."""
    code = (
        "import numpy, torch; torch.set_num_threads(2); from asr.vad import StreamingVAD; "
        "StreamingVAD(16000).push(numpy.zeros(16000, 'float32')); print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2"]
