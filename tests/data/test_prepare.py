"""asr.data.prepare: the real corpora's splits and transcripts, folders, and layout errors."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tarfile
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import corpus_path

from asr.cli import main
from asr.data.manifest import Utterance, read_manifest
from asr.data.prepare import CORPORA, SplitSummary, format_summary, left_out, prepare_corpus


def read_splits(out_dir: Path) -> dict[str, list[Utterance]]:
    return {path.stem: read_manifest(path) for path in sorted(out_dir.glob("*.jsonl"))}


def check_outputs(out_dir: Path, summaries: dict[str, SplitSummary]) -> dict[str, list[Utterance]]:
    """Manifests and summary.json agree with the returned summaries; paths are absolute."""
    splits = read_splits(out_dir)
    assert set(splits) == set(summaries)
    for name, utterances in splits.items():
        assert summaries[name] == SplitSummary.of(utterances)
        assert all(Path(u.audio_filepath).is_absolute() for u in utterances)
    written = json.loads((out_dir / "summary.json").read_text())
    assert written["splits"] == {
        name: {"utterances": s.utterances, "hours": pytest.approx(s.hours), "speakers": s.speakers}
        for name, s in summaries.items()
    }
    return splits


@pytest.fixture(scope="module")
def an4_prepared(tmp_path_factory) -> tuple[Path, dict[str, SplitSummary]]:
    out = tmp_path_factory.mktemp("an4")
    return out, prepare_corpus("an4", corpus_path("an4"), out)


def an4_transcripts(an4_dir: Path) -> dict[str, str]:
    """id -> text, parsed independently of the code under test."""
    texts = {}
    for name in ("an4_train.transcription", "an4_test.transcription"):
        for line in (an4_dir / "etc" / name).read_text().splitlines():
            words, source = line.rsplit(" (", 1)
            first, speaker, last = source.rstrip(")").split("-")
            texts[f"{speaker}-{first}-{last}"] = (
                words.replace("<s>", "").replace("</s>", "").strip()
            )
    return texts


@pytest.mark.needs_corpus
def test_an4_is_split_as_espnet_does(an4_prepared, an4_dir):
    out, summaries = an4_prepared
    splits = check_outputs(out, summaries)
    assert {name: s.utterances for name, s in summaries.items()} == {
        "train": 848,
        "dev": 100,
        "test": 130,
    }
    training_ids = sorted(u.utt_id for u in splits["train"] + splits["dev"])
    assert [u.utt_id for u in splits["dev"]] == training_ids[:100]
    assert [u.utt_id for u in splits["train"]] == training_ids[100:]
    expected = an4_transcripts(an4_dir)
    for utterance in [u for split in splits.values() for u in split]:
        assert re.fullmatch(r"[a-z0-9]+-[a-z0-9]+-[a-z0-9]+", utterance.utt_id)
        assert utterance.text == expected[utterance.utt_id]
        assert not re.search(r"<s>|</s>|[()]", utterance.text)
        assert utterance.speaker == Path(utterance.audio_filepath).parent.name
        assert utterance.speaker == utterance.utt_id.split("-")[0]
    dev = {u.utt_id: u for u in splits["dev"]}
    assert dev["fash-an251-b"].text == "YES"
    assert dev["fash-an251-b"].audio_filepath == str(
        an4_dir / "wav" / "an4_clstk" / "fash" / "an251-fash-b.wav"
    )


@pytest.mark.needs_corpus
def test_an4_parent_directory_is_accepted(an4_prepared, an4_dir, tmp_path):
    out, _ = an4_prepared
    prepare_corpus("an4", an4_dir.parent, tmp_path)
    for name in ("train", "dev", "test"):
        assert (tmp_path / f"{name}.jsonl").read_text() == (out / f"{name}.jsonl").read_text()


@pytest.mark.needs_corpus
def test_mini_an4_tarball_gives_the_transcripts_of_the_wav_corpus(
    mini_an4_tar, an4_dir, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        summaries = prepare_corpus("an4", mini_an4_tar, tmp_path)
    assert "holding out 1" in caplog.text  # 5 training utterances cannot give 100 to dev
    lone = "wav/an4_clstk/fash/cen7-fash-b.sph"  # no line of the tarball's names it
    assert f"an4 train: 1 audio file(s) no transcription line names, left out: {lone}" in (
        caplog.text
    )
    assert json.loads((tmp_path / "summary.json").read_text())["missing_transcripts"] == [lone]
    splits = check_outputs(tmp_path, summaries)
    assert {name: len(utterances) for name, utterances in splits.items()} == {
        "train": 4,
        "dev": 1,
        "test": 2,
    }
    expected = an4_transcripts(an4_dir)
    for utterance in [u for split in splits.values() for u in split]:
        assert utterance.audio_filepath.endswith(".sph")
        assert Path(utterance.audio_filepath).is_relative_to(tmp_path / "raw")
        assert utterance.text == expected[utterance.utt_id]


@pytest.mark.needs_corpus
def test_a_folder_holding_the_tarball_works_and_extraction_happens_once(
    mini_an4_tar, tmp_path, monkeypatch
):
    first = prepare_corpus("an4", mini_an4_tar.parent, tmp_path)
    manifests = {p.name: p.read_text() for p in tmp_path.glob("*.jsonl")}

    def refuse(*args, **kwargs):
        raise AssertionError("extracted again")

    monkeypatch.setattr(tarfile, "open", refuse)
    assert prepare_corpus("an4", mini_an4_tar, tmp_path) == first
    assert {p.name: p.read_text() for p in tmp_path.glob("*.jsonl")} == manifests


@pytest.mark.needs_corpus
@pytest.mark.parametrize("level", ["LibriSpeech", "parent"])
def test_librispeech_sample(librispeech_dir, tmp_path, level):
    data_dir = librispeech_dir if level == "LibriSpeech" else librispeech_dir.parent
    summaries = prepare_corpus("librispeech", data_dir, tmp_path)
    splits = check_outputs(tmp_path, summaries)
    assert set(splits) == {"train-clean-5", "train"}
    assert splits["train"] == splits["train-clean-5"]
    expected = {}
    for transcripts in librispeech_dir.glob("train-clean-5/*/*/*.trans.txt"):
        for line in transcripts.read_text().splitlines():
            utterance_id, text = line.split(" ", 1)
            expected[utterance_id] = text
    assert {u.utt_id: u.text for u in splits["train"]} == expected
    assert len(expected) == 38
    for utterance in splits["train"]:
        assert utterance.speaker == utterance.utt_id.split("-")[0]
        assert Path(utterance.audio_filepath).name == f"{utterance.utt_id}.flac"
        assert utterance.duration == soundfile.info(utterance.audio_filepath).duration
    assert summaries["train"].speakers == 2


@pytest.mark.needs_corpus
def test_mini_librispeech_opus_files_are_found_beside_their_transcripts(tmp_path):
    """Mini LibriSpeech here is Ogg Opus: the LibriSpeech layout with another audio suffix."""
    root = corpus_path("mini_librispeech", "LibriSpeech")
    summaries = prepare_corpus("librispeech", root, tmp_path, splits=["dev-clean-5"])
    splits = check_outputs(tmp_path, summaries)
    assert len(splits["dev-clean-5"]) == 82 and summaries["dev"].speakers == 2
    for utterance in splits["dev-clean-5"]:
        assert Path(utterance.audio_filepath).name == f"{utterance.utt_id}.opus"
        assert utterance.duration > 0


def test_librispeech_missing_audio_is_named_by_its_stem_of_any_suffix(tmp_path, caplog):
    """Mini LibriSpeech is Opus: a missing file named as .flac would name one never there."""
    chapter = tmp_path / "LibriSpeech" / "dev-clean-5" / "19" / "198"
    chapter.mkdir(parents=True)
    (chapter / "19-198.trans.txt").write_text("19-198-0001 YES\n19-198-0002 NO\n")
    write_tone(chapter / "19-198-0001.opus", 0.5, "OGG")
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        prepare_corpus("librispeech", tmp_path, tmp_path / "out")
    missing = str(chapter / "19-198-0002.*")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["missing_audio"] == [missing]
    assert f"audio missing for 1: {missing}" in caplog.text


def test_librispeech_lines_with_a_tab_and_audio_of_an_upper_case_suffix_are_read(tmp_path):
    """A tab after the id glued the first word to it (the audio "missing"); `.FLAC` was not
    found as `.flac` is."""
    chapter = tmp_path / "LibriSpeech" / "dev-clean-5" / "19" / "198"
    chapter.mkdir(parents=True)
    (chapter / "19-198.trans.txt").write_text("19-198-0001\tYES NO\n19-198-0002 NO\n")
    write_tone(chapter / "19-198-0001.opus", 0.5, "OGG")
    write_tone(chapter / "19-198-0002.FLAC", 0.5, "FLAC")
    prepare_corpus("librispeech", tmp_path, tmp_path / "out")
    assert left_out(tmp_path / "out") == []
    lines = [json.loads(line) for line in (tmp_path / "out" / "dev.jsonl").open()]
    assert {(u["id"], u["text"], Path(u["audio_filepath"]).name) for u in lines} == {
        ("19-198-0001", "YES NO", "19-198-0001.opus"),
        ("19-198-0002", "NO", "19-198-0002.FLAC"),
    }


def test_corpus_transcripts_with_a_bom_or_a_line_not_utf8_are_read_line_by_line(tmp_path):
    """A byte-order mark hid the first id (its audio "missing"); a line not UTF-8 stopped the
    whole run naming no file. The mark is left out; the line is named, the others go on."""
    chapter = tmp_path / "LibriSpeech" / "dev-clean-5" / "19" / "198"
    chapter.mkdir(parents=True)
    text = "19-198-0001 YES\n19-198-0002 CAF\xe9\n19-198-0003 NO\n".encode("latin-1")
    (chapter / "19-198.trans.txt").write_bytes(b"\xef\xbb\xbf" + text)
    for k in (1, 2, 3):
        write_tone(chapter / f"19-198-000{k}.opus", 0.5, "OGG")
    prepare_corpus("librispeech", tmp_path, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["missing_audio"] == []
    assert summary["bad_transcripts"] == [f"{chapter / '19-198.trans.txt'}:2: transcript is "
                                          "not valid UTF-8 (byte 0xe9 at column 16)"]  # fmt: skip
    ids = [json.loads(line)["id"] for line in (tmp_path / "out" / "dev.jsonl").open()]
    assert sorted(ids) == ["19-198-0001", "19-198-0003"]
    assert summary["missing_transcripts"] == [], "its line names it, though not as UTF-8"


def test_librispeech_ids_repeated_in_other_chapters_and_audio_no_line_names_are_listed(
    tmp_path, caplog
):
    """An id given in two chapters of a split is listed at its second line (the manifest
    would hold it twice); audio no transcript line names is listed and warned of."""
    split = tmp_path / "LibriSpeech" / "dev-clean-5"
    for chapter in ("19/198", "19/198 copy"):
        (split / chapter).mkdir(parents=True)
        (split / chapter / "19-198.trans.txt").write_text("19-198-0001 YES\n")
        write_tone(split / chapter / "19-198-0001.opus", 0.5, "OGG")
    (split / "20/205").mkdir(parents=True)
    write_tone(split / "20/205/20-205-0001.flac", 0.5, "FLAC")
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        summaries = prepare_corpus("librispeech", tmp_path, tmp_path / "out")
    assert summaries["dev-clean-5"].utterances == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    first, again = (split / c / "19-198.trans.txt" for c in ("19/198", "19/198 copy"))
    assert summary["bad_transcripts"] == [f"{again}:1: 19-198-0001 is already on line 1 of {first}"]
    assert summary["missing_transcripts"] == ["dev-clean-5/20/205/20-205-0001.flac"]
    assert "1 audio file(s) no .trans.txt line names, left out: 20/205/20-205-0001.flac" in (
        caplog.text
    )


@pytest.mark.needs_corpus
def test_librispeech_unknown_split_is_named(librispeech_dir, tmp_path):
    with pytest.raises(ValueError, match=r"dev-clean not found; found train-clean-5"):
        prepare_corpus("librispeech", librispeech_dir, tmp_path, splits=["dev-clean"])


@pytest.mark.needs_corpus
def test_yesno_splits_and_labels(yesno_dir, tmp_path):
    summaries = prepare_corpus("yesno", yesno_dir, tmp_path)
    splits = check_outputs(tmp_path, summaries)
    assert {name: len(utterances) for name, utterances in splits.items()} == {
        "train": 26,
        "dev": 5,
        "test": 29,
    }
    names = sorted(path.stem for path in yesno_dir.glob("*.wav"))
    assert [u.utt_id for u in splits["train"] + splits["dev"]] == names[:31]
    assert [u.utt_id for u in splits["test"]] == names[31:]
    for utterance in [u for split in splits.values() for u in split]:
        words = utterance.text.split()
        assert len(words) == 8
        assert words == [{"0": "NO", "1": "YES"}[label] for label in utterance.utt_id.split("_")]
        assert utterance.speaker == "yesno"


@pytest.mark.needs_corpus
def test_an_unreadable_yesno_recording_moves_none_to_another_split(yesno_dir, tmp_path):
    """The split is by name: a test recording went to dev (which chooses checkpoints) when a
    training one was left out."""
    copy = tmp_path / "waves_yesno"
    shutil.copytree(yesno_dir, copy)
    names = sorted(path.stem for path in copy.glob("*.wav"))
    (copy / f"{names[3]}.wav").write_bytes(b"not audio")
    splits = read_splits_after("yesno", copy, tmp_path / "out")
    assert [u.utt_id for u in splits["train"]] == names[:3] + names[4:26]
    assert [u.utt_id for u in splits["dev"]] == names[26:31]
    assert [u.utt_id for u in splits["test"]] == names[31:]


def write_tone(path: Path, seconds: float, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(round(8000 * seconds)) / 8000
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32), 8000, format=fmt)


@pytest.fixture
def folder(tmp_path) -> Path:
    """10 transcribed recordings of 2 speakers in several formats, and one without transcript."""
    root = tmp_path / "corpus"
    for n in range(10):
        suffix = ("wav", "flac", "ogg")[n % 3]
        audio = root / f"spk{n % 2}" / f"utt{n}.{suffix}"
        write_tone(audio, 0.1 + 0.01 * n)
        audio.with_suffix(".txt").write_text(f"  words of\nutterance {n} \n", encoding="utf-8")
    write_tone(root / "spk1" / "lonely.wav", 0.1)
    return root


def test_folder_reports_audio_without_transcript(folder, tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        summaries = prepare_corpus("folder", folder, out)
    assert (
        "1 audio file(s) without a transcript" in caplog.text and "spk1/lonely.wav" in caplog.text
    )
    assert json.loads((out / "summary.json").read_text())["missing_transcripts"] == [
        "spk1/lonely.wav"
    ]
    splits = check_outputs(out, summaries)
    everything = [u for split in splits.values() for u in split]
    assert sorted(u.utt_id for u in everything) == sorted(f"spk{n % 2}-utt{n}" for n in range(10))
    for utterance in everything:
        n = int(utterance.utt_id.rsplit("utt", 1)[1])
        assert utterance.text == f"words of utterance {n}"
        assert utterance.speaker == f"spk{n % 2}"
        assert utterance.duration == pytest.approx(0.1 + 0.01 * n, abs=1e-9)


def test_a_folder_that_cannot_be_listed_is_named_not_left_out(
    folder, tmp_path, monkeypatch, caplog
):
    """Permissions a user lacks (root reads every folder: the listing is refused here):
    `os.walk` and `Path.glob` skipped the folder, its utterances gone without a word. It is
    listed as broken input, the rest prepared (`lost+found` may be one, and cannot move)."""
    for chapter in (tmp_path / "LibriSpeech" / "dev-clean-5" / "19" / c for c in ("197", "198")):
        chapter.mkdir(parents=True)
        (chapter / f"19-{chapter.name}.trans.txt").write_text(f"19-{chapter.name}-0001 YES\n")
        write_tone(chapter / f"19-{chapter.name}-0001.flac", 0.5)
    (chapter.parent / "197" / "deeper").mkdir()  # below a chapter: no transcript read there
    listed = os.scandir

    def refused(path=".", *args):
        if not isinstance(path, int) and Path(path).name in ("spk1", "198", "deeper"):
            raise PermissionError(13, "Permission denied", str(path))
        return listed(path, *args)

    monkeypatch.setattr(os, "scandir", refused)
    for corpus, data, locked, count in (
        ("folder", folder, folder / "spk1", 5),
        ("librispeech", tmp_path, chapter, 1),
    ):
        out = tmp_path / f"out_{corpus}"
        with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
            summaries = prepare_corpus(corpus, data, out)
        said = f"{locked}: cannot list this folder (Permission denied)"
        assert left_out(out) == [said] and said in caplog.text
        assert sum(s.utterances for k, s in summaries.items() if "-" not in k) == count


def test_a_transcript_whose_suffix_is_upper_case_is_read(folder, tmp_path):
    """`u.TXT` beside `u.wav`, as `U.WAV` is audio: before, the audio was listed as without a
    transcript, and the transcript nowhere."""
    (folder / "spk1" / "lonely.TXT").write_text("LONELY\n")
    prepare_corpus("folder", folder, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["missing_transcripts"] == []
    manifests = (tmp_path / "out").glob("*.jsonl")
    texts = {u.utt_id: u.text for m in manifests for u in read_manifest(m)}
    assert texts["spk1-lonely"] == "LONELY"


def test_folder_random_split_is_a_seeded_partition(folder, tmp_path):
    first = read_splits_after("folder", folder, tmp_path / "a", seed=3)
    again = read_splits_after("folder", folder, tmp_path / "b", seed=3)
    other = read_splits_after("folder", folder, tmp_path / "c", seed=4)
    assert first == again
    assert {name: len(u) for name, u in first.items()} == {"train": 8, "dev": 1, "test": 1}
    ids = [u.utt_id for split in first.values() for u in split]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 10
    assert first != other


STEP = {"test": 0, "dev": 1, "train": 2}


@pytest.mark.parametrize("seed", range(6))
def test_a_recording_added_or_removed_moves_at_most_one_other_per_boundary(seed, tmp_path):
    """A shuffle's order changed whole with the set of ids: one transcript removed sent most
    of dev and test elsewhere."""
    corpus = tmp_path / "corpus"

    def add(name: str) -> None:
        write_tone(corpus / f"{name}.wav", 0.01)
        (corpus / f"{name}.txt").write_text(name)

    def placed(out: str) -> dict[str, str]:
        splits = read_splits_after("folder", corpus, tmp_path / out, seed=seed)
        return {u.utt_id: name for name, split in splits.items() for u in split}

    for n in range(40):
        add(f"u{n:02d}")
    less = placed("a")
    for n in range(40, 56):  # each added alone: 45 to 46 moves both rounded sizes at once
        add(f"u{n:02d}")
        more = placed(f"b{n}")
        moved = [i for i in less if more[i] != less[i]]
        assert len(moved) <= 2, "one across each boundary at most"
        assert all(abs(STEP[less[i]] - STEP[more[i]]) == 1 for i in moved), "to the next split"
        less = more
    for gone in sorted(less)[:8]:  # and removed
        for path in corpus.glob(f"{gone}.*"):
            path.unlink()
        fewer = placed(f"c{gone}")
        moved = [i for i in fewer if fewer[i] != less[i]]
        assert len(moved) <= 2
        assert all(abs(STEP[less[i]] - STEP[fewer[i]]) == 1 for i in moved)
        less = fewer


def test_an_unreadable_recording_moves_none_to_another_split(folder, an4_fixture, tmp_path):
    """Splits are drawn by name before unreadable audio is left out: one broken dev file took
    a test utterance into train (folder) or the next training one into dev (AN4)."""
    whole = read_splits_after("folder", folder, tmp_path / "a", dev_fraction=0.2, seed=3)
    broken, emptied = whole["dev"][0], whole["test"][0]
    Path(broken.audio_filepath).write_bytes(b"not audio")
    Path(emptied.audio_filepath).with_suffix(".txt").write_text("")  # a transcript left out
    now = read_splits_after("folder", folder, tmp_path / "b", dev_fraction=0.2, seed=3)
    left = {k: [u.utt_id for u in v if u.utt_id not in (broken.utt_id, emptied.utt_id)]
            for k, v in whole.items()}  # fmt: skip
    assert {k: [u.utt_id for u in v] for k, v in now.items()} == {
        k: v for k, v in left.items() if v
    }
    an4 = tmp_path / "an4"
    shutil.copytree(an4_fixture, an4)
    whole = read_splits_after("an4", an4, tmp_path / "c", dev_size=2)
    assert [u.utt_id for u in whole["dev"]] == ["fash-an251-b", "fash-an253-b"]
    for gone, out in (("an251-fash-b", "d"), ("an253-fash-b", "e")):  # unreadable; missing
        wav = an4 / "wav" / "an4_clstk" / "fash" / f"{gone}.wav"
        wav.write_bytes(b"not audio") if out == "d" else wav.unlink()
        now = read_splits_after("an4", an4, tmp_path / out, dev_size=2)
        assert [u.utt_id for u in now["train"]] == [u.utt_id for u in whole["train"]]
    assert not now.get("dev"), "both held out: none taken from train in their place"


def read_splits_after(corpus: str, data_dir: Path, out: Path, **options) -> dict:
    prepare_corpus(corpus, data_dir, out, **options)
    return read_splits(out)


def test_folder_split_file_assigns_every_utterance(folder, tmp_path):
    split_file = tmp_path / "splits.txt"
    lines = ["# id split"] + [
        f"spk{n % 2}-utt{n} {'eval' if n < 3 else 'train'}" for n in range(10)
    ]
    split_file.write_text("\n".join(lines) + "\n")
    splits = read_splits_after("folder", folder, tmp_path / "out", split_file=split_file)
    assert {name: len(u) for name, u in splits.items()} == {"eval": 3, "train": 7}
    assert {u.utt_id for u in splits["eval"]} == {"spk0-utt0", "spk1-utt1", "spk0-utt2"}
    split_file.write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match=r"splits.txt: no split given for 1: spk1-utt9"):
        prepare_corpus("folder", folder, tmp_path / "out", split_file=split_file)


def test_a_split_file_names_ids_as_typed_and_its_faults_by_line(tmp_path):
    """An id may start with `#` (a file `#take1.wav`: not a comment there), and one typed in
    NFC matches a macOS folder's NFD name; a line that is not UTF-8 is named by its number."""
    root = tmp_path / "corpus"
    nfd = unicodedata.normalize("NFD", "Jos\u00e9")
    for name in ("#take1", "#take2", f"{nfd}/u1", f"{nfd}/u2"):
        write_tone(root / f"{name}.wav", 0.1)
        (root / f"{name}.txt").write_text("YES")
    split_file = tmp_path / "splits.txt"
    lines = ["# a comment", "#take1 train", "#take2 dev", "Jos\u00e9-u1 train", "Jos\u00e9-u2 dev"]
    split_file.write_text("\n".join(lines) + "\n")
    splits = read_splits_after("folder", root, tmp_path / "out", split_file=split_file)
    assert sorted(u.utt_id for u in splits["dev"]) == ["#take2", f"{nfd}-u2"]
    split_file.write_bytes("\n".join(lines[:3]).encode() + b"\nJos\xe9-u1 train\n")
    with pytest.raises(
        ValueError, match=r"splits.txt:4: not valid UTF-8 \(byte 0xe9 at column 4\)"
    ):
        prepare_corpus("folder", root, tmp_path / "again", split_file=split_file)
    with pytest.raises(ValueError, match="a folder, not a split file"):
        prepare_corpus("folder", root, tmp_path / "again", split_file=tmp_path)
    split_file.write_text("#take1 was noisy\n")
    with pytest.raises(ValueError, match="splits.txt:1: .*#take1 is an utterance id; write comm"):
        prepare_corpus("folder", root, tmp_path / "again", split_file=split_file)
    write_tone(root / "Jos\u00e9" / "u1.wav", 0.1)  # the NFC name beside the NFD one
    (root / "Jos\u00e9" / "u1.txt").write_text("YES")
    split_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="differ in their Unicode form alone.*: Jos\u00e9-u1"):
        prepare_corpus("folder", root, tmp_path / "again", split_file=split_file)


