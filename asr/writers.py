"""Transcripts as files: txt, json, srt and vtt."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from asr.results import Transcript
from asr.timing import Word

FORMATS = ("txt", "json", "srt", "vtt")


def format_timestamp(seconds: float, decimal_marker: str = ",") -> str:
    """`HH:MM:SS,mmm` (SRT; WebVTT uses "." as the marker).

    >>> format_timestamp(3725.5), format_timestamp(0.0004, ".")
    ('01:02:05,500', '00:00:00.000')
    """
    millis = round(max(seconds, 0.0) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


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
    raise ValueError(f"unknown output format {fmt!r}; choose from {FORMATS}")


def output_stems(paths: Sequence[str | os.PathLike], out_dir: Path) -> list[Path]:
    """`out_dir/<stem>` per input; two inputs with one stem would overwrite each other.

    Raises:
        ValueError: two inputs share a file stem (both are named).
    """
    seen: dict[str, str] = {}
    for path in paths:
        stem = Path(path).stem
        if stem in seen:
            raise ValueError(f"{seen[stem]} and {path} would write the same output files")
        seen[stem] = str(path)
    return [out_dir / Path(p).stem for p in paths]
