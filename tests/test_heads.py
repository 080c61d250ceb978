"""`asr choose-heads`: the attention maps whose word times agree best with CTC alignment."""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch
from test_evaluate import _manifest
from test_transcribe import UTTERANCES, WAV, _overfit_recognizer

from asr.cli import main
from asr.heads import choose_heads, reference_alignments, score_heads
from asr.recognizer import load_model
from asr.timing import attention_timestamps


@pytest.fixture(scope="module")
def overfit():
    return _overfit_recognizer(str(WAV))


def test_the_chosen_maps_time_words_no_farther_from_ctc_than_all_maps(overfit, tmp_path):
    recognizer, waves = overfit
    alignments = reference_alignments(recognizer, _manifest(tmp_path / "m.jsonl", UTTERANCES),
                                      progress=False)  # fmt: skip
    assert len(alignments) == len(UTTERANCES)
    choice = choose_heads(recognizer, alignments)
    maps = alignments[0].attention.size(0)
    assert choice.per_head.shape == (len(alignments), maps) and choice.chosen
    assert set(choice.chosen) <= set(range(maps))
    # The best prefix of the ranking, all maps among them (here all 4 were best; on the AN4
    # Transformer 4 of 8 beat all 8: recipes/an4/RESULTS.md, "Word times").
    assert choice.chosen_errors.mean() <= choice.all_heads.mean()
    best_single = choice.per_head.mean(0).min()
    assert choice.chosen_errors.mean() <= best_single + 1e-9  # the best prefix, one map included
    again = score_heads(recognizer, alignments, choice.chosen)
    np.testing.assert_allclose(again.chosen_errors, choice.chosen_errors)
    assert "| all maps |" in choice.table() and f"chosen {choice.chosen}" in choice.table()
    assert f"| given {choice.chosen} |" in again.table()  # named by the user, not chosen

    # A recognizer told the maps times words from them.
    chosen = replace(recognizer, alignment_heads=choice.chosen)
    [decoded] = chosen.search(waves[:1])
    expected = attention_timestamps(decoded.hypothesis.attention, chosen.frame_seconds,
                                    choice.chosen)[: len(decoded.hypothesis.tokens)]  # fmt: skip
    assert chosen.token_times(decoded) == expected


def test_a_map_that_does_not_follow_the_audio_is_left_out_and_boundaries_improve(overfit, tmp_path):
    """The trained tiny model's maps all follow the audio; maps 0-2 replaced by one that runs
    backwards (token i attends to the frame as far from the end as it should be from the
    start) do not. Choosing must leave them out, and beat averaging all maps. (Averaged with
    three maps that follow the audio, the tiny model's times absorb one such map.)"""
    recognizer, _ = overfit
    alignments = reference_alignments(recognizer, _manifest(tmp_path / "m.jsonl", UTTERANCES),
                                      progress=False)  # fmt: skip
    flipped = []
    for a in alignments:
        attention = a.attention.clone()
        rows, frames = attention.shape[1:]
        backwards = torch.linspace(frames - 1, 0, rows).round().long()
        attention[:3] = torch.nn.functional.one_hot(backwards, frames).float()
        flipped.append(replace(a, attention=attention))
    choice = choose_heads(recognizer, flipped)
    assert choice.chosen == [3]
    assert choice.chosen_errors.mean() < choice.all_heads.mean()


def test_references_that_cannot_be_aligned_are_counted(overfit, tmp_path, caplog):
    recognizer, _ = overfit
    ids = list(UTTERANCES)
    too_long = " ".join([UTTERANCES[ids[3]]] * 8)  # more tokens than CTC has frames for
    texts = {ids[0]: UTTERANCES[ids[0]], ids[1]: "日本", ids[2]: "!!!", ids[3]: too_long}
    with caplog.at_level(logging.WARNING, logger="asr.heads"):
        alignments = reference_alignments(recognizer, _manifest(tmp_path / "m.jsonl", texts),
                                          progress=False)  # fmt: skip
    assert len(alignments) == 1
    stem = [Path(i).name for i in ids]  # the manifest's ids: named, to be found
    left_out = (f"1 outside the vocabulary ({stem[1]}), 1 no words ({stem[2]}), "
                f"1 CTC could not align ({stem[3]})")  # fmt: skip
    assert f"3 of 4 utterances left out: {left_out}" in caplog.text
    with pytest.raises(
        ValueError, match=rf"no utterance could be aligned \(1 no words \({stem[0]}"
    ):
        reference_alignments(recognizer, _manifest(tmp_path / "n.jsonl", {ids[0]: "!!!"}),
                             progress=False)  # fmt: skip