def test_folder_names_with_spaces_backslashes_and_bom_transcripts_make_valid_manifests(tmp_path):
    root = tmp_path / "corpus"
    for n in range(10):  # as phones name recordings; transcripts as Notepad saves them
        gap = "\\" if n == 8 else " "  # a backslash in a name must not reach its id
        audio = root / "alice smith" / f"Recording{gap}{n}.wav"
        write_tone(audio, 0.1)
        audio.with_suffix(".txt").write_bytes(b"\xef\xbb\xbfYES NO\r\n")
    split_file = tmp_path / "splits.txt"
    lines = [f"alice_smith-Recording{'-' if n == 8 else '_'}{n} {'dev' if n < 2 else 'train'}"
             for n in range(10)]  # fmt: skip
    split_file.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())
    splits = read_splits_after("folder", root, tmp_path / "out", split_file=split_file)
    assert {u.utt_id for u in splits["dev"]} == {
        "alice_smith-Recording_0",
        "alice_smith-Recording_1",
    }
    assert {u.text for split in splits.values() for u in split} == {"YES NO"}
    (root / "alice smith" / "Recording 9.txt").write_bytes(b"\xef\xbb\xbfYES \xff")
    prepare_corpus("folder", root, tmp_path / "again")
    [bad] = json.loads((tmp_path / "again" / "summary.json").read_text())["bad_transcripts"]
    assert bad.endswith("Recording 9.txt: transcript is not valid UTF-8 (byte 0xff at offset 7)")


