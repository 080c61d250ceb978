"""`asr transcribe` spread over processes (asr.cli.parallel): the split, `--workers`, torchrun,
re-runs that skip what is written, and failures from every rank listed at the end.

The model is test_transcribe's tiny Transformer overfit on four AN4 fixture utterances, saved
as a checkpoint so that child processes can load it; it says YES, GO, YES and U M N Y H SIX.
Every run decodes one input at a time on one thread, so any two runs compute alike.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePath

import pytest
import torch
from conftest import REPO, page_data
from test_package import save_overfit_checkpoint
from test_transcribe import UTTERANCES, WAV

from asr.audio import audio_info
from asr.checkpoint import RECOGNIZER_KEY
from asr.cli import _parser, main
from asr.cli.inputs import Input, _references_in_the_way, expand_inputs
from asr.cli.parallel import (
    LOCK,
    MERGED,
    Plan,
    World,
    _announce,
    holds_records,
    is_written,
    launched_world,
    make_plan,
    merge,
    output_record,
    read_records,
    split_by_duration,
    spreads,
    worker_main,
    writing,
)
from asr.results import Segment, Transcript, Word
from asr.segment import Clip
from asr.writers import expand_formats, write_outputs

# Alike in every run: greedy, one input per batch, one thread per process.
SAME_WORK = ["--beam-size", "1", "--batch-size", "1", "--threads", "1", "--quiet"]
GOOD = {  # output stem -> the fixture utterance copied there
    "a/yes": "an4_clstk/fash/an251-fash-b",
    "a/go": "an4_clstk/fash/an253-fash-b",
    "a/yes2": "an4_clstk/fash/an254-fash-b",
    "b/letters": "an4_clstk/fash/an255-fash-b",
    "b/test1": "an4test_clstk/fcaw/an406-fcaw-b",
    "b/test2": "an4test_clstk/fcaw/an407-fcaw-b",
}
SAID = {stem: UTTERANCES.get(utterance) for stem, utterance in GOOD.items()}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The overfit recognizer as a checkpoint file, with the longest segment `asr fit` stores."""
    path = save_overfit_checkpoint(tmp_path_factory.mktemp("overfit"))
    state = torch.load(path, weights_only=True)
    state[RECOGNIZER_KEY]["segment_seconds"] = TRAINED_SECONDS
    torch.save(state, path)
    return path


TRAINED_SECONDS = 5.0  # longer than every recording here: no segment is cut


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """audio/a and audio/b hold the six good recordings, audio/bad a corrupt one;
    good.jsonl lists the good ones (with an id and a reference; those of b/ without their
    duration, which the workers then measure), all.jsonl also the corrupt one and one that is
    missing."""
    root = tmp_path_factory.mktemp("corpus")
    lines = []
    for stem, utterance in GOOD.items():
        path = root / "audio" / f"{stem}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(WAV / f"{utterance}.wav", path)
        line = {"audio_filepath": str(path), "id": f"utt-{path.stem}"}
        if stem.startswith("a/"):
            line["duration"] = audio_info(path).duration
        lines.append(line | {"text": SAID[stem] or ""})
    corrupt = root / "audio" / "bad" / "corrupt.wav"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(range(256)) * 8)
    bad = [{"audio_filepath": str(corrupt)}, {"audio_filepath": str(root / "audio/missing.wav")}]
    for name, records in (("good", lines), ("all", lines[:3] + bad + lines[3:])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"root": root, "good": root / "good.jsonl", "all": root / "all.jsonl"}


