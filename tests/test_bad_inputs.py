"""Bad audio, transcripts and manifests through the batch commands (issue 7): one table of
cases, each saying what `asr prepare folder`, `asr validate-data` (the check `asr fit` runs
before training), `asr transcribe` and `asr evaluate` must do with it.

Every command gets the bad input next to a good one: a format the loader converts must work
like the good one, anything else must be reported on a line naming the file (and the
manifest line) with the reason, the good input must still be processed, and the exit status
must be 1 (2 where the command refuses to start). The model is a randomly initialised tiny
Transformer: only the handling of inputs is under test, not what it recognises.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.audio import audio_info
from asr.cli import main

RATE = 16000
GOOD_TEXT = "YES"
HOUR = 3600  # seconds
BIG_FILE = 10 * 2**20  # bytes: files this large are deleted after each test

# --------------------------------------------------------------------------- artefacts


def tone(seconds: float = 1.0, rate: int = RATE, channels: int = 1) -> np.ndarray:
    """A 440 Hz sine at 0.3 of full scale, `(S,)` or `(S, channels)` float32."""
    wave = 0.3 * np.sin(2 * np.pi * 440 * np.arange(round(seconds * rate)) / rate)
    wave = wave.astype(np.float32)
    return wave if channels == 1 else np.repeat(wave[:, None], channels, axis=1)


def wav(name: str, **options) -> Callable[[Path], Path]:
    """A writer of `<folder>/<name>.wav` holding `tone()`; `options` go to soundfile.write
    (`subtype`), `tone` (`rate`, `channels`) or set `samples` instead of the tone."""

    def write(folder: Path) -> Path:
        path = folder / f"{name}.wav"
        rate, channels = options.get("rate", RATE), options.get("channels", 1)
        samples = options.get("samples", tone(rate=rate, channels=channels))
        soundfile.write(path, samples, rate, subtype=options.get("subtype"))
        return path

    return write


def raw(name: str, content: Callable[[bytes], bytes]) -> Callable[[Path], Path]:
    """A writer of `<folder>/<name>.wav` whose bytes are `content(bytes of a good WAV)`."""

    def write(folder: Path) -> Path:
        path = folder / f"{name}.wav"
        soundfile.write(path, tone(), RATE, subtype="PCM_16")
        path.write_bytes(content(path.read_bytes()))
        return path

    return write


def with_sample(value: float) -> np.ndarray:
    samples = tone()
    samples[100] = value
    return samples


def missing(folder: Path) -> Path:
    """A dangling link: the name is there (a folder scan finds it), the file is not."""
    path = folder / "missing.wav"
    path.symlink_to(folder / "gone.wav")
    return path


def directory(folder: Path) -> Path:
    path = folder / "directory.wav"
    path.mkdir()
    return path


def unreadable(folder: Path) -> Path:
    path = wav("unreadable")(folder)
    path.chmod(0)
    return path


def one_hour(folder: Path) -> Path:
    """An hour at 16 kHz: a second of tone, then silence; written a minute at a time."""
    path = folder / "one-hour.wav"
    with soundfile.SoundFile(path, "w", RATE, 1, subtype="PCM_16") as file:
        file.write(tone())
        for written in range(1, HOUR, 60):
            file.write(np.zeros(min(60, HOUR - written) * RATE, np.float32))
    return path


def duplicate(folder: Path) -> Path:
    """Audio whose stem, hence its id and output names, is the good file's."""
    path = folder / "good.flac"
    soundfile.write(path, tone(), RATE)
    return path


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Outcome:
    """What a command must do with a case: exit with `code`, and unless it is 0, print a line
    matching `message`, a regex in which {audio}, {txt}, {line} and {id} stand for the case's
    audio path, transcript path, `manifest:line` and utterance id."""

    code: int
    message: str = ""


OK = Outcome(0)


def failed(message: str) -> Outcome:
    """Reported, and the other inputs processed: exit 1."""
    return Outcome(1, message)


def refused(message: str) -> Outcome:
    """The command stops before doing anything: exit 2."""
    return Outcome(2, message)


@dataclass(frozen=True)
class Case:
    """One bad (or unusual) input. None: the command does not take this kind of input."""

    id: str
    audio: Callable[[Path], Path]  # writes the case's audio into a folder, returns its path
    prepare: Outcome | None
    validate: Outcome | None  # `asr validate-data --tokenizer`, the up-front check of `asr fit`
    transcribe: Outcome | None
    evaluate: Outcome | None
    text: bytes = GOOD_TEXT.encode()  # its transcript as stored (.txt file, manifest text)
    line: Callable[[bytes], bytes] | None = None  # edits its manifest line
    full: Outcome | None = None  # `validate-data --full` (decodes audio), where checked
    marks: tuple = ()

    def param(self):
        return pytest.param(self, id=self.id, marks=self.marks)


