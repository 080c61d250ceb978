"""The model package (`asr export`, `asr.package`): a checkpoint and its package decode
identically, weights are read only from safetensors (a pickle is refused, naming the file),
`hf://owner/name` resolves offline from a Hugging Face cache, and the model card.

Two models: the tiny Transformer overfit in memory on four AN4 utterances (it recognises them,
so "same hypotheses" means the same right transcripts), saved as `asr fit` saves a checkpoint;
and a checkpoint written by `asr fit` itself (GlobalCMVN statistics as an asset, tied decoder
embeddings), for the command line. No test touches the network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from conftest import REPO
from test_evaluate import TEST_UTTERANCES
from test_transcribe import UTTERANCES, WAV, _overfit_recognizer, fit_tiny_checkpoint

import asr
import asr.package
from asr.audio import audio_info
from asr.checkpoint import (
    RECOGNIZER_KEY,
    CheckpointError,
    checkpoint_payload,
    load_checkpoint,
    submodule_weights,
    weights_digest,
)
from asr.cli import main
from asr.data.manifest import Utterance, write_manifest
from asr.evaluate import evaluate
from asr.package import (
    ALIASES,
    CARD_FILE,
    CONFIG_FILE,
    RESULTS_HEADER,
    WEIGHTS_FILE,
    ModelCard,
    read_safetensors,
    results_row,
    results_tables,
    write_package,
)
from asr.search import SearchOptions
from asr.streaming import StreamOptions, _with_model_search
from asr.text import CharTokenizer

OVERFIT_CONFIG = {  # the architecture `_overfit_recognizer` trains, as `asr fit` records it
    "frontend": {
        "class_path": "asr.frontends.Frontend",
        "init_args": {
            "features": {"class_path": "asr.frontends.LogMelFilterbank",
                         "init_args": {"n_mels": 40}},
            "normalize": {"class_path": "asr.frontends.UtteranceCMVN",
                          "init_args": {"norm_vars": True}},
        },
    },
    "encoder": {
        "class_path": "asr.models.transformer.TransformerEncoder",
        "init_args": {"d_model": 64, "num_heads": 4, "ffn_dim": 128, "num_layers": 2, "dropout": 0},
    },
    "decoder": {
        "class_path": "asr.models.transformer.TransformerDecoder",
        "init_args": {"d_model": 64, "num_heads": 4, "ffn_dim": 128, "num_layers": 1, "dropout": 0},
    },
    "ctc_weight": 0.3,
}  # fmt: skip
DECODING = {"beam_size": 3, "ctc_weight": 0.3}  # as `asr finalize` stores them


def save_overfit_checkpoint(folder: Path) -> Path:
    """The overfit recognizer saved as `asr fit` saves a checkpoint, decoding defaults set."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    config = OVERFIT_CONFIG | {"vocab_size": recognizer.tokenizer.vocab_size}
    state = {f"model.{k}": v for k, v in recognizer.model.state_dict().items()}
    payload = checkpoint_payload(config, recognizer.tokenizer, decoding=DECODING)
    torch.save({"state_dict": state, RECOGNIZER_KEY: payload}, folder / "overfit.ckpt")
    return folder / "overfit.ckpt"


@pytest.fixture(scope="module")
def overfit_checkpoint(tmp_path_factory) -> Path:
    return save_overfit_checkpoint(tmp_path_factory.mktemp("overfit"))


@pytest.fixture(scope="module")
def fit_checkpoint(tmp_path_factory) -> Path:
    return fit_tiny_checkpoint(tmp_path_factory.getbasetemp() / "tiny_fit")


def _waves() -> list[Path]:
    return [WAV / f"{p}.wav" for p in UTTERANCES]


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


# --------------------------------------------------------------------------- round trip


def test_a_package_decodes_as_its_checkpoint(overfit_checkpoint, tmp_path):
    written = write_package(overfit_checkpoint, tmp_path / "pkg")
    assert sorted(written) == sorted(
        ["model.safetensors", "config.json", "tokenizer/tokenizer.json", "README.md"]
    )
    from_ckpt, from_package = asr.load_model(overfit_checkpoint), asr.load_model(tmp_path / "pkg")
    _assert_same_weights(from_ckpt.model, from_package.model)
    assert from_package.default_options == from_ckpt.default_options
    assert (from_package.default_options.beam_size, from_package.default_options.ctc_weight) == (
        3,
        0.3,
    )
    texts = []
    for wav in _waves():  # the default (joint CTC beam) search and word times
        ours, theirs = from_ckpt.transcribe(wav), from_package.transcribe(wav)
        assert ours == theirs
        texts.append(theirs.text)
    assert texts == list(UTTERANCES.values()), "the package recognises what the model learnt"
    greedy = [from_package.transcribe(w, beam_size=1, ctc_weight=0.0).text for w in _waves()]
    assert greedy == texts


def test_the_weights_file_holds_the_checkpoints_weights_once(overfit_checkpoint, tmp_path):
    write_package(overfit_checkpoint, tmp_path / "pkg")
    stored = read_safetensors(tmp_path / "pkg" / WEIGHTS_FILE)
    state = load_checkpoint(overfit_checkpoint)["state_dict"]
    assert stored.keys() == {k.removeprefix("model.") for k in state}
    for name, tensor in stored.items():
        assert torch.equal(tensor, state[f"model.{name}"]), name
    from safetensors import safe_open

    with safe_open(str(tmp_path / "pkg" / WEIGHTS_FILE), framework="pt") as f:
        on_disk = set(f.keys())
    tied = "decoder.output.weight"  # the output projection shares the embedding's storage
    assert tied in stored and tied not in on_disk


