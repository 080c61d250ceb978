"""Recipe smoke runs (recipes/*/run.sh over recipes/lib/stages.sh) on tiny settings.

Every run writes under tmp_path (--data, --exp), never into the repository's data/ or exp/.
The recipes call `asr` from PATH: the tests put this interpreter's bin directory first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal as signal_module
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import REPO, corpus_path

from asr.cli import main
from asr.data.manifest import read_manifest
from asr.text import Tokenizer

BIN = Path(sys.executable).parent
WER_LINE = re.compile(r"WER (\d+\.\d+)%  CER (\d+\.\d+)%  over (\d+) utterances")
TIMEOUT = 900  # seconds; a hung recipe fails instead of blocking the suite


def run_recipe(
    corpus: str, *args: str, bin_dir: Path | None = None, check: bool = True, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run recipes/<corpus>/run.sh, in `cwd`, with `asr` from `bin_dir` (then this venv) on
    PATH."""
    path = os.pathsep.join(
        [*([str(bin_dir)] if bin_dir else []), str(BIN), os.environ.get("PATH", "")]
    )
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", str(REPO / "recipes" / corpus / "run.sh"), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=TIMEOUT,
    )
    if check and result.returncode != 0:
        pytest.fail(f"run.sh {corpus} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def markers(directory: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in directory.glob(".done-*"))


def skipped(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"== stage (\d+) \(.*\): done already, skipping", stdout)]


def ran(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"== stage (\d+) \(.*\): done in", stdout)]


@pytest.fixture(scope="module")
def repo_outputs():
    """Fails a test that wrote into the repository's data/ or exp/ (recipe defaults)."""
    corpora = ("an4", "yesno", "folder", "librispeech", "mini_librispeech")
    watched = [REPO / d / c for d in ("data", "exp") for c in corpora]
    before = {p for p in watched if p.exists()}
    yield
    created = {p for p in watched if p.exists()} - before
    assert not created, f"recipes wrote into the repository: {sorted(map(str, created))}"


# ------------------------------------------------------------------------------ options


@pytest.mark.parametrize("corpus", ["an4", "yesno", "folder", "librispeech", "mini_librispeech"])
def test_help_and_usage_errors(corpus):
    result = run_recipe(corpus, "--help")
    assert "stage" in result.stdout and f"recipes/{corpus}/run.sh" in result.stdout
    assert not result.stdout.startswith("#!")
    unknown = run_recipe(corpus, "--no-such-option", check=False)
    assert unknown.returncode == 2 and "unknown option --no-such-option" in unknown.stderr
    no_value = run_recipe(corpus, "--stage", check=False)
    assert no_value.returncode == 2 and "--stage needs a value" in no_value.stderr
    not_a_number = run_recipe(corpus, "--stop-stage", "two", check=False)
    assert not_a_number.returncode == 2 and "needs a whole number" in not_a_number.stderr
    for option, value, said in [  # found before any stage runs, not when theirs comes
        ("--average", "zero", "--average needs a whole number, got 'zero'"),
        ("--ctc-weight", "1.5", "--ctc-weight needs a number in [0, 1], got '1.5'"),
        ("--stop-stage", "-1", "needs a whole number"),
        ("--beam-size", "0", "--beam-size needs a whole number from 1 to 999999999, got '0'"),
        ("--average", "00", "--average needs a whole number from 1 to 999999999, got '00'"),
        ("--average", "9223372036854775808", "--average needs a whole number from 1 to"),
    ]:
        wrong = run_recipe(corpus, option, value, check=False)
        assert wrong.returncode == 2 and said in wrong.stderr, wrong.stderr
    backwards = run_recipe(corpus, "--stage", "5", "--stop-stage", "3", check=False)
    assert "--stage 5 is after --stop-stage 3: no stage to run" in backwards.stderr
    huge = run_recipe(corpus, "--stage", "99999999999999999999", "--stop-stage", "1", check=False)
    assert huge.returncode == 2 and "--stage needs a whole number from 0 to 999999999" in (
        huge.stderr
    )  # it overflowed the comparisons, which then ran stage 1
    if corpus in ("yesno", "folder", "librispeech"):  # those with --config
        missing = run_recipe(corpus, "--config", "conf/none.yaml", check=False)
        assert missing.returncode == 2 and "no config conf/none.yaml" in missing.stderr


def test_folder_needs_data_dir(tmp_path, repo_outputs):
    result = run_recipe("folder", "--data", tmp_path / "data", check=False)
    assert result.returncode == 2 and "--data-dir DIR is required" in result.stderr
    assert not (tmp_path / "data").exists()
    result = run_recipe("folder", "--data-dir", tmp_path, "--init", tmp_path / "no.ckpt",
                        check=False)  # fmt: skip
    assert result.returncode == 2 and f"--init {tmp_path / 'no.ckpt'}: no such" in result.stderr
    fake, _ = recording_asr(tmp_path)  # a fine-tune trained: its initial model may be gone
    (tmp_path / "exp" / "conformer").mkdir(parents=True)
    (tmp_path / "exp" / "conformer" / ".done-4").write_text("")
    args = ["--data-dir", tmp_path, "--data", tmp_path / "data", "--exp", tmp_path / "exp",
            "--init", tmp_path / "no.ckpt"]  # fmt: skip
    resumed = run_recipe("folder", *args, "--stage", "4", "--stop-stage", "4", bin_dir=fake)
    assert skipped(resumed.stdout) == [4]
    # forced to train again, its checkpoints would go first: it needs its initial model
    forced = run_recipe("folder", *args, "--stage", "4", "--force", bin_dir=fake, check=False)
    assert forced.returncode == 2 and "no such checkpoint or package" in forced.stderr
    assert (tmp_path / "exp" / "conformer" / ".done-4").is_file()


def test_a_corpus_folder_that_is_not_there_is_named_not_downloaded_over(tmp_path):
    """Where --data-dir holds no corpus, stage 0 downloads it; without a network (or a
    typo'd --data-dir) that ended in a URLError traceback. It says why in a line now."""
    args = ["--data", tmp_path / "data", "--exp", tmp_path / "exp"]
    result = run_recipe("yesno", *args, "--data-dir", tmp_path / "nowhere", "--url",
                        f"file://{tmp_path}/none.tar.gz", check=False)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"no corpus at {tmp_path / 'nowhere'}" in result.stdout
    assert f"download of file://{tmp_path}/none.tar.gz failed" in result.stderr
    result = run_recipe("librispeech", *args, "--data-dir", tmp_path / "dl", "--url-base",
                        f"file://{tmp_path}/none", "--stop-stage", "0", check=False)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"download of file://{tmp_path}/none/" in result.stderr


# -------------------------------------------------------------------------------- yesno