def converted(name: str, **options) -> Case:
    """A format the loader converts (bit depth, channels, rate): works everywhere."""
    return Case(name, wav(name, **options), OK, OK, OK, OK)


def unreadable_audio(name: str, writer: Callable[[Path], Path], reason: str, **more) -> Case:
    """Audio whose header cannot be used: every command names it with `reason`."""
    return Case(
        name,
        writer,
        prepare=failed(rf"{{audio}}: {reason}"),
        validate=failed(rf"{{line}}: audio {{audio}}: {reason}"),
        transcribe=failed(rf"{{audio}}: {reason}"),
        evaluate=failed(rf"{{line}}: audio {{audio}}: {reason}"),
        **more,
    )


def bad_samples(name: str, value: float, reason: str = "contains NaN or infinite samples") -> Case:
    """A valid header over bad samples: found when the samples are decoded."""
    return Case(
        name,
        wav(name, samples=with_sample(value), subtype="FLOAT"),
        prepare=OK,  # headers only
        validate=OK,  # headers only; see `full`
        transcribe=failed(rf"{{audio}}: {reason}"),
        evaluate=failed(rf"{{audio}} \({{id}}\): {reason}"),
        full=failed(rf"{{line}}: audio {{audio}}: {reason}"),
    )


def bad_text(name: str, text: bytes, prepare: str, validate: str, evaluate: Outcome) -> Case:
    """A good recording with a bad transcript (prepare reads it from `<stem>.txt`)."""
    return Case(
        name,
        wav(name),
        prepare=failed(prepare) if prepare else OK,
        validate=failed(validate),
        transcribe=None,
        evaluate=evaluate,
        text=text,
    )


AS_ROOT = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0, reason="root reads files without read permission"
)
NOT_FOUND, CORRUPT = "file not found", r"unreadable or corrupt audio \(.+\)"
UTF8 = "not valid UTF-8"