def test_the_cli_exports_a_fit_checkpoint_with_its_cmvn_statistics(fit_checkpoint, tmp_path):
    pkg = tmp_path / "pkg"
    args = ["--checkpoint", str(fit_checkpoint), "--out", str(pkg), "--format", "package"]
    assert main(["export", *args]) == 0
    config = json.loads((pkg / CONFIG_FILE).read_text())
    stats = config["model_config"]["frontend"]["init_args"]["normalize"]["init_args"]
    assert stats["stats_path"] == "cmvn.json" and config["assets"] == ["cmvn.json"]
    original = fit_checkpoint.parents[1] / "cmvn.json"
    assert (pkg / "cmvn.json").read_bytes() == original.read_bytes()
    assert config["segment_seconds"] == load_checkpoint(fit_checkpoint)["asr"]["segment_seconds"]
    # None stored, none written: the live search's defaults are not the offline ones
    assert "decoding" not in config and "None stored" in (pkg / CARD_FILE).read_text()
    from_ckpt, from_package = asr.load_model(fit_checkpoint), asr.load_model(pkg)
    assert from_package.default_options == from_ckpt.default_options
    live = [_with_model_search(StreamOptions(), r) for r in (from_ckpt, from_package)]
    assert live[0] == live[1]
    _assert_same_weights(from_ckpt.model, from_package.model)
    for wav in _waves():
        a, b = (
            from_ckpt.search([from_ckpt.load(wav)]),
            from_package.search([from_package.load(wav)]),
        )
        assert a[0].hypothesis.tokens == b[0].hypothesis.tokens
        assert a[0].hypothesis.score == b[0].hypothesis.score
        assert torch.equal(a[0].hypothesis.attention, b[0].hypothesis.attention)