def transcribe(*args) -> tuple[int, str, str]:
    """`asr transcribe ARGS` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["transcribe", *map(str, args)])
        except KeyboardInterrupt:  # would stop the whole test run
            pytest.fail("a Ctrl-C escaped the command")
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def workers_run(checkpoint, corpus, tmp_path_factory) -> dict:
    """`--workers 2` over all.jsonl: its exit status, output and folder."""
    out = tmp_path_factory.mktemp("workers") / "out"
    code, stdout, stderr = transcribe(
        "--manifest", corpus["all"], "--checkpoint", checkpoint, "--output-dir", out,
        "--workers", "2", "--explorer", *SAME_WORK, "--max-segment-seconds", "6",
    )  # fmt: skip
    return {"code": code, "stdout": stdout, "stderr": stderr, "out": out}


PAGE = "explorer.html"


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` but the merged manifest and the explorer's page (whose
    embedded audio is encoded anew each time), by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (MERGED, PAGE)
    }


def merged(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / MERGED).read_text().splitlines()]


# --------------------------------------------------------------------------- the split


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
def test_the_split_is_a_deterministic_partition_balanced_by_duration(parts):
    rng = random.Random(parts)
    durations = [rng.uniform(0.5, 20.0) for _ in range(101)]
    shares = split_by_duration(durations, parts)
    assert sorted(i for share in shares for i in share) == list(range(len(durations)))
    assert all(share == sorted(share) for share in shares)
    assert split_by_duration(durations, parts) == shares
    loads = [sum(durations[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(durations)  # the greedy deal's bound
    assert max(loads) - min(loads) < 0.05 * sum(loads) / parts  # ranks finish together
    assert split_by_duration([], parts) == [[] for _ in range(parts)]
    with pytest.raises(ValueError, match="at least 1"):
        split_by_duration(durations, 0)


def test_the_world_comes_from_torchrun_and_several_processes_need_an_output_dir():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert launched_world(env) == World(rank=1, size=2, local_rank=1, local_size=2)
    assert launched_world({}) is None
    with pytest.raises(ValueError, match="RANK 2 is outside WORLD_SIZE 2"):
        launched_world({"RANK": "2", "WORLD_SIZE": "2"})
    parse = _parser("transcribe").parse_args
    base = ["transcribe", "a.wav", "--checkpoint", "m.ckpt"]
    assert not spreads(parse(base), {})
    assert not spreads(parse(base), {"RANK": "0", "WORLD_SIZE": "1"})  # one process printing
    assert spreads(parse([*base, "--output-dir", "out"]), {"RANK": "0", "WORLD_SIZE": "1"})
    assert spreads(parse([*base, "--output-dir", "out", "--workers", "1"]), {})
    with pytest.raises(ValueError, match="2 processes share the inputs through --output-dir"):
        spreads(parse(base), env)
    with pytest.raises(ValueError, match="2 processes share the inputs through --output-dir"):
        spreads(parse([*base, "--workers", "2"]), {})
    with pytest.raises(ValueError, match="under torchrun .* leave it out"):
        spreads(parse([*base, "--output-dir", "out", "--workers", "2"]), env)
    with pytest.raises(ValueError, match="-: audio on stdin cannot be shared out"):
        spreads(parse([*base[:2], "-", *base[2:], "--output-dir", "out", "--workers", "2"]), {})


def test_the_command_says_what_is_wrong(capsys, tmp_path):
    assert main(["transcribe", "a.wav", "--checkpoint", "m.ckpt", "--workers", "2"]) == 2
    assert "2 processes share the inputs through --output-dir" in capsys.readouterr().err
    (tmp_path / "m.ckpt").touch()
    spread = ["transcribe", "a.wav", "--checkpoint", str(tmp_path / "m.ckpt"), "--workers", "2"]
    assert main([*spread, "--output-dir", str(tmp_path), "--lm", "typo.ckpt"]) == 2
    assert capsys.readouterr().err == "asr transcribe: error: typo.ckpt: no such checkpoint\n"
    assert main(["transcribe", "--checkpoint", "m.ckpt"]) == 2
    assert "nothing to transcribe" in capsys.readouterr().err


# --------------------------------------------------------------------------- runs


def test_workers_write_the_good_files_and_list_the_bad_ones_at_the_end(workers_run, corpus):
    assert workers_run["code"] == 1
    audio = corpus["root"] / "audio"
    tail = workers_run["stderr"].split("asr transcribe: 2 of 8 files failed:\n")[-1]
    assert f"  {audio / 'bad/corrupt.wav'}: unreadable or corrupt audio (" in tail
    assert f"  {audio / 'missing.wav'}: file not found" in tail
    # a warning of the model, said by each worker that loads it: once
    assert workers_run["stderr"].count("--max-segment-seconds 6 is longer than 95%") == 1
    out = workers_run["out"]
    written = sorted(files_of(out))
    kept = ("json", "txt", "explore.npz")  # the npz: the explorer's maps (--explorer)
    assert written == sorted(["explore.json", *(f"{stem}.{end}" for stem in GOOD for end in kept)])
    assert f"explorer: {out / PAGE}" in workers_run["stderr"], "the page, once all is written"
    page = page_data((out / PAGE).read_text())
    assert sorted(u["id"] for u in page["utterances"]) == sorted(GOOD)
    assert all("attention" in u["arrays"] for u in page["utterances"])
    for stem, said in SAID.items():
        assert said is None or (out / f"{stem}.txt").read_text() == said + "\n"
    records = merged(out)
    assert [r["id"] for r in records] == [f"utt-{Path(stem).name}" for stem in GOOD]
    for record, (stem, said) in zip(records, SAID.items()):
        assert record["files"] == [f"{stem}.txt", f"{stem}.json"]
        assert record["audio_filepath"] == str(audio / f"{stem}.wav")
        assert record["text"] == (said or "")  # the manifest's reference stays
        assert record["pred_text"] == (out / f"{stem}.txt").read_text().strip()
        assert record["offset"] == 0.0 and record["duration"] > 0
    assert not list(out.rglob("*.partial")) and not list(out.glob("transcripts.rank*"))


def test_workers_write_what_one_process_writes(workers_run, checkpoint, corpus, tmp_path):
    out = tmp_path / "one"
    code, stdout, stderr = transcribe(
        "--manifest", corpus["all"], "--checkpoint", checkpoint, "--output-dir", out,
        "--explorer", *SAME_WORK,
    )  # fmt: skip
    assert code == 1 and "2 of 8 files failed" in stderr
    assert files_of(out) == files_of(workers_run["out"])
    assert sorted(stdout.splitlines()) == sorted(workers_run["stdout"].splitlines())


def test_a_rerun_skips_everything_written(workers_run, checkpoint, corpus, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(workers_run["out"], out)
    before = files_of(out), merged(out)
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out,
        "--workers", "2", *SAME_WORK,
    )  # fmt: skip
    assert code == 0 and stdout == ""
    assert f"6 of 6 inputs already written in {out}: skipped" in stderr
    assert (files_of(out), merged(out)) == before

    other = tmp_path / "other" / "a"  # another recording of the same name: not written yet
    other.mkdir(parents=True)
    shutil.copy(corpus["root"] / "audio" / "a" / "go.wav", other / "yes.wav")
    code, stdout, stderr = transcribe(
        other.parent, "--checkpoint", checkpoint, "--output-dir", out, "--workers", "2", *SAME_WORK
    )
    assert code == 0 and "already written" not in stderr, stderr
    assert (out / "a" / "yes.txt").read_text().strip() == SAID["a/go"]
    # that file replaced by another recording, of an earlier time: its transcript is stale
    letters = tmp_path / "letters.wav"
    shutil.copy2(corpus["root"] / "audio" / "b" / "letters.wav", letters)
    os.utime(letters, (0, 0))
    os.replace(letters, other / "yes.wav")  # as mv does, keeping the time
    code, stdout, stderr = transcribe(
        other.parent, "--checkpoint", checkpoint, "--output-dir", out, "--workers", "2", *SAME_WORK
    )
    assert code == 0 and "already written" not in stderr, stderr
    assert (out / "a" / "yes.txt").read_text().strip() == SAID["b/letters"]


def test_a_rerun_finishes_an_interrupted_run(workers_run, checkpoint, corpus, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(workers_run["out"], out)
    complete = files_of(out), merged(out)
    (out / "a/yes.json").unlink()  # killed between an input's files
    killed = out / f"a/.go.txt.{2**22 + 1}-0123abcd.partial"  # its process gone
    (out / "a/go.txt").replace(killed)  # killed while writing one
    killed.write_text("YE")
    lines = (out / MERGED).read_text().splitlines(keepends=True)
    (out / MERGED).write_text("".join(lines[:3] + lines[4:]))  # killed before its line...
    stale = {"run": "0", "stem": "b/letters", "name": "x", "error": "an old failure"}
    (out / "transcripts.rank1.jsonl").write_text(json.dumps(stale) + '\n{"run": "0", "st')
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out,
        "--workers", "2", "--explorer", *SAME_WORK,
    )  # fmt: skip
    assert code == 0, stderr
    assert f"3 of 6 inputs already written in {out}: skipped" in stderr
    audio = corpus["root"] / "audio"
    assert sorted(stdout.splitlines()) == sorted(
        f"{audio / stem}.wav\t{SAID[stem]}" for stem in ("a/yes", "a/go", "b/letters")
    )
    assert (files_of(out), merged(out)) == complete
    assert not list(out.rglob("*.partial")) and not list(out.glob("transcripts.rank*"))


def test_one_process_writing_over_a_merged_folder_keeps_its_manifest_true(
    workers_run, checkpoint, corpus, tmp_path
):
    """One process writes every input again: the merged manifest's lines of them follow, so
    that a later spread run does not skip on lines another model or search wrote."""
    out = tmp_path / "out"
    shutil.copytree(workers_run["out"], out)
    complete = merged(out)
    stale = [{**line, "pred_text": "STALE"} for line in complete]
    (out / MERGED).write_text("".join(json.dumps(line) + "\n" for line in stale))
    code, _, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out, *SAME_WORK
    )  # fmt: skip
    assert code == 0, stderr
    assert merged(out) == complete and not list(out.glob("transcripts.rank*"))
    # a killed spread run left its parts alone, which the next spread run would trust
    (out / MERGED).unlink()
    stale_line = {"run": "0", "stem": "a/yes", "name": "x", "record": stale[0]}
    (out / "transcripts.rank0.jsonl").write_text(json.dumps(stale_line) + "\n")
    code, _, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out, *SAME_WORK
    )  # fmt: skip
    assert code == 0, stderr
    assert merged(out) == complete and not list(out.glob("transcripts.rank*"))


def test_a_second_run_into_a_folder_being_written_is_refused(
    checkpoint, corpus, tmp_path, monkeypatch
):
    """Two runs into one folder appended to the same parts, and the first to merge removed
    them all: the other's lines were lost and its inputs called failed. The second is refused
    (spread or one process); a killed run's folder is free for the next."""
    import asr.cli.parallel

    follow, out, others, started = asr.cli.parallel._follow, tmp_path / "out", [], []
    one = corpus["root"] / "audio" / "a" / "yes.wav"
    command = ["--checkpoint", checkpoint, "--output-dir", out, *SAME_WORK]

    def then_others(*args):
        follow(*args)  # the first run's parts are all written, not yet merged
        if not started:
            started.append(True)
            others.append(transcribe(one, *command, "--workers", "1"))
            others.append(transcribe("--manifest", corpus["good"], *command))  # one process
            monkeypatch.setenv("WORLD_SIZE", "1")  # rank 0 of torchrun's
            others.append(transcribe(one, *command))
            monkeypatch.delenv("WORLD_SIZE")

    monkeypatch.setattr(asr.cli.parallel, "_follow", then_others)
    code, _, stderr = transcribe("--manifest", corpus["good"], *command, "--workers", "2")
    assert code == 0, stderr
    assert [line["files"][0] for line in merged(out)] == [f"{stem}.txt" for stem in GOOD]
    for code, stdout, stderr in others:
        assert code == 2 and stdout == "", stderr
        assert stderr == (
            f"asr transcribe: error: {out}: another `asr transcribe` is writing into this "
            "folder: wait for it to end, or give another --output-dir\n"
        )
    assert not (out / LOCK).exists()
    plain = tmp_path / "plain"  # one process into a folder of no manifest holds it too
    with writing(plain):
        code, _, stderr = transcribe(one, "--checkpoint", checkpoint, "--output-dir", plain)
    assert code == 2 and "another `asr transcribe` is writing into this folder" in stderr
    (out / LOCK).touch()  # as a killed run leaves it: its lock went with its process
    code, _, stderr = transcribe("--manifest", corpus["good"], *command, "--workers", "2")
    assert code == 0 and f"6 of 6 inputs already written in {out}" in stderr, stderr


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "workers"])
def test_a_transcripts_jsonl_of_someone_else_is_not_written_over(
    workers, checkpoint, corpus, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()
    theirs = corpus["good"].read_bytes()  # a manifest of that name
    (out / MERGED).write_bytes(theirs)
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out,
        *SAME_WORK, *workers,
    )  # fmt: skip
    assert code == 2 and stdout == "", stderr
    assert f"error: {out / MERGED}: not a manifest this command wrote" in stderr
    assert (out / MERGED).read_bytes() == theirs and [p.name for p in out.iterdir()] == [MERGED]