CASES = [
    unreadable_audio("missing", missing, NOT_FOUND),
    unreadable_audio("zero-bytes", raw("zero-bytes", lambda _: b""), r"empty file \(0 bytes\)"),
    unreadable_audio(
        "no-samples",
        wav("no-samples", samples=np.zeros(0, np.float32)),
        r"(audio is )?empty \(0 samples\)",
    ),
    unreadable_audio("truncated-header", raw("truncated-header", lambda b: b[:20]), CORRUPT),
    unreadable_audio("corrupt-header", raw("corrupt-header", lambda b: b"RIFX" + b[4:]), CORRUPT),
    unreadable_audio(
        "random-bytes", raw("random-bytes", lambda _: np.random.default_rng(0).bytes(4096)), CORRUPT
    ),
    Case(  # transcribe searches a folder for audio
        "directory",
        directory,
        prepare=failed(r"{audio}: is a directory, not an audio file"),
        validate=failed(r"{line}: audio {audio}: is a directory, not an audio file"),
        transcribe=failed(r"{audio}: no audio files in this folder"),
        evaluate=failed(r"{line}: audio {audio}: is a directory, not an audio file"),
    ),
    unreadable_audio("unreadable", unreadable, "permission denied", marks=(AS_ROOT,)),
    Case(  # the header's data size is larger than the file: libsndfile reads what is there
        "truncated-data",
        raw("truncated-data", lambda b: b[:1000]),
        prepare=OK,
        validate=failed(r"{line}: duration 0\.030 s is below 0\.1 s"),  # as fit refuses it
        transcribe=OK,  # too short to hold a word: an empty transcript
        evaluate=failed(r"{audio} \({id}\): .*too short"),
    ),
    bad_samples("nan", float("nan")),
    bad_samples("inf", float("inf")),
    # a float file's glitch: its features would overflow to NaN statistics
    bad_samples("huge", 1e30, reason=r"float samples lie within ±1, got 1e\+30"),
    Case(  # shorter than `asr fit` takes (data.min_duration): validate-data names it too
        "too-short",
        wav("too-short", samples=tone(0.01)),
        prepare=OK,  # a recording, if a short one: the minimum is training's to apply
        validate=failed(r"{line}: duration 0\.010 s is below 0\.1 s"),
        transcribe=None,
        evaluate=None,
    ),
    converted("pcm-u8", subtype="PCM_U8"),
    converted("pcm-24", subtype="PCM_24"),
    converted("float-32", subtype="FLOAT"),
    converted("stereo", channels=2),
    converted("6-channels", channels=6),
    converted("8-khz", rate=8000),
    converted("48-khz", rate=48000),
    # evaluate decodes each manifest utterance whole: recordings this long go to transcribe,
    # which splits them (and reads the hour a minute at a time).
    Case("one-hour", one_hour, prepare=OK, validate=OK, transcribe=OK, evaluate=None),
    bad_text(
        "non-utf8-text",
        b"caf\xe9",
        prepare=rf"{{txt}}: transcript is {UTF8} \(byte 0xe9 at offset 3\)",
        validate=rf"{{line}}: {UTF8} \(byte 0xe9 at column \d+\)",
        evaluate=failed(rf"{{line}}: {UTF8} \(byte 0xe9 at column \d+\)"),
    ),
    bad_text(
        "empty-text",
        b"",
        prepare=r"{txt}: transcript is empty",
        validate=r"{line}: empty transcript",
        evaluate=OK,  # an empty reference scores its hypothesis as insertions
    ),
    bad_text(
        "out-of-vocabulary",
        "日本".encode(),
        prepare="",  # no tokenizer yet
        validate=r"{line}: outside the tokenizer's vocabulary: '日' '本'",
        evaluate=OK,  # references are scored as they are
    ),
    bad_text(
        "punctuation-only",
        b"!!! ...",
        prepare="",  # the words are the tokenizer's to judge
        validate=r"{line}: no tokens left after the tokenizer's normalisation",
        evaluate=OK,
    ),
    Case(
        "invalid-json",
        wav("invalid-json"),
        prepare=None,
        validate=failed(r"{line}: invalid JSON: .+ \(column \d+\)"),
        transcribe=None,
        evaluate=failed(r"{line}: invalid JSON: .+ \(column \d+\)"),
        line=lambda line: line[: len(line) // 2],
    ),
    Case(
        "duplicate-id",
        duplicate,
        prepare=refused(r"{audio} and .*good\.wav both give utterance id 'good'"),
        validate=failed(r"{line}: duplicate id 'good' \(first on line 1\)"),
        transcribe=refused(r"good\.wav and {audio} would write the same output files"),
        evaluate=failed(r"{line}: duplicate id 'good' \(first on line 1\)"),
    ),
]
BY_ID = {case.id: case for case in CASES}


def test_the_table_covers_every_case_of_the_issue():
    issue = [
        "missing", "zero-bytes", "truncated-header", "corrupt-header", "random-bytes", "nan",
        "inf", "pcm-u8", "pcm-24", "float-32", "stereo", "6-channels", "8-khz", "48-khz",
        "one-hour", "directory", "unreadable", "non-utf8-text", "empty-text", "invalid-json",
        "duplicate-id", "out-of-vocabulary",
    ]  # fmt: skip
    assert set(issue) <= set(BY_ID) and len(BY_ID) == len(CASES)
    commands = ("prepare", "validate", "transcribe", "evaluate")
    for case in CASES:
        assert any(getattr(case, command) is not None for command in commands), case.id


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> dict[str, Path]:
    return tiny_checkpoint


@dataclass
class Inputs:
    """A good recording and a case's input side by side, as files and as a manifest."""

    good: Path
    bad: Path
    manifest: Path
    case: Case

    def pattern(self, message: str) -> str:
        names = {
            "audio": self.bad,
            "txt": self.bad.with_suffix(".txt"),
            "line": f"{self.manifest}:2",
            "id": self.bad.stem,
        }
        return message.format(**{key: re.escape(str(value)) for key, value in names.items()})


@pytest.fixture
def inputs(request, tmp_path) -> Iterator[Inputs]:
    """The case's files in `corpus/` (audio + same-stem .txt, the good ones too) and a
    manifest: the good recording on line 1, the case's on line 2."""
    case: Case = request.param
    folder = tmp_path / "corpus"
    folder.mkdir()
    good = wav("good")(folder)
    bad = case.audio(folder)
    good.with_suffix(".txt").write_text(GOOD_TEXT, encoding="utf-8")
    bad.with_suffix(".txt").write_bytes(case.text)
    line = manifest_line(bad, case.text)
    lines = [manifest_line(good, GOOD_TEXT.encode()), case.line(line) if case.line else line]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    yield Inputs(good, bad, manifest, case)
    for path in folder.iterdir():  # keep pytest's retained tmp folders small
        if path.is_file() and not path.is_symlink() and path.stat().st_size > BIG_FILE:
            path.unlink()


def manifest_line(audio: Path, text: bytes) -> bytes:
    """A manifest line for `audio` with `text` as stored (invalid UTF-8 is kept as it is);
    its duration from the header, or 1 s where there is no readable header."""
    try:
        duration = audio_info(audio).duration or 1.0
    except ValueError:
        duration = 1.0
    record = {"audio_filepath": str(audio), "duration": duration, "text": "@", "id": audio.stem}
    try:
        quoted = json.dumps(text.decode("utf-8"), ensure_ascii=False).encode()
    except UnicodeDecodeError:
        quoted = b'"' + text + b'"'
    return json.dumps(record, ensure_ascii=False).encode().replace(b'"@"', quoted)


def cases_for(command: str) -> list:
    return [case.param() for case in CASES if getattr(case, command) is not None]


def run(argv: list[str], capsys) -> tuple[int, str]:
    """`asr ARGV` in this process: exit status, and stdout and stderr together."""
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def check(outcome: Outcome, code: int, output: str, inputs: Inputs) -> None:
    """The exit status, and for failures a line naming the input with the reason."""
    assert code == outcome.code, output
    if outcome.code:
        pattern = inputs.pattern(outcome.message)
        assert re.search(pattern, output), f"no line matches {pattern!r} in:\n{output}"


# --------------------------------------------------------------------------- the commands


@pytest.mark.parametrize("inputs", cases_for("prepare"), indirect=True)
def test_prepare_folder(inputs, tmp_path, capsys):
    out = tmp_path / "prepared"
    argv = ["prepare", "folder", "--data-dir", str(inputs.good.parent), "--out", str(out)]
    code, output = run(argv, capsys)
    check(inputs.case.prepare, code, output, inputs)
    if code == 2:
        assert not out.exists(), "refused before writing anything"
        return
    manifests = [path.read_text() for path in out.glob("*.jsonl")]
    prepared = [json.loads(line) for text in manifests for line in text.splitlines()]
    assert {u["id"] for u in prepared} == ({"good"} if code else {"good", inputs.bad.stem})
    for u in prepared:
        assert u["duration"] == pytest.approx(audio_info(u["audio_filepath"]).duration)


@pytest.mark.skipif(sys.platform != "linux", reason="a file name of any bytes is Linux's")
def test_prepare_folder_lists_a_file_name_not_utf8_and_goes_on(tmp_path, capsys):
    """A manifest is UTF-8: audio named by other bytes is listed, by its bytes, and left out."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in (b"good", b"caf\xe9"):
        path = Path(os.fsdecode(os.fsencode(folder) + b"/" + name))
        with open(path.with_suffix(".wav"), "wb") as file:  # libsndfile takes UTF-8 names
            soundfile.write(file, tone(), RATE, format="WAV")
        path.with_suffix(".txt").write_text(GOOD_TEXT, encoding="utf-8")
    out = tmp_path / "prepared"
    code, output = run(["prepare", "folder", "--data-dir", str(folder), "--out", str(out)], capsys)
    assert code == 1, output
    named = re.escape(f"{folder}/caf\\xe9.wav: name is not valid UTF-8 (byte 0xe9)")
    assert re.search(rf"^  {named}", output, re.MULTILINE), output
    prepared = [json.loads(line) for path in out.glob("*.jsonl") for line in path.open()]
    assert [u["id"] for u in prepared] == ["good"]
    assert not list(out.glob("*.partial"))


@pytest.mark.parametrize("inputs", cases_for("validate"), indirect=True)
def test_validate_data_as_fit_does(inputs, model, capsys):
    argv = ["validate-data", "--manifest", str(inputs.manifest),
            "--tokenizer", str(model["tokenizer"])]  # fmt: skip
    code, output = run(argv, capsys)
    check(inputs.case.validate, code, output, inputs)
    assert f"{inputs.manifest}: {2 - code} good, {code} bad" in output
    if inputs.case.full is not None:
        code, output = run([*argv, "--full"], capsys)
        check(inputs.case.full, code, output, inputs)


@pytest.mark.parametrize("inputs", cases_for("transcribe"), indirect=True)
def test_transcribe_goes_on_past_bad_files(inputs, model, tmp_path, capsys):
    out = tmp_path / "transcripts"
    argv = ["transcribe", str(inputs.good), str(inputs.bad),
            "--checkpoint", str(model["checkpoint"]), "--output-dir", str(out),
            "--beam-size", "1", "--format", "txt", "--quiet"]  # fmt: skip
    code, output = run(argv, capsys)
    check(inputs.case.transcribe, code, output, inputs)
    if code == 2:
        assert not out.exists(), "refused before writing anything"
        return
    written = {path.stem for path in out.glob("*.txt")}
    assert written == ({"good"} if code else {"good", inputs.bad.stem})
    assert f"{inputs.good}\t" in output
    if code:
        assert "1 of 2 files failed" in output


@pytest.mark.parametrize("inputs", cases_for("evaluate"), indirect=True)
def test_evaluate_scores_the_rest(inputs, model, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["evaluate", "--checkpoint", str(model["checkpoint"]),
            "--manifest", str(inputs.manifest), "--out", str(out),
            "--beam-size", "1", "--plots", "0", "--quiet"]  # fmt: skip
    code, output = run(argv, capsys)
    check(inputs.case.evaluate, code, output, inputs)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["utterances"] == 2 - code == len((out / "hyp.txt").read_text().splitlines())
    assert len(metrics["failures"]) == code
    if code:
        assert re.search(inputs.pattern(inputs.case.evaluate.message), metrics["failures"][0])