def test_a_quoted_home_checkpoint_exports_as_it_loads(overfit_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copy(overfit_checkpoint, tmp_path / "model.ckpt")
    out = tmp_path / "pkg"
    assert main(["export", "--checkpoint", "~/model.ckpt", "--out", str(out)]) == 0
    assert (out / CONFIG_FILE).is_file()


def test_finalize_stores_a_scaling_that_checkpoint_and_package_words_carry(
    overfit_checkpoint, tmp_path, capsys
):
    ckpt = tmp_path / "model.ckpt"
    shutil.copy(overfit_checkpoint, ckpt)
    files = {WAV / f"{p}.wav": t for p, t in {**UTTERANCES, **TEST_UTTERANCES}.items()}
    manifest = tmp_path / "dev.jsonl"  # learnt utterances (right words) and unseen ones (wrong)
    short = tmp_path / "click.wav"  # too short for the encoder, as a missing file: left out
    soundfile.write(short, np.zeros(480, np.float32), 16000)
    write_manifest(manifest, [Utterance(str(f), audio_info(f).duration, t, f.stem)
                              for f, t in files.items()]
                   + [Utterance(str(short), 0.03, "YES", "click"),
                      Utterance(str(tmp_path / "gone.wav"), 1.0, "NO", "gone")])  # fmt: skip
    args = ["--checkpoint", str(ckpt), "--manifest", str(manifest), "--quiet"]
    assert main(["calibrate", *args]) == 1
    printed, said = capsys.readouterr()
    assert "2 manifest line(s) or utterance(s) left out" in said
    assert f"{short} (click)" in said and "gone.wav" in said
    assert main(["choose-heads", *args]) == 1
    printed, said = capsys.readouterr()
    assert "chosen" in printed and f"{short} (click)" in said and "gone.wav" in said
    assert main(["finalize", *args]) == 1
    printed, said = capsys.readouterr()
    assert "probability: ECE" in printed and "confidence: ECE" in printed
    assert "caution: fitted on only " in printed, "a few utterances' words"
    assert "alignment maps [" in printed, "the click is left out of choosing them too"
    assert f"{short} (click)" in said and said.count("gone.wav") == 1
    recognizer = asr.load_model(ckpt)
    scaling = recognizer.confidence_scaling
    assert scaling is not None and f"{scaling.scale:.4f} * log(probability)" in printed
    write_package(ckpt, tmp_path / "pkg")
    assert asr.load_model(tmp_path / "pkg").confidence_scaling == scaling
    words = recognizer.transcribe(_waves()[-1]).words
    assert words and all(w.ctc_probability is not None for w in words)
    assert all(w.confidence == scaling(w.probability, w.ctc_probability) for w in words)

    metrics = evaluate(recognizer, manifest, tmp_path / "eval", plots=0, progress=False,
                       skip_bad=True)  # fmt: skip
    report = metrics["confidence"]
    assert report["scaling"] == scaling.as_dict()
    mean_confidence = sum(b["mean_confidence"] * b["words"] for b in report["bins"] if b["words"])
    assert mean_confidence / report["words"] == pytest.approx(report["accuracy"], abs=1e-4), (
        "fitted on these very words, the confidences average to the share right"
    )


def test_on_words_all_right_calibrate_fails_and_finalize_stores_no_scaling(
    overfit_checkpoint, tmp_path, capsys
):
    ckpt = tmp_path / "model.ckpt"
    shutil.copy(overfit_checkpoint, ckpt)
    files = {WAV / f"{p}.wav": t for p, t in UTTERANCES.items()}
    manifest = tmp_path / "dev.jsonl"  # only learnt utterances: every word is right
    write_manifest(manifest, [Utterance(str(f), audio_info(f).duration, t, f.stem)
                              for f, t in files.items()]
                   + [Utterance(str(tmp_path / "gone.wav"), 1.0, "NO", "gone")])  # fmt: skip
    args = ["--checkpoint", str(ckpt), "--manifest", str(manifest), "--quiet"]
    assert main(["calibrate", *args]) == 2
    assert "both right and wrong words" in capsys.readouterr().err
    assert main(["finalize", *args, "--beam-size", "2"]) == 1  # a file left out, still named
    printed, said = capsys.readouterr()
    assert "confidence: not fitted (" in printed and "gone.wav" in said
    recognizer = asr.load_model(ckpt)
    assert recognizer.confidence_scaling is None and recognizer.default_options.beam_size == 2


def test_transcribe_takes_a_package_as_model(fit_checkpoint, tmp_path, capsys):
    write_package(fit_checkpoint, tmp_path / "pkg")
    wavs = [str(w) for w in _waves()]
    args = ["transcribe", *wavs, "--quiet", "--beam-size", "2", "--length-bonus", "1"]
    assert main([*args, "--checkpoint", str(fit_checkpoint)]) == 0
    from_ckpt = capsys.readouterr().out
    assert main([*args, "--model", str(tmp_path / "pkg")]) == 0
    assert capsys.readouterr().out == from_ckpt
    assert all(wav in from_ckpt for wav in wavs) and "-->" in from_ckpt


def test_exporting_again_replaces_the_package_and_keeps_other_files(overfit_checkpoint, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / ".git").mkdir(parents=True)
    write_package(overfit_checkpoint, pkg)
    (pkg / "tokenizer" / "tokenizer.model").write_bytes(b"a stale SentencePiece model")
    (pkg / "tokenizer" / "sub").mkdir()
    write_package(overfit_checkpoint, pkg)
    assert sorted(p.name for p in pkg.iterdir()) == [
        ".git",
        "README.md",
        "config.json",
        "model.safetensors",
        "tokenizer",
    ], "no temporary file left behind"
    assert [p.name for p in (pkg / "tokenizer").iterdir()] == ["tokenizer.json"]


def test_exporting_again_over_links_replaces_them_and_leaves_their_targets(
    overfit_checkpoint, tmp_path
):
    """A package whose tokenizer/ (or onnx/) was a link to a folder elsewhere: the export
    stopped with a bare 'File exists' after removing the graphs, leaving a broken package."""
    pkg, elsewhere = tmp_path / "pkg", tmp_path / "elsewhere"
    write_package(overfit_checkpoint, pkg)
    (pkg / "tokenizer").rename(elsewhere)
    (pkg / "tokenizer").symlink_to(elsewhere)
    (pkg / "onnx").symlink_to(elsewhere)
    kept = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    write_package(overfit_checkpoint, pkg)
    assert (pkg / "tokenizer").is_dir() and not (pkg / "tokenizer").is_symlink()
    assert not (pkg / "onnx").exists() and not (pkg / "onnx").is_symlink()
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == kept
    asr.load_model(pkg)


@pytest.mark.parametrize("repo_id", ["me/an4..x", "-me/an4", "me/x.git", "mé/x", "an4"])
def test_a_repo_id_the_hub_refuses_is_refused_before_writing(
    overfit_checkpoint, tmp_path, capsys, repo_id
):
    """The card's own `hf://` examples would be refused by `hf://` itself."""
    args = ["export", "--model", str(overfit_checkpoint), "--out", str(tmp_path / "pkg")]
    with pytest.raises(SystemExit):
        main([*args, f"--repo-id={repo_id}"])
    assert "--repo-id: must be owner/name as the Hub takes it" in capsys.readouterr().err
    with pytest.raises(ValueError):
        write_package(overfit_checkpoint, tmp_path / "pkg", card=ModelCard(repo_id=repo_id))
    assert not (tmp_path / "pkg").exists()


def test_exporting_again_removes_the_graphs_of_the_earlier_weights(overfit_checkpoint, tmp_path):
    """ONNX graphs left from an earlier export decoded with the other model's weights (or
    crashed where the families differ): a new export, with or without graphs, removes them."""
    pkg = tmp_path / "pkg"
    write_package(overfit_checkpoint, pkg)
    (pkg / "onnx").mkdir()
    (pkg / "onnx" / "encoder.onnx").write_bytes(b"another model's graph")
    write_package(overfit_checkpoint, pkg)
    assert not (pkg / "onnx").exists()
    for folder in ("onnx", "tokenizer"):  # not a package's: left alone, the export refused
        mine = tmp_path / f"mine_{folder}"
        (mine / folder).mkdir(parents=True)
        (mine / folder / "notes.txt").write_text("mine")
        with pytest.raises(ValueError, match="holds no package: export into another folder"):
            write_package(overfit_checkpoint, mine)
        assert [p.name for p in mine.iterdir()] == [folder]
        assert (mine / folder / "notes.txt").read_text() == "mine"
        (mine / "config.json").write_text('{"model_type": "bert"}')  # another library's
        with pytest.raises(ValueError, match="holds no package: export into another folder"):
            write_package(overfit_checkpoint, mine)
        assert (mine / "config.json").read_text() == '{"model_type": "bert"}'
        assert (mine / folder / "notes.txt").read_text() == "mine"
    for name in ("README.md", "model.safetensors"):  # a project's own, not a package's
        mine = tmp_path / f"mine_{name}"
        mine.mkdir()
        (mine / name).write_text("mine")
        with pytest.raises(ValueError, match=f"{name} there, and .* holds no package: export"):
            write_package(overfit_checkpoint, mine)
        assert [p.name for p in mine.iterdir()] == [name] and (mine / name).read_text() == "mine"


# --------------------------------------------------------------------------- no pickles


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def package(overfit_checkpoint, tmp_path) -> Path:
    write_package(overfit_checkpoint, tmp_path / "pkg")
    return tmp_path / "pkg"


def test_a_pickle_named_model_safetensors_is_refused_unread(package, tmp_path):
    marker = tmp_path / "code-ran"
    with open(package / WEIGHTS_FILE, "wb") as f:
        pickle.dump({"decoder.embedding.weight": _RunsCode(marker)}, f)
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: refused to load: it is a pickle"
    ):
        asr.load_model(package)
    assert not marker.exists()