def test_folder_speakers_are_the_folders_under_the_root(tmp_path):
    """alice/session1 and bob/session1 are two speakers, not one named session1, and
    wav/alice and wav/bob not one named wav; files at the root are one, named as the root."""
    root = tmp_path / "corpus"
    for path in ("alice/session1/a.wav", "bob/session1/b.wav", "c.wav", "wav/dan/d.wav"):
        write_tone(root / path, 0.1)
        (root / path).with_suffix(".txt").write_text("YES")
    splits = read_splits_after("folder", root, tmp_path / "out", dev_fraction=0, test_fraction=0)
    speakers = {u.utt_id: u.speaker for u in splits["train"]}
    assert speakers == {"alice-session1-a": "alice-session1", "bob-session1-b": "bob-session1",
                        "c": "corpus", "wav-dan-d": "wav-dan"}  # fmt: skip
    for path in ("bob/s1/e.wav", "bob-s1/f.wav"):  # two folders spelling one name
        write_tone(root / path, 0.1)
        (root / path).with_suffix(".txt").write_text("YES")
    splits = read_splits_after("folder", root, tmp_path / "out", dev_fraction=0, test_fraction=0)
    speakers = {u.utt_id: u.speaker for u in splits["train"]}
    assert speakers["bob-s1-e"] != speakers["bob-s1-f"]
    assert {speakers["bob-s1-e"][:7], speakers["bob-s1-f"][:7]} == {"bob-s1-"}
    assert speakers["c"] == "corpus" and speakers["wav-dan-d"] == "wav-dan"