def test_audio_that_cannot_be_read_is_listed_naming_its_file_once(overfit, tmp_path):
    recognizer, _ = overfit
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    first = WAV / f"{next(iter(UTTERANCES))}.wav"
    cut = tmp_path / "cut.flac"  # its header whole, its stream cut: read only as it decodes
    soundfile.write(cut, soundfile.read(first)[0], 16000)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    lines = manifest.read_text().splitlines()
    lines[0] = lines[0].replace(str(first), str(cut))
    manifest.write_text("\n".join(lines) + "\n")
    failures: list[str] = []
    reference_alignments(recognizer, manifest, progress=False, failures=failures)
    assert len(failures) == 1 and failures[0].count(str(cut)) == 1, failures


def test_maps_that_are_not_the_models_are_refused_before_aligning(tiny_checkpoint, capsys):
    """--heads 99, or a map twice, stop before the manifest is aligned (a missing one here)."""
    model = str(tiny_checkpoint["checkpoint"])
    maps = load_model(model).model.decoder.num_attention_maps
    for heads, said in ((["99"], f"maps [99]: this model's are 0 to {maps - 1}"),
                        (["1", "1"], "maps [1, 1]: each map once")):  # fmt: skip
        command = ["choose-heads", "--model", model, "--manifest", "missing.jsonl", "--heads"]
        assert main([*command, *heads]) == 2
        assert said in capsys.readouterr().err


def test_one_attention_map_leaves_nothing_to_choose(monkeypatch, capsys):
    rnn = SimpleNamespace(model=SimpleNamespace(decoder=SimpleNamespace(num_attention_maps=1)),
                          checkpoint="rnn.ckpt")  # fmt: skip
    with pytest.raises(ValueError, match="rnn.ckpt: one attention map, nothing to choose"):
        choose_heads(rnn, [])
    # the command says so before aligning the manifest (a missing one here)
    monkeypatch.setattr("asr.cli._load_model", lambda args: rnn)
    assert main(["choose-heads", "--model", "rnn.ckpt", "--manifest", "missing.jsonl"]) == 2
    assert "one attention map, nothing to choose" in capsys.readouterr().err


def test_finalize_stores_the_choice_that_load_model_reads(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    checkpoint = tmp_path / "model.ckpt"
    shutil.copy(tiny_checkpoint["checkpoint"], checkpoint)
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    assert load_model(checkpoint).alignment_heads is None
    args = ["--checkpoint", str(checkpoint), "--manifest", str(manifest), "--quiet"]
    assert main(["finalize", *args]) == 0
    stored, said = load_model(checkpoint).alignment_heads, capsys.readouterr()
    assert stored and f"alignment maps {stored}:" in said.out
    assert said.err.endswith("decoding, alignment maps stored; confidence cleared\n")  # too few
    assert "confidence: not fitted" in said.out
    without_ctc = load_model(checkpoint)
    without_ctc.model.ctc = None  # named as the maps it stored are
    monkeypatch.setattr("asr.cli._load_model", lambda args: without_ctc)
    assert main(["finalize", *args, "--ctc-weight", "0"]) == 0
    said = capsys.readouterr()
    assert "alignment maps: not fitted (no CTC head to compare attention times with)" in said.out
    assert said.err.endswith("decoding stored; confidence, alignment maps cleared\n")
    monkeypatch.undo()
    assert main(["choose-heads", *args, "--heads", "0"]) == 0
    assert "| given [0] |" in capsys.readouterr().out
