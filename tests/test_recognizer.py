"""load_model and the decoding defaults: one source of truth for the API and the CLI."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
import soundfile
from test_transcribe import GREEDY, WAV, _overfit_recognizer

import asr.recognizer
from asr.audio import AudioError
from asr.checkpoint import CheckpointError, load_checkpoint
from asr.cli import main
from asr.recognizer import load_lm, load_model
from asr.search import DEFAULT_CTC_WEIGHT, SearchOptions


@pytest.fixture
def checkpoint(tiny_checkpoint, tmp_path):
    path = tmp_path / "model.ckpt"
    shutil.copy(tiny_checkpoint["checkpoint"], path)
    return path


def test_without_stored_settings_the_api_decodes_as_search_options_say(checkpoint):
    recognizer = load_model(checkpoint)
    assert recognizer.decoding is None
    assert recognizer.default_options == SearchOptions(ctc_weight=DEFAULT_CTC_WEIGHT)


def test_set_decoding_stores_settings_that_api_and_cli_decode_with(checkpoint, monkeypatch):
    assert main(["set-decoding", "--checkpoint", str(checkpoint), "--beam-size", "3",
                 "--ctc-weight", "0.6", "--max-len-ratio", "2"]) == 0  # fmt: skip
    expected = replace(SearchOptions(), beam_size=3, ctc_weight=0.6, max_len_ratio=2.0)
    assert load_model(checkpoint).default_options == expected

    used = []
    search = asr.recognizer.Recognizer.search

    def spy(self, waves, options=None, lm=None):
        used.append(options or self.default_options)
        return search(self, waves, options, lm)

    monkeypatch.setattr(asr.recognizer.Recognizer, "search", spy)
    wave = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    audio = checkpoint.parent / "a.wav"
    soundfile.write(audio, wave, 16000)
    load_model(checkpoint).transcribe(str(audio))
    out = checkpoint.parent / "out"
    assert main(["transcribe", str(audio), "--checkpoint", str(checkpoint),
                 "--output-dir", str(out), "--quiet"]) == 0  # fmt: skip
    assert main(["transcribe", str(audio), "--checkpoint", str(checkpoint), "--beam-size", "2",
                 "--output-dir", str(out), "--quiet"]) == 0  # fmt: skip
    assert used == [expected, expected, replace(expected, beam_size=2)]


def test_set_decoding_refuses_settings_the_model_cannot_decode_with(checkpoint, tmp_path):
    state = load_checkpoint(checkpoint)
    state["asr"]["model_config"]["ctc_weight"] = 0.0  # a model without a CTC head
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if ".ctc." not in k}
    import torch

    torch.save(state, tmp_path / "no_ctc.ckpt")
    assert main(["set-decoding", "--checkpoint", str(tmp_path / "no_ctc.ckpt"),
                 "--ctc-weight", "0.5"]) == 2  # fmt: skip


def test_load_lm_names_a_recognizer_checkpoint_for_what_it_is(checkpoint):
    with pytest.raises(CheckpointError, match="recognizer checkpoint"):
        load_lm(checkpoint)


# --------------------------------------------------------------------------- keyword options


@pytest.fixture(scope="module")
def overfit():
    """A tiny Transformer + CTC that recognises four AN4 utterances (test_transcribe's)."""
    return _overfit_recognizer(str(WAV))


def test_search_keywords_decode_as_the_search_options_they_set(overfit, monkeypatch):
    recognizer, waves = overfit
    used = []
    search = asr.recognizer.Recognizer.search

    def spy(self, waves, options=None, lm=None):
        used.append(options)
        return search(self, waves, options, lm)

    monkeypatch.setattr(asr.recognizer.Recognizer, "search", spy)
    options = SearchOptions(beam_size=3, ctc_weight=0.5, length_bonus=0.5, max_len_ratio=0.5)
    ways = [
        {"options": options},
        {"beam_size": 3, "ctc_weight": 0.5, "length_bonus": 0.5, "max_len_ratio": 0.5},
        {"options": SearchOptions(beam_size=3), "ctc_weight": 0.5, "length_bonus": 0.5,
         "max_len_ratio": 0.5},  # keywords set over the options given
    ]  # fmt: skip
    results = [[r.transcript for r in recognizer.transcribe_batch(waves, **w)] for w in ways]
    assert used == [options] * len(ways)  # one batch each
    for other in results[1:]:
        assert [t.tokens for t in other] == [t.tokens for t in results[0]]
        assert [t.score for t in other] == [t.score for t in results[0]]
    assert recognizer.transcribe(waves[0], beam_size=3).tokens == results[0][0].tokens
    assert used[-1] == replace(recognizer.default_options, beam_size=3)  # over the defaults


def test_unknown_keywords_are_named_and_bad_values_refused(overfit):
    recognizer, waves = overfit
    with pytest.raises(TypeError, match=r"'beam' \(did you mean 'beam_size'\?\)"):
        recognizer.transcribe(waves[0], beam=3)
    with pytest.raises(TypeError, match=r"'timestamps' \(did you mean 'word_timestamps'\?\)"):
        recognizer.transcribe_batch(waves, timestamps="ctc")
    with pytest.raises(TypeError, match="unknown keyword argument 'nbest'"):
        recognizer.transcribe(waves[0], nbest=2)  # search keeps only the best hypothesis
    with pytest.raises(TypeError):  # everything after the audio is a keyword
        recognizer.transcribe(waves[0], 16000)
    with pytest.raises(ValueError, match="word_timestamps must be one of"):
        recognizer.transcribe(waves[0], word_timestamps=True)
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        recognizer.transcribe(waves[0], beam_size=0)


def test_word_timestamps_choose_how_words_are_timed(overfit):
    recognizer, waves = overfit
    ctc = recognizer.transcribe(waves[0], options=GREEDY, word_timestamps="ctc")
    attention = recognizer.transcribe(waves[0], options=GREEDY)
    decoded = recognizer.search([waves[0]], GREEDY)[0]
    assert ctc.words == recognizer.words(decoded, "ctc")
    assert attention.words == recognizer.words(decoded, "attention") != ctc.words


def test_a_bad_input_of_a_batch_fails_alone_and_named(overfit, tmp_path):
    recognizer, waves = overfit
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF not really a wave file")
    stereo, tiny = np.zeros((2, 16000), dtype=np.float32), np.zeros(80, dtype=np.float32)
    results = recognizer.transcribe_batch([waves[0], corrupt, stereo, tiny, waves[1]])
    names = ["<waveform 0>", str(corrupt), "<waveform 2>", "<waveform 3>", "<waveform 4>"]
    assert [r.name for r in results] == names
    assert [r.transcript.text for r in (results[0], results[4])] == ["YES", "GO"]
    assert results[0].error is None and results[0].transcript_or_raise() is results[0].transcript
    reasons = ["unreadable or corrupt audio", "mono waveform", "cannot be decoded: .*too short"]
    for result, reason in zip(results[1:4], reasons):
        assert result.transcript is None and re.search(reason, result.error.reason)
        with pytest.raises(AudioError, match=f"^{re.escape(result.name)}: .*{reason}"):
            result.transcript_or_raise()
    with pytest.raises(AudioError, match=f"^{re.escape(str(corrupt))}: unreadable"):
        recognizer.transcribe(corrupt)  # one input: its error is raised