def _shift_module():
    spec = importlib.util.spec_from_file_location("shift", REPO / "recipes/yesno/shift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_word_spans_merge_close_runs_and_drop_clicks():
    shift = _shift_module()
    quiet, loud = [-60.0] * 10, [0.0] * 8
    energy = np.array(quiet + loud + [-60.0] * 2 + loud + quiet + [0.0] * 2 + quiet + loud)
    # the 2-frame gap is inside a word, the 2-frame burst is a click
    assert shift.word_spans(energy) == [(10, 28), (50, 58)]


def test_shifted_copies_start_in_the_gaps(tmp_path):
    """Synthetic 'words' (tone bursts) between silences: one copy per later word, each
    starting in the silence before it, with the remaining words as text."""
    shift = _shift_module()
    rate, words = 8000, ["NO", "YES", "YES", "NO"]
    t = np.arange(int(0.3 * rate)) / rate
    burst, gap = 0.5 * np.sin(2 * np.pi * 440 * t), np.zeros(int(0.2 * rate))
    wave = np.concatenate([gap, *[np.concatenate([burst, gap]) for _ in words]])
    sf.write(tmp_path / "a.wav", wave.astype(np.float32), rate)
    utterance = shift.Utterance(str(tmp_path / "a.wav"), len(wave) / rate, " ".join(words), "a")
    copies = shift.shifted(utterance, rate)
    assert [c.text for c in copies] == ["YES YES NO", "YES NO", "NO"]
    for k, copy in enumerate(copies, start=1):
        word_start = 0.2 + k * 0.5
        assert word_start - 0.2 < copy.offset < word_start
        assert copy.offset + copy.duration == pytest.approx(len(wave) / rate, abs=1e-6)
    assert shift.shifted(shift.Utterance(utterance.audio_filepath, 1.0, "NO YES", "b"), rate) == []


def _assert_yesno_data(data: Path) -> dict[str, int]:
    """Stages 1-3 of the yesno recipe wrote the splits, the shifted copies, tokenizer and CMVN."""
    assert markers(data) == [1, 2, 3]
    sizes = {
        split: len(read_manifest(data / f"{split}.jsonl")) for split in ("train", "dev", "test")
    }
    assert sizes == {"train": 26, "dev": 5, "test": 29}
    train = read_manifest(data / "train.jsonl")
    shifted = read_manifest(data / "train_shifted.jsonl")
    assert shifted[: len(train)] == train and len(shifted) > 4 * len(train)
    assert any(u.text.startswith("YES") for u in shifted)  # what the copies are for
    assert Tokenizer.load(data / "tokenizer").vocab_size > 5 and (data / "cmvn.json").is_file()
    return sizes


@pytest.mark.slow
@pytest.mark.needs_corpus
def test_yesno_end_to_end_tiny(yesno_dir, tmp_path, repo_outputs):
    """All stages with a 1-epoch training: printed WER/CER match the written metrics."""
    data, exp = tmp_path / "data", tmp_path / "exp"
    args = ["--data-dir", yesno_dir, "--data", data, "--exp", exp, "--beam-size", "1"]
    result = run_recipe("yesno", *args, "--average", "1", "--", "--trainer.max_epochs", "1")
    assert ran(result.stdout) == [1, 2, 3, 4, 5, 6, 7]
    model_dir = exp / "transformer"
    assert markers(model_dir) == [4, 5, 6, 7]
    sizes = _assert_yesno_data(data)
    assert (model_dir / "avg.ckpt").is_file()
    printed = WER_LINE.findall(result.stdout)
    for (wer, cer, count), split in zip(printed, ("dev", "test"), strict=True):
        metrics = json.loads((model_dir / f"decode_{split}" / "metrics.json").read_text())
        assert (float(wer), float(cer)) == (round(metrics["wer"], 2), round(metrics["cer"], 2))
        assert int(count) == sizes[split]
        table = (model_dir / "RESULTS.md").read_text()
        assert table in result.stdout and f"- decode_{split}: beam 1, ctc 0.3;" in table
        assert results_row(table, f"decode_{split}", metrics["wer"], metrics["cer"], sizes[split])

    again = run_recipe("yesno", *args, "--average", "1")  # the `--` options need not be given
    assert skipped(again.stdout) == [1, 2, 3, 4, 5, 6, 7] and ran(again.stdout) == []


@pytest.mark.slow  # stage 0's download is in the default run on AN4
@pytest.mark.needs_corpus
def test_yesno_download_when_absent(yesno_dir, tmp_path, repo_outputs):
    """Stage 0 fetches the tarball (a file:// URL here) when --data-dir has no corpus; stages
    1-3 then prepare the real corpus, and a re-run finds the downloaded copy and skips them.
    (Training and decoding run end to end in the AN4 test; on yesno, in the slow tests.)"""
    tarball = tmp_path / "waves_yesno.tar.gz"
    with tarfile.open(tarball, "w:gz", compresslevel=1) as archive:
        archive.add(yesno_dir, arcname="waves_yesno")
    data = tmp_path / "data"
    args = ["--data-dir", tmp_path / "absent", "--data", data, "--exp", tmp_path / "exp"]
    missing = run_recipe("yesno", *args, "--stage", "1", check=False)
    assert missing.returncode == 2 and "not found" in missing.stderr
    result = run_recipe("yesno", *args, "--url", tarball.as_uri(), "--stop-stage", "3")
    assert f"== stage 0 (download {tarball.as_uri()}): no corpus at" in result.stdout
    assert ran(result.stdout) == [1, 2, 3]
    assert len(list((data / "download" / "waves_yesno").glob("*.wav"))) == 60
    _assert_yesno_data(data)
    again = run_recipe("yesno", *args, "--stop-stage", "3")
    assert "corpus found at" in again.stdout
    assert skipped(again.stdout) == [1, 2, 3] and ran(again.stdout) == []


@pytest.mark.slow
@pytest.mark.needs_corpus
def test_yesno_default_recipe_reaches_low_wer(yesno_dir, tmp_path, repo_outputs):
    run_recipe("yesno", "--data-dir", yesno_dir, "--data", tmp_path / "d", "--exp", tmp_path / "e")
    for split in ("dev", "test"):
        metrics = json.loads((tmp_path / f"e/transformer/decode_{split}/metrics.json").read_text())
        assert metrics["wer"] < 10.0, (split, metrics["wer"])


# ---------------------------------------------------------------------------------- AN4


@pytest.fixture(params=["fixture", "mini_an4"])
def an4_tarball(request, an4_fixture, tmp_path) -> Path:
    """An AN4 tarball as CMU distributes it: made from tests/fixtures/an4 (WAV under `an4/`),
    or ../shared's 8-utterance sample of the real one (SPHERE under `downloads/an4/`)."""
    if request.param == "mini_an4":
        return corpus_path("mini_an4", "an4_sphere_mini.tar.gz")
    tarball = tmp_path / "an4_sphere.tar.gz"
    with tarfile.open(tarball, "w:gz", compresslevel=1) as archive:
        archive.add(an4_fixture, arcname="an4")
    return tarball


def _transcript_lines(an4_tarball: Path) -> dict[str, int]:
    """Split -> lines of etc/an4_<split>.transcription in an AN4 tarball."""
    with tarfile.open(an4_tarball) as archive:
        return {
            split: len(archive.extractfile(member).read().splitlines())
            for member in archive.getmembers()
            for split in ("train", "test")
            if member.name.endswith(f"etc/an4_{split}.transcription")
        }


def test_an4_download_when_absent(an4_tarball, an4_fixture, tmp_path, repo_outputs):
    """Stage 0 fetches the tarball (a file:// URL here) when --data-dir is not found, checks
    its layout and keeps it as it is; stage 1 prepares it; a re-run finds the downloaded copy."""
    data = tmp_path / "data"
    args = ["--data-dir", tmp_path / "absent", "--data", data, "--exp", tmp_path / "exp"]
    missing = run_recipe("an4", *args, "--stage", "1", check=False)
    assert missing.returncode == 2 and f"AN4 not found at {tmp_path / 'absent'}" in missing.stderr
    assert "an4_sphere.tar.gz" in missing.stderr and not data.exists()

    not_an4 = tmp_path / "not_an4.tar.gz"  # audio but no transcripts: refused, nothing kept
    with tarfile.open(not_an4, "w:gz", compresslevel=1) as archive:
        archive.add(an4_fixture / "wav", arcname="an4/wav")
    refused = run_recipe("an4", *args, "--an4-url", not_an4.as_uri(), check=False)
    assert refused.returncode == 1
    assert "nothing matches *an4/etc/an4_train.transcription" in refused.stderr
    assert "pass --data-dir" in refused.stderr and not list((data / "download").iterdir())

    result = run_recipe("an4", *args, "--an4-url", an4_tarball.as_uri(), "--stop-stage", "1")
    assert f"== stage 0 (download {an4_tarball.as_uri()})" in result.stdout
    assert ran(result.stdout) == [1]
    downloaded = data / "download" / "an4_sphere.tar.gz"
    assert downloaded.read_bytes() == an4_tarball.read_bytes()
    sizes = {s: len(read_manifest(data / f"{s}.jsonl")) for s in ("train", "dev", "test")}
    lines = _transcript_lines(an4_tarball)
    assert (sizes["train"] + sizes["dev"], sizes["test"]) == (lines["train"], lines["test"])
    assert sizes["dev"] == 1

    again = run_recipe("an4", *args, "--an4-url", "file:///nowhere", "--stop-stage", "1")
    assert f"AN4 found at {downloaded}, skipping" in again.stdout and skipped(again.stdout) == [1]


def results_row(table: str, name: str, wer: float, cer: float, utterances: int) -> bool:
    """Whether the WER and the CER table of a recipe's RESULTS.md hold `name`'s row, in
    ESPnet's columns (dataset, Snt, Wrd, Corr, Sub, Del, Ins, Err, S.Err)."""
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith(f"| {name} |")]
    if len(rows) != 2:
        return False
    (word, char) = ([cell.strip() for cell in r] for r in rows)
    corr, sub, dele = (float(x) for x in word[3:6])
    return (
        word[1] == char[1] == str(utterances)
        and word[7] == f"{wer:.1f}" and char[7] == f"{cer:.1f}"
        and abs(corr + sub + dele - 100) < 0.2
    )  # fmt: skip