@pytest.mark.parametrize(
    "mode",  # the workers' parent checks as one process does; the workers' run is the slowest
    [[], pytest.param(["--workers", "2"], marks=pytest.mark.slow), ["--streaming"]],
    ids=["one process", "workers", "streaming"],
)
def test_references_beside_the_audio_are_not_written_over(mode, tiny_checkpoint, tmp_path):
    """A folder transcribed into itself: each `u.txt` beside its `u.wav` is a reference (the
    layout `asr prepare folder` reads) until a json of the same audio shows asr wrote it."""
    folder = tmp_path / "folder"
    folder.mkdir()
    for stem in ("b/test1", "b/test2"):
        shutil.copy(WAV / f"{GOOD[stem]}.wav", folder / f"{Path(stem).name}.wav")
    reference = folder / "test1.txt"
    reference.write_text("THE REFERENCE\n")
    checkpoint = tiny_checkpoint["checkpoint"]  # one that streams, as well as a random one can
    code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder, *mode)
    assert code == 2 and f"error: {reference}: a transcript beside its audio that asr " in stderr
    assert reference.read_text() == "THE REFERENCE\n"
    assert sorted(p.name for p in folder.iterdir()) == ["test1.txt", "test1.wav", "test2.wav"]
    json_alone = ["--format", "json"]  # a json of the audio says nothing of the txt beside it
    assert transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder, *json_alone,
                      *mode)[0] == 0  # fmt: skip
    code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder, *mode)
    assert code == 2 and reference.read_text() == "THE REFERENCE\n", stderr
    reference.unlink()  # the transcripts asr writes there are its own: a re-run writes over them
    for _ in range(2):
        code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder,
                                     *mode)  # fmt: skip
        assert code == 0, stderr
    assert reference.read_text() != "THE REFERENCE\n" and (folder / "test1.json").is_file()
    moved = folder.rename(tmp_path / "moved")  # its outputs are still its own
    code, _, stderr = transcribe(moved, "--checkpoint", checkpoint, "--output-dir", moved, *mode)
    assert code == 0, stderr