def test_safetensors_whose_header_length_starts_like_a_pickle_load(tmp_path):
    """The header length's low byte is the file's first: 0x80, pickle's, in one file of 256."""
    from safetensors.torch import save_file

    for size in range(300):
        weights = {"w": torch.arange(3.0), "name" + "x" * size: torch.zeros(1)}
        save_file(weights, tmp_path / "m.safetensors")
        if (tmp_path / "m.safetensors").read_bytes()[0] == 0x80:
            break
    loaded = read_safetensors(tmp_path / "m.safetensors")
    assert torch.equal(loaded["w"], weights["w"]) and set(loaded) == set(weights)


def test_tied_weights_that_name_a_tensor_gone_are_refused_naming_the_file(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    malformed = f"its {ALIASES} metadata is not a mapping of tied names to stored ones"
    for aliases, said in [
        ({"out": "gone"}, "its tied weights name tensors it does not hold: ['gone']"),
        ({"out": ["w"]}, malformed),
        (None, malformed),
        ("w", malformed),
        ({"v": "w", "w": "v"}, malformed),  # a stored tensor named as tied: replaced
    ]:
        weights = {"w": torch.zeros(2)} | ({"v": torch.ones(2)} if "v" in str(aliases) else {})
        save_file(weights, path, metadata={ALIASES: json.dumps(aliases)})
        with pytest.raises(CheckpointError) as refused:
            read_safetensors(path)
        assert str(refused.value) == f"{path}: {said}"


def test_a_torch_save_file_named_model_safetensors_is_refused(package):
    torch.save({"w": torch.zeros(2)}, package / WEIGHTS_FILE)  # a zip of pickles
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: refused to load: it is a pickle"
    ):
        asr.load_model(package)


def test_a_package_with_pickled_weights_instead_is_refused(package):
    (package / WEIGHTS_FILE).unlink()
    torch.save({"w": torch.zeros(2)}, package / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"refused to load pytorch_model\.bin: pickled"):
        asr.load_model(package)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_or_device_among_the_tokenizer_files_is_refused_unread(package):
    """Reading a pipe would wait forever, /dev/zero fill the memory."""
    extra = package / "tokenizer" / "vocab.extra"
    os.mkfifo(extra)
    with pytest.raises(CheckpointError, match=r"vocab\.extra: not a regular file"):
        asr.load_model(package)
    extra.unlink()
    extra.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=r"vocab\.extra: not a regular file"):
        asr.load_model(package)