@pytest.mark.needs_corpus
def test_an4_quick_end_to_end(mini_an4_tar, tmp_path):
    """The quick recipe on a few AN4 recordings, each stage for real; a re-run skips every
    stage, and --force reruns the stages asked for alone. (The LM and robustness stages'
    wiring are tests of their own; the LM stages run for real in the slow Mini LibriSpeech
    test, `asr robustness` in tests/test_robustness.py.)"""
    data, exp = tmp_path / "data", tmp_path / "exp"
    args = ["--data-dir", mini_an4_tar, "--data", data, "--exp", exp, "--quick"]
    args += ["--beam-size", "2", "--average", "1"]
    result = run_recipe("an4", *args, "--", "--trainer.max_epochs", "1")
    assert ran(result.stdout) == [1, 2, 3, 4, 5, 6, 7]
    assert markers(data) == [1, 2, 3]
    model_dir = exp / "transformer_quick"
    assert markers(model_dir) == [4, 5, 6, 7]
    table = (model_dir / "RESULTS.md").read_text()
    for split in ("dev", "test"):  # a Transformer decodes at CTC 0.5 unless told otherwise
        metrics = json.loads((model_dir / f"decode_{split}" / "metrics.json").read_text())
        assert f"- decode_{split}: beam 2, ctc 0.5;" in table and table in result.stdout
        assert results_row(table, f"decode_{split}", metrics["wer"], metrics["cer"],
                           metrics["utterances"])  # fmt: skip
    outputs = [data / "train.jsonl", data / "tokenizer" / "tokenizer.json", data / "cmvn.json"]
    stamps = [p.stat().st_mtime_ns for p in outputs]
    again = run_recipe("an4", *args)
    assert ran(again.stdout) == [] and skipped(again.stdout) == [1, 2, 3, 4, 5, 6, 7]
    assert [p.stat().st_mtime_ns for p in outputs] == stamps

    forced = run_recipe("an4", *args, "--stage", "3", "--stop-stage", "3", "--force")
    assert ran(forced.stdout) == [3]
    assert [p.stat().st_mtime_ns for p in outputs][:2] == stamps[:2]
    assert outputs[2].stat().st_mtime_ns != stamps[2]


FAKE_METRICS = dict(  # the metrics.json of a decode, as the recorder's `evaluate` writes it
    reference_words=1, reference_characters=1, substitutions=0, deletions=0, insertions=0,
    char_substitutions=0, char_deletions=0, char_insertions=0, sentence_errors=0,
    utterances=1, real_time_factor=0.1, search=dict(beam_size=10, ctc_weight=0.5, lm_weight=0.3),
)  # fmt: skip
RECORDING_ASR = """#!{python}
# Records its arguments; `evaluate` writes a metrics.json for the results stage.
import json, os, sys
with open("{log}", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "evaluate":
    out = sys.argv[sys.argv.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump({metrics}, f)
"""


def recording_asr(tmp_path: Path) -> tuple[Path, Path]:
    """A folder whose `asr` records its arguments, and the file it writes them to."""
    fake, log = tmp_path / "bin", tmp_path / "calls.txt"
    fake.mkdir()
    (fake / "asr").write_text(recorder(log))
    (fake / "asr").chmod(0o755)
    return fake, log


def recorder(log: Path) -> str:
    """The program of `recording_asr`."""
    return RECORDING_ASR.format(python=sys.executable, log=log, metrics=json.dumps(FAKE_METRICS))


LEAVING_OUT_ASR = """#!{python}
# `asr prepare` writes a manifest, lists an input it left out and exits {status}, or crashes
# (exit 1, no summary); the other commands record their arguments.
import json, os, sys
if sys.argv[1] == "prepare":
    if "{status}" == "crash":
        raise RuntimeError("a bug")
    out = sys.argv[sys.argv.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "train.jsonl"), "w").close()
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({{"unusable_audio": ["bad.wav: unreadable"]}}, f)
    print("asr prepare: 1 input(s) left out:\\n  bad.wav: unreadable", file=sys.stderr)
    sys.exit({status})
with open("{log}", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
"""


@pytest.mark.parametrize("corpus", ["an4", "yesno", "librispeech"])
def test_a_prepare_stage_that_left_inputs_out_warns_and_goes_on(corpus, tmp_path):
    """`asr prepare`'s exit status 1 (inputs listed and left out, the rest's manifests written)
    is a warning, as Kaldi's data preparation drops a bad utterance; 2 still stops the recipe."""
    data, exp, fake, log = tmp_path / "data", tmp_path / "exp", tmp_path / "bin", tmp_path / "log"
    fake.mkdir()
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--stop-stage", "2"]
    if corpus == "librispeech":
        (tmp_path / "train-set").mkdir()
        args += ["--train-sets", "train-set", "--dev-set", "train-set", "--test-sets", "train-set"]
    for status in (2, "crash", 1):  # a crash exits 1 too, but lists nothing left out
        (fake / "asr").write_text(LEAVING_OUT_ASR.format(python=sys.executable, log=log,
                                                         status=status))  # fmt: skip
        (fake / "asr").chmod(0o755)
        result = run_recipe(corpus, *args, bin_dir=fake, check=False)
        if status != 1:
            code = 2 if status == 2 else 1
            assert result.returncode == code, result.stderr
            assert f"stage 1 (prepare manifests) failed (exit {code})" in result.stderr
            assert not log.exists() and 1 not in markers(data)
    assert result.returncode == 0, result.stderr
    assert "bad.wav: unreadable" in result.stderr
    assert "warning: stage 1 (prepare manifests): asr prepare left out" in result.stderr
    assert "--stage 1 --force" in result.stderr
    assert ran(result.stdout)[0] == 1 and 2 in ran(result.stdout) and 1 in markers(data)
    assert "tokenizer --manifest" in log.read_text()