def test_folder_ids_of_long_file_names_are_cut_to_what_manifests_take(tmp_path):
    """A 240-byte file name spelt a 250-byte id, which manifests refuse (ids name files): it
    is cut, a hash of the path keeping ids of names alike apart."""
    root = tmp_path / "corpus"
    for last in "ab":
        path = root / "spk" / ("é" * 119 + f"{last}.wav")
        write_tone(path, 0.1)
        path.with_suffix(".txt").write_text("YES")
    splits = read_splits_after("folder", root, tmp_path / "out", dev_fraction=0, test_fraction=0)
    ids = [u.utt_id for u in splits["train"]]  # read back as the manifest reader does
    assert len(set(ids)) == 2 and all(len(i.encode()) <= 200 for i in ids)
    assert all(i.startswith("spk-éé") for i in ids)


def test_folder_ids_must_be_unique(folder, tmp_path):
    write_tone(folder / "spk0" / "utt0.mp3", 0.1)  # utt0.wav is there already
    with pytest.raises(ValueError, match="both give utterance id 'spk0-utt0'"):
        prepare_corpus("folder", folder, tmp_path / "out")


def test_paths_spelling_one_id_get_two(tmp_path):
    """`x/y-z.wav` and `x-y/z.wav` both read as `x-y-z`: each id carries a hash of its path (a
    recording added does not take the id of one there before), and both are prepared; a
    second audio file of one transcript is still refused."""
    root = tmp_path / "corpus"
    for path in (root / "x-y" / "z.wav", root / "x" / "y-z.wav"):
        write_tone(path, 0.1)
        path.with_suffix(".txt").write_text("YES")
    splits = read_splits_after("folder", root, tmp_path / "out", dev_fraction=0, test_fraction=0)
    ids = {Path(u.audio_filepath).relative_to(root).as_posix(): u.utt_id for u in splits["train"]}
    assert sorted(ids) == ["x-y/z.wav", "x/y-z.wav"]
    assert all(re.fullmatch(r"x-y-z-[0-9a-f]{10}", i) for i in ids.values())
    assert len(set(ids.values())) == 2
    write_tone(root / "x-y" / "z.flac", 0.1)
    with pytest.raises(ValueError, match=r"z\.flac and .*z\.wav both give utterance id 'x-y-z'"):
        prepare_corpus("folder", root, tmp_path / "again")


