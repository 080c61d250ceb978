"""Transcripts as files (txt, json, srt, vtt, tsv) or as timed lines, and where they go.

`write_txt`, `write_json`, `write_srt`, `write_vtt` and `write_tsv` are public as
`asr.write_srt(transcript, "talk.srt")` and so on; each writes what `render` gives.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path, PurePath

import numpy as np

from asr.results import Transcript
from asr.timing import Word

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
ALL = "all"  # every one of FORMATS


def expand_formats(formats: Sequence[str]) -> list[str]:
    """`formats` with "all" replaced by every format, each once, in order.

    >>> expand_formats(["srt", "all"])
    ['srt', 'txt', 'json', 'vtt', 'tsv']
    """
    unknown = sorted(set(formats) - {*FORMATS, ALL})
    if unknown:
        raise ValueError(f"unknown output formats {unknown}; choose from {(*FORMATS, ALL)}")
    named = [f for name in formats for f in (FORMATS if name == ALL else [name])]
    return list(dict.fromkeys(named))


def format_timestamp(seconds: float, decimal_marker: str = ",", hours: bool = True) -> str:
    """`HH:MM:SS,mmm` (SRT; WebVTT uses "." as the marker); `hours=False` leaves out hours
    when there are none, as Whisper prints.

    >>> format_timestamp(3725.5), format_timestamp(0.0004, "."), format_timestamp(1.2, ".", False)
    ('01:02:05,500', '00:00:00.000', '00:01.200')
    """
    millis = round(max(seconds, 0.0) * 1000)
    hh, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    clock = f"{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"
    return f"{hh:02d}:{clock}" if hours or hh else clock


def subtitle_cues(transcript: Transcript, words_per_cue: int = 0) -> list[tuple[float, float, str]]:
    """Subtitle cues `(start, end, text)`: one per segment, or per `words_per_cue` words of a
    segment when > 0, timed by the first and last word. Segments without words give none.
    """
    if words_per_cue < 0:
        raise ValueError(f"words_per_cue must be >= 0, got {words_per_cue}")
    groups: list[list[Word]] = [[] for _ in transcript.segments]
    starts = [s.start for s in transcript.segments]
    for word in transcript.words:  # to the last segment starting before the word's centre
        k = max(0, int(np.searchsorted(starts, (word.start + word.end) / 2, side="right")) - 1)
        groups[k].append(word)
    cues = []
    for words in groups:
        size = words_per_cue or len(words)
        for first in range(0, len(words), max(size, 1)):
            chunk = words[first : first + size]
            cues.append((chunk[0].start, chunk[-1].end, " ".join(w.text for w in chunk)))
    return cues


def to_srt(cues: Sequence[tuple[float, float, str]]) -> str:
    """SubRip text of the cues.

    >>> print(to_srt([(0.5, 1.25, "YES")]), end="")
    1
    00:00:00,500 --> 00:00:01,250
    YES
    <BLANKLINE>
    """
    return "".join(
        f"{n}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n\n"
        for n, (start, end, text) in enumerate(cues, 1)
    )


def to_vtt(cues: Sequence[tuple[float, float, str]]) -> str:
    """WebVTT text of the cues."""
    body = "".join(
        f"{format_timestamp(start, '.')} --> {format_timestamp(end, '.')}\n{text}\n\n"
        for start, end, text in cues
    )
    return "WEBVTT\n\n" + body


def to_tsv(cues: Sequence[tuple[float, float, str]]) -> str:
    """Tab-separated cues in whole milliseconds, with a header, as Whisper writes them.

    >>> to_tsv([(0.5, 1.25, "YES")]).splitlines()
    ['start\\tend\\ttext', '500\\t1250\\tYES']
    """
    rows = "".join(
        f"{round(1000 * start)}\t{round(1000 * end)}\t{text.replace(chr(9), ' ')}\n"
        for start, end, text in cues
    )
    return "start\tend\ttext\n" + rows


def timed_lines(transcript: Transcript) -> str:
    """One `[start --> end] text` line per segment with text, as Whisper prints them.

    >>> from asr.results import Segment
    >>> t = Transcript("YES", [], [], [], [], [], 0.0, 2.0, [Segment(0.5, 1.25, "YES", 0.0)])
    >>> print(timed_lines(t), end="")
    [00:00.500 --> 00:01.250] YES
    """
    return "".join(
        f"[{format_timestamp(s.start, '.', False)} --> {format_timestamp(s.end, '.', False)}] "
        f"{s.text}\n"
        for s in transcript.segments
        if s.text
    )


def render(transcript: Transcript, fmt: str, audio: str = "", words_per_cue: int = 0) -> str:
    """The transcript as the text of an output file of format `fmt` (one of `FORMATS`)."""
    if fmt == "txt":
        return transcript.text + "\n"
    if fmt == "json":
        return json.dumps({"audio": audio, **transcript.to_dict()}, indent=1, ensure_ascii=False)
    if fmt == "srt":
        return to_srt(subtitle_cues(transcript, words_per_cue))
    if fmt == "vtt":
        return to_vtt(subtitle_cues(transcript, words_per_cue))
    if fmt == "tsv":
        return to_tsv(subtitle_cues(transcript, words_per_cue))
    raise ValueError(f"unknown output format {fmt!r}; choose from {FORMATS}")


def write_transcript(
    transcript: Transcript,
    path: str | os.PathLike,
    fmt: str,
    *,
    audio: str = "",
    words_per_cue: int = 0,
) -> None:
    """Write `render(transcript, fmt, audio, words_per_cue)` to `path` (UTF-8)."""
    text = render(transcript, fmt, audio, words_per_cue)
    Path(path).write_text(text, encoding="utf-8")


def write_outputs(
    transcript: Transcript,
    stem: str | os.PathLike,
    formats: Sequence[str],
    audio: str = "",
    words_per_cue: int = 0,
) -> None:
    """`<stem>.<format>` for each of `formats`, its folder made where missing."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_transcript(transcript, path, fmt, audio=audio, words_per_cue=words_per_cue)