@pytest.mark.slow  # the LM stages also run for real in the slow Mini LibriSpeech test
def test_an4_language_model_stages_train_and_fuse_the_recipe_lm(tmp_path):
    """--lm-weight W: stage 8 trains conf/an4/lm.yaml on the training transcripts into
    exp/lm, stage 9 decodes dev and test with it fused at W and rewrites the results table
    (asr replaced by a recorder: the stages' commands, not their work)."""
    fake, log = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    for stage in range(1, 8):  # stages 1-7 done already
        (data if stage < 4 else exp / "transformer_quick").mkdir(parents=True, exist_ok=True)
        ((data if stage < 4 else exp / "transformer_quick") / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick"]
    undecoded = run_recipe("an4", *args, "--lm-weight", "0.3", bin_dir=fake, check=False)
    assert undecoded.returncode == 1 and "results: dev is not decoded" in undecoded.stderr
    assert [c.split()[0] for c in log.read_text().splitlines()] == ["fit"], "no LM decodes"
    log.unlink()
    (exp / "lm" / ".done-8").unlink()  # as were it not trained yet
    for split in ("dev", "test"):  # stage 6's decodes
        (exp / "transformer_quick" / f"decode_{split}").mkdir()
        (exp / "transformer_quick" / f"decode_{split}" / "metrics.json").write_text(
            json.dumps(FAKE_METRICS)
        )
    result = run_recipe("an4", *args, "--lm-weight", "0.3", bin_dir=fake)
    assert ran(result.stdout) == [8, 9]
    fit, *decodes = log.read_text().splitlines()
    assert fit.startswith("fit --config conf/an4/lm.yaml")
    assert f"--data.train_manifest {data}/train.jsonl" in fit
    assert f"--trainer.default_root_dir {exp}/lm" in fit
    lm = f"--lm {exp}/lm/checkpoints/last.ckpt --lm-weight 0.3"
    assert [d.split(" --out ")[1].split()[0] for d in decodes] == [
        f"{exp}/transformer_quick/decode_{split}_lm" for split in ("dev", "test")
    ]
    assert all(d.startswith("evaluate --checkpoint") and d.endswith(lm) for d in decodes)
    assert "| decode_dev_lm | 1 |" in result.stdout, "stage 9 rewrote the results table"
    assert "--ckpt_path" not in fit
    other = run_recipe("an4", *args, "--lm-weight", "0.3", "--beam-size", "3", bin_dir=fake,
                       check=False)  # fmt: skip
    assert other.returncode == 2 and "stage 9 was done otherwise" in other.stderr
    # the model decoded again without the LM: its table has no rows of the model before
    run_recipe("an4", *args, "--stage", "6", "--stop-stage", "7", "--force", bin_dir=fake)
    table = (exp / "transformer_quick" / "RESULTS.md").read_text()
    assert "decode_dev |" in table and "_lm" not in table
    assert not (exp / "transformer_quick" / "decode_dev_lm").exists()

    (exp / "lm" / "checkpoints").mkdir(parents=True)  # killed during stage 8: it resumes
    (exp / "lm" / "checkpoints" / "last.ckpt").write_text("")
    (exp / "lm" / "logs" / "version_0").mkdir(parents=True)
    (exp / "lm" / ".done-8").unlink()
    log.unlink()
    run_recipe("an4", *args, "--lm-weight", "0.3", "--stop-stage", "8", bin_dir=fake)
    assert log.read_text().splitlines()[0].endswith("--ckpt_path last")
    log.unlink()  # --force over the finished stage: afresh, its checkpoints gone
    run_recipe("an4", *args, "--lm-weight", "0.3", "--stage", "8", "--stop-stage", "8",
               "--force", bin_dir=fake)  # fmt: skip
    assert "--ckpt_path" not in log.read_text() and not (exp / "lm" / "checkpoints").exists()
    assert not (exp / "lm" / "logs").exists(), "the old run's curves would join the new one's"
    (exp / "lm" / "logs" / "version_0").mkdir(parents=True)  # killed before a checkpoint
    (exp / "lm" / ".done-8").unlink()
    run_recipe("an4", *args, "--lm-weight", "0.3", "--stop-stage", "8", bin_dir=fake)
    assert not (exp / "lm" / "logs").exists(), "a run afresh, joined to the killed one's"
    (exp / "lm" / "logs" / "version_0").mkdir(parents=True)  # a finished run's: kept
    run_recipe("an4", *args, "--lm-weight", "0.3", "--stop-stage", "8", bin_dir=fake)
    assert (exp / "lm" / "logs" / "version_0").is_dir()


def test_an4_robustness_stage_scores_the_model_with_the_recipes_search(tmp_path):
    """--robustness adds stage 10: `asr robustness` of the averaged model on test, with the
    recipe's beam and CTC weight (asr replaced by a recorder: the stage's command)."""
    fake, log = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    for stage in range(1, 8):  # stages 1-7 done already
        (data if stage < 4 else exp / "transformer_quick").mkdir(parents=True, exist_ok=True)
        ((data if stage < 4 else exp / "transformer_quick") / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--robustness"]
    result = run_recipe("an4", *args, "--beam-size", "2", bin_dir=fake)
    assert ran(result.stdout) == [10]
    model_dir = exp / "transformer_quick"
    assert log.read_text().splitlines() == [
        f"robustness --checkpoint {model_dir}/avg.ckpt --manifest {data}/test.jsonl --out "
        f"{model_dir}/robustness_test --beam-size 2 --ctc-weight 0.5"
    ]
    assert markers(model_dir) == [4, 5, 6, 7, 10]
    again = run_recipe("an4", *args, "--beam-size", "2", bin_dir=fake)
    assert ran(again.stdout) == [] and 10 in skipped(again.stdout)


def test_stages_asked_for_that_none_runs_are_a_usage_error(tmp_path):
    """The LM stages without --lm-weight, or a stage past the last: it printed nothing and
    exited 0, as if they had run."""
    fake, log = recording_asr(tmp_path)
    args = ["--data-dir", tmp_path, "--data", tmp_path / "data", "--exp", tmp_path / "exp"]
    for stages in (["--stage", "8", "--stop-stage", "9"], ["--stage", "12"]):
        result = run_recipe("an4", *args, "--quick", *stages, bin_dir=fake, check=False)
        assert result.returncode == 2, result.stderr
        assert f"no stage from {stages[1]} to " in result.stderr and "turns them on" in (
            result.stderr
        )
    assert not log.exists() or not log.read_text()
    no_download = run_recipe("folder", *args, "--stage", "0", "--stop-stage", "0", check=False)
    assert no_download.returncode == 2 and "no stage from 0 to 0 ran" in no_download.stderr


@pytest.mark.parametrize(
    ("sets", "said"),
    [(["--train-sets", "books-a"], "--train-sets books-a: train.jsonl pools the sets named"),
     (["--train-sets", "train-clean-100", "--test-sets", "train-other-500"],
      "train-other-500: a set named train-* is pooled into"),
     (["--dev-set", "train-clean-5"], "train-clean-5: a set named train-* is pooled into")],
)  # fmt: skip
def test_librispeech_sets_are_pooled_by_their_names(tmp_path, sets, said):
    """asr prepare pools train-* into train.jsonl: a test set so named was trained on, and a
    train set named otherwise left out."""
    fake, log = recording_asr(tmp_path)
    args = ["--data-dir", tmp_path, "--data", tmp_path / "data", "--exp", tmp_path / "exp"]
    result = run_recipe("librispeech", *args, *sets, bin_dir=fake, check=False)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert not log.exists() or not log.read_text()


def test_a_stage_done_before_an_earlier_one_ran_again_elsewhere_is_named(tmp_path):
    """Forcing stage 1 drops the later markers of data/ only: training in exp/ was done on
    the manifests it replaced, and a re-run that skips it says so."""
    fake, _ = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    for stage in range(1, 8):
        (data if stage < 4 else exp / "transformer_quick").mkdir(parents=True, exist_ok=True)
        ((data if stage < 4 else exp / "transformer_quick") / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--stop-stage", "7"]
    quiet = run_recipe("an4", *args, "--stage", "4", bin_dir=fake)
    assert skipped(quiet.stdout) == [4, 5, 6, 7] and "warning" not in quiet.stderr
    run_recipe("an4", *args, "--stage", "1", "--stop-stage", "1", "--force", bin_dir=fake)
    later = run_recipe("an4", *args, "--stage", "4", bin_dir=fake)
    assert skipped(later.stdout) == [4, 5, 6, 7]
    assert f"warning: stage 1 ran again ({data}/.done-1) after stage 4 was done" in later.stderr
    assert "--stage 4 --force" in later.stderr and later.stderr.count("warning") == 1
    # The LM (exp/lm) reads the data, not the model: a model trained again leaves it be.
    (exp / "lm").mkdir()
    (exp / "lm" / ".done-8").write_text("")
    lm = ["--lm-weight", "0.3", "--stop-stage", "8"]
    run_recipe("an4", *args, *lm, "--stage", "4", "--stop-stage", "4", "--force", bin_dir=fake)
    assert "warning" not in run_recipe("an4", *args, *lm, "--stage", "8", bin_dir=fake).stderr
    run_recipe("an4", *args, *lm, "--stage", "1", "--stop-stage", "1", "--force", bin_dir=fake)
    again = run_recipe("an4", *args, *lm, "--stage", "8", bin_dir=fake)
    assert "warning: stage 1 ran again" in again.stderr, again.stderr
    # the decodes with the LM read it: an LM trained again leaves them behind
    (exp / "transformer_quick" / ".done-9").write_text("")
    lm[-1] = "9"
    run_recipe("an4", *args, *lm, "--stage", "8", "--stop-stage", "8", "--force", bin_dir=fake)
    fused = run_recipe("an4", *args, *lm, "--stage", "9", bin_dir=fake)
    assert skipped(fused.stdout) == [9] and "warning: stage 8 ran again" in fused.stderr


@pytest.mark.parametrize("options, vocabulary", [((), []), (("--tokenizer", "bpe"), ["100"]),
                                                  (("--tokenizer", "unigram", "--vocab-size", "60"),
                                                   ["60"])])  # fmt: skip
def test_an4_tokenizer_stage_gives_pieces_a_vocabulary_size(tmp_path, options, vocabulary):
    fake, log = recording_asr(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    (data / ".done-1").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", tmp_path / "exp", "--quick"]
    run_recipe("an4", *args, *options, "--stage", "2", "--stop-stage", "2", bin_dir=fake)
    call = log.read_text().split()
    assert call[0] == "tokenizer" and call[call.index("--kind") + 1] == (options or ["", "char"])[1]
    given = call[call.index("--vocab-size") + 1 :][:1] if "--vocab-size" in call else []
    assert given == vocabulary


def test_models_of_one_frontend_share_the_cmvn_stage(tmp_path):
    """The statistics depend on the level normaliser and features alone: a second model with
    the same ones skips stage 3 (also after a marker of the older form, which names the first
    config by its path), one with other features is refused as done otherwise."""
    fake, log = recording_asr(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    for stage in (1, 2):
        (data / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", tmp_path / "exp", "--stop-stage", "3"]
    first = run_recipe("folder", *args, "--config", "conf/an4/conformer.yaml", bin_dir=fake)
    assert ran(first.stdout) == [3] and "--config conf/an4/conformer.yaml" in log.read_text()
    again = run_recipe("folder", *args, "--config", "conf/an4/transformer.yaml", bin_dir=fake)
    assert skipped(again.stdout) == [1, 2, 3]
    config = yaml.safe_load((REPO / "conf/an4/conformer.yaml").read_text())
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(config.pop("model")))
    (tmp_path / "split.yaml").write_text(yaml.safe_dump({**config, "model": "model.yaml"}))
    split = run_recipe("folder", *args, "--config", tmp_path / "split.yaml", bin_dir=fake)
    assert skipped(split.stdout) == [1, 2, 3]  # its model in a file of its own: one frontend
    command = log.read_text().split()
    for older in (f"CMVN statistics: asr {' '.join(command)}", f"asr {' '.join(command)}"):
        (data / ".done-3").write_text(older + "\n")
        rerun = run_recipe("folder", *args, "--config", "conf/an4/transformer.yaml", bin_dir=fake)
        assert skipped(rerun.stdout) == [1, 2, 3]  # another config, the same frontend
    run_recipe("folder", *args, "--config", "conf/an4/conformer.yaml", "--stage", "3", "--force",
               bin_dir=fake)  # fmt: skip
    other = tmp_path / "mels40.yaml"
    other.write_text(
        Path(REPO / "conf/an4/conformer.yaml").read_text().replace("n_mels: 80", "n_mels: 40")
    )
    refused = run_recipe("folder", *args, "--config", other, bin_dir=fake, check=False)
    assert refused.returncode == 2 and "stage 3 was done otherwise" in refused.stderr
    assert '"n_mels":40' in refused.stderr and '"n_mels":80' in refused.stderr


def test_results_of_a_split_not_decoded_are_refused(tmp_path):
    """A results stage with one split's decode missing wrote a table of the others, marked
    itself done and named the missing split's plots. A table is titled by the configs that
    trained the model."""
    fake, _ = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    model = exp / "transformer_quick"
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--stage", "7"]
    for stage in range(1, 7):  # stages 1-6 done already, dev decoded
        folder = data if stage < 4 else model
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f".done-{stage}").write_text("")
    (model / ".done-4").write_text("train (conf/an4/transformer_quick.yaml): asr fit ...\n")
    for split in ("dev", "test"):
        (model / f"decode_{split}").mkdir()
    (model / "decode_dev" / "metrics.json").write_text(json.dumps(FAKE_METRICS))
    failed = run_recipe("an4", *args, bin_dir=fake, check=False)
    assert failed.returncode != 0
    assert f"results: test is not decoded (no {model}/decode_test/metrics.json)" in failed.stderr
    assert not (model / ".done-7").exists() and not (model / "RESULTS.md").exists()
    # titled by the configs that trained the model, not by those of the run that writes it
    (model / "decode_test" / "metrics.json").write_text(json.dumps(FAKE_METRICS))
    run_recipe("an4", *args, "--", "--config", "conf/an4/augment.yaml", bin_dir=fake)
    title = (model / "RESULTS.md").read_text().splitlines()[0]
    assert title == "# conf/an4/transformer_quick.yaml"


def test_a_stage_done_with_other_options_is_not_skipped_as_if_done_with_these(tmp_path):
    """A decode done at beam 10, asked again at beam 3: a usage error showing both commands,
    not a skip that claims beam 3. --force runs it; a forced run that fails leaves no marker,
    so the next plain run does not take the old results for done. Bad --lm-weight: refused."""
    fake, log = tmp_path / "bin", tmp_path / "calls.txt"
    failing = tmp_path / "failing"
    for folder, tail in ((fake, ""), (failing, "sys.exit(1)\n")):
        folder.mkdir()
        (folder / "asr").write_text(recorder(log) + tail)
        (folder / "asr").chmod(0o755)
    data, exp = tmp_path / "data", tmp_path / "exp"
    for stage in range(1, 6):  # stages 1-5 done already (hand-made markers: any command)
        folder = data if stage < 4 else exp / "transformer_quick"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--stage", "6",
            "--stop-stage", "6"]  # fmt: skip
    assert ran(run_recipe("an4", *args, bin_dir=fake).stdout) == [6]
    again = run_recipe("an4", *args, bin_dir=fake)
    assert "stage 6 (decode dev and test (beam 10, CTC weight 0.5)): done already" in again.stdout
    other = run_recipe("an4", *args, "--beam-size", "3", bin_dir=fake, check=False)
    assert other.returncode == 2 and "stage 6 was done otherwise" in other.stderr
    assert "give --stage 6 --force to run it again" in other.stderr  # not stages 1-5 too
    then, now = (line for line in other.stderr.splitlines() if line.startswith(("  then", "  now")))
    assert "(beam 10, CTC weight 0.5)" in then and "(beam 3, CTC weight 0.5)" in now
    forced = run_recipe("an4", *args, "--beam-size", "3", "--force", bin_dir=failing, check=False)
    assert forced.returncode != 0 and not (exp / "transformer_quick" / ".done-6").exists()
    assert ran(run_recipe("an4", *args, bin_dir=fake).stdout) == [6], "not taken for done"
    bad = run_recipe("an4", *args, "--lm-weight", "0,4", bin_dir=fake, check=False)
    assert bad.returncode == 2 and "--lm-weight needs a number >= 0, got '0,4'" in bad.stderr
    spelt = run_recipe("an4", *args, "--ctc-weight", "0.50", bin_dir=fake)  # as 0.5
    assert "stage 6 (decode dev and test (beam 10, CTC weight 0.5)): done already" in spelt.stdout
    marker = exp / "transformer_quick" / ".done-6"  # a record of 0.50, from before
    marker.write_text(marker.read_text().replace("CTC weight 0.5", "CTC weight 0.50"))
    assert "CTC weight 0.50" in marker.read_text()
    assert "done already" in run_recipe("an4", *args, bin_dir=fake).stdout


def test_stage_records_compare_option_numbers_in_one_spelling_and_nothing_else():
    """A record of CTC weight 0.50 is one of 0.5; a path "an4 01" is not one of "an4 1"."""
    record = "decode (beam 10, CTC weight 0.50) --seed 007 --data-dir /d/an4 01"
    script = f"source {REPO / 'recipes/lib/stages.sh'}; normal_numbers '{record}'"
    said = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert said.stdout == "decode (beam 10, CTC weight 0.5) --seed 7 --data-dir /d/an4 01\n"


def test_gpu_smoke_refuses_an_out_folder_holding_what_it_would_remove(tmp_path):
    """--out is removed first: `--out .` (taken from the repository) was a no-op refusal of
    rm, and relative options named folders there; as given it must not remove the folder the
    script was started in, the data, or the repository."""
    (tmp_path / "LibriSpeech").mkdir()
    script = REPO / "recipes" / "librispeech" / "gpu_smoke.sh"
    (tmp_path / "start").symlink_to(tmp_path)  # started in a linked folder
    for out, said in ((".", "is removed first"), ("..", "is removed first"),
                      (str(REPO), "is removed first"), (str(tmp_path), "is removed first"),
                      (str(REPO / "recipes"), "lies in the repository")):  # fmt: skip
        result = subprocess.run(
            ["bash", str(script), "--data-dir", "LibriSpeech", "--out", out],
            capture_output=True, text=True, cwd=tmp_path / "start", timeout=60,
        )  # fmt: skip
        assert result.returncode == 2 and said in result.stderr, result.stderr
    assert (tmp_path / "LibriSpeech").is_dir()
    # numbers are checked as given, not once the data are prepared ("abc: unbound variable")
    for option, value, said in [
        ("--steps", "abc", "--steps needs a whole number, got 'abc'"),
        ("--workers", "-1", "--workers needs a whole number"),
        ("--batch-seconds", "0", "--batch-seconds needs a number above 0"),
        ("--accelerator", "tpu", "--accelerator needs gpu or cpu, got 'tpu'"),
        ("--data-dir", "", "--data-dir needs a value"),
    ]:
        args = ["bash", str(script), option, value, "--out", str(tmp_path / "scratch")]
        result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert result.returncode == 2 and said in result.stderr, result.stderr
    for option in ("--out", "--data-dir", "--accelerator"):  # said, not "$2: unbound variable"
        args = ["bash", str(script), "--steps", "5", option]
        result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert result.returncode == 2 and f"{option} needs " in result.stderr, result.stderr
    # a folder no smoke run made (the recipe's exp/librispeech, say) is kept: it was removed
    (tmp_path / "results" / "model").mkdir(parents=True)
    (tmp_path / "results" / "notes.txt").write_text("weeks of work")
    args = ["bash", str(script), "--data-dir", "LibriSpeech", "--out", "results"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    said = f"--out {tmp_path / 'results'} holds notes.txt, which no smoke run wrote"
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert (tmp_path / "results" / "notes.txt").read_text() == "weeks of work"


@pytest.mark.parametrize(
    ("corpus", "option", "value", "said"),
    [
        ("an4", "--tokenizer", "bpee", "--tokenizer needs one of char bpe unigram, got 'bpee'"),
        ("an4", "--vocab-size", "abc", "--vocab-size needs a whole number, got 'abc'"),
        ("an4", "--lm-weight", "200", "--lm-weight needs a number in [0, 100], got '200'"),
        ("folder", "--seed", "x", "--seed needs a whole number, got 'x'"),
        ("folder", "--dev-fraction", "2", "--dev-fraction needs a number in [0, 1], got '2'"),
        ("an4", "--vocab-size", "50", "--vocab-size sets a bpe or unigram tokenizer's size"),
        ("mini_librispeech", "--model", "--quick", "--model needs a value"),
        ("librispeech", "--cmvn-utterances", "0", "--cmvn-utterances needs a whole number from"),
        ("mini_librispeech", "--lm-config", "conf/none.yaml", "no LM config conf/none.yaml"),
    ],
)
def test_a_recipes_own_options_are_checked_before_any_stage(corpus, option, value, said):
    """Each was found only when its stage came (the LM config after training), or never."""
    extra = ["--lm-weight", "0.4"] if option == "--lm-config" else []
    wrong = run_recipe(corpus, *extra, option, value, check=False)
    assert wrong.returncode == 2 and said in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("option", ["--data", "--exp", "--data-dir"])
def test_an_empty_folder_option_is_refused(option, tmp_path):
    """`--data "$UNSET"` ran the recipe into the folder it was started in."""
    folders = {"--data": tmp_path / "data", "--exp": tmp_path / "exp", "--data-dir": tmp_path}
    args = [x for name, value in folders.items() for x in (name, value)]
    args[args.index(option) + 1] = ""
    empty = run_recipe("yesno", *args, "--stop-stage", "1", check=False, cwd=tmp_path)
    assert empty.returncode == 2 and f"{option} needs a value, got an empty one" in empty.stderr
    assert not list(tmp_path.iterdir())


def test_a_config_after_the_double_dash_makes_another_model(tmp_path):
    """`-- --config conf/an4/augment.yaml` trains another model than the plain config: either
    run over the other's stage 4 is refused, not skipped as done."""
    fake, log = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    data.mkdir()
    for stage in range(1, 4):
        (data / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--stage", "4",
            "--stop-stage", "4"]  # fmt: skip
    augmented = ["--", "--config", "conf/an4/augment.yaml"]
    for first, then in (([], ["--", "--config=conf/an4/augment.yaml"]), (augmented, [])):
        assert ran(run_recipe("an4", *args, "--force", *first, bin_dir=fake).stdout) == [4]
        other = run_recipe("an4", *args, *then, bin_dir=fake, check=False)
        assert other.returncode == 2 and "stage 4 was done otherwise" in other.stderr
        assert "+ conf/an4/augment.yaml" in other.stderr
    assert log.read_text().splitlines()[-1].endswith("--config conf/an4/augment.yaml")


def test_paths_after_the_double_dash_are_read_from_where_the_recipe_started(tmp_path):
    """`-- --data.train_manifest data/an4/train.jsonl` read the repository's manifest (which
    may be another data set of the same vocabulary) though the recipe started elsewhere, and a
    path missing there still does; words, numbers, class paths and URLs are left as they are,
    and configs not found there are read from the repository."""
    start = tmp_path / "my start"
    (start / "data" / "an4").mkdir(parents=True)
    (start / "data" / "an4" / "train.jsonl").write_text("")
    (start / "init.ckpt").write_text("")
    given = [
        "--data.train_manifest",
        "data/an4/train.jsonl",
        "--trainer.accelerator",
        "cpu",
        "--model.init_args.init_from=init.ckpt",
        "--trainer.max_epochs",
        "0.5",
        "--config",
        "conf/an4/augment.yaml",
        "--data.val_manifest",
        "data/an4/dev.jsonl",
        "--model.init_args.frontend.init_args.augment",
        "asr.frontends.SpecAugment",
        "--model.init_args.init_from",
        "hf://me/an4",
        "--x",
        "~/y/z",
        "--trainer.logger",  # a dict, whose paths are asr fit's to read
        '{"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "a/b"}}',
    ]
    script = (f'root="{REPO}"; source "{REPO}/recipes/lib/stages.sh"; fit_args=("$@"); '
              'fit_paths; printf "%s\\n" "${fit_args[@]}"')  # fmt: skip
    said = subprocess.run(["bash", "-c", script, "-", *given], capture_output=True, text=True,
                          cwd=start, check=True)  # fmt: skip
    expected = [
        *given[:1],
        str(start / "data/an4/train.jsonl"),
        *given[2:4],
        f"--model.init_args.init_from={start / 'init.ckpt'}",
        *given[5:10],
        str(start / "data/an4/dev.jsonl"),
        *given[11:],
    ]
    assert said.stdout.splitlines() == expected


def test_force_trains_afresh_a_run_stopped_halfway(tmp_path):
    """An interrupted stage 4 resumes when the recipe runs again; with --force it trains
    afresh, as asked (before, it resumed the old weights, or was refused for another tokenizer
    on every rerun)."""
    fake, log = recording_asr(tmp_path)
    data, exp = tmp_path / "data", tmp_path / "exp"
    data.mkdir()
    for stage in range(1, 4):
        (data / f".done-{stage}").write_text("")
    checkpoints = exp / "transformer_quick" / "checkpoints"
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick", "--stage", "4",
            "--stop-stage", "4"]  # fmt: skip
    for extra, resumed in (([], True), (["--force"], False)):
        checkpoints.mkdir(parents=True, exist_ok=True)
        (checkpoints / "last.ckpt").write_text("")
        (exp / "transformer_quick" / ".done-4").unlink(missing_ok=True)  # stopped halfway
        assert ran(run_recipe("an4", *args, *extra, bin_dir=fake).stdout) == [4]
        fit = log.read_text().splitlines()[-1]
        assert ("--ckpt_path last" in fit) == resumed and checkpoints.exists() == resumed


@pytest.mark.parametrize(
    ("marker", "same"),
    [
        ("asr x --data {root}/data/an4/ --out data//tok", "asr x --data data/an4 --out data/tok"),
        ("prepare /c/my corpus/./a//b/ /c/x/../y", "prepare /c/my corpus/a/b /c/y"),
        ("asr fit --config ./conf/x.yaml --data /../d", "asr fit --config conf/x.yaml --data /d"),
    ],
)  # fmt: skip
def test_paths_in_markers_compare_as_the_folders_they_name(marker, same):
    """A marker of `data/`, `./data` or the repository's own `data` by its full path is one of
    `data`: markers written before the recipes normalised their paths, or a default folder
    given again by name, are not another run."""
    script = f'root="{REPO}"; source "{REPO}/recipes/lib/stages.sh"; normal_paths "$1"'
    said = subprocess.run(["bash", "-c", script, "-", marker.format(root=REPO)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert said.stdout == same + "\n"


@pytest.mark.parametrize(
    ("marker", "record", "same"),
    [
        ("prepare /c/yy x", "prepare /c/yy", False),  # another folder, with a space in its name
        ("prepare /c/yy --seed 3", "prepare /c/yy", True),  # options of an older marker
        ("prepare /c/yy", "prepare /c/yy", True),
        ("", "prepare /c/yy", True),  # made by hand
    ],
)  # fmt: skip
def test_a_marker_is_of_this_stage_by_its_record_or_options_after_it(marker, record, same):
    script = f'root="{REPO}"; source "{REPO}/recipes/lib/stages.sh"; same_stage "$1" "$2"'
    said = subprocess.run(["bash", "-c", script, "-", marker, record], capture_output=True)
    assert (said.returncode == 0) == same, said.stderr


def test_a_stage_run_again_leaves_the_stages_after_it_to_run_again(tmp_path):
    """A forced stage 4 that failed kept the markers of 5-7: the re-run trained again, then
    skipped averaging and decoding, and the old model's results stood for the new one's. One
    folder spelled otherwise (a trailing slash, a `.`) is the same folder."""
    fake, _ = recording_asr(tmp_path)
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "asr").write_text("#!/usr/bin/env bash\nexit 1\n")
    (failing / "asr").chmod(0o755)
    data, exp = tmp_path / "data", tmp_path / "exp"
    model = exp / "transformer_quick"
    for stage in range(1, 8):  # stages 1-7 done already (hand-made markers: any command)
        folder = data if stage < 4 else model
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f".done-{stage}").write_text("")
    args = ["--data-dir", tmp_path, "--data", data, "--exp", exp, "--quick"]
    spelled = ["--data-dir", tmp_path, "--data", f"{data}/", "--exp", f"{exp}/./", "--quick"]
    assert skipped(run_recipe("an4", *spelled, "--stop-stage", "6", bin_dir=fake).stdout) == [
        1, 2, 3, 4, 5, 6
    ]  # fmt: skip
    forced = run_recipe("an4", *args, "--stage", "5", "--stop-stage", "5", "--force",
                        bin_dir=failing, check=False)  # fmt: skip
    assert forced.returncode != 0 and markers(model) == [4]
    for stage in (5, 6, 7):
        (model / f".done-{stage}").write_text("")
    run_recipe("an4", *args, "--stage", "4", "--stop-stage", "4", "--force", bin_dir=fake)
    assert markers(model) == [4] and markers(data) == [1, 2, 3]


@pytest.mark.needs_corpus
def test_an4_stage_failing_halfway_reruns_cleanly(mini_an4_tar, tmp_path):
    """A tokenizer stage that dies after writing part of its output: no marker, the next
    run skips stage 1, redoes stage 2 over the debris and carries on."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "asr").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = tokenizer ]; then\n'
        '  out="${@: -1}"; mkdir -p "$out"; echo "{partial" > "$out/tokenizer.json"\n'
        '  echo "simulated crash" >&2; exit 3\n'
        "fi\n"
        f'exec "{BIN / "asr"}" "$@"\n'
    )
    (fake / "asr").chmod(0o755)
    data = tmp_path / "data"
    args = ["--data-dir", mini_an4_tar, "--data", data, "--exp", tmp_path / "exp"]

    failed = run_recipe("an4", *args, "--stop-stage", "3", bin_dir=fake, check=False)
    assert failed.returncode == 3
    assert "stage 2 (tokenizer) failed (exit 3)" in failed.stderr
    (fake / "asr").write_text((fake / "asr").read_text().replace("exit 3", "exit 143"))
    stopped = run_recipe("an4", *args, "--stop-stage", "3", bin_dir=fake, check=False)
    assert stopped.returncode == 143 and "stage 2 (tokenizer) stopped by SIGTERM" in stopped.stderr
    assert "failed" not in stopped.stderr
    assert markers(data) == [1] and not (data / "cmvn.json").exists()

    rerun = run_recipe("an4", *args, "--stop-stage", "3")
    assert skipped(rerun.stdout) == [1] and ran(rerun.stdout) == [2, 3]
    assert markers(data) == [1, 2, 3]
    assert Tokenizer.load(data / "tokenizer").vocab_size > 4  # the debris was replaced


@pytest.mark.parametrize(
    ("signal", "status", "by"),
    [("TERM", 143, "SIGTERM"), ("INT", 130, "Ctrl-C"), ("HUP", 129, "SIGHUP (its terminal"),
     ("KILL", -9, None)],
)  # fmt: skip
def test_a_signal_to_the_recipe_stops_the_command_of_its_stage(tmp_path, signal, status, by):
    """`kill` of the recipe's shell (or Ctrl-C to it) ends the stage's command as well, and
    the recipe ends after it: a training left running, orphaned, or still saving, would race
    the re-run that resumes it. SIGKILL, which the recipe cannot trap, ends it within
    seconds."""
    if signal == "HUP" and signal_module.getsignal(signal_module.SIGHUP) == signal_module.SIG_IGN:
        pytest.skip("SIGHUP is ignored here (nohup), so the recipe can neither trap nor get it")
    fake, pid_file, ended = tmp_path / "bin", tmp_path / "stage.pid", tmp_path / "ended"
    fake.mkdir()
    (fake / "asr").write_text(  # a command that takes a second to stop, as a fit saving
        f'#!/usr/bin/env bash\necho $$ > "{pid_file}"\n'
        f"trap 'sleep 1; kill $! 2>/dev/null; touch \"{ended}\"; exit 143' TERM INT\n"
        "sleep 60 & wait\n"
    )
    (fake / "asr").chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join([str(fake), os.environ.get("PATH", "")])}
    args = ["--data-dir", tmp_path, "--data", tmp_path / "data", "--exp", tmp_path / "exp"]
    log = tmp_path / "log"
    with log.open("w") as out:  # not a pipe, which the command would hold open after it
        recipe = subprocess.Popen(
            ["bash", str(REPO / "recipes/an4/run.sh"), *map(str, args)],
            stdout=out, stderr=out, text=True, env=env, cwd=REPO,
        )  # fmt: skip
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        stage_pid = int(pid_file.read_text())
        recipe.send_signal(getattr(signal_module, f"SIG{signal}"))
        assert recipe.wait(timeout=20) == status
        if by is not None:
            assert ended.exists(), "the recipe ended before its stage's command"
            assert f"stage 1 (prepare manifests) stopped by {by}" in log.read_text()
        for _ in range(100):  # the watch looks every second
            try:
                os.kill(stage_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with pytest.raises(ProcessLookupError):
            os.kill(stage_pid, 0)
    finally:
        recipe.kill()
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal_module.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


# ------------------------------------------------------------------------------- folder


def _audio_folder(yesno_dir: Path, root: Path, count: int = 12) -> dict[str, str]:
    """`count` yes/no recordings in two speaker folders with .txt transcripts, and one
    recording without a transcript; returns utterance id -> text."""
    texts = {}
    for k, wav in enumerate(sorted(yesno_dir.glob("*.wav"))[:count]):
        speaker = root / f"spk{k % 2}"
        speaker.mkdir(parents=True, exist_ok=True)
        (speaker / wav.name).symlink_to(wav)
        text = " ".join("YES" if c == "1" else "NO" for c in wav.stem.split("_"))
        (speaker / f"{wav.stem}.txt").write_text(text.lower() + "\n")
        texts[f"{speaker.name}-{wav.stem}"] = text.lower()
    (root / "spk0" / "untranscribed.wav").symlink_to(sorted(yesno_dir.glob("*.wav"))[-1])
    return texts


@pytest.mark.needs_corpus
def test_folder_random_split(yesno_dir, tmp_path, repo_outputs):
    """Stages 1-3 (its training and decoding: test_folder_all_stages, slow)."""
    texts = _audio_folder(yesno_dir, tmp_path / "audio")
    data, exp = tmp_path / "data", tmp_path / "exp"
    split = ["--dev-fraction", "0.25", "--test-fraction", "0.25", "--seed", "3"]
    args = ["--data-dir", tmp_path / "audio", "--data", data, "--exp", exp, *split]
    result = run_recipe("folder", *args, "--tokenizer", "char", "--stop-stage", "3")
    assert ran(result.stdout) == [1, 2, 3]
    splits = {s: read_manifest(data / f"{s}.jsonl") for s in ("train", "dev", "test")}
    assert {s: len(u) for s, u in splits.items()} == {"train": 6, "dev": 3, "test": 3}
    ids = [u.utt_id for utterances in splits.values() for u in utterances]
    assert sorted(ids) == sorted(texts)  # disjoint, complete, the untranscribed one left out
    assert all(u.text == texts[u.utt_id] for utterances in splits.values() for u in utterances)
    summary = json.loads((data / "summary.json").read_text())
    assert summary["missing_transcripts"] == ["spk0/untranscribed.wav"]
    assert markers(data) == [1, 2, 3] and (data / "cmvn.json").is_file()
    other = run_recipe("folder", *args[:-1], "4", "--stop-stage", "1", check=False)  # seed 4
    assert other.returncode == 2 and "stage 1 was done otherwise" in other.stderr
    spelled = ["--data-dir", f"{tmp_path}/./audio/", "--data", f"{data}/", "--exp", exp, *split]
    assert skipped(run_recipe("folder", *spelled, "--stop-stage", "1").stdout) == [1]
    numbers = ["--dev-fraction", "0.250", "--test-fraction", ".25", "--seed", "03"]  # as numbers
    assert skipped(run_recipe("folder", *args[:4], *numbers, "--stop-stage", "1").stdout) == [1]
    (data / ".done-1").write_text("prepare manifests: prepare\n")  # the older form: no options
    assert skipped(run_recipe("folder", *args, "--stop-stage", "1").stdout) == [1]


@pytest.mark.needs_corpus
def test_folder_split_file(yesno_dir, tmp_path):
    texts = _audio_folder(yesno_dir, tmp_path / "audio", count=6)
    ids = sorted(texts)
    assigned = dict(zip(ids, ["train"] * 4 + ["dev", "test"]))
    split_file = tmp_path / "split.txt"
    split_file.write_text("".join(f"{i} {s}\n" for i, s in assigned.items()))
    data = tmp_path / "data"
    args = ["--data-dir", tmp_path / "audio", "--data", data, "--split-file", split_file]
    run_recipe("folder", *args, "--exp", tmp_path / "exp", "--stop-stage", "1")
    for name in ("train", "dev", "test"):
        got = [u.utt_id for u in read_manifest(data / f"{name}.jsonl")]
        assert got == [i for i in ids if assigned[i] == name]

    split_file.write_text(f"{ids[0]} train\n")  # the others have no split
    bad = run_recipe("folder", *args, "--data", tmp_path / "bad", "--stop-stage", "1", check=False)
    assert bad.returncode != 0 and "no split given for 5" in bad.stderr
    assert markers(tmp_path / "bad") == []


@pytest.mark.slow
@pytest.mark.needs_corpus
def test_folder_all_stages(yesno_dir, tmp_path, repo_outputs):
    _audio_folder(yesno_dir, tmp_path / "audio")
    fit = ["--trainer.max_epochs", "2", "--data.num_workers", "0", "--trainer.precision", "32-true"]
    args = ["--data-dir", tmp_path / "audio", "--data", tmp_path / "d", "--exp", tmp_path / "e"]
    args += ["--tokenizer", "char", "--test-fraction", "0.2", "--beam-size", "2"]
    result = run_recipe("folder", *args, "--", *fit)
    assert ran(result.stdout) == [1, 2, 3, 4, 5, 6, 7]
    assert len(WER_LINE.findall(result.stdout)) == 2
    assert "# conf/folder/conformer.yaml" in result.stdout
    assert "- decode_test: beam 2, ctc " in result.stdout and "| decode_test | " in result.stdout


# -------------------------------------------------------------------------- LibriSpeech

SAMPLE_SETS = ["--train-sets", "train-clean-5", "--dev-set", "train-clean-5"]
SAMPLE_SETS += ["--test-sets", "train-clean-5"]
SMOKE = [*SAMPLE_SETS, "--config", "conf/librispeech/transformer_smoke.yaml"]  # BPE 100


@pytest.fixture
def librispeech_mirror(librispeech_dir, tmp_path) -> str:
    """A file:// "OpenSLR" holding train-clean-5.tar.gz made from the sample."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with tarfile.open(mirror / "train-clean-5.tar.gz", "w:gz", compresslevel=1) as archive:
        archive.add(librispeech_dir / "train-clean-5", arcname="LibriSpeech/train-clean-5")
    return mirror.as_uri()


@pytest.mark.needs_corpus
def test_librispeech_download_prepare_and_bpe(librispeech_mirror, tmp_path, repo_outputs):
    corpus, data = tmp_path / "corpus", tmp_path / "data"
    args = ["--data-dir", corpus, "--data", data, "--exp", tmp_path / "exp", *SMOKE]
    missing = run_recipe("librispeech", *args, "--stage", "1", check=False)
    assert missing.returncode == 2 and "train-clean-5 not found" in missing.stderr

    result = run_recipe("librispeech", *args, "--url-base", librispeech_mirror, "--stop-stage", "2")
    assert "== stage 0 (download train-clean-5)" in result.stdout
    assert ran(result.stdout) == [1, 2]
    assert (corpus / "LibriSpeech" / "train-clean-5").is_dir()
    assert not list(corpus.glob(".download-*"))  # the unpacking folder is gone
    train = read_manifest(data / "train.jsonl")
    assert len(train) == 38 and train == read_manifest(data / "train-clean-5.jsonl")
    assert Tokenizer.load(data / "bpe100").vocab_size == 100  # the config's size by default

    again = run_recipe("librispeech", *args, "--url-base", "file:///nowhere", "--stop-stage", "2")
    assert "every set found" in again.stdout and skipped(again.stdout) == [1, 2]
    other_size = run_recipe("librispeech", *args, "--vocab-size", "90", "--stop-stage", "2")
    assert skipped(other_size.stdout) == [1] and ran(other_size.stdout) == [2]
    assert Tokenizer.load(data / "bpe90").vocab_size == 90


@pytest.mark.needs_corpus
def test_librispeech_default_config_trains_on_shards_written_by_stage_1(
    librispeech_dir, tmp_path, repo_outputs
):
    data = tmp_path / "data"
    args = ["--data-dir", librispeech_dir.parent, "--data", data, "--exp", tmp_path / "e"]
    args += SAMPLE_SETS
    result = run_recipe("librispeech", *args, "--stop-stage", "1")
    assert "== stage 1 (write shards)" in result.stdout and ran(result.stdout) == [1, 1]
    index = json.loads((data / "shards" / "train" / "shards.json").read_text())
    assert index["utterances"] == 38
    again = run_recipe("librispeech", *args, "--stop-stage", "1")
    assert skipped(again.stdout) == [1, 1]


@pytest.mark.slow
@pytest.mark.needs_corpus
def test_librispeech_smoke_all_stages(librispeech_dir, tmp_path, repo_outputs):
    args = ["--data-dir", librispeech_dir.parent, "--data", tmp_path / "d", "--exp", tmp_path / "e"]
    result = run_recipe("librispeech", *args, *SMOKE, "--beam-size", "2")
    assert ran(result.stdout) == [1, 2, 3, 4, 5, 6, 7]
    assert "# conf/librispeech/transformer_smoke.yaml" in result.stdout
    assert "- decode_train-clean-5: beam 2, ctc 0.3;" in result.stdout


# ---------------------------------------------------------------------- Mini LibriSpeech


def few_mini_librispeech_files(
    root: Path, out: Path, per_set: dict[str, int], shortest: tuple[str, ...] = ()
) -> Path:
    """A copy of the first `per_set[set]` utterances of each set of Mini LibriSpeech (Opus), of
    those in `shortest` the ones with the shortest transcripts (an untrained model decodes a
    long one slowly), in the LibriSpeech layout, under out/LibriSpeech."""
    for name, count in per_set.items():
        lines = [(trans, line) for trans in sorted((root / name).glob("*/*/*.trans.txt"))
                 for line in trans.read_text().splitlines()]  # fmt: skip
        if name in shortest:
            lines.sort(key=lambda found: (len(found[1]), found[1]))
        chosen: dict[Path, list[str]] = {}
        for trans, line in lines[:count]:
            chosen.setdefault(trans, []).append(line)
        for trans, kept in chosen.items():
            chapter = out / "LibriSpeech" / name / trans.parent.parent.name / trans.parent.name
            chapter.mkdir(parents=True)
            (chapter / trans.name).write_text("".join(line + "\n" for line in sorted(kept)))
            for line in kept:
                audio = trans.parent / f"{line.split()[0]}.opus"
                (chapter / audio.name).write_bytes(audio.read_bytes())
    return out


def _mini_librispeech_default_stages(tmp_path: Path) -> tuple[list, Path, Path]:
    """Stages 1-7 on a few Opus files with the default model (one batch, dev decoded); the
    recipe's arguments, its data and its exp folder."""
    root = corpus_path("mini_librispeech", "LibriSpeech")
    sets = {"train-clean-5": 8, "dev-clean-5": 2}
    corpus = few_mini_librispeech_files(root, tmp_path / "corpus", sets, ("dev-clean-5",))
    data, exp = tmp_path / "d", tmp_path / "e"
    args = ["--data-dir", corpus, "--data", data, "--exp", exp]
    args += ["--dev-set", "dev-clean-5", "--test-sets", "dev-clean-5"]
    args += ["--vocab-size", "60", "--beam-size", "2"]
    fit = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1"]
    fit += ["--model.init_args.greedy_validation", "false"]  # it keeps checkpoints by val/acc
    result = run_recipe("mini_librispeech", *args, "--", *fit)
    assert ran(result.stdout) == [1, 2, 3, 4, 5, 6, 7]
    assert len(read_manifest(data / "train.jsonl")) == 8
    assert len(read_manifest(data / "dev-clean-5.jsonl")) == 2
    assert Tokenizer.load(data / "bpe60").vocab_size == 60
    assert "# conf/mini_librispeech/conformer.yaml" in result.stdout, "the default model"
    assert "| decode_dev-clean-5 | 2 |" in result.stdout
    return args, data, exp


@pytest.mark.slow  # its stages 1-7 also run before the slow LM stages' test
@pytest.mark.needs_corpus
def test_mini_librispeech_stages_of_the_default_and_a_step_of_each_other_model(
    tmp_path, repo_outputs
):
    _, data, _ = _mini_librispeech_default_stages(tmp_path)
    for model in ("transformer", "rnn"):
        root_dir = tmp_path / model
        main(["fit", "--config", str(REPO / f"conf/mini_librispeech/{model}.yaml"),
              "--data.train_manifest", str(data / "train.jsonl"),
              "--data.val_manifest", str(data / "dev-clean-5.jsonl"),
              "--data.test_manifest", str(data / "dev-clean-5.jsonl"),
              "--data.tokenizer", str(data / "bpe60"),
              "--model.init_args.frontend.init_args.normalize.init_args.stats_path",
              str(data / "cmvn.json"), "--trainer.default_root_dir", str(root_dir),
              "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
              "--data.max_batch_seconds", "20"])  # fmt: skip
        assert (root_dir / "checkpoints" / "last.ckpt").is_file(), model


@pytest.mark.slow
@pytest.mark.needs_corpus
def test_mini_librispeech_lm_stages(tmp_path, repo_outputs):
    """After stages 1-7, the recipe's LM (two epochs) and a decode fused with it (stages 8-9)."""
    args, _, exp = _mini_librispeech_default_stages(tmp_path)
    lm_config = tmp_path / "lm.yaml"
    lm_yaml = (REPO / "conf/mini_librispeech/lm.yaml").read_text()
    lm_config.write_text(lm_yaml.replace("max_epochs: 20", "max_epochs: 2"))
    fused = run_recipe("mini_librispeech", *args, "--stage", "8", "--lm-weight", "0.3",
                       "--lm-config", lm_config)  # fmt: skip
    assert ran(fused.stdout) == [8, 9] and markers(exp / "lm_bpe60") == [8]
    assert "- decode_dev-clean-5_lm: beam 2, ctc 0.5, LM 0.3;" in fused.stdout
    assert "| decode_dev-clean-5 | 2 |" in fused.stdout  # the plain row stays in the table


def test_librispeech_lm_weight_needs_an_lm_config(tmp_path):
    result = run_recipe("librispeech", "--data", tmp_path, "--lm-weight", "0.3", check=False)
    assert result.returncode == 2 and "--lm-weight needs --lm-config" in result.stderr


def test_mini_librispeech_rejects_an_unknown_model():
    result = run_recipe("mini_librispeech", "--model", "lstm", check=False)
    assert result.returncode == 2 and "no config" in result.stderr
    later = run_recipe("mini_librispeech", "--stop-stage", "0", "--model", "lstm", check=False)
    assert later.returncode == 2 and "no config" in later.stderr, "--model anywhere"
