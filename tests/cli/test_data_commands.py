"""The data commands (prepare, tokenizer, cmvn, validate-data, shard) on paths and configs that
cannot work: a one-line error naming what is wrong and exit 2, never a traceback."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.cli import main


@pytest.fixture
def manifest(tmp_path):
    soundfile.write(tmp_path / "a.wav", np.zeros(1600, dtype=np.float32), 16000)
    path = tmp_path / "m.jsonl"
    record = {"audio_filepath": str(tmp_path / "a.wav"), "duration": 0.1, "text": "yes"}
    path.write_text(json.dumps(record) + "\n")
    return path


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["tokenizer", "--manifest", "{m}", "--out", "{file}"], "--out {file}: {file} is a file"),
        (["shard", "--manifest", "{m}", "--out", "{file}/x"], "--out {file}/x: {file} is a file"),
        (["shard", "--manifest", "{m}", "--out", "{link}"], "{link} is a broken link, not a"),
        (["evaluate", "--checkpoint", "{tmp}/no.ckpt", "--manifest", "{m}", "--out", "{file}/x"],
         "--out {file}/x: {file} is a file, not a folder"),
        (["robustness", "--checkpoint", "{tmp}/no.ckpt", "--manifest", "{m}", "--out", "{file}/x"],
         "--out {file}/x: {file} is a file, not a folder"),
        (["export", "--checkpoint", "{tmp}/no.ckpt", "--out", "{file}/x"],
         "--out {file}/x: {file} is a file, not a folder"),
        (["prepare", "an4", "--data-dir", "{dir}", "--out", "{file}"],
         "--out {file}: {file} is a file, not a folder"),
        (["tokenizer", "--manifest", "{dir}", "--out", "{tmp}/tok"],
         "{dir}: is a directory, not a manifest"),
        (["tokenizer", "--manifest", "{tmp}/no.jsonl", "--out", "{tmp}/tok"],
         "{tmp}/no.jsonl: manifest not found"),
        (["validate-data", "--manifest", "{m}", "--tokenizer", "{tmp}/no"],
         "--tokenizer: {tmp}/no: no tokenizer there (`asr tokenizer` writes one)"),
        (["validate-data", "--manifest", "{m}", "--tokenizer", "{binary}"],
         "tokenizer.model: not UTF-8 text (a tokenizer is its folder, or its tokenizer.json)"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--config", "{tmp}/no.yaml"],
         "--config {tmp}/no.yaml: no such file"),
        (["cmvn", "--manifest", "{m}", "--out", "{m}"],
         "--out {m} is the --manifest this command reads: writing it would overwrite it"),
        (["cmvn", "--manifest", "{m}", "--out", "{bad_yaml}", "--config", "{bad_yaml}"],
         "--out {bad_yaml} is the --config this command reads"),
        (["validate-data", "--manifest", "{file}", "{m}", "--report", "{m}"],
         "--report {m} is the --manifest this command reads: writing it would overwrite it"),
        (["cmvn", "--manifest", "{m}", "--out", "{dir}"], "--out {dir} is a folder: name the"),
        (["cmvn", "--manifest", "{m}", "--out", "{file}/x.json"],
         "--out {file}/x.json: {file} is a file, not a folder"),
        (["validate-data", "--manifest", "{m}", "--report", "{dir}"],
         "--report {dir} is a folder: name the file to write"),
        (["validate-data", "--manifest", "{m}", "--report", "{file}/r.txt"],
         "--report {file}/r.txt: {file} is a file, not a folder"),
        (["tokenizer", "--manifest", "{m}", "--out", "{tmp}/tok", "--kind", "bpe"],
         "--kind bpe needs --vocab-size"),
        (["prepare", "yesno", "--data-dir", "{dir}", "--out", "{tmp}/p", "--dev-size", "3"],
         "yesno takes no option --dev-size; it is an option of an4"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--config", "{bad_yaml}"],
         "bad.yaml:3:1: not valid YAML"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--config", "{bad_class}"],
         "class.yaml:4: model.init_args.frontend.class_path: "),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--config", "{bad_class}",
          "--n-mels", "40", "--target-dbfs", "-20"],
         "--n-mels and --target-dbfs: the features are --config's; give either"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--config", "{bad_class}",
          "--config", "{bad_yaml}"], "--config given twice: give the one config whose model"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--target-dbfs=-150"],
         "error: --target-dbfs -150.0: floor_dbfs -100.0 must be below"),
        (["cmvn", "--manifest", "{m}", "--out", "{tmp}/c.json", "--n-mels", "300"],
         "error: --sample-rate 16000 --n-mels 300: LogMelFilterbank: 43 of the 300 mel bands"),
    ],
)  # fmt: skip
def test_a_path_or_config_that_cannot_work_is_named(argv, said, manifest, tmp_path, capsys):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    (tmp_path / "tokenizer.model").write_bytes(b"\n\x05\xff\xfe")  # SentencePiece's, say
    (tmp_path / "bad.yaml").write_text("model:\n  a: [1, 2\n")
    (tmp_path / "class.yaml").write_text(
        "model:\n  init_args:\n    frontend:\n      class_path: asr.frontends.NoSuchFrontend\n"
    )
    places = {"m": manifest, "dir": tmp_path / "dir", "file": tmp_path / "file", "tmp": tmp_path,
              "bad_yaml": tmp_path / "bad.yaml", "bad_class": tmp_path / "class.yaml",
              "link": tmp_path / "link", "binary": tmp_path / "tokenizer.model"}  # fmt: skip
    before = Path(manifest).read_bytes()
    assert main([arg.format(**places) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asr {argv[0]}: error: ") and said.format(**places) in err, err
    assert "Traceback" not in err
    assert Path(manifest).read_bytes() == before


def test_validate_data_reports_every_manifest(manifest, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"audio_filepath": "gone.wav", "duration": 1, "text": "no"}\n')
    report = tmp_path / "reports" / "report.txt"
    empty = tmp_path / "empty.jsonl"  # refused as training refuses it, and the others go on
    empty.write_text("\n")
    missing = tmp_path / "missing.jsonl"  # named, and the others still checked
    argv = ["validate-data", "--manifest", str(bad), str(empty), str(missing), str(manifest),
            "--report", str(report)]  # fmt: skip
    assert main(argv) == 1
    lines = report.read_text().splitlines()
    assert lines[0] == f"{bad}: 0 good, 1 bad" and lines[1].startswith(f"{bad}:1: audio ")
    assert lines[2:] == [f"{empty}: no utterances to validate", f"{missing}: manifest not found",
                         f"{manifest}: 1 good, 0 bad"]  # fmt: skip
    assert f"{empty}: no utterances to validate" in capsys.readouterr().out


def test_a_list_option_given_twice_takes_both_lists(manifest, tmp_path, capsys):
    """argparse's last one wins: a tokenizer trained on dev text alone, or data half checked."""
    other = tmp_path / "other.jsonl"
    other.write_text('{"audio_filepath": "gone.wav", "duration": 1, "text": "no"}\n')
    assert main(["validate-data", "--manifest", str(other), "--manifest", str(manifest)]) == 1
    out = capsys.readouterr().out
    assert f"{other}: 0 good, 1 bad" in out and f"{manifest}: 1 good, 0 bad" in out