def test_damaged_or_missing_package_files_are_named(package, tmp_path):
    (package / WEIGHTS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors"):
        asr.load_model(package)
    config = json.loads((package / CONFIG_FILE).read_text())
    (package / CONFIG_FILE).write_text(json.dumps(config | {"assets": ["../secret.json"]}))
    with pytest.raises(CheckpointError, match=r"'\.\./secret\.json' is not an asset file name"):
        asr.load_model(package)
    (package / CONFIG_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"no config\.json, so not a model package"):
        asr.load_model(package)
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        asr.load_model(tmp_path / "no-such-folder" / "")


def test_damaged_tokenizer_or_cmvn_files_of_a_package_are_named_as_there(fit_checkpoint, tmp_path):
    """Not as the temporary copies the model is built from, and a tokenizer of another size
    (a folder replaced by hand) is refused at loading, not at the first decode."""
    package = tmp_path / "pkg"
    write_package(fit_checkpoint, package)
    (package / "cmvn.json").write_text('{"count"')
    with pytest.raises(CheckpointError, match=rf"^{package}: its cmvn\.json:1: not valid JSON"):
        asr.load_model(package)
    tokenizer = package / "tokenizer" / "tokenizer.json"
    tokenizer.write_text("garbage")
    with pytest.raises(ValueError, match=rf"^{tokenizer}:1: invalid JSON"):
        asr.load_model(package)
    CharTokenizer.train(["ABC"]).save(package / "tokenizer")
    with pytest.raises(CheckpointError, match=r"its tokenizer has 8 ids, its model \d+: not the "):
        asr.load_model(package)


def test_a_config_this_asr_cannot_build_is_named(package):
    """A package of a newer asr (an option this one lacks) or a class that is not there: the
    package and the option are named, not a jsonargparse traceback."""
    config = json.loads((package / CONFIG_FILE).read_text())
    encoder = config["model_config"]["encoder"]
    encoder["init_args"]["future_option"] = 3
    (package / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"^{package}: its model config does not build: "
                       r".*Option 'future_option' is not accepted\.$"):  # fmt: skip
        asr.load_model(package)
    del encoder["init_args"]["future_option"]
    encoder["class_path"] = "asr.models.nowhere.Encoder"
    (package / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"^{package}: its model config does not build"):
        asr.load_model(package)


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda c: c.setdefault("decoding", {}).update(future_option=1),
         r"its stored decoding or confidence settings do not load \(TypeError: .*future_option"),
        (lambda c: c.update(confidence_scaling={"scale": 1.0}),
         r"its stored decoding or confidence settings do not load \(KeyError: 'bias'\)"),
        (lambda c: c.pop("model_config"), r"config\.json: no model_config"),
        (lambda c: c.update(format_version="1"), r"format_version '1' is not a whole number"),
        (lambda c: c.update(assets=None), r"assets is None, not a list of file names"),
        (lambda c: c.update(segment_seconds="5"), r"segment_seconds is '5', not a number in"),
        (lambda c: c.update(segment_seconds=0.5), r"segment_seconds is 0.5, not a number in"),
        (lambda c: c.update(segment_seconds=2), r"segment_seconds is 2, not a number in \[3, "),
        (lambda c: c.update(tokens_per_second=-1), r"tokens_per_second is -1, not a number in"),
        (lambda c: c.update(tokens_per_second=1e308), r"tokens_per_second is 1e\+308, not"),
        (lambda c: c.update(alignment_heads="0,1"), r"alignment_heads is '0,1', not a list"),
        (lambda c: c.update(alignment_heads=[99]), r"alignment_heads is \[99\], not a list"),
        (lambda c: c["model_config"].update(vocab_size="31"), r"its model '31': not the"),
    ],
)  # fmt: skip
def test_package_settings_this_asr_cannot_read_are_named(package, edit, said):
    """A newer asr's search option or an edited config.json: the package named when it loads,
    no traceback then or in a later transcribe."""
    config = json.loads((package / CONFIG_FILE).read_text())
    edit(config)
    (package / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"^{package}.*{said}"):
        asr.load_model(package)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c["encoder"].update(class_path="stranger.Encoder"), "stranger.Encoder"),
        (lambda c: c.update(encoder="stranger.build"), "stranger.build"),  # a callable's path
        (lambda c: c.update(encoder="ñstranger.build"), "ñstranger.build"),  # any identifier
        (lambda c: c["encoder"].update(dict_kwargs={"x": ["stranger.X"]}), "stranger.X"),
        # torch's class reached through an asr module: not one of asr's
        (lambda c: c["encoder"].update(class_path="asr.models.seq2seq.nn.Identity"),
         "asr.models.seq2seq.nn.Identity"),
    ],
)  # fmt: skip
def test_a_config_naming_code_outside_asr_is_refused_before_importing_it(
    package, tmp_path, monkeypatch, edit, named
):
    """A package is data: a class or callable named by its import path in a module beside it
    (or anywhere on the path) would run that module's code on loading, which `load_model` must
    never do."""
    (tmp_path / f"{named.split('.')[0]}.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\nclass Encoder: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = json.loads((package / CONFIG_FILE).read_text())
    edit(config["model_config"])
    (package / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"names '{re.escape(named)}', not a class of asr"):
        asr.load_model(package)
    assert not (tmp_path / "ran").exists()


def test_settings_of_training_alone_that_name_files_are_no_import_paths(package):
    """A fine-tune's config names the model it started from, and every config its tokenizer:
    file names, not parsed to build the network."""
    config = json.loads((package / CONFIG_FILE).read_text())
    config["model_config"] |= {"init_from": "avg.ckpt", "tokenizer": "data.an4"}
    (package / CONFIG_FILE).write_text(json.dumps(config))
    assert asr.load_model(package).transcribe(WAV / "an4_clstk/fash/an251-fash-b.wav").text


def test_weights_that_do_not_fit_the_config_are_named(package):
    config = json.loads((package / CONFIG_FILE).read_text())
    config["model_config"]["encoder"]["init_args"]["num_layers"] += 1
    (package / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"^{package}: its weights do not fit its config"):
        asr.load_model(package)


def test_a_package_over_a_file_is_named(tmp_path):
    (tmp_path / "pkg").write_text("")
    with pytest.raises(NotADirectoryError, match=r"pkg: a file; a package is a folder"):
        write_package(tmp_path / "none.ckpt", tmp_path / "pkg")


def test_finalize_on_a_package_says_what_to_do(package, tmp_path, capsys):
    args = ["--model", str(package), "--manifest", str(tmp_path / "dev.jsonl")]
    assert main(["finalize", *args, "--beam-size", "2"]) == 2
    assert "a model package; finalize its checkpoint" in capsys.readouterr().err
    # A checkpoint keeps no LM: its stored search, and the confidences fitted to it, had
    # taken the LM's hypotheses and stored the search without it.
    with pytest.raises(SystemExit):
        main(["finalize", *args, "--lm", "lm.ckpt", "--lm-weight", "0.8"])
    assert "unrecognized arguments: --lm lm.ckpt --lm-weight 0.8" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # it rewrites a checkpoint: ONNX graphs come from packages
        main(["finalize", *args, "--backend", "onnx"])
    assert "unrecognized arguments: --backend onnx" in capsys.readouterr().err
    for model in (str(package), "hf://me/tiny-an4"):  # said before any decoding or download
        assert main(["finalize", "--model", model, "--manifest", "missing.jsonl"]) == 2
        assert f"{model}: a model package; finalize" in capsys.readouterr().err
        assert main(["export", "--checkpoint", model, "--out", str(tmp_path / "again")]) == 2
        assert f"{model}: a model package; exported already" in capsys.readouterr().err
    run = tmp_path / "run"  # a training run's folder, or any other, is no package
    run.mkdir()
    assert main(["finalize", "--model", str(run), "--manifest", "missing.jsonl"]) == 2
    assert f"{run}: a folder, not a checkpoint (give its .ckpt file)" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "again")]) == 2
    assert f"{run}: a folder, not a checkpoint (give its .ckpt file)" in capsys.readouterr().err


# --------------------------------------------------------------------------- hf://


def _hf_cache(package: Path, cache: Path, repo_id: str, ref: bool = True) -> str:
    """Lay `package` out in a Hugging Face cache as `huggingface_hub` downloads a repository:
    content-addressed blobs, a snapshot of symlinks per commit, and `refs/main` (not where
    `ref` is False: a fetch by commit writes none)."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in package.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(package)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    return commit


@pytest.fixture
def hub_cache(package, tmp_path, monkeypatch) -> tuple[Path, str]:
    """A Hugging Face cache holding `package` as me/tiny-an4."""
    import huggingface_hub

    cache = tmp_path / "hub"
    commit = _hf_cache(package, cache, "me/tiny-an4")
    cached = huggingface_hub.scan_cache_dir(cache)
    assert [r.repo_id for r in cached.repos] == ["me/tiny-an4"], "a layout the hub reads"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache, commit


@pytest.fixture
def offline_hub(hub_cache, monkeypatch) -> tuple[Path, str]:
    """`hub_cache`; the Hub offline, sockets shut."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise AssertionError("a test tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    return hub_cache


