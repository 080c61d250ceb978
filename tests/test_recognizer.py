"""load_model and the decoding defaults: one source of truth for the API and the CLI."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import soundfile

import asr.recognizer
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