def test_subtitles_or_a_json_beside_their_audio_are_not_written_over(tiny_checkpoint, tmp_path):
    """Subtitles beside a film (film.srt for film.m4a), or a json of its own, were replaced by
    an in-place run asking for that format without a word."""
    folder = tmp_path / "films"
    folder.mkdir()
    shutil.copy(WAV / f"{GOOD['b/test1']}.wav", folder / "film.wav")
    theirs = {"srt": "1\n00:00:00,400 --> 00:00:03,700\nMade by hand\n\n", "json": '{"year": 1}'}
    checkpoint = tiny_checkpoint["checkpoint"]
    for kind, text in theirs.items():
        (folder / f"film.{kind}").write_text(text)
        code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder,
                                     "--format", kind)  # fmt: skip
        assert code == 2 and f"{folder / f'film.{kind}'}: a transcript beside its audio" in stderr
        assert (folder / f"film.{kind}").read_text() == text
        if kind == "json":  # which --explorer writes whatever --format says
            code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir",
                                         folder, "--format", "txt", "--explorer")  # fmt: skip
            assert code == 2 and f"{folder / 'film.json'}: a transcript beside" in stderr
            assert (folder / "film.json").read_text() == text
        (folder / f"film.{kind}").unlink()
    for _ in range(2):  # its own are written over
        code, _, stderr = transcribe(folder, "--checkpoint", checkpoint, "--output-dir", folder,
                                     "--format", "json", "srt", "vtt", "tsv")  # fmt: skip
        assert code == 0, stderr
    assert "Made by hand" not in (folder / "film.srt").read_text()


@pytest.mark.parametrize("words_per_cue", [0, 1])
def test_what_asr_wrote_beside_its_audio_is_known_for_its_own(words_per_cue, tmp_path):
    """A cue of digits was read as a SubRip cue number, and arrows as SubRip shortens them or
    as WebVTT escapes them as timing lines: asr's own subtitles were refused on a re-run."""
    audio = tmp_path / "x.wav"
    audio.touch()
    words = [Word(w, 0.2 * k, 0.2 * k + 0.1) for k, w in enumerate(["YES", "42", "A-->B", "&<"])]
    text = " ".join(w.text for w in words)
    said = Transcript(text, [], [], [], [], words, -1.0, 2.0, [Segment(0.0, 1.0, text, -1.0)])
    write_outputs(said, tmp_path / "x", expand_formats(["all"]), str(audio), words_per_cue)
    outputs = [(str(audio), PurePath("x"))]
    assert _references_in_the_way(outputs, tmp_path, ["all"]) == []
    (tmp_path / "x.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\nYES 42 BY HAND\n\n")
    assert _references_in_the_way(outputs, tmp_path, ["all"]) == [str(tmp_path / "x.srt")]


def test_ctrl_c_stops_the_workers_quietly(checkpoint, corpus, tmp_path, monkeypatch):
    """Ctrl-C while the workers run: they stop, no input is called failed, status 130 and
    what to do. (A re-run after an interruption: the test above.)"""
    import asr.cli.parallel

    started = []

    def ctrl_c(children, *_):
        started.extend(children)
        raise KeyboardInterrupt

    monkeypatch.setattr(asr.cli.parallel, "_follow", ctrl_c)
    out = tmp_path / "out"
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", out,
        "--workers", "2", *SAME_WORK,
    )  # fmt: skip
    assert code == 130, stderr
    assert f"asr transcribe: interrupted: the same command transcribes the rest into {out}" in (
        stderr
    )
    assert "failed" not in stderr and "exited with status" not in stderr
    assert len(started) == 2 and all(child.returncode is not None for child in started)