def test_a_txt_file_without_audio_is_listed_and_fails_nothing(folder, tmp_path, caplog):
    """A transcript whose recording is missing (or a README.txt) is named in summary.json and
    a warning, and is no broken input: `asr prepare` succeeds."""
    (folder / "README.txt").write_text("my recordings")
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        assert main(["prepare", "folder", "--data-dir", str(folder), "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["transcripts_without_audio"] == ["README.txt"]
    assert "1 .txt file(s) without same-stem audio: README.txt" in caplog.text


@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_wrong_layout_says_what_was_expected(tmp_path, corpus):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("nothing here")
    with pytest.raises(ValueError, match="expected") as caught:
        prepare_corpus(corpus, tmp_path / "empty", tmp_path / "out")
    assert str(tmp_path / "empty") in str(caught.value)


def test_an4_with_several_tarballs_is_ambiguous(tmp_path):
    for name in ("a.tar.gz", "b.tar.gz"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError, match="found 2 tarballs"):
        prepare_corpus("an4", tmp_path, tmp_path / "out")


def test_an4_corrupt_tarball_is_named(tmp_path):
    tarball = tmp_path / "an4_sphere.tar.gz"
    tarball.write_bytes(b"not a tarball at all")
    with pytest.raises(ValueError, match="an4_sphere.tar.gz: cannot read the tarball"):
        prepare_corpus("an4", tarball, tmp_path / "out")


def test_unknown_corpus_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown corpus 'timit'; known: an4, folder"):
        prepare_corpus("timit", tmp_path, tmp_path / "out")


def test_format_summary_aligns_columns():
    table = format_summary({"train-clean-100": SplitSummary(28539, 100.59, 251)})
    assert table.splitlines() == [
        "split            utterances   hours  speakers",
        "train-clean-100       28539  100.59       251",
    ]


def fake_an4(root: Path, train: list[str], test: list[str]) -> Path:
    """An AN4 layout whose transcript lines are `train` and `test`, with a tone for each id
    named in them (ids given with a `!` after them get no audio)."""
    for split, lines, audio_dir in (("train", train, "an4_clstk"), ("test", test, "an4test_clstk")):
        (root / "etc").mkdir(parents=True, exist_ok=True)
        text = "\n".join(line.replace("!", "") for line in lines) + "\n"
        (root / "etc" / f"an4_{split}.transcription").write_text(text)
        for line in lines:
            found = re.search(r"\((\w+)-(\w+)-(\w+)(!?)\)", line)
            if found and not found.group(4):
                source = "-".join(found.groups()[:3])
                write_tone(root / "wav" / audio_dir / found.group(2) / f"{source}.wav", 0.1)
    (root / "wav").mkdir(exist_ok=True)
    return root


def test_an4_lists_audio_no_line_names_by_its_whole_name(tmp_path):
    root = fake_an4(tmp_path / "an4", ["<s> A </s> (a1-spk-b)"], ["<s> T </s> (t1-tsp-b)"])
    for name in ("a1-spk-b-2", "a2-spk-b"):  # the first's first three parts name a line's
        write_tone(root / "wav" / "an4_clstk" / "spk" / f"{name}.wav", 0.1)
    prepare_corpus("an4", root, tmp_path / "out", dev_size=0)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["missing_transcripts"] == [
        "wav/an4_clstk/spk/a1-spk-b-2.wav",
        "wav/an4_clstk/spk/a2-spk-b.wav",
    ]


def test_an4_leaves_out_and_lists_bad_lines_and_missing_audio(tmp_path):
    root = fake_an4(
        tmp_path / "an4",
        train=[f"<s> WORD {n} </s> (a{n}-spk-b)" for n in range(4)]
        + ["<s> </s> (a7-spk-b)", "<s> AGAIN </s> (a1-spk-b)", "<s> GONE </s> (a8-spk-b!)"],
        test=["<s> TEST </s> (t1-tsp-b)", "no parenthesis here"],
    )
    summaries = prepare_corpus("an4", root, tmp_path / "out", dev_size=1)
    splits = check_outputs(tmp_path / "out", summaries)
    assert {name: len(u) for name, u in splits.items()} == {"train": 3, "dev": 1, "test": 1}
    assert [u.text for u in splits["train"] + splits["dev"]].count("WORD 1") == 1
    problems = "\n".join(left_out(tmp_path / "out"))
    train, test = root / "etc" / "an4_train.transcription", root / "etc" / "an4_test.transcription"
    assert f"{train}:5: spk-a7-b: transcript is empty" in problems
    assert f"{train}:6: spk-a1-b is already on line 2" in problems
    assert "an4_clstk/spk/a8-spk-b.{wav,sph}" in problems
    assert f"{test}:2: expected '<s> WORDS </s> (an251-fash-b)'" in problems


def test_an4_audio_of_an_upper_case_suffix_is_found(tmp_path):
    root = fake_an4(
        tmp_path / "an4", train=["<s> A </s> (a1-spk-b)"], test=["<s> B </s> (t1-tsp-b)"]
    )
    wav = root / "wav" / "an4test_clstk" / "tsp" / "t1-tsp-b.wav"
    wav.rename(wav.with_suffix(".SPH"))  # soundfile reads it by its header
    splits = check_outputs(tmp_path / "out", prepare_corpus("an4", root, tmp_path / "out"))
    assert [Path(u.audio_filepath).name for u in splits["test"]] == ["t1-tsp-b.SPH"]


def test_audio_too_short_to_train_on_is_kept_and_named(folder, tmp_path, caplog):
    """`asr fit` refuses lines under 0.1 s by default: said here, not first at training."""
    write_tone(folder / "spk0" / "blip.wav", 0.05)
    (folder / "spk0" / "blip.txt").write_text("BLIP\n")
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        summaries = prepare_corpus("folder", folder, tmp_path / "out")
    splits = check_outputs(tmp_path / "out", summaries)
    assert "spk0-blip" in {u.utt_id for split in splits.values() for u in split}
    assert left_out(tmp_path / "out") == []
    blip = folder / "spk0" / "blip.wav"
    assert "1 recording(s) shorter than the 0.1 s asr fit takes by default" in caplog.text
    assert f"{blip} (0.050 s)" in caplog.text


def test_an4_line_not_utf8_moves_no_utterance_between_dev_and_train(tmp_path):
    """The dev draw is over every line's id: one whose words are not UTF-8 still counts."""
    train = [f"<s> WORD {n} </s> (a{n}-spk-b)" for n in range(8)]
    fake_an4(tmp_path / "an4", train, ["<s> TEST </s> (t1-tsp-b)"])
    prepare_corpus("an4", tmp_path / "an4", tmp_path / "clean", dev_size=3)
    transcription = tmp_path / "an4" / "etc" / "an4_train.transcription"
    lines = transcription.read_bytes().splitlines(keepends=True)
    dev = {u.utt_id for u in read_manifest(tmp_path / "clean" / "dev.jsonl")}
    spoilt = next(k for k in range(len(lines)) if f"spk-a{k}-b" in dev)
    lines[spoilt] = lines[spoilt].replace(b"WORD", b"W\xa0RD")
    transcription.write_bytes(b"".join(lines))
    prepare_corpus("an4", tmp_path / "an4", tmp_path / "spoilt", dev_size=3)
    left = {u.utt_id for u in read_manifest(tmp_path / "spoilt" / "dev.jsonl")}
    assert left == dev - {f"spk-a{spoilt}-b"}


def test_a_corpus_with_no_usable_utterance_is_refused(tmp_path):
    root = fake_an4(tmp_path / "an4", ["<s> A </s> (a1-spk-b!)"], ["<s> B </s> (t1-tsp-b!)"])
    with pytest.raises(ValueError, match=r"no usable utterance \(missing_audio: .*a1-spk-b"):
        prepare_corpus("an4", root, tmp_path / "out")


def test_splits_of_an_earlier_preparation_are_removed(tmp_path, caplog):
    """Preparing again without dev must not leave the old dev set, now in train, beside it."""
    root = fake_an4(
        tmp_path / "an4", [f"<s> W </s> (a{n}-spk-b)" for n in range(5)], ["<s> T </s> (t-s-b)"]
    )
    out = tmp_path / "out"
    prepare_corpus("an4", root, out, dev_size=2)
    (out / "notes.jsonl").write_text("{}\n")  # not a split of ours: kept
    with caplog.at_level(logging.WARNING, logger="asr.data.prepare"):
        summaries = prepare_corpus("an4", root, out, dev_size=0)
    assert sorted(p.name for p in out.glob("*.jsonl")) == [
        "notes.jsonl",
        "test.jsonl",
        "train.jsonl",
    ]
    assert f"removing {out / 'dev.jsonl'}" in caplog.text
    assert set(summaries) == {"train", "test"} and summaries["train"].utterances == 5


def test_an_option_of_another_corpus_is_named(tmp_path):
    with pytest.raises(
        ValueError, match="yesno takes no option --dev-size; it is an option of an4"
    ):
        prepare_corpus("yesno", tmp_path, tmp_path / "out", dev_size=3)
    with pytest.raises(ValueError, match="an4 takes no option --splits; it is an option of libri"):
        prepare_corpus("an4", tmp_path, tmp_path / "out", splits=["train"])


def test_an4_tarball_cut_short_is_named(tmp_path):
    root = fake_an4(tmp_path / "an4", ["<s> A </s> (a1-spk-b)"], ["<s> B </s> (t1-tsp-b)"])
    for n in range(20):  # incompressible audio, so that the cut lands inside the archive
        path = root / "wav" / "an4_clstk" / "spk" / f"noise{n}.wav"
        soundfile.write(path, np.random.default_rng(n).uniform(-1, 1, 8000), 8000)
    whole = tmp_path / "an4.tar.gz"
    with tarfile.open(whole, "w:gz") as archive:
        archive.add(root, arcname="an4")
    cut = tmp_path / "an4_cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match="an4_cut.tar.gz: cannot read the tarball"):
        prepare_corpus("an4", cut, tmp_path / "out")


@pytest.mark.needs_corpus
def test_a_librispeech_split_named_twice_is_prepared_once(librispeech_dir, tmp_path):
    summaries = prepare_corpus(
        "librispeech", librispeech_dir, tmp_path, splits=["train-clean-5", "train-clean-5"]
    )
    assert summaries["train"].utterances == summaries["train-clean-5"].utterances == 38


def test_librispeech_splits_sharing_utterances_pool_each_once(librispeech_dir, tmp_path, caplog):
    """Mini LibriSpeech's train-clean-5 is part of train-clean-100, and both unpack into one
    LibriSpeech folder: train.jsonl holds each utterance once (else asr fit refuses it)."""
    root = tmp_path / "LibriSpeech"
    shutil.copytree(librispeech_dir / "train-clean-5", root / "train-clean-5")
    chapter = next((root / "train-clean-5").glob("*/*"))
    shutil.copytree(chapter, root / "train-clean-100" / chapter.parent.name / chapter.name)
    shared = len((next(chapter.glob("*.trans.txt"))).read_text().splitlines())
    with caplog.at_level(logging.WARNING):
        summaries = prepare_corpus("librispeech", tmp_path, tmp_path / "out")
    assert summaries["train-clean-100"].utterances == shared
    assert summaries["train"].utterances == summaries["train-clean-5"].utterances == 38
    assert read_manifest(tmp_path / "out" / "train.jsonl")  # ids unique, as read_manifest asks
    said = f"librispeech train-clean-5: {shared} utterance(s) also in train-clean-100"
    assert said in caplog.text


def librispeech_copy(source: Path, root: Path, splits: dict[str, bool]) -> Path:
    """`root`/LibriSpeech with a copy of `source`'s train-clean-5 as each split: whole, or one
    chapter (False)."""
    chapter = next((source / "train-clean-5").glob("*/*"))
    for name, whole in splits.items():
        if whole:
            shutil.copytree(source / "train-clean-5", root / "LibriSpeech" / name)
        else:
            shutil.copytree(
                chapter, root / "LibriSpeech" / name / chapter.parent.name / chapter.name
            )
    return root


@pytest.mark.needs_corpus
def test_librispeech_prepared_split_by_split_keeps_the_splits_before(
    librispeech_dir, tmp_path, caplog
):
    """`--splits dev-clean` after `--splits train-clean-100` into one folder removed the
    training manifests. Those of the same folder stay, with what was left out of them; a pool
    written without one of them says so; another corpus's are replaced."""
    root = librispeech_copy(librispeech_dir, tmp_path / "ls", {"train-clean-100": True,
                            "dev-clean": False, "train-other": False})  # fmt: skip
    broken = next((root / "LibriSpeech" / "train-clean-100").rglob("*.flac"))
    broken.write_bytes(b"not audio")
    out = tmp_path / "out"
    prepare_corpus("librispeech", root, out, splits=["train-clean-100"])
    train, said = (out / "train.jsonl").read_text(), left_out(out)
    assert len(said) == 1 and said[0].startswith(str(broken))
    summaries = prepare_corpus("librispeech", root, out, splits=["dev-clean"])
    names = ["dev", "dev-clean", "train", "train-clean-100"]
    assert sorted(p.stem for p in out.glob("*.jsonl")) == sorted(summaries) == names
    assert (out / "train.jsonl").read_text() == train and summaries["train"].utterances == 37
    assert sorted(json.loads((out / "summary.json").read_text())["splits"]) == names
    assert left_out(out) == said
    with caplog.at_level(logging.WARNING):
        prepare_corpus("librispeech", root, out, splits=["train-other"])
    said = "train.jsonl holds train-other, not train-clean-100 prepared before (name it in"
    assert said in caplog.text
    other = librispeech_copy(librispeech_dir, tmp_path / "other", {"dev-clean": False})
    prepare_corpus("librispeech", other, out, splits=["dev-clean"])
    assert sorted(p.stem for p in out.glob("*.jsonl")) == ["dev", "dev-clean"]


@pytest.mark.needs_corpus
def test_a_librispeech_split_named_as_its_pool_is_pooled_with_the_others(
    librispeech_dir, tmp_path, caplog
):
    """A folder named `train` beside `train-clean-100` was train.jsonl alone, the train-* data
    left out of it unsaid: the pool holds both, and says so."""
    root = librispeech_copy(librispeech_dir, tmp_path / "ls", {"train": False,
                                                               "train-other": True})  # fmt: skip
    with caplog.at_level(logging.WARNING):
        summaries = prepare_corpus("librispeech", root, tmp_path / "out")
    assert summaries["train"].utterances == summaries["train-other"].utterances == 38
    assert "the split folder train is pooled with train-other into train.jsonl" in caplog.text


def an4_tarball(path: Path, train: list[str]) -> Path:
    """`path`, an AN4 .tar.gz of `fake_an4(train, one test line)`."""
    root = fake_an4(path.parent / f"{path.parent.name}-an4", train, ["<s> T </s> (t1-tsp-b)"])
    with tarfile.open(path, "w:gz") as archive:
        archive.add(root, arcname="an4")
    return path


def test_an4_another_tarball_of_the_same_name_is_extracted_afresh(tmp_path, monkeypatch):
    """The extraction in raw/ is reused only for the tarball it came from (path, size, time)."""
    small = an4_tarball(tmp_path / "a" / "an4_sphere.tar.gz", ["<s> A </s> (a1-spk-b)"])
    full = an4_tarball(
        tmp_path / "b" / "an4_sphere.tar.gz", [f"<s> B </s> (b{n}-tsp-b)" for n in range(3)]
    )
    out = tmp_path / "out"
    (out / "raw" / "an4").mkdir(parents=True)  # the user's, though named as the tarball's top
    (out / "raw" / "an4" / "README").write_text("mine")
    assert prepare_corpus("an4", small, out, dev_size=0)["train"].utterances == 1
    assert prepare_corpus("an4", full, out, dev_size=0)["train"].utterances == 3
    assert not list((out / "raw").rglob("a1-spk-b.wav")), "the old extraction was replaced"
    assert (out / "raw" / "an4" / "README").read_text() == "mine"
    an4_tarball(full, [f"<s> C </s> (c{n}-tsp-b)" for n in range(5)])  # same path, new content
    assert prepare_corpus("an4", full, out, dev_size=0)["train"].utterances == 5

    def refuse(*args, **kwargs):
        raise AssertionError("extracted again")

    monkeypatch.setattr(tarfile, "open", refuse)
    assert prepare_corpus("an4", full, out, dev_size=0)["train"].utterances == 5


def test_a_tarball_refused_leaves_the_earlier_extraction_its_manifests_name(tmp_path, monkeypatch):
    good = an4_tarball(tmp_path / "a" / "an4_sphere.tar.gz", ["<s> A </s> (a1-spk-b)"])
    out = tmp_path / "out"
    prepare_corpus("an4", good, out, dev_size=0)
    audio = [json.loads(line)["audio_filepath"] for line in (out / "train.jsonl").open()]
    other = tmp_path / "other.tar.gz"  # no AN4 inside
    with tarfile.open(other, "w:gz") as archive:
        archive.add(good, arcname="x/an4_sphere.tar.gz")
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[:300])
    for bad, said in ((other, "found 0"), (cut, "cannot read the tarball")):
        with pytest.raises(ValueError, match=said):
            prepare_corpus("an4", bad, out, dev_size=0)
        assert all(Path(path).is_file() for path in audio)
        assert sorted(p.name for p in (out / "raw").iterdir()) == ["extracted.json", "tarball"]

    def refuse(*args, **kwargs):
        raise AssertionError("extracted again")

    monkeypatch.setattr(tarfile, "open", refuse)  # the earlier record stands
    assert prepare_corpus("an4", good, out, dev_size=0)["train"].utterances == 1