def test_conditions_given_twice_add_up_and_none_means_all():
    from asr.cli import _parser

    argv = ["robustness", "--model", "m", "--manifest", "m.jsonl", "--out", "o"]
    twice = [*argv, "--conditions", "clean", "--conditions", "white:10"]
    assert _parser("robustness").parse_args(twice).conditions == ["clean", "white:10"]
    assert _parser("robustness").parse_args(argv).conditions is None  # all, as the run starts


def test_validate_data_refuses_the_short_utterances_fit_refuses(tmp_path, capsys):
    """By default, the least duration `asr fit` takes (data.min_duration's default);
    --min-duration 0 takes any."""
    from asr.data.manifest import MIN_DURATION
    from asr.lightning import ASRDataModule

    fits = inspect.signature(ASRDataModule.__init__).parameters["min_duration"].default
    assert fits == MIN_DURATION
    soundfile.write(tmp_path / "a.wav", np.zeros(160, dtype=np.float32), 16000)
    path = tmp_path / "m.jsonl"
    record = {"audio_filepath": str(tmp_path / "a.wav"), "duration": 0.01, "text": "yes"}
    path.write_text(json.dumps(record) + "\n")
    assert main(["validate-data", "--manifest", str(path)]) == 1
    assert f"{path}:1: duration 0.010 s is below {MIN_DURATION:g} s" in capsys.readouterr().out
    assert main(["validate-data", "--manifest", str(path), "--min-duration", "0"]) == 0