def test_ctrl_c_while_the_workers_start_is_quiet_too(checkpoint, corpus, tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: children still importing printed
    a traceback each; they leave it to the parent, which stops them."""
    command = [sys.executable, "-m", "asr", "transcribe", "--manifest", str(corpus["good"]),
               "--checkpoint", str(checkpoint), "--output-dir", str(tmp_path / "out"),
               *SAME_WORK, "--workers", "2"]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             cwd=REPO, start_new_session=True, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _children(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the children are importing
        os.killpg(child.pid, signal.SIGINT)  # as the terminal sends it
        stderr = child.communicate(timeout=60)[1]
    finally:
        child.kill()
    assert child.returncode == 130 and "Traceback" not in stderr, stderr
    assert "interrupted: the same command transcribes the rest" in stderr


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.parametrize(  # the workers' run is the slowest
    "workers",
    [[], pytest.param(["--workers", "2"], marks=pytest.mark.slow)],
    ids=["one process", "workers"],
)
def test_a_reader_that_goes_away_ends_it_quietly(workers, checkpoint, corpus, tmp_path):
    """`asr transcribe ... | head -1`: the command ends at once with 141, as tools killed by
    SIGPIPE do, and no traceback (workers whose output was relayed into the closed pipe hung
    on it once it was full)."""
    lines = corpus["good"].read_text().splitlines()
    many = tmp_path / "many.jsonl"
    many.write_text("".join(
        json.dumps(json.loads(line) | {"id": f"u{k}-{n}"}) + "\n"
        for k in range(40) for n, line in enumerate(lines)))  # fmt: skip
    command = [sys.executable, "-m", "asr", "transcribe", "--manifest", str(many),
               "--checkpoint", str(checkpoint), "--output-dir", str(tmp_path / "out"),
               *SAME_WORK, *workers]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert child.stdout.readline()
    child.stdout.close()
    try:
        child.wait(timeout=90)
    finally:
        child.kill()
    assert child.returncode == 141
    assert "Traceback" not in child.stderr.read().decode()


def test_an_interrupted_worker_leaves_the_word_to_its_parent(tmp_path, capsys):
    job = (_interrupted, argparse.Namespace(output_dir=tmp_path), ["an input"], "0", 0, ["txt"])
    try:
        assert worker_main(io.BytesIO(pickle.dumps(job))) == 130
    except KeyboardInterrupt:  # would stop the whole test run
        pytest.fail("a Ctrl-C escaped the worker")
    assert capsys.readouterr() == ("", "")


def _interrupted(*args):
    raise KeyboardInterrupt


def test_ctrl_c_in_one_process_is_a_line_and_status_130(monkeypatch):
    import asr.cli

    monkeypatch.setattr(asr.cli, "_transcribe", _interrupted)
    assert transcribe("x.wav", "--model", "m.ckpt") == (130, "", "asr transcribe: interrupted\n")
    said = "asr transcribe: interrupted; the files written stay in out"
    assert transcribe("x.wav", "--model", "m.ckpt", "--output-dir", "out") == (130, "", f"{said}\n")
    spread = transcribe("x.wav", "--model", "m.ckpt", "--output-dir", "out", "--workers", "2")
    assert spread == (130, "", f"{said} (a re-run resumes where it stopped)\n")


def test_ctrl_c_while_the_command_line_is_read_is_a_line_and_status_130(monkeypatch):
    """Reading it imports torch, seconds on a cold start: a Ctrl-C then was a traceback."""
    import asr.cli

    monkeypatch.setattr(asr.cli, "_parser", _interrupted)
    assert transcribe("x.wav", "--model", "m.ckpt") == (130, "", "asr transcribe: interrupted\n")


@pytest.mark.parametrize("mode", [[], ["--workers", "2"], ["--streaming"]])
def test_an_output_dir_a_file_stands_in_the_way_of_is_named(tmp_path, mode):
    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        code, _, err = transcribe("x.wav", "--model", "m.ckpt", "--output-dir", out, *mode)
        said = f"--output-dir {out}: {tmp_path / 'afile'} is a file, not a folder"
        assert (code, err) == (2, f"asr transcribe: error: {said}\n")


def test_records_of_a_later_run_replace_earlier_ones(tmp_path):
    def line(run, stem, text=None):
        if text is None:
            return {"run": run, "stem": stem, "name": stem, "error": "bad"}
        return {"run": run, "stem": stem, "record": {"pred_text": text, "files": [f"{stem}.txt"]}}

    (tmp_path / MERGED).write_text(json.dumps({"pred_text": "old", "files": ["x.txt"]}) + "\n")
    parts = [[line("2", "x", "new"), line("2", "y")], [line("1", "x", "older"), line("1", "z")]]
    for rank, lines in enumerate(parts):
        part = tmp_path / f"transcripts.rank{rank}.jsonl"
        part.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn')
    records = read_records(tmp_path, run="2")
    assert records.written["x"]["pred_text"] == "new"
    assert records.fresh == {"x"} and records.errors == {"y": "y: bad"}


def test_torchrun_writes_the_merged_manifest_of_workers(workers_run, checkpoint, corpus, tmp_path):
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "asr", "transcribe", "--manifest", str(corpus["good"]),
        "--checkpoint", str(checkpoint), "--output-dir", str(out), "--explorer", *SAME_WORK,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert merged(out) == merged(workers_run["out"])
    assert files_of(out) == files_of(workers_run["out"])
    assert len(done.stdout.splitlines()) == len(GOOD)  # each input once, from its rank
    assert done.stderr.count(f"explorer: {out / PAGE}") == 1, "rank 0 writes the page"


# --------------------------------------------------------------------------- what a re-run reuses


def test_spans_of_same_named_files_in_two_folders_keep_their_folders(tmp_path):
    """The output stem of a span came from a name made up for it, never a file: spans of
    spk1/utt.wav and spk2/utt.wav all went to utt@... at the top, over each other."""
    lines = []
    for speaker in ("spk1", "spk2"):
        (tmp_path / speaker).mkdir()
        shutil.copy(WAV / f"{GOOD['a/yes']}.wav", tmp_path / speaker / "utt.wav")
        lines += [{"audio_filepath": f"{speaker}/utt.wav", "offset": o, "duration": 0.1}
                  for o in (0.0, 0.1)]  # fmt: skip
    manifest = tmp_path / "spans.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    inputs, failures = expand_inputs([], tmp_path, manifests=[str(manifest)])
    assert not failures
    assert [i.stem.as_posix() for i in inputs] == [
        "spk1/utt@0-100",
        "spk1/utt@100-200",
        "spk2/utt@0-100",
        "spk2/utt@100-200",
    ]


def test_a_manifest_keeps_its_layout_when_a_missing_file_comes_back(tmp_path):
    """Outputs mirror the paths below the folder the manifest's files share, missing ones
    too: else restoring one moved every other output, and the re-run wrote them again."""
    (tmp_path / "lay" / "a").mkdir(parents=True)
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", tmp_path / "lay" / "a" / "1.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": f"lay/{p}"}) + "\n"
                                for p in ("a/1.wav", "b/2.wav")))  # fmt: skip
    stems = []
    for _ in range(2):
        inputs, failures = expand_inputs([], tmp_path, manifests=[str(manifest)])
        assert not failures  # the missing file fails when read
        stems.append([i.stem.as_posix() for i in inputs])
        (tmp_path / "lay" / "b").mkdir(exist_ok=True)
        shutil.copy(WAV / f"{GOOD['a/go']}.wav", tmp_path / "lay" / "b" / "2.wav")
    assert stems == [["a/1", "b/2"]] * 2


def test_lines_of_one_recording_are_named_once(tmp_path):
    """Two manifest lines of the same audio and span are transcribed once; the second is
    named, not dropped without a word."""
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", tmp_path / "a.wav")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": "a.wav", "duration": 0.5, "id": i})
                                + "\n" for i in ("a1", "a2")))  # fmt: skip
    inputs, failures = expand_inputs([], tmp_path, manifests=[str(manifest)])
    assert [i.fields["id"] for i in inputs] == ["a1"]
    assert failures == [f"{manifest}:2: the same audio as {manifest}:1: transcribed once, "
                        "under that line"]  # fmt: skip
    assert inputs[0].stem.as_posix() == "a", "one span: named as its recording, as alone"
    again, failures = expand_inputs([str(tmp_path / "a.wav")] * 2, tmp_path)
    assert len(again) == 1 and not failures  # a file named twice is simply one input
    nemo = tmp_path / "manifest.json"  # read as audio, it was "unreadable or corrupt audio"
    nemo.write_text(manifest.read_text())
    again, failures = expand_inputs([str(nemo)], tmp_path)
    assert again == [] and failures == [
        f"{nemo}: JSON, not audio: give a manifest of JSON lines so named (NeMo's manifest.json) "
        f"as --manifest {nemo}"
    ]
    # spans equal to the millisecond, as their outputs are named: float noise refused the run
    manifest.write_text("".join(json.dumps({"audio_filepath": "a.wav", "offset": offset,
                                            "duration": 0.5}) + "\n"
                                for offset in (0.3, 0.1 + 0.2)))  # fmt: skip
    inputs, failures = expand_inputs([], tmp_path, manifests=[str(manifest)])
    assert len(inputs) == 1 and failures == [
        f"{manifest}:2: the same audio as {manifest}:1: transcribed once, under that line"
    ]


def test_spans_of_one_recording_in_two_manifests_are_named_as_in_one(tmp_path):
    """Lines of a recording are counted across manifests: split over two, its spans stopped
    the command as named twice."""
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", tmp_path / "a.wav")
    lines = [{"audio_filepath": "a.wav"}, {"audio_filepath": "a.wav", "offset": 0.2}]
    for name, chosen in (("1", lines[:1]), ("2", lines[1:]), ("both", lines)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in chosen))
    named = []
    for manifests in (["1", "2"], ["both"]):
        paths = [str(tmp_path / f"{name}.jsonl") for name in manifests]
        inputs, failures = expand_inputs([], tmp_path, manifests=paths)
        assert not failures
        named.append([(i.name, i.stem.as_posix()) for i in inputs])
    wav = tmp_path / "a.wav"
    assert named == [[(f"{wav}@0-end", "a@0-end"), (f"{wav}@200-end", "a@200-end")]] * 2


def test_a_record_of_stdin_names_no_scratch_file():
    """One process writing `-` over a merged folder recorded the scratch copy of stdin, which
    is gone when the command ends."""
    stdin = Input(Clip("/tmp/asr-transcribe-x/stdin"), "-", PurePath("stdin"))
    assert output_record(stdin, "YES", 1.0, ["txt"])["audio_filepath"] == "-"


def test_a_records_duration_is_to_the_millisecond_as_its_json():
    """4.1 s from 0.5 s on was 3.5999999999999996 in transcripts.jsonl, 3.6 in its json."""
    clip = Input(Clip("a.wav", 0.5), "a.wav@500-end", PurePath("a"), {"audio_filepath": "a.wav"})
    assert output_record(clip, "YES", 4.1 - 0.5, ["txt"])["duration"] == 3.6


def test_an_earlier_record_of_an_input_now_named_otherwise_is_left_out(tmp_path):
    """A line per recording: the record an earlier run wrote under another output name (its
    files still there) gives way to the input's line now."""
    wav = tmp_path / "a.wav"
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", wav)
    before, now = _input(wav, "a"), _input(wav, "x/a")
    for stem in ("a", "x/a"):
        (tmp_path / f"{stem}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / f"{stem}.txt").write_text("YES\n")
    _part(tmp_path, *({"run": run, "stem": item.stem.as_posix(),
                       "record": output_record(item, "YES", 0.5, ["txt"])}
                      for run, item in (("1", before), ("2", now))))  # fmt: skip
    merge(Plan("2", [now], [[now]], [], ["txt"]), tmp_path)
    assert [line["files"] for line in merged(tmp_path)] == [["x/a.txt"]]


def _input(path: Path, stem: str, **fields) -> Input:
    clip = Clip(str(path), fields.get("offset", 0.0), fields.get("duration"))
    return Input(clip, str(path), PurePath(stem), fields or None)


def _part(out: Path, *lines: dict) -> None:
    (out / "transcripts.rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_manifest_lists_every_file_of_an_input_and_a_rerun_needs_them_listed(tmp_path):
    """A re-run with another --format listed only its own files, and a later run skipped an
    input on files its line did not list (another recording's, of the same name)."""
    wav = tmp_path / "a.wav"
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", wav)
    item = _input(wav, "a")
    for suffix in ("txt", "json", "srt"):
        (tmp_path / f"a.{suffix}").write_text("YES\n")
    first = output_record(item, "YES", 0.5, ["txt", "json"])
    (tmp_path / MERGED).write_text(json.dumps(first) + "\n")
    _part(tmp_path, {"run": "2", "stem": "a", "record": output_record(item, "YES", 0.5, ["srt"])})
    merge(Plan("2", [item], [[item]], [], ["srt"]), tmp_path)
    assert [line["files"] for line in merged(tmp_path)] == [["a.txt", "a.json", "a.srt"]]
    assert is_written(item, tmp_path, ["txt"], read_records(tmp_path))

    other = _input(tmp_path / "b.wav", "a")  # another recording, written over as srt alone
    shutil.copy(wav, tmp_path / "b.wav")
    (tmp_path / "a.srt").write_text("GO\n")
    _part(tmp_path, {"run": "3", "stem": "a", "record": output_record(other, "GO", 0.5, ["srt"])})
    merge(Plan("3", [other], [[other]], [], ["srt"]), tmp_path)
    assert [line["files"] for line in merged(tmp_path)] == [["a.srt"]]
    records = read_records(tmp_path)
    assert is_written(other, tmp_path, ["srt"], records)
    assert not is_written(other, tmp_path, ["txt"], records), "a.txt is the other recording's"
    # written again, and said so: a file there that its line does not list
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        _announce(Plan("4", [other], [[other]], [], ["txt"], unlisted=1), tmp_path)
    assert "1 inputs whose files are in" in err.getvalue() and "an older asr's" in err.getvalue()


def test_files_of_a_recording_replaced_under_its_name_are_not_listed_with_the_new_one(tmp_path):
    """A run with --format txt srt, the audio replaced by another recording of the same length,
    then a run with --format txt: its line listed the srt of the recording gone, under the new
    text. Audio whose inode alone changed (a chmod) gives the same text and keeps its files."""
    wav = tmp_path / "a.wav"
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", wav)
    item = _input(wav, "a")
    for suffix in ("txt", "srt"):
        (tmp_path / f"a.{suffix}").write_text("YES\n")
    (tmp_path / MERGED).write_text(json.dumps(output_record(item, "YES", 0.5, ["txt", "srt"])))

    def rerun(run: str, text: str) -> list[str]:
        time.sleep(0.02)  # past the clock's tick: the audio changes after the files
        (tmp_path / "a.txt").write_text(f"{text}\n")
        _part(
            tmp_path, {"run": run, "stem": "a", "record": output_record(item, text, 0.5, ["txt"])}
        )
        merge(Plan(run, [item], [[item]], [], ["txt"]), tmp_path)
        return [line["files"] for line in merged(tmp_path)]

    time.sleep(0.02)
    wav.chmod(0o600)
    assert rerun("2", "YES") == [["a.txt", "a.srt"]]
    time.sleep(0.02)
    shutil.copy(WAV / f"{GOOD['a/go']}.wav", wav)
    assert rerun("3", "NO") == [["a.txt"]]
    assert (tmp_path / "a.srt").exists(), "not removed: a chmod and another model look the same"


def test_records_of_standard_input_never_take_each_others_files(tmp_path):
    """Two recordings piped in turn are both "-", of the same length maybe."""
    first = {"audio_filepath": "-", "offset": 0.0, "duration": 1.0, "pred_text": "YES",
             "files": ["stdin.srt"]}  # fmt: skip
    second = {**first, "pred_text": "NO", "files": ["stdin.txt"]}
    (tmp_path / MERGED).write_text(json.dumps(first) + "\n")
    _part(tmp_path, {"run": "2", "stem": "stdin", "record": second})
    assert read_records(tmp_path).written["stdin"]["files"] == ["stdin.txt"]


def test_a_manifest_saved_with_a_bom_is_still_ours_and_a_refused_run_leaves_no_folder(tmp_path):
    record = output_record(_input(tmp_path / "a.wav", "a"), "YES", 1.0, ["txt"])
    (tmp_path / MERGED).write_text("\ufeff" + json.dumps(record) + "\n", encoding="utf-8")
    assert holds_records(tmp_path)
    fresh = tmp_path / "fresh"
    with pytest.raises(ValueError, match="refused"), writing(fresh):
        raise ValueError("refused")
    assert not fresh.exists()


def test_a_missing_file_fails_though_another_input_wrote_its_stem(tmp_path):
    """Missing files keep their bare stem; their failure must not be taken for the success of
    another input with that stem."""
    there, missing = _input(tmp_path / "a" / "x.wav", "x"), _input(tmp_path / "b" / "x.wav", "x")
    record = output_record(there, "YES", 1.0, ["txt"])
    (tmp_path / "x.txt").write_text("YES\n")
    _part(tmp_path, {"run": "1", "stem": "x", "name": there.name, "record": record},
          {"run": "1", "stem": "x", "name": missing.name, "error": "no such file"})  # fmt: skip
    plan = Plan("1", [there, missing], [[there, missing]], [], ["txt"])
    assert merge(plan, tmp_path) == [f"{missing.name}: no such file"]


def test_a_rerun_redoes_a_span_made_longer_and_takes_a_corrected_reference(tmp_path):
    wav = tmp_path / "a.wav"
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", wav)
    old = _input(wav, "a", offset=0.0, duration=0.5, text="OLD REF")
    (tmp_path / "a.txt").write_text("YES\n")
    _part(tmp_path, {"run": "1", "stem": "a", "record": output_record(old, "YES", 0.5, ["txt"])})
    records = read_records(tmp_path)
    assert is_written(old, tmp_path, ["txt"], records)
    longer = _input(wav, "a", offset=0.0, duration=0.9, text="OLD REF")
    assert not is_written(longer, tmp_path, ["txt"], records)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": str(wav), "offset": 0.0, "duration": 0.5,
                                    "text": "OLD REF"}) + "\n")  # fmt: skip
    for explorer, pending in ((False, 0), (True, 1)):  # --explorer needs the maps too
        args = argparse.Namespace(audio=[], manifest=[str(manifest)], output_dir=str(tmp_path),
                                  format=["txt"], explorer=explorer)  # fmt: skip
        assert len(make_plan(args, 1).shares[0]) == pending

    corrected = _input(wav, "a", offset=0.0, duration=0.5, text="NEW REF")
    merge(Plan("2", [corrected], [[]], [], ["txt"]), tmp_path)
    (line,) = merged(tmp_path)
    assert (line["text"], line["pred_text"], line["files"]) == ("NEW REF", "YES", ["a.txt"])


