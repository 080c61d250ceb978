"""asr.data.manifest: round trips, line-exact errors, skip_bad, and validation of audio and text."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asr.data.manifest import (
    BadEntry,
    ManifestError,
    Utterance,
    ValidationReport,
    manifest_bytes,
    read_clip,
    read_manifest,
    validate_manifest,
    write_manifest,
)

GOOD = '{"audio_filepath": "/a/%d.wav", "duration": 1.5, "text": "hello"}'


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    data = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
    path.write_bytes(data + b"\n")
    return path


def write_tone(path: Path, seconds: float = 1.0, sample_rate: int = 16000) -> Path:
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), sample_rate)
    return path


def test_a_manifest_from_a_pipe_reads_the_same_twice(tmp_path):
    """`asr finalize --manifest <(head dev.jsonl)` reads it for each part it fits: the second
    read found the pipe drained, and the alignment maps were cleared as unfittable."""
    read, write = os.pipe()
    os.write(write, "\n".join(GOOD % i for i in range(3)).encode() + b"\n")
    os.close(write)
    try:
        piped = f"/dev/fd/{read}"
        first = read_manifest(piped)
        assert len(first) == 3
        assert read_manifest(piped) == first
        assert validate_manifest(piped, check_audio=False).good == first
        assert manifest_bytes(piped).count(b"\n") == 3
    finally:
        os.close(read)
    fifo = tmp_path / "fifo"  # a named FIFO's writer may send anew: read afresh
    os.mkfifo(fifo)
    for i in (1, 2):
        writer = threading.Thread(target=fifo.write_text, args=(GOOD % i + "\n",))
        writer.start()
        assert [u.audio_filepath for u in read_manifest(fifo)] == [f"/a/{i}.wav"]
        writer.join()
    regular = write_lines(tmp_path / "m.jsonl", [GOOD % 0])
    assert len(read_manifest(regular)) == 1
    write_lines(regular, [GOOD % 0, GOOD % 1])  # a file is read afresh each time
    assert len(read_manifest(regular)) == 2


def test_relative_audio_through_a_pipe_is_the_working_folders(tmp_path, monkeypatch):
    """`--manifest <(cat m.jsonl)` named rel.wav as /dev/fd/rel.wav; a file behind /dev/fd
    (`< m.jsonl` as /dev/stdin) names from its own folder, as given by name."""
    monkeypatch.chdir(tmp_path)
    line = json.dumps({"audio_filepath": "rel.wav", "duration": 1.0, "text": "a"})
    read, write = os.pipe()
    os.write(write, line.encode() + b"\n")
    os.close(write)
    try:
        piped = Path(f"/dev/fd/{read}")
        assert read_manifest(piped)[0].audio_filepath == str(tmp_path / "rel.wav")
    finally:
        os.close(read)
    for folder in ("sub", "dev"):  # dev/: a folder of the user's, not /dev
        (tmp_path / folder).mkdir()
        write_lines(tmp_path / folder / "m.jsonl", [line])
    assert read_manifest(Path("dev/m.jsonl"))[0].audio_filepath == str(tmp_path / "dev/rel.wav")
    with pytest.raises(ManifestError, match="^/: is a directory, not a manifest$"):
        read_manifest("/")  # no folder above it
    with open(tmp_path / "sub" / "m.jsonl") as behind:
        named = Path(f"/dev/fd/{behind.fileno()}")
        assert read_manifest(named)[0].audio_filepath == str(tmp_path / "sub" / "rel.wav")


def test_write_then_read_round_trips(tmp_path):
    utterances = [
        Utterance(str(tmp_path / "a.wav"), 1.25, "grüß gott — ok", id="u1", speaker="s1"),
        Utterance(str(tmp_path / "b.flac"), 0.1, "", speaker="s2", offset=3.5),
        Utterance(str(tmp_path / "c.sph"), 12.0, "YES NO", id="u3"),
    ]
    path = tmp_path / "sub" / "m.jsonl"
    write_manifest(path, utterances)
    assert read_manifest(path) == utterances


def test_written_lines_are_utf8_json_objects_without_none_fields(tmp_path):
    path = tmp_path / "m.jsonl"
    write_manifest(path, [Utterance("/x/a.wav", 2.0, "ça", id=None, speaker="s")])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 and "ça" in lines[0]  # not escaped
    assert json.loads(lines[0]) == {
        "audio_filepath": "/x/a.wav",
        "duration": 2.0,
        "text": "ça",
        "speaker": "s",
        "offset": 0.0,
    }


def test_a_line_that_cannot_be_utf8_is_named_and_the_earlier_manifest_kept(tmp_path):
    """A path of other bytes (Python's lone surrogates) stops the write, naming the line; no
    `.partial` file is left behind and the manifest written before stays as it was."""
    path = tmp_path / "m.jsonl"
    write_manifest(path, [Utterance("/x/a.wav", 1.0, "old")])
    before = path.read_bytes()
    unnamable = Utterance("/x/caf\udce9.wav", 1.0, "new")
    with pytest.raises(ValueError, match=r"m\.jsonl:2: not valid UTF-8 .*caf\\udce9\.wav"):
        write_manifest(path, [Utterance("/x/a.wav", 1.0, "new"), unnamable])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.jsonl"]


def test_relative_paths_resolve_against_the_manifest_directory(tmp_path):
    (tmp_path / "lists").mkdir()
    path = write_lines(
        tmp_path / "lists" / "m.jsonl",
        [
            '{"audio_filepath": "../wav/a.wav", "duration": 1, "text": "a"}',
            '{"audio_filepath": "b.wav", "duration": 1, "text": "b"}',
            '{"audio_filepath": "/abs/c.wav", "duration": 1, "text": "c"}',
        ],
    )
    paths = [u.audio_filepath for u in read_manifest(path)]
    assert paths == [
        str(tmp_path / "wav" / "a.wav"),
        str(tmp_path / "lists" / "b.wav"),
        "/abs/c.wav",
    ]


def test_a_path_out_of_a_linked_folder_leads_where_the_os_finds_it(tmp_path, monkeypatch):
    """`lists/../wav/a.wav` where `lists` is a link: the OS goes up from the link's target,
    where folding the `..` as text went up from the link (and found no file)."""
    real = tmp_path / "corpus"
    (real / "lists").mkdir(parents=True)
    (real / "wav").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "lists").symlink_to(real / "lists")
    write_lines(real / "lists" / "m.jsonl",
                ['{"audio_filepath": "../wav/a.wav", "duration": 1, "text": "a"}'])  # fmt: skip
    monkeypatch.chdir(tmp_path / "work")
    real = Path(os.path.realpath(real))
    for manifest in ("lists/m.jsonl", "lists/../lists/m.jsonl"):
        [utterance] = read_manifest(manifest)
        assert utterance.audio_filepath == str(real / "wav" / "a.wav")
    line = '{"audio_filepath": "../wav/a.wav"}'
    assert read_clip(line, "lists")[0] == str(real / "wav" / "a.wav")
    # where folding `..` leads to the same folder, the path keeps its spelling: one file,
    # one name, however each manifest reaches it (through the link here)
    (tmp_path / "work" / "corpus").symlink_to(real)
    assert read_clip(line, "corpus/lists")[0] == os.path.join("corpus", "wav", "a.wav")


def test_blank_lines_skipped_unknown_keys_ignored_integer_ids_accepted(tmp_path):
    path = write_lines(
        tmp_path / "m.jsonl",
        [
            "",
            '{"audio_filepath": "/a.wav", "duration": 2, "text": "x", "lang": "en", "id": 7}',
            "   ",
            '{"audio_filepath": "/b.wav", "duration": 1e-3, "text": "y", "speaker": 19}',
        ],
    )
    first, second = read_manifest(path)
    assert first == Utterance("/a.wav", 2.0, "x", id="7")
    assert second.speaker == "19" and second.duration == 0.001


def test_utt_id_is_the_id_or_stable_and_distinct_per_path_and_offset():
    assert Utterance("/a/x.wav", 1.0, "t", id="given").utt_id == "given"
    derived = Utterance("/a/x.wav", 1.0, "t").utt_id
    assert derived == Utterance("/a/x.wav", 3.0, "other").utt_id  # only path and offset count
    assert derived.startswith("x-")
    others = {
        Utterance("/b/x.wav", 1.0, "t").utt_id,
        Utterance("/a/x.wav", 1.0, "t", offset=2.0).utt_id,
    }
    assert derived not in others and len(others) == 2
    spaced = Utterance("/a/take 0\tb.wav", 1.0, "t").utt_id  # ids start Kaldi-format lines
    assert spaced.startswith("take_0_b-") and len(spaced.split()) == 1


BAD_LINES = [
    ('{"audio_filepath": "/a.wav", "duration": 1, "text": "x"', "invalid JSON"),
    ('["/a.wav", 1, "x"]', "expected a JSON object, got array"),
    ('{"audio_filepath": "/a.wav", "text": "x"}', "missing key(s): 'duration'"),
    ('{"duration": 1, "text": "x"}', "missing key(s): 'audio_filepath'"),
    ('{"audio_filepath": "/a.wav", "duration": 1}', "missing key(s): 'text'"),
    (
        '{"audio_filepath": "/a.wav", "duration": "1.0", "text": "x"}',
        "'duration' must be a number, got string \"1.0\"",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": null, "text": "x"}',
        "'duration' must be a number, got null",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": [1], "text": "x"}',
        "'duration' must be a number, got array [1]",
    ),
    ('{"audio_filepath": "/a.wav", "duration": true, "text": "x"}', "'duration' must be a number"),
    ('{"audio_filepath": "/a.wav", "duration": 0, "text": "x"}', "'duration' must be > 0"),
    ('{"audio_filepath": "/a.wav", "duration": -2.5, "text": "x"}', "'duration' must be > 0"),
    ('{"audio_filepath": "/a.wav", "duration": NaN, "text": "x"}', "'duration' must be finite"),
    ('{"audio_filepath": "/a.wav", "duration": Infinity, "text": "x"}', "must be finite"),
    (
        '{"audio_filepath": "/a.wav", "duration": 1%s, "text": "x"}' % ("0" * 400),
        "'duration' must be finite, got an integer of 401 digits",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "n": 1%s}' % ("0" * 5000),
        "invalid JSON: Exceeds the limit",
    ),
    ('{"audio_filepath": "/a.wav", "x": %s}' % ("[" * 100_000), "nested deeper than"),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": 5}',
        "'text' must be a string, got number 5",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": null}',
        "'text' must be a string, got null",
    ),
    ('{"audio_filepath": "", "duration": 1, "text": "x"}', "'audio_filepath' must be a non-empty"),
    ('{"audio_filepath": 3, "duration": 1, "text": "x"}', "'audio_filepath' must be a non-empty"),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "offset": -1}',
        "'offset' must be >= 0",
    ),
    ('{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": [1]}', "'id' must be"),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": "../../plot"}',
        '(it names files), got "../../plot"',
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": "utt 1"}',
        "'id' must have no spaces",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": "utt\\u0000"}',
        "no spaces, control characters",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": "%s"}' % ("é" * 101),
        "'id' must be at most 200 bytes long",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "speaker": ""}',
        "'speaker' must be",
    ),
    (  # as asr transcribe's transcripts.jsonl names a file of other bytes
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "id": "caf\\udce9"}',
        "'id' holds \\udce9 at 4, half of a surrogate pair",
    ),
    (
        '{"audio_filepath": "/a.wav", "duration": 1, "text": "x", "speaker": "s\\udce9"}',
        "'speaker' holds \\udce9 at 2",
    ),
    (
        b'{"audio_filepath": "/a.wav", "duration": 1, "text": "caf\xe9"}',
        "not valid UTF-8 (byte 0xe9",
    ),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES, ids=[r for _, r in BAD_LINES])
def test_each_kind_of_bad_line_is_reported_with_file_and_line(tmp_path, line, reason):
    """Each reason is found in the report, and the value is named once (`got null`)."""
    path = write_lines(tmp_path / "bad_lines.jsonl", [GOOD % 1, "", GOOD % 2, line, GOOD % 3])
    with pytest.raises(ManifestError) as caught:
        read_manifest(path)
    assert [entry.location for entry in caught.value.entries] == [f"{path}:4"]
    assert reason in caught.value.entries[0].reason
    assert "null null" not in caught.value.entries[0].reason
    assert f"{path}:4: " in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_duplicate_ids_are_rejected_naming_the_first_line(tmp_path):
    line = '{"audio_filepath": "/%s.wav", "duration": 1, "text": "x", "id": "same"}'
    path = write_lines(tmp_path / "dup.jsonl", [line % "a", GOOD % 1, line % "b"])
    with pytest.raises(
        ManifestError, match=r"dup\.jsonl:3: duplicate id 'same' \(first on line 1\)"
    ):
        read_manifest(path)


def test_lines_without_id_are_duplicates_when_path_and_offset_repeat(tmp_path):
    path = write_lines(tmp_path / "dup.jsonl", [GOOD % 1, GOOD % 2, GOOD % 1])
    with pytest.raises(
        ManifestError, match=r"dup\.jsonl:3: duplicate id '1-\w+' \(first on line 1\)"
    ):
        read_manifest(path)


def test_a_byte_order_mark_is_tolerated_on_the_first_line(tmp_path):
    path = write_lines(tmp_path / "bom.jsonl", [b"\xef\xbb\xbf" + (GOOD % 1).encode()])
    assert read_manifest(path) == [Utterance("/a/1.wav", 1.5, "hello")]
    path = write_lines(tmp_path / "bom_blank.jsonl", [b"\xef\xbb\xbf", GOOD % 1])  # then blank
    assert read_manifest(path) == [Utterance("/a/1.wav", 1.5, "hello")]


def test_every_bad_line_is_listed_at_once_first_twenty_spelled_out(tmp_path):
    lines = [GOOD % 0] + ["not json"] * 25
    path = write_lines(tmp_path / "many.jsonl", lines)
    with pytest.raises(ManifestError) as caught:
        read_manifest(path)
    assert [e.location for e in caught.value.entries] == [f"{path}:{n}" for n in range(2, 27)]
    message = str(caught.value)
    assert message.startswith("25 bad entries:")
    assert f"{path}:21:" in message and f"{path}:22:" not in message
    assert "and 5 more" in message


def test_skip_bad_returns_the_good_lines_and_warns_about_the_rest(tmp_path, caplog):
    path = write_lines(tmp_path / "mixed.jsonl", [GOOD % 1, "{oops", GOOD % 2, "[]", GOOD % 3])
    with caplog.at_level(logging.WARNING, logger="asr.data.manifest"):
        utterances = read_manifest(path, skip_bad=True)
    assert [u.audio_filepath for u in utterances] == ["/a/1.wav", "/a/2.wav", "/a/3.wav"]
    assert f"{path}:2: invalid JSON" in caplog.text
    assert f"{path}:4: expected a JSON object" in caplog.text


@pytest.mark.parametrize("make", [None, Path.mkdir], ids=["missing", "directory"])
def test_unreadable_manifest_raises_naming_it(tmp_path, make):
    path = tmp_path / "gone.jsonl"
    if make:
        make(path)
    with pytest.raises(ManifestError, match="gone.jsonl"):
        read_manifest(path, skip_bad=True)


class CharTokenizer:
    """Stands in for asr.text tokenizers: knows lowercase letters and space."""

    def oov(self, text: str) -> list[str]:
        return [c for c in text if not (c.islower() or c == " ")]

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text if c.islower()]


@pytest.fixture
def mixed_manifest(tmp_path) -> Path:
    """Line 1 good, 2 missing audio, 3 empty audio, 4 corrupt audio, 5 OOV text, 6 empty text,
    7 not JSON, 8 NaN samples (caught only by a full decode), 9 duration past the audio."""
    write_tone(tmp_path / "good.wav")
    empty = tmp_path / "empty.wav"
    soundfile.write(empty, np.zeros(0, np.float32), 16000)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00junk" * 50)
    nan = tmp_path / "nan.wav"
    samples = np.zeros(16000, np.float32)
    samples[5] = np.nan
    soundfile.write(nan, samples, 16000, subtype="FLOAT")
    rows = [
        ("good.wav", 1.0, "hello there", 0.0),
        ("missing.wav", 1.0, "hello", 0.0),
        ("empty.wav", 1.0, "hello", 0.0),
        ("corrupt.wav", 1.0, "hello", 0.0),
        ("good.wav", 0.5, "Hello 42", 0.5),
        ("good.wav", 0.4, "  ", 0.0),
        None,
        ("nan.wav", 1.0, "hello", 0.0),
        ("good.wav", 2.5, "hello", 0.0),
        ("good.wav", 1.0, "hello\ud800", 0.0),  # JSON's escape of half a surrogate pair
    ]
    keys = ("audio_filepath", "duration", "text", "offset")
    lines = [
        "{bad" if row is None else json.dumps({"id": f"u{n}", **dict(zip(keys, row, strict=True))})
        for n, row in enumerate(rows, start=1)
    ]
    return write_lines(tmp_path / "mixed.jsonl", lines)


def test_validate_reports_audio_text_and_line_problems(mixed_manifest):
    report = validate_manifest(mixed_manifest, tokenizer=CharTokenizer())
    reasons = {int(e.location.rsplit(":", 1)[1]): e.reason for e in report.bad}
    assert all(e.location.startswith(f"{mixed_manifest}:") for e in report.bad)
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 9, 10]
    assert "missing.wav: file not found" in reasons[2]
    assert "empty.wav: empty" in reasons[3]
    assert "corrupt.wav: unreadable or corrupt" in reasons[4]
    assert "vocabulary: 'H' '4' '2'" in reasons[5]
    assert reasons[6] == "empty transcript"
    assert "invalid JSON" in reasons[7]
    assert "exceeds audio" in reasons[9]
    assert reasons[10].startswith("'text' holds \\ud800 at 6, half of a surrogate pair")
    assert [u.text for u in report.good] == ["hello there", "hello"]  # lines 1 and 8
    assert not report.ok


def test_full_check_decodes_and_finds_non_finite_samples(mixed_manifest):
    report = validate_manifest(mixed_manifest, check_audio="full")
    reasons = {int(e.location.rsplit(":", 1)[1]): e.reason for e in report.bad}
    assert "nan.wav: contains NaN" in reasons[8]
    assert 5 not in reasons  # no tokenizer, no OOV check


def test_files_cut_short_are_found_by_their_length_or_by_the_full_check(tmp_path):
    """An MP3 cut to a third (an interrupted download) keeps its header's 4 s but is measured
    by decoding; a FLAC cut short keeps its header's length, and only decoding finds the cut."""
    wave = 0.3 * np.random.default_rng(0).standard_normal(16000 * 4).astype(np.float32)
    for suffix in ("mp3", "flac"):
        soundfile.write(tmp_path / f"whole.{suffix}", wave, 16000)
        data = (tmp_path / f"whole.{suffix}").read_bytes()
        (tmp_path / f"cut.{suffix}").write_bytes(data[: len(data) // 3])
    lines = [json.dumps({"audio_filepath": str(tmp_path / name), "duration": 4.0,
                         "text": "yes", "id": name})
             for name in ("whole.mp3", "cut.mp3", "whole.flac", "cut.flac")]  # fmt: skip
    path = write_lines(tmp_path / "m.jsonl", lines)
    [bad] = validate_manifest(path, check_audio=True).bad
    assert bad.location == f"{path}:2" and "exceeds audio" in bad.reason
    assert f"{tmp_path / 'cut.mp3'} (1.2" in bad.reason
    mp3, flac = validate_manifest(path, check_audio="full").bad
    assert mp3 == bad
    assert flac.location == f"{path}:4" and "cut.flac: unreadable or corrupt audio" in flac.reason


def test_audio_shorter_than_the_minimum_is_found_though_its_line_says_enough(tmp_path):
    """A line may say up to 0.1 s more than its audio holds, as much as the minimum itself: a
    30 ms click said to last 0.12 s passed, and stopped training when its batch came."""
    soundfile.write(tmp_path / "click.wav", np.full(480, 0.1, np.float32), 16000)
    soundfile.write(tmp_path / "word.wav", np.full(3200, 0.1, np.float32), 16000)
    lines = [json.dumps({"audio_filepath": str(tmp_path / name), "duration": 0.12,
                         "text": "yes", "id": name})
             for name in ("click.wav", "word.wav")]  # fmt: skip
    # the last 0.1 s of a 0.7 s file: 0.7 - 0.6 is 0.0999... in floats
    soundfile.write(tmp_path / "end.wav", np.full(11200, 0.1, np.float32), 16000)
    end = {"audio_filepath": str(tmp_path / "end.wav"), "offset": 0.6, "duration": 0.1,
           "text": "yes", "id": "end"}  # fmt: skip
    lines.append(json.dumps(end))
    path = write_lines(tmp_path / "m.jsonl", lines)
    assert validate_manifest(path).ok, "no minimum asked for"
    [bad] = validate_manifest(path, min_duration=0.1).bad
    assert bad.location == f"{path}:1"
    assert bad.reason == (f"audio {tmp_path / 'click.wav'} holds 0.030 s from offset 0.000 s, "
                          "below 0.1 s (its line says 0.120 s)")  # fmt: skip


def test_without_audio_checks_only_lines_and_text_are_checked(mixed_manifest):
    report = validate_manifest(mixed_manifest, check_audio=False)
    assert [int(e.location.rsplit(":", 1)[1]) for e in report.bad] == [6, 7, 10]


def test_report_raises_and_lists_every_problem(mixed_manifest):
    report = validate_manifest(mixed_manifest)
    with pytest.raises(ManifestError) as caught:
        report.raise_if_bad()
    assert caught.value.entries == report.bad
    written = report.lines()
    assert written[0] == f"{mixed_manifest}: {len(report.good)} good, {len(report.bad)} bad"
    assert written[1:] == [str(entry) for entry in report.bad]


def test_a_clean_report_does_not_raise(tmp_path):
    write_tone(tmp_path / "a.wav")
    path = tmp_path / "m.jsonl"
    write_manifest(path, [Utterance(str(tmp_path / "a.wav"), 1.0, "abc", id="a")])
    report = validate_manifest(path, tokenizer=CharTokenizer(), check_audio="full")
    assert report == ValidationReport(good=read_manifest(path), bad=[], manifest=str(path))
    report.raise_if_bad()


def test_bad_entry_prints_as_location_and_reason():
    assert str(BadEntry("m.jsonl:3", "invalid JSON")) == "m.jsonl:3: invalid JSON"


def test_a_manifest_error_pickles_whole():
    """A worker process hands its error back pickled: unpickling called ManifestError(message),
    which read the message's characters as its entries."""
    import pickle

    error = ManifestError([BadEntry("m.jsonl:3", "invalid JSON")])
    again = pickle.loads(pickle.dumps(error))
    assert again.entries == error.entries and str(again) == str(error)