def test_hf_addresses_resolve_offline_from_the_cache(offline_hub, overfit_checkpoint):
    _, commit = offline_hub
    from_ckpt = asr.load_model(overfit_checkpoint)
    for address in ("hf://me/tiny-an4", f"hf://me/tiny-an4@{commit}"):
        recognizer = asr.load_model(address)
        _assert_same_weights(from_ckpt.model, recognizer.model)
        assert recognizer.checkpoint == address
    wav = _waves()[-1]
    assert recognizer.transcribe(wav) == from_ckpt.transcribe(wav)


def test_a_cached_hf_model_loads_where_the_hub_never_answers(hub_cache, monkeypatch):
    """A network that takes connections and never answers (a dead proxy): huggingface_hub
    waits for good; the Hub is asked with a time bound, then the cached snapshot is used."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(asr.package, "HUB_TIMEOUT", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections are taken by the kernel, and never read
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        started = time.monotonic()
        recognizer = asr.load_model("hf://me/tiny-an4")
        assert time.monotonic() - started < 30
        with pytest.raises(CheckpointError, match="hf://me/elsewhere: cannot fetch"):
            asr.load_model("hf://me/elsewhere")
    assert recognizer.checkpoint == "hf://me/tiny-an4"


def test_an_hf_model_fetched_online_is_found_offline_by_its_name(package, tmp_path, monkeypatch):
    """asr fetches the commit its name resolves to (asked first, with a time bound), for
    which huggingface_hub records no refs/main: the model then fetched was not found offline
    by its name, nor where the Hub could not be reached."""
    import huggingface_hub
    from huggingface_hub.file_download import repo_folder_name

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    commit, real = hashlib.sha1(b"me/tiny-an4").hexdigest(), huggingface_hub.snapshot_download
    monkeypatch.setattr(
        huggingface_hub.HfApi, "repo_info", lambda *a, **k: types.SimpleNamespace(sha=commit)
    )

    def download(repo_id, revision=None, local_files_only=False, **kwargs):
        if local_files_only:
            return real(repo_id, revision=revision, local_files_only=True, **kwargs)
        assert revision == commit
        _hf_cache(package, cache, repo_id, ref=False)  # as the Hub's download lays it out
        return str(cache / repo_folder_name(repo_id=repo_id, repo_type="model") / "snapshots"
                   / commit)  # fmt: skip

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    online = asr.load_model("hf://me/tiny-an4")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    offline = asr.load_model("hf://me/tiny-an4")
    _assert_same_weights(online.model, offline.model)


def test_an_uncached_hf_model_offline_is_named(offline_hub):
    with pytest.raises(CheckpointError, match="hf://me/elsewhere: cannot fetch the model package"):
        asr.load_model("hf://me/elsewhere")
    with pytest.raises(CheckpointError, match=r"fetched once with network access it is found in "
                       r"the Hugging Face cache .* or give a local package folder"):  # fmt: skip
        asr.load_model("hf://me/elsewhere")
    for name in ("hf://just-a-name", "hf://me/..", "hf://-me/an4", "hf://me/an4..x"):
        with pytest.raises(ValueError, match=f"^{re.escape(name)}: a Hub model is named hf://"):
            asr.load_model(name)


def test_a_cached_package_whose_weights_link_is_broken_says_so(offline_hub):
    cache, commit = offline_hub
    [weights] = cache.glob(f"models--me--tiny-an4/snapshots/{commit}/model.safetensors")
    weights.resolve().unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing \(a broken link\)"):
        asr.load_model("hf://me/tiny-an4")


def test_the_command_finds_an_hf_model_with_hf_hub_offline(package, tmp_path):
    """The user's way: HF_HUB_OFFLINE=1 and HF_HUB_CACHE in the environment."""
    _hf_cache(package, tmp_path / "hub", "me/tiny-an4")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    env["PYTHONPATH"] = str(REPO)
    wav = str(_waves()[1])
    command = [sys.executable, "-m", "asr.cli", "transcribe", wav, "--quiet"]
    out = subprocess.run(
        [*command, "--model", "hf://me/tiny-an4"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("GO")


# --------------------------------------------------------------------------- model card


def _metrics(overfit_checkpoint: Path, out: Path, beam_size: int) -> Path:
    manifest = out.parent / "test.jsonl"
    utterances = zip(_waves(), UTTERANCES.values())
    write_manifest(manifest, [Utterance(str(w), audio_info(w).duration, t) for w, t in utterances])
    options = SearchOptions(beam_size=beam_size, ctc_weight=0.3)
    recognizer = asr.load_model(overfit_checkpoint)
    evaluate(recognizer, manifest, out, options=options, plots=0, progress=False)
    return out / "metrics.json"


def test_the_model_card_has_decoding_results_training_and_licence(
    overfit_checkpoint, tmp_path, caplog
):
    from huggingface_hub import ModelCard as HubCard

    beams = {"decode_dev": 1, "decode_test": 3}
    metrics = [_metrics(overfit_checkpoint, tmp_path / name, b) for name, b in beams.items()]
    pkg = tmp_path / "pkg"
    command = "asr fit --config conf/an4/transformer.yaml"
    args = ["export", "--model", str(overfit_checkpoint), "--out", str(pkg),
            "--repo-id", "me/tiny-an4"]  # fmt: skip
    args += ["--license", "cc-by-4.0", "--training-command", command, "--data", "AN4 (848 utts)"]
    assert main([*args, "--metrics", str(metrics[0]), "--metrics", str(metrics[1])]) == 0
    card = (pkg / "README.md").read_text()
    assert HubCard.load(pkg / "README.md").data.to_dict()["license"] == "cc-by-4.0"
    assert "| beam_size | 3 |" in card and "| ctc_weight | 0.3 |" in card
    assert 'asr.load_model("hf://me/tiny-an4")' in card
    assert f"```bash\n{command}\n```" in card and "AN4 (848 utts)" in card
    assert card.count(RESULTS_HEADER) == 2, "a WER and a CER table in ESPnet's columns"
    for path in metrics:
        m = json.loads(path.read_text())
        name = path.parent.name
        assert results_row(name, m, "word") in card and results_row(name, m, "char") in card
        assert f"- {name}: beam {m['search']['beam_size']}, ctc 0.3" in card
        assert f"scored on `{overfit_checkpoint}`\n" in card, "the checkpoint exported"
    assert "| decode_test | 4 | 9 | 100.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 |" in card
    assert "another model's" not in caplog.text


def test_the_card_of_a_package_with_graphs_lists_them(overfit_checkpoint, tmp_path):
    for onnx in (False, True):
        write_package(overfit_checkpoint, tmp_path / str(onnx), card=ModelCard(onnx=onnx))
        card = (tmp_path / str(onnx) / "README.md").read_text()
        assert ("- `onnx/`: the ONNX Runtime graphs (`--backend onnx`" in card) == onnx


def test_a_card_quotes_a_folder_with_a_space_and_a_home_path_loads(
    overfit_checkpoint, tmp_path, monkeypatch
):
    write_package(overfit_checkpoint, tmp_path / "my pkg")
    card = (tmp_path / "my pkg" / "README.md").read_text()
    assert "asr transcribe audio.wav --model 'my pkg/'" in card
    assert 'asr.load_model("my pkg/")' in card
    monkeypatch.setenv("HOME", str(tmp_path))
    for path in ("~/my pkg", "~/my pkg/", Path("~") / "my pkg"):  # as a shell expands it
        assert asr.load_model(path).tokenizer.vocab_size > 0


def test_a_card_without_metrics_says_so_and_a_bad_metrics_file_is_named(
    overfit_checkpoint, tmp_path
):
    write_package(overfit_checkpoint, tmp_path / "pkg", card=ModelCard(license="apache-2.0"))
    card = (tmp_path / "pkg" / "README.md").read_text()
    assert "None given (`asr export --metrics" in card and "license: apache-2.0" in card
    bad = tmp_path / "decode_x" / "metrics.json"
    bad.parent.mkdir()
    bad.write_text('{"wer": 1.0}')
    with pytest.raises(ValueError, match=r"decode_x/metrics\.json: not an `asr evaluate`"):
        write_package(overfit_checkpoint, tmp_path / "pkg2", card=ModelCard(metrics=[bad]))
    assert not (tmp_path / "pkg2").exists(), "nothing written"


def test_importing_the_recognizer_leaves_safetensors_and_the_hub_unimported():
    lazy = "{'safetensors', 'huggingface_hub'}"
    code = f"import sys, asr.recognizer; print(sorted({lazy} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_a_package_folder_copies_and_loads_anywhere(package, tmp_path):
    moved = shutil.copytree(package, tmp_path / "elsewhere" / "model")
    assert asr.load_model(moved).transcribe(_waves()[0]).text == "YES"
    # what Jupyter or an editor leaves beside the tokenizer refused the package
    (moved / "tokenizer" / ".ipynb_checkpoints").mkdir()
    assert asr.load_model(moved).transcribe(_waves()[0]).text == "YES"


def test_weights_cloned_without_git_lfs_are_named_as_a_pointer(package):
    """A Hub repository cloned without git-lfs holds the weights' pointer file: its 'header
    too large' said nothing of that."""
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 123456\n"
    (package / WEIGHTS_FILE).write_text(pointer)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: a Git LFS pointer, not the"):
        asr.load_model(package)
    (package / "tokenizer" / "tokenizer.model").write_text(pointer)  # a BPE model's, read first
    with pytest.raises(CheckpointError, match=r"tokenizer\.model: a Git LFS pointer, not the"):
        asr.load_model(package)


def test_weights_with_non_finite_values_are_refused_naming_the_file_and_tensor(
    tiny_checkpoint, tmp_path
):
    """Damaged weights (a NaN, an infinity) loaded silently and decoded everything as nothing."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    write_package(tiny_checkpoint["checkpoint"], tmp_path / "pkg")
    path = tmp_path / "pkg" / WEIGHTS_FILE
    with safe_open(str(path), framework="pt") as f:
        weights, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    name = "decoder.output.bias"
    weights[name][3] = float("nan")
    save_file(weights, path, metadata=metadata)
    with pytest.raises(CheckpointError) as refused:
        asr.load_model(tmp_path / "pkg")
    assert str(refused.value) == f"{path}: {name}: non-finite values (a damaged file)"
    state = load_checkpoint(tiny_checkpoint["checkpoint"])
    state["state_dict"][f"model.{name}"][0] = float("-inf")
    torch.save(state, tmp_path / "damaged.ckpt")
    with pytest.raises(CheckpointError) as refused:
        asr.load_model(tmp_path / "damaged.ckpt")
    said = f"{tmp_path / 'damaged.ckpt'}: {name}: non-finite values (a damaged file)"
    assert str(refused.value) == said


def _scored_metrics(folder: Path, checkpoint: str) -> Path:
    """A metrics.json of `asr evaluate` that scored `checkpoint` (2 errors in 10 words)."""
    counts = {"substitutions": 1, "deletions": 1, "insertions": 0}
    metrics = {"utterances": 2, "sentence_errors": 1, "reference_words": 10}
    metrics |= {"reference_characters": 40} | counts | {f"char_{k}": v for k, v in counts.items()}
    metrics |= {"search": {"beam_size": 10, "ctc_weight": 0.5}, "manifest": "test.jsonl"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(json.dumps(metrics | {"checkpoint": checkpoint}))
    return folder / "metrics.json"


def test_results_of_another_checkpoint_are_named_so_and_warned_of(
    overfit_checkpoint, tmp_path, caplog
):
    """A WER measured on last.ckpt went into the card of avg.ckpt, unremarked."""
    other = tmp_path / "last.ckpt"
    shutil.copy(overfit_checkpoint, other)  # the same weights by now, but another file
    same = f"{overfit_checkpoint.parent}/./{overfit_checkpoint.name}"  # spelt otherwise
    metrics = [_scored_metrics(tmp_path / "decode_test", same)]
    metrics.append(_scored_metrics(tmp_path / "decode_last", str(other)))
    # relative to the folder `asr evaluate` ran in, one above the metrics file: the same file
    relative = os.path.relpath(overfit_checkpoint, tmp_path.parent)
    metrics.append(_scored_metrics(tmp_path / "decode_rel", relative))
    # scored where the run was before it moved: that file is gone, and of the exported's name
    gone = str(tmp_path / "moved_from" / overfit_checkpoint.name)
    metrics.append(_scored_metrics(tmp_path / "decode_moved", gone))
    with caplog.at_level(logging.WARNING, logger="asr.package"):
        write_package(overfit_checkpoint, tmp_path / "pkg", card=ModelCard(metrics=metrics))
    card = (tmp_path / "pkg" / CARD_FILE).read_text()
    assert f"- decode_test: beam 10, ctc 0.5; `test.jsonl`, scored on `{same}`\n" in card
    assert f"- decode_rel: beam 10, ctc 0.5; `test.jsonl`, scored on `{relative}`\n" in card
    assert f"- decode_moved: beam 10, ctc 0.5; `test.jsonl`, scored on `{gone}`\n" in card
    assert (
        f"- decode_last: beam 10, ctc 0.5; `test.jsonl`, scored on `{other}`, not on the "
        f"checkpoint exported (`{overfit_checkpoint}`)\n"
    ) in card
    assert [r.getMessage() for r in caplog.records] == [
        f"{metrics[1]}: scored {other}, not {overfit_checkpoint}, the checkpoint exported: its "
        "WER is another model's"
    ]


def test_the_weights_a_metrics_file_records_tell_the_model_it_scored(
    overfit_checkpoint, tmp_path, monkeypatch, caplog
):
    """By name, a relative path found from the folder export runs in, or a file moved away,
    passed for the model exported; the weights' digests tell."""
    state = torch.load(overfit_checkpoint, weights_only=True)
    exported = weights_digest(submodule_weights(state, "model."))
    monkeypatch.chdir(overfit_checkpoint.parent)  # `name` is here, but scored another's
    name, gone = overfit_checkpoint.name, str(tmp_path / "gone" / "other.ckpt")
    metrics = []
    for folder, scored, weights in [("decode_other", name, "0" * 32),
                                    ("decode_moved", gone, exported)]:  # fmt: skip
        path = _scored_metrics(tmp_path / folder, scored)
        path.write_text(json.dumps(json.loads(path.read_text()) | {"weights": weights}))
        metrics.append(path)
    with caplog.at_level(logging.WARNING, logger="asr.package"):
        write_package(overfit_checkpoint, tmp_path / "pkg", card=ModelCard(metrics=metrics))
    card = (tmp_path / "pkg" / CARD_FILE).read_text()
    assert f"scored on `{name}`, not on the checkpoint exported" in card
    assert f"scored on `{gone}`\n" in card
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [str(metrics[0])]


def test_metrics_in_the_working_folder_are_named_by_it(tmp_path, monkeypatch):
    """`--metrics metrics.json` gave the row an empty dataset name."""
    _scored_metrics(tmp_path / "decode_test", "avg.ckpt")
    monkeypatch.chdir(tmp_path / "decode_test")
    tables = results_tables(["metrics.json"])
    assert "- decode_test: beam 10" in tables and "\n| decode_test | 2 | 10 |" in tables
    fused = json.loads(Path("metrics.json").read_text())
    fused["search"] |= {"lm_weight": 0.3}
    fused["lm"] = "exp/an4/lm/avg.ckpt"
    Path("metrics.json").write_text(json.dumps(fused))
    tables = results_tables(["metrics.json"])  # the LM, not in the package, is named
    assert "- decode_test: beam 10, ctc 0.5, LM 0.3 (`exp/an4/lm/avg.ckpt`); `test" in tables
    (tmp_path / "decode_link").symlink_to(tmp_path / "decode_test")  # named as given
    assert "- decode_link: beam 10" in results_tables([tmp_path / "decode_link/metrics.json"])
    # run otherwise than as trained, each of which changes the WER: said
    unlike = {"backend": "onnx-int8", "precision": "bf16", "chunk_ms": 160}
    Path("metrics.json").write_text(json.dumps(fused | unlike))
    tables = results_tables(["metrics.json"])
    assert "ctc 0.5, LM 0.3 (`exp/an4/lm/avg.ckpt`), onnx-int8, bf16, chunks of 160 ms; `" in tables
    as_trained = {"backend": "torch", "precision": "fp32", "chunk_ms": None}
    Path("metrics.json").write_text(json.dumps(fused | as_trained))
    assert "(`exp/an4/lm/avg.ckpt`); `test" in results_tables(["metrics.json"])
    assert "- decode_link: beam 10" in results_tables([tmp_path / "decode_link/metrics.json"])