def test_a_rerun_plans_an_input_of_a_name_near_the_longest_a_folder_takes(tmp_path):
    """A stem of 251 bytes: its .txt fits the folder, its .explore.npz cannot be there."""
    wav = tmp_path / ("録" * 83 + "ab.wav")
    shutil.copy(WAV / f"{GOOD['a/yes']}.wav", wav)
    item = _input(wav, wav.stem)
    (tmp_path / f"{wav.stem}.txt").write_text("YES\n")
    _part(
        tmp_path, {"run": "1", "stem": wav.stem, "record": output_record(item, "YES", 1.0, ["txt"])}
    )
    for explorer, pending in ((False, 0), (True, 1)):
        args = argparse.Namespace(audio=[str(wav)], manifest=[], output_dir=str(tmp_path),
                                  format=["txt"], explorer=explorer)  # fmt: skip
        assert len(make_plan(args, 1).shares[0]) == pending


def test_sigterm_stops_the_workers_as_ctrl_c_does(checkpoint, corpus, tmp_path, monkeypatch):
    """`timeout`, systemd and scancel send SIGTERM: the workers stopped running on, orphaned."""
    import signal

    import asr.cli.parallel

    started = []

    def terminated(children, *_):
        started.extend(children)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(asr.cli.parallel, "_follow", terminated)
    handler = signal.getsignal(signal.SIGTERM)
    code, _, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint, "--output-dir", tmp_path,
        "--workers", "2", *SAME_WORK,
    )  # fmt: skip
    assert code == 143 and "interrupted" in stderr, stderr
    assert len(started) == 2 and all(child.returncode is not None for child in started)
    assert signal.getsignal(signal.SIGTERM) == handler, "the handler is the command's only"


