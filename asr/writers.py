"""Transcripts as files (txt, json, srt, vtt, tsv) or as timed lines, and where they go."""

from __future__ import annotations

import errno
import html
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

import numpy as np

from asr.files import write_atomically

if TYPE_CHECKING:  # torch comes with them: `asr connect` prints timed lines without it
    from asr.results import Transcript
    from asr.timing import Word

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
CUE_FORMATS = ("srt", "vtt", "tsv")  # those of subtitle cues (`subtitle_cues`)
ALL = "all"


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
    """`HH:MM:SS,mmm`; `hours=False` leaves out zero hours, as Whisper prints.

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
    """Cues `(start, end, text)`: one per segment, or per `words_per_cue` words of one."""
    if words_per_cue < 0:
        raise ValueError(f"words_per_cue must be >= 0, got {words_per_cue}")
    spans = [(s.start, s.end, s.text) for s in transcript.segments]
    if not spans and transcript.words:  # a transcript made by hand: its words are one span
        spans = [(0.0, transcript.duration, transcript.text)]
    groups = _segment_words(spans, transcript.words)
    cues: list[tuple[float, float, str]] = []
    for (start, end, text), words in zip(spans, groups):
        if not words and text.strip():  # text without word times: the segment's
            cues.append((start, end, text))
        size = words_per_cue or len(words)
        for first in range(0, len(words), max(size, 1)):
            chunk = words[first : first + size]
            cues.append((chunk[0].start, chunk[-1].end, " ".join(w.text for w in chunk)))
    shown = []
    last = transcript.duration if transcript.duration > 0 else math.inf
    for start, end, text in cues:  # in order and apart (words of two windows may overlap)
        start, end = min(max(start, 0.0), last), min(max(end, 0.0), last)  # within the audio
        start = max(start, shown[-1][1]) if shown else start
        shown.append((start, max(start, end), " ".join(text.split())))  # one line each
    return _lasting(shown, transcript.duration)


def _segment_words(spans: list[tuple[float, float, str]], words: list[Word]) -> list[list[Word]]:
    """Each span's words: in turn where they spell the spans' texts (a word of an instant at
    a segment's end stays there), else each to the last span starting before its centre."""
    texts = [text.split() for _, _, text in spans]
    if [w.text for w in words] == [t for text in texts for t in text]:
        ends = np.cumsum([0, *map(len, texts)]).tolist()
        return [words[a:b] for a, b in zip(ends, ends[1:])]
    groups: list[list[Word]] = [[] for _ in spans]
    starts = [start for start, _, _ in spans]
    for word in words:
        k = max(0, int(np.searchsorted(starts, (word.start + word.end) / 2, side="right")) - 1)
        groups[k].append(word)
    return groups


LONE_CUE_SECONDS = 0.5  # what a transcript's only cue, of an instant, is shown for


def _lasting(
    cues: list[tuple[float, float, str]], duration: float
) -> list[tuple[float, float, str]]:
    """Cues in order that each last a millisecond or more (players skip, and WebVTT forbids,
    one that ends as it starts: words the timing gave no frames). Such a cue joins the next
    one, the last one the cue before it; an only one is shown for `LONE_CUE_SECONDS`."""
    kept: list[tuple[float, float, str]] = []
    waiting: tuple[float, str] | None = None  # an instant's start and text, for the next cue
    for start, end, text in cues:
        if waiting is not None:
            start, text, waiting = waiting[0], f"{waiting[1]} {text}", None
        if round(end * 1000) <= round(start * 1000):
            waiting = (start, text)
        else:
            kept.append((start, end, text))
    if waiting is not None and kept:
        start, end, text = kept.pop()
        kept.append((start, max(end, waiting[0]), f"{text} {waiting[1]}"))
    elif waiting is not None:  # within the audio where it is long enough
        start = min(waiting[0], max(duration - LONE_CUE_SECONDS, 0.0))
        end = min(start + LONE_CUE_SECONDS, duration) if duration > start else start
        kept.append((start, max(end, start + 0.001), waiting[1]))
    return kept


def to_srt(cues: Sequence[tuple[float, float, str]]) -> str:
    """SubRip text of the cues; an arrow in a cue's text, which players read as a timing
    line, is shortened (SubRip has no escapes).

    >>> print(to_srt([(0.5, 1.25, "YES ---> NO")]), end="")
    1
    00:00:00,500 --> 00:00:01,250
    YES -> NO
    <BLANKLINE>
    """
    return "".join(
        f"{n}\n{format_timestamp(start)} --> {format_timestamp(end)}\n{shorten_arrows(text)}\n\n"
        for n, (start, end, text) in enumerate(cues, 1)
    )


def shorten_arrows(text: str) -> str:
    """`text` with each arrow of two or more dashes (`-->`, a SubRip timing line's) as `->`."""
    return re.sub("-{2,}>", "->", text)


def to_vtt(cues: Sequence[tuple[float, float, str]]) -> str:
    """WebVTT text of the cues, `&`, `<` and `>` escaped as the format asks.

    >>> print(to_vtt([(0.5, 1.25, "R&B <3")]), end="")
    WEBVTT
    <BLANKLINE>
    00:00:00.500 --> 00:00:01.250
    R&amp;B &lt;3
    <BLANKLINE>
    """
    body = "".join(
        f"{format_timestamp(start, '.')} --> {format_timestamp(end, '.')}\n"
        f"{html.escape(text, quote=False)}\n\n"
        for start, end, text in cues
    )
    return "WEBVTT\n\n" + body


def to_tsv(cues: Sequence[tuple[float, float, str]]) -> str:
    """Tab-separated cues in whole milliseconds under a header, as Whisper writes them.

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

    >>> from asr.results import Segment, Transcript
    >>> t = Transcript("YES", [], [], [], [], [], 0.0, 2.0, [Segment(0.5, 1.25, "YES", 0.0)])
    >>> print(timed_lines(t), end="")
    [00:00.500 --> 00:01.250] YES
    """
    return "".join(timed_line(s.start, s.end, s.text) for s in transcript.segments if s.text)


def timed_line(start: float, end: float, text: str) -> str:
    """`[MM:SS.mmm --> MM:SS.mmm] text` and a newline."""
    return (
        f"[{format_timestamp(start, '.', False)} --> {format_timestamp(end, '.', False)}] {text}\n"
    )


def render(
    transcript: Transcript,
    fmt: str,
    audio: str = "",
    words_per_cue: int = 0,
    offset: float = 0.0,
) -> str:
    """The transcript as the text of an output file of format `fmt`; `offset`: where in `audio`
    its times start (a manifest line's), kept in json where not 0."""
    if fmt == "txt":
        return " ".join(transcript.text.splitlines()) + "\n"  # one line, as documented
    if fmt == "json":
        # a file's absolute path leads to it from any folder (the explorer's); "-" is stdin
        if audio != "-" and os.path.isfile(audio):
            audio = os.path.abspath(audio)
        where = {"audio": audio} | ({"offset": round(offset, 3)} if offset else {})
        return json.dumps(where | transcript.to_dict(), indent=1, ensure_ascii=False)
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
    offset: float = 0.0,
) -> None:
    """Write the transcript as a `fmt` file (see `render`), whole or not at all."""
    write_text_atomically(path, render(transcript, fmt, audio, words_per_cue, offset))


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write `text` whole or not at all (`asr.files.write_atomically`): whoever finds `path`
    finds all of it (a re-run that skips written files relies on this).

    Args:
        path: the file to write (UTF-8); its folder must exist.
        text: its whole content.
    """
    # a file name that is not UTF-8 (its bytes as lone surrogates) goes as `\udcXX`, which
    # JSON reads back as the same name
    write_atomically(path, lambda partial: partial.write_text(text, "utf-8", "backslashreplace"))


def unwritten(error: OSError) -> str:
    """Why an input's outputs were not written, naming the file they stopped at."""
    named = f"{error.filename}: " if error.filename else ""
    return f"cannot write its outputs ({named}{error.strerror or error})"


