"""asr.writers: where outputs go (mirrored paths, no collisions), tsv, timed lines, formats."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import PurePath

import pytest

import asr
from asr.results import Segment, Transcript
from asr.timing import Word
from asr.writers import (
    FORMATS,
    expand_formats,
    output_stems,
    render,
    subtitle_cues,
    timed_lines,
    write_text_atomically,
)


def transcript() -> Transcript:
    """Two segments of two words each, the second past an hour."""
    words = [Word("YES", 0.5, 0.9), Word("NO", 1.0, 1.25), Word("GO", 3600.0, 3600.4),
             Word("U\tM", 3600.5, 3601.0)]  # fmt: skip
    segments = [Segment(0.4, 1.3, "YES NO", -1.0), Segment(3599.9, 3601.2, "GO U\tM", -2.0)]
    return Transcript("YES NO GO U\tM", [], [], [], [], words, -3.0, 3602.0, segments)


def test_outputs_mirror_paths_below_the_shared_folder(tmp_path):
    paths = [tmp_path / "d/alice/001.wav", tmp_path / "d/bob/001.wav", tmp_path / "d/x.flac"]
    assert output_stems(paths) == [PurePath("alice/001"), PurePath("bob/001"), PurePath("x")]
    folder = tmp_path / "d"  # a folder argument: its files mirrored below it
    assert output_stems(paths[:1], [folder]) == [PurePath("alice/001")]
    assert output_stems([tmp_path / "a/talk.m4a"], [None]) == [PurePath("talk")]


def test_two_inputs_writing_the_same_files_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"a\.wav and .*a\.flac would write the same output"):
        output_stems([tmp_path / "a.wav", tmp_path / "a.flac"])


def test_tsv_has_whispers_columns_per_segment_or_word():
    rows = [line.split("\t") for line in render(transcript(), "tsv").splitlines()]
    assert rows == [["start", "end", "text"], ["500", "1250", "YES NO"],
                    ["3600000", "3601000", "GO U M"]]  # fmt: skip
    per_word = render(transcript(), "tsv", words_per_cue=1).splitlines()
    assert per_word[1:3] == ["500\t900\tYES", "1000\t1250\tNO"]


def test_timed_lines_are_whispers_and_show_hours_only_past_one():
    assert timed_lines(transcript()).splitlines() == [
        "[00:00.400 --> 00:01.300] YES NO",
        "[59:59.900 --> 01:00:01.200] GO U\tM",
    ]


def test_all_formats_and_unknown_ones():
    assert expand_formats(["all"]) == list(FORMATS)
    assert expand_formats(["tsv", "txt", "tsv"]) == ["tsv", "txt"]
    with pytest.raises(ValueError, match="unknown output formats \\['doc'\\]"):
        expand_formats(["txt", "doc"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_public_writers_write_what_render_gives(fmt, tmp_path):
    path = tmp_path / f"talk.{fmt}"
    getattr(asr, f"write_{fmt}")(transcript(), path)
    assert path.read_text(encoding="utf-8") == render(transcript(), fmt)


def test_public_writers_pass_their_options_on(tmp_path):
    asr.write_srt(transcript(), tmp_path / "a.srt", words_per_cue=1)
    assert (tmp_path / "a.srt").read_text() == render(transcript(), "srt", words_per_cue=1)
    asr.write_json(transcript(), tmp_path / "a.json", audio="talk.wav")
    assert (tmp_path / "a.json").read_text() == render(transcript(), "json", "talk.wav")


def test_a_json_names_its_audio_file_by_absolute_path(tmp_path, monkeypatch):
    """A path relative to where `asr transcribe` ran would lead nowhere from elsewhere (the
    explorer's folder); names of no file ("-": stdin) stay as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in/talk.wav").write_bytes(b"")
    for given, kept in (("in/talk.wav", str(tmp_path / "in/talk.wav")), ("-", "-"),
                        ("gone.wav", "gone.wav")):  # fmt: skip
        assert json.loads(render(transcript(), "json", given))["audio"] == kept


def test_files_are_written_whole_through_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "talk.txt"
    write_text_atomically(path, "YES\n")
    assert path.read_text() == "YES\n" and sorted(tmp_path.iterdir()) == [path]
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C between the writing and the renaming
        write_text_atomically(path, "NO\n")
    assert path.read_text() == "YES\n" and sorted(tmp_path.iterdir()) == [path], "no partial"
    monkeypatch.undo()
    asr.write_txt(transcript(), path)
    assert path.read_text() == "YES NO GO U\tM\n" and sorted(tmp_path.iterdir()) == [path]
    asr.write_txt(replace(transcript(), text="YES NO\nGO U\tM"), path)  # one made by hand
    assert path.read_text() == "YES NO GO U\tM\n"


def test_a_file_name_that_is_not_utf8_is_written_and_its_json_names_it(tmp_path):
    """Latin-1 names of an old archive: Python holds their bytes as lone surrogates."""
    audio = tmp_path / os.fsdecode(b"caf\xe9.wav")
    audio.write_bytes(b"")
    path = tmp_path / os.fsdecode(b"caf\xe9.json")
    write_text_atomically(path, render(transcript(), "json", str(audio)))
    assert os.fsencode(json.loads(path.read_text(encoding="utf-8"))["audio"]) == os.fsencode(audio)
    assert sorted(tmp_path.iterdir()) == sorted([audio, path])


def test_a_name_near_the_longest_a_folder_takes_is_written(tmp_path):
    """Its `.<name>.partial` would pass the file system's 255 bytes."""
    path = tmp_path / ("a" * 245 + ".json")
    write_text_atomically(path, "{}\n")
    assert path.read_text() == "{}\n" and sorted(tmp_path.iterdir()) == [path]


def test_a_file_in_a_folder_that_is_not_there_is_named_not_its_partial(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"speech.srt: no folder .*nodir to write it in"):
        write_text_atomically(tmp_path / "nodir" / "speech.srt", "")


def test_cues_are_in_order_apart_on_one_line_and_never_lost():
    """Words of two overlapping windows may overlap in time; a segment may have text and no
    word times; text may hold a line break. The srt stays well formed all the same."""
    words = [Word("U", 4.36, 4.44), Word("ERASE", 4.36, 5.12)]
    segments = [Segment(0.0, 4.5, "U", -1.0), Segment(4.5, 8.3, "ERASE", -1.0),
                Segment(9.0, 10.0, "LINE\nBREAK", -1.0)]  # fmt: skip
    cues = subtitle_cues(Transcript("", [], [], [], [], words, 0.0, 10.0, segments))
    assert cues == [(4.36, 4.44, "U"), (4.44, 5.12, "ERASE"), (9.0, 10.0, "LINE BREAK")]
    blocks = render(Transcript("", [], [], [], [], words, 0.0, 10.0, segments), "srt")
    assert [block.splitlines()[0] for block in blocks.strip().split("\n\n")] == ["1", "2", "3"]


def test_srt_cues_hold_no_timing_arrow_and_words_without_segments_are_cued():
    """An arrow in a cue's text reads as a timing line to SubRip players (VTT escapes it);
    a transcript made by hand with words and no segments gets its words cued."""
    segments = [Segment(0.0, 1.0, "A --> B ---> C", -1.0)]
    srt = render(Transcript("A --> B ---> C", [], [], [], [], [], 0.0, 1.0, segments), "srt")
    assert srt.count("-->") == 1 and "A -> B -> C" in srt
    alone = Transcript("HI", [], [], [], [], [Word("HI", 0.1, 0.5)], 0.0, 1.0, [])
    assert subtitle_cues(alone) == [(0.1, 0.5, "HI")]


def test_an_instant_at_a_segments_end_is_cued_once_and_cues_stay_within_the_audio():
    """A word clamped to its segment's end has its centre on the next one's start: it stays
    with its segment's text rather than being shown there and again with the next. Words timed
    before the audio, and an instant in audio shorter than a lone cue, give cues in [0, end]
    that last."""
    words = [Word("HELLO", 2.0, 2.0), Word("WORLD", 2.1, 2.9)]
    segments = [Segment(0.0, 2.0, "HELLO", -1.0), Segment(2.0, 3.0, "WORLD", -1.0)]
    cues = subtitle_cues(Transcript("HELLO WORLD", [], [], [], [], words, 0.0, 3.0, segments))
    assert " ".join(text for *_, text in cues).split() == ["HELLO", "WORLD"]
    early = [Word("A", -1.0, -0.5), Word("B", 0.2, 0.6)]
    short = [Word("YES", 0.1, 0.1)]
    for words, duration in ((early, 1.0), (short, 0.2)):
        text = " ".join(w.text for w in words)
        segment = Segment(0.0, duration, text, -1.0)
        cues = subtitle_cues(Transcript(text, [], [], [], [], words, 0.0, duration, [segment]))
        assert " ".join(t for *_, t in cues) == text
        for start, end, _ in cues:
            assert 0.0 <= start and end <= duration and round(end * 1000) > round(start * 1000)


def test_words_of_an_instant_join_a_cue_that_lasts():
    """Words the timing gave no frames made cues that end as they start (`2.720 --> 2.720`),
    which players skip and WebVTT forbids: they join the next cue, the last the one before."""
    words = [Word("A", 1.0, 1.5), Word("E", 2.72, 2.72), Word("S", 2.72, 3.2),
             Word("THREE", 3.2, 3.2), Word("FIVE", 4.0, 4.0)]  # fmt: skip
    segments = [Segment(0.0, 5.0, "A E S THREE FIVE", -1.0)]
    plain = Transcript("", [], [], [], [], words, 0.0, 5.0, segments)
    assert subtitle_cues(plain, words_per_cue=1) == [
        (1.0, 1.5, "A"), (2.72, 3.2, "E S"), (3.2, 4.0, "THREE FIVE")]  # fmt: skip
    lone = Transcript("", [], [], [], [], [Word("YES", 4.9, 4.9)], 0.0, 5.0, segments[:1])
    assert subtitle_cues(lone) == [(4.5, 5.0, "YES")]
    for cues in (subtitle_cues(plain, 1), subtitle_cues(plain, 2), subtitle_cues(lone)):
        assert all(round(end * 1000) > round(start * 1000) for start, end, _ in cues)