def test_a_checkpoint_that_is_not_there_is_said_once(corpus, tmp_path):
    code, _, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", tmp_path / "none.ckpt",
        "--output-dir", tmp_path / "out", "--workers", "2", *SAME_WORK,
    )  # fmt: skip
    assert code == 2 and stderr.count("no such checkpoint") == 1, stderr
    assert not (tmp_path / "out").exists()


def test_search_options_every_process_refuses_are_said_once(checkpoint, corpus, tmp_path):
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", checkpoint,
        "--output-dir", tmp_path / "out", "--workers", "2", *SAME_WORK, "--nbest", "5",
    )  # fmt: skip
    assert (code, stdout) == (2, "")
    assert stderr == (
        "asr transcribe: error: --nbest 5: more hypotheses than --beam-size 1 keeps; give "
        "--beam-size 5 or more\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("beam", [2, None])
def test_an_nbest_above_the_models_own_beam_is_said_once(beam, checkpoint, corpus, tmp_path):
    """Without --beam-size the model's stored beam, or asr's default, bounds --nbest: the
    parent says so before any worker starts."""
    state = torch.load(checkpoint, weights_only=True)
    state[RECOGNIZER_KEY].pop("decoding", None)
    if beam is not None:  # as `asr finalize` stores it
        state[RECOGNIZER_KEY]["decoding"] = {"beam_size": beam}
    torch.save(state, tmp_path / "model.ckpt")
    code, stdout, stderr = transcribe(
        "--manifest", corpus["good"], "--checkpoint", tmp_path / "model.ckpt",
        "--output-dir", tmp_path / "out", "--workers", "2", *SAME_WORK[2:], "--nbest", "11",
    )  # fmt: skip
    keeps = f"the model's stored beam ({beam})" if beam else "the default beam (10)"
    assert (code, stdout) == (2, "")
    assert stderr == (
        f"asr transcribe: error: --nbest 11: more hypotheses than {keeps} keeps; give "
        "--beam-size 11 or more\n"
    )
    assert not (tmp_path / "out").exists()