def write_txt(transcript: Transcript, path: str | os.PathLike) -> None:
    """The text, one line."""
    write_transcript(transcript, path, "txt")


def write_json(transcript: Transcript, path: str | os.PathLike, *, audio: str = "") -> None:
    """Text, segments, words and tokens with their times (`Transcript.to_dict`), and `audio`,
    the recording's name."""
    write_transcript(transcript, path, "json", audio=audio)


def write_srt(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """SubRip subtitles: a cue per segment, or per `words_per_cue` words of one
    (`subtitle_cues`)."""
    write_transcript(transcript, path, "srt", words_per_cue=words_per_cue)


def write_vtt(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """WebVTT subtitles, cues as `write_srt`'s."""
    write_transcript(transcript, path, "vtt", words_per_cue=words_per_cue)


def write_tsv(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """`start<TAB>end<TAB>text` rows in milliseconds under a header (Whisper's), cues as
    `write_srt`'s."""
    write_transcript(transcript, path, "tsv", words_per_cue=words_per_cue)


def output_stems(
    paths: Sequence[str | os.PathLike],
    bases: Sequence[str | os.PathLike | None] | None = None,
    unique: bool = True,
) -> list[PurePath]:
    """Where each input's outputs go, relative to the output directory and without suffix:
    its path below the deepest folder shared by all `bases` (by default each input's own
    folder), so `alice/001.wav` and `bob/001.wav` give `alice/001` and `bob/001`, and files of
    one folder their stems. An input whose base is None gives its stem alone.

    >>> [s.as_posix() for s in output_stems(["d/alice/1.wav", "d/bob/1.wav"], ["d", "d"])]
    ['alice/1', 'bob/1']
    >>> [s.as_posix() for s in output_stems(["d/alice/1.wav", "d/2.flac"])]
    ['alice/1', '2']

    Raises:
        ValueError: with `unique`, two inputs would write the same files (both are named).
    """
    bases = [os.path.dirname(p) for p in paths] if bases is None else bases
    root = _common_folder([b for b in bases if b is not None])
    stems: list[PurePath] = []
    owners: dict[PurePath, str] = {}
    for path, base in zip(paths, bases):
        stem = PurePath(Path(path).stem)
        if base is not None and root is not None:
            stem = PurePath(os.path.relpath(os.path.abspath(path), root)).with_suffix("")
        if unique and stem in owners:
            raise ValueError(f"{owners[stem]} and {path} would write the same output files")
        owners.setdefault(stem, str(path))
        stems.append(stem)
    return stems


def _common_folder(folders: Sequence[str | os.PathLike]) -> str | None:
    """The deepest folder holding all of `folders` (absolute); None if there is none (no
    folders, or Windows drives that differ)."""
    try:
        return os.path.commonpath([os.path.abspath(f) for f in folders]) if folders else None
    except ValueError:
        return None