def file_there(path: str | os.PathLike) -> bool:
    """Whether `path` is a file; False, not OSError, where its name is too long to be one (an
    output's sibling, a few bytes longer than a name near the file system's limit)."""
    try:
        return Path(path).is_file()
    except OSError as err:
        if err.errno != errno.ENAMETOOLONG:
            raise
        return False


def write_outputs(
    transcript: Transcript,
    stem: str | os.PathLike,
    formats: Sequence[str],
    audio: str = "",
    words_per_cue: int = 0,
    offset: float = 0.0,
) -> None:
    """Write `<stem>.<format>` for each of `formats`, making the folder."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_transcript(
            transcript, path, fmt, audio=audio, words_per_cue=words_per_cue, offset=offset
        )


def write_txt(transcript: Transcript, path: str | os.PathLike) -> None:
    """Write the transcript's text as one line.

    Args:
        transcript: the transcript to write.
        path: the file to write (UTF-8).
    """
    write_transcript(transcript, path, "txt")


def write_json(transcript: Transcript, path: str | os.PathLike, *, audio: str = "") -> None:
    """Write text, segments, words and tokens with their times (`Transcript.to_dict`) as JSON.

    Args:
        transcript: the transcript to write.
        path: the file to write (UTF-8).
        audio: the recording's name, stored under "audio".
    """
    write_transcript(transcript, path, "json", audio=audio)


def write_srt(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """Write SubRip subtitles.

    Args:
        transcript: the transcript to write.
        path: the file to write (UTF-8).
        words_per_cue: words per cue; 0 gives a cue per segment.

    Raises:
        ValueError: `words_per_cue` is negative.
    """
    write_transcript(transcript, path, "srt", words_per_cue=words_per_cue)


def write_vtt(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """Write WebVTT subtitles.

    Args:
        transcript: the transcript to write.
        path: the file to write (UTF-8).
        words_per_cue: words per cue; 0 gives a cue per segment.

    Raises:
        ValueError: `words_per_cue` is negative.
    """
    write_transcript(transcript, path, "vtt", words_per_cue=words_per_cue)


def write_tsv(transcript: Transcript, path: str | os.PathLike, *, words_per_cue: int = 0) -> None:
    """Write `start<TAB>end<TAB>text` rows in milliseconds under a header, as Whisper does.

    Args:
        transcript: the transcript to write.
        path: the file to write (UTF-8).
        words_per_cue: words per row; 0 gives a row per segment.

    Raises:
        ValueError: `words_per_cue` is negative.
    """
    write_transcript(transcript, path, "tsv", words_per_cue=words_per_cue)


def output_stems(
    paths: Sequence[str | os.PathLike],
    bases: Sequence[str | os.PathLike | None] | None = None,
    unique: bool = True,
    names: Sequence[str] | None = None,
) -> list[PurePath]:
    """Each input's output path without suffix, below the deepest folder shared by `bases`;
    clashes are told by `names` (default: the paths).

    >>> [s.as_posix() for s in output_stems(["d/alice/1.wav", "d/bob/1.wav"], ["d", "d"])]
    ['alice/1', 'bob/1']
    """
    bases = [os.path.dirname(p) for p in paths] if bases is None else bases
    root = _common_folder([b for b in bases if b is not None])
    names = [str(p) for p in paths] if names is None else names
    stems: list[PurePath] = []
    owners: dict[PurePath, tuple[str, str]] = {}  # each stem's first path and name
    for path, base, name in zip(paths, bases, names):
        stem = PurePath(Path(path).stem)
        if base is not None and root is not None:
            stem = PurePath(os.path.relpath(os.path.abspath(path), root)).with_suffix("")
        if unique and stem in owners:
            if os.path.abspath(owners[stem][0]) == os.path.abspath(path):
                raise ValueError(
                    f"{path} is named twice with different spans (a file and a manifest line "
                    "of it?): its outputs would be the same files"
                )
            raise ValueError(f"{owners[stem][1]} and {name} would write the same output files")
        owners.setdefault(stem, (str(path), name))
        stems.append(stem)
    return stems


def _common_folder(folders: Sequence[str | os.PathLike]) -> str | None:
    """The deepest folder holding all of `folders`; None if there is none."""
    try:
        return os.path.commonpath([os.path.abspath(f) for f in folders]) if folders else None
    except ValueError:
        return None
