"""Transcribing recordings of any length with a `Recognizer`.

Each input is cut into segments (`asr.segment`); segments are read one at a time with
`load_audio(offset=, duration=)`, sorted by length and decoded `batch_size` at a time; each
segment's times are shifted by its start, and where two fixed windows overlap, each keeps the
words whose centre lies on its side of the overlap's midpoint.

`Recognizer.transcribe` runs this for the Python API and `transcribe_files` for
`asr transcribe`, whose arguments `expand_inputs` turns into files (folders searched, globs
expanded, manifest lines read, stdin saved); it writes `<stem>.<format>` per input and format
(`asr.writers`), or prints timed lines. The recognizer is named here only for type checking:
`asr.recognizer` binds these functions as its methods, so the import points one way.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import IO, TYPE_CHECKING, TypeVar

from torch import Tensor
from tqdm import tqdm

from asr.audio import AUDIO_SUFFIXES, AudioError, AudioInput, as_waveform, audio_files
from asr.data.manifest import read_clip
from asr.results import BatchResult, Decoded, Transcript
from asr.search import LanguageModel, SearchOptions
from asr.segment import (
    ArraySource,
    AudioSource,
    Clip,
    SegmenterOptions,
    Span,
    open_source,
    segment_source,
)
from asr.text import Tokenizer
from asr.timing import word_index
from asr.writers import expand_formats, output_stems, timed_lines, write_transcript

if TYPE_CHECKING:
    from asr.recognizer import Recognizer

# Segments decoded together by `transcribe`: more costs memory faster than it saves time.
TRANSCRIBE_BATCH_SIZE = 4

T = TypeVar("T")


def _batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def transcribe_sources(
    recognizer: Recognizer,
    audios: Sequence[AudioInput | Clip],
    *,
    sample_rate: int | None = None,
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    progress: bool = False,
) -> list[BatchResult]:
    """Segment every input, decode all segments in length-sorted batches, join per input.

    Args:
        recognizer: the model.
        audios: file paths, `Clip`s of files, or mono waveforms `(S,)` at `sample_rate`.
        sample_rate: rate of waveform inputs; None: the recognizer's.
        options: search settings; None: `recognizer.default_options`.
        lm: language model for shallow fusion.
        timestamps: "attention" or "ctc" (`Recognizer.transcribe`'s `word_timestamps`).
        batch_size: segments decoded together.
        segmenter: how long audio is split; None: `recognizer.segmenter()`.
        progress: show a tqdm bar over segments.

    Returns:
        Per input, in order, a `BatchResult`: its `Transcript`, or the `AudioError` that
        stopped it (the other inputs still decode).

    Raises:
        ValueError: settings the recognizer cannot decode with (before any input is read).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    segmenter = segmenter or recognizer.segmenter()
    recognizer.check_options(options, lm, timestamps)  # before any file, not once per file
    names = [_input_name(audio, i) for i, audio in enumerate(audios)]
    results: list[Transcript | AudioError | None] = [None] * len(audios)
    sources: dict[int, AudioSource] = {}
    work: list[tuple[int, Span]] = []
    for i, audio in enumerate(audios):
        try:
            sources[i] = _open(audio, names[i], recognizer.sample_rate, sample_rate)
            work.extend((i, span) for span in segment_source(sources[i], segmenter))
        except AudioError as err:
            results[i] = err
    work.sort(key=lambda item: item[1][1] - item[1][0], reverse=True)  # less padding
    parts: dict[int, list[tuple[Span, Transcript]]] = {i: [] for i in sources}
    with tqdm(total=len(work), desc="segments", disable=not progress, leave=False) as bar:
        for batch in _batches(work, batch_size):
            todo, waves = [], []
            for i, span in batch:
                if results[i] is None:
                    try:
                        waves.append(sources[i].read(*span))
                        todo.append((i, span))
                    except AudioError as err:
                        results[i] = err
            for (i, span), decoded in zip(todo, search_or_errors(recognizer, waves, options, lm)):
                if isinstance(decoded, ValueError):
                    results[i] = AudioError(sources[i].name, f"cannot be decoded: {decoded}")
                else:
                    parts[i].append((span, recognizer.transcript(decoded, timestamps)))
            bar.update(len(batch))
    for i, source in sources.items():
        if results[i] is None:
            results[i] = join_segments(recognizer.tokenizer, parts[i], source.duration)
    return [
        BatchResult(name, None, r) if isinstance(r, AudioError) else BatchResult(name, r)
        for name, r in zip(names, results)
    ]


def _input_name(audio: AudioInput | Clip, index: int) -> str:
    """How an input is named in its result and errors: its path, or `<waveform i>`."""
    if isinstance(audio, Clip):
        return audio.path
    if isinstance(audio, (str, os.PathLike)):
        return str(audio)
    return f"<waveform {index}>"


def _open(audio: AudioInput | Clip, name: str, rate: int, sample_rate: int | None) -> AudioSource:
    """`open_source`, a waveform named `name` and refused by an `AudioError` naming it.

    Raises:
        AudioError: the file cannot be read, or the array is no mono waveform of finite samples.
    """
    if isinstance(audio, (Clip, str, os.PathLike)):
        return open_source(audio, rate)
    try:
        return ArraySource(as_waveform(audio, sample_rate or rate, rate), rate, name)
    except ValueError as err:
        raise AudioError(name, str(err)) from None


def search_or_errors(
    recognizer: Recognizer,
    waves: list[Tensor],
    options: SearchOptions | None,
    lm: LanguageModel | None,
) -> list[Decoded | ValueError]:
    """`recognizer.search`, or where the batch fails on its input (audio shorter than the
    encoder needs), each wave alone: the result holds the ValueError of each bad one."""
    try:
        return recognizer.search(waves, options, lm)
    except ValueError as err:
        if len(waves) == 1:
            return [err]
    results: list[Decoded | ValueError] = []
    for wave in waves:
        try:
            results += recognizer.search([wave], options, lm)
        except ValueError as err:
            results.append(err)
    return results


def join_segments(
    tokenizer: Tokenizer, parts: Sequence[tuple[Span, Transcript]], duration: float
) -> Transcript:
    """One `Transcript` from segment transcripts (times relative to their span's start).

    Times are shifted into the input's timeline. Where two spans overlap, the earlier one
    keeps the words whose centre lies before the overlap's midpoint and the later one the
    rest; the segments reported are cut at that midpoint too.

    Args:
        tokenizer: decodes the tokens a segment keeps.
        parts: `(span, transcript)` per segment, in any order.
        duration: seconds of the whole input.
    """
    parts = sorted(parts, key=lambda part: part[0][0])
    spans = [span for span, _ in parts]
    out = Transcript("", [], [], [], [], [], 0.0, duration, [])
    logprob_sum, logprob_count = 0.0, 0  # over whole segments: tokens and eos
    for k, (span, part) in enumerate(parts):
        low, high = _kept_range(spans, k)
        keep = _kept_tokens(part, span[0], low, high)
        tokens = [t for t, kept in zip(part.tokens, keep) if kept]
        text = part.text if all(keep) else tokenizer.decode(tokens)
        out.tokens += tokens
        out.pieces += [p for p, kept in zip(part.pieces, keep) if kept]
        out.token_starts += [span[0] + s for s, kept in zip(part.token_starts, keep) if kept]
        out.token_ends += [span[0] + e for e, kept in zip(part.token_ends, keep) if kept]
        out.token_probs += [p for p, kept in zip(part.token_probs, keep) if kept]
        out.words += [
            replace(w, start=span[0] + w.start, end=span[0] + w.end)
            for w in part.words
            if low <= span[0] + (w.start + w.end) / 2 < high
        ]
        [whole] = part.segments
        start, end = max(span[0], low), min(span[1], high)
        out.segments.append(replace(whole, start=start, end=end, text=text))
        out.score += part.score
        if part.avg_logprob is not None:
            logprob_sum += part.avg_logprob * (len(part.tokens) + 1)
            logprob_count += len(part.tokens) + 1
    out.text = " ".join(s.text for s in out.segments if s.text)
    out.avg_logprob = logprob_sum / logprob_count if logprob_count else None
    return out


def _kept_range(spans: Sequence[Span], k: int) -> tuple[float, float]:
    """Where span `k`'s words may lie: its overlaps with its neighbours cut at the middle."""
    low, high = -math.inf, math.inf
    if k > 0 and spans[k - 1][1] > spans[k][0]:
        low = (spans[k - 1][1] + spans[k][0]) / 2
    if k + 1 < len(spans) and spans[k + 1][0] < spans[k][1]:
        high = (spans[k][1] + spans[k + 1][0]) / 2
    return low, high


def _kept_tokens(part: Transcript, offset: float, low: float, high: float) -> list[bool]:
    """Which tokens stay: those of kept words; a token outside words (a space) stays when the
    words on both sides of it (where there are any) stay."""
    if low == -math.inf and high == math.inf:
        return [True] * len(part.tokens)
    kept_words = [low <= offset + (w.start + w.end) / 2 < high for w in part.words]
    index = word_index(part.pieces)
    keep = []
    for j, word in enumerate(index):
        if word is not None:
            keep.append(kept_words[word])
            continue
        before = next((w for w in reversed(index[:j]) if w is not None), None)
        after = next((w for w in index[j + 1 :] if w is not None), None)
        keep.append(all(kept_words[w] for w in (before, after) if w is not None))
    return keep


@dataclass(frozen=True)
class Input:
    """One recording to transcribe: a file, a line of a manifest, or what came on stdin."""

    audio: Clip  # what to read
    name: str  # how it is reported: its path, "-" for stdin, "path@start-end" (ms) for a clip
    stem: PurePath  # where its outputs go under the output directory, without suffix


# What an argument yields: (audio, name, path its output stem is taken from, base folder of
# that path; None: the stem alone).
Found = tuple[Clip, str, str, str | None]


def expand_inputs(
    arguments: Sequence[str], scratch: str | os.PathLike, stdin: IO[bytes] | None = None
) -> tuple[list[Input], list[str]]:
    """The recordings that `asr transcribe` arguments name, and what is wrong with the others.

    An argument is a file; a folder (searched recursively for files with `AUDIO_SUFFIXES`); a
    glob pattern, which we expand (`**` too), keeping audio files; a `.jsonl` manifest, whose
    lines give `audio_filepath` (relative: to the manifest's folder) and optionally `offset`
    and `duration` in seconds; or "-", audio bytes on stdin, saved under `scratch`. Outputs
    mirror the inputs' paths below the deepest folder the arguments share
    (`asr.writers.output_stems`); manifest lines that share a file are told apart by their
    span in milliseconds (`talk@12000-15500`). A file found twice is transcribed once.

    Returns:
        The inputs in argument order, and one "name: reason" per argument or manifest line
        that gives nothing (a folder without audio, a glob without matches, a bad line).
        Files that are missing or unreadable are found to be so when they are read.

    Raises:
        ValueError: two inputs would write the same output files.
    """
    found: list[Found] = []
    failures: list[str] = []
    for argument in arguments:
        found += _expand(argument, Path(scratch), stdin, failures)
    seen, kept = set(), []
    for item in found:
        key = (os.path.abspath(item[0].path), item[0].offset, item[0].duration)
        if key not in seen:
            seen.add(key)
            kept.append(item)
    stems = output_stems([path for _, _, path, _ in kept], [base for *_, base in kept])
    return [Input(clip, name, stem) for (clip, name, *_), stem in zip(kept, stems)], failures


def _expand(
    argument: str, scratch: Path, stdin: IO[bytes] | None, failures: list[str]
) -> list[Found]:
    """What one argument names (see `expand_inputs`); its problems go to `failures`."""
    if argument == "-":
        return _stdin_input(scratch, stdin or sys.stdin.buffer, failures)
    if os.path.isdir(argument):
        files = _audio_files(Path(argument))
        if not files:
            failures.append(f"{argument}: no audio files in this folder ({_suffixes()})")
        return [(Clip(f), f, f, argument) for f in files]
    if _is_pattern(argument) and not os.path.exists(argument):
        return _glob_inputs(argument, failures)
    if argument.lower().endswith(".jsonl") and os.path.isfile(argument):
        return _manifest_inputs(Path(argument), failures)
    return [(Clip(argument), argument, argument, os.path.dirname(argument))]


def _suffixes() -> str:
    return "suffixes " + " ".join(AUDIO_SUFFIXES)


def _audio_files(folder: Path) -> list[str]:
    """The audio files under `folder` (folders named like audio left out), sorted."""
    return [str(p) for p in audio_files(folder) if p.is_file()]


def _is_pattern(argument: str) -> bool:
    return any(char in argument for char in "*?[")


def _glob_inputs(pattern: str, failures: list[str]) -> list[Found]:
    """Audio files matching `pattern` (and in folders it matches), named below its fixed
    leading folders."""
    parts = Path(pattern).parts
    fixed = list(itertools.takewhile(lambda part: not _is_pattern(part), parts[:-1]))
    base = str(Path(*fixed)) if fixed else "."
    files = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isdir(match):
            files += _audio_files(Path(match))
        elif Path(match).suffix.lower() in AUDIO_SUFFIXES:
            files.append(match)
    if not files:
        failures.append(f"{pattern}: no audio files match ({_suffixes()})")
    return [(Clip(f), f, f, base) for f in files]


def _manifest_inputs(manifest: Path, failures: list[str]) -> list[Found]:
    """The clips a manifest's lines name; its bad lines go to `failures` as `file:line: why`."""
    try:
        lines = manifest.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        failures.append(f"{manifest}: cannot read manifest ({error})")
        return []
    clips, bad = [], 0
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                clips.append(Clip(*read_clip(line, manifest.parent)))
            except ValueError as error:
                failures.append(f"{manifest}:{number}: {error}")
                bad += 1
    if not clips and not bad:
        failures.append(f"{manifest}: no lines")
    lines_of = Counter(clip.path for clip in clips)
    found: list[Found] = []
    for clip in clips:
        path = Path(clip.path)
        if lines_of[clip.path] == 1:
            found.append((clip, str(path), str(path), str(path.parent)))
        else:  # told apart by their spans
            span = _span(clip)
            named = path.with_name(f"{path.stem}{span}{path.suffix}")
            found.append((clip, f"{path}{span}", str(named), str(path.parent)))
    return found


def _span(clip: Clip) -> str:
    """`@start-end` of a clip in milliseconds.

    >>> _span(Clip("a.wav", 1.5, 2.0)), _span(Clip("a.wav", 3.0))
    ('@1500-3500', '@3000-end')
    """
    end = "end" if clip.duration is None else round(1000 * (clip.offset + clip.duration))
    return f"@{round(1000 * clip.offset)}-{end}"


def _stdin_input(scratch: Path, stdin: IO[bytes], failures: list[str]) -> list[Found]:
    """Audio bytes on stdin, saved as `scratch/stdin` (read once, however often "-" is given)."""
    path = scratch / "stdin"
    if not path.exists():
        if stdin.isatty():
            failures.append("-: stdin is a terminal; pipe audio in (asr transcribe - < talk.m4a)")
            return []
        with open(path, "wb") as file:
            shutil.copyfileobj(stdin, file)
    return [(Clip(str(path)), "-", str(path), None)]


def file_inputs(paths: Sequence[str | os.PathLike]) -> list[Input]:
    """Files as `Input`s, their outputs named by `asr.writers.output_stems`."""
    stems = output_stems(paths)
    return [Input(Clip(path), str(path), stem) for path, stem in zip(paths, stems)]


def transcribe_files(
    recognizer: Recognizer,
    inputs: Sequence[str | os.PathLike] | Sequence[Input],
    out_dir: str | os.PathLike | None = None,
    *,
    formats: Sequence[str] = ("txt",),
    options: SearchOptions | None = None,
    lm: LanguageModel | None = None,
    timestamps: str = "attention",
    batch_size: int = TRANSCRIBE_BATCH_SIZE,
    segmenter: SegmenterOptions | None = None,
    words_per_cue: int = 0,
    progress: bool = True,
) -> list[str]:
    """Transcribe files `batch_size` at a time, into `out_dir/<stem>.<format>` per format
    ("all": every one), printing `name<TAB>text` per input; or, without `out_dir`, printing
    each input's segments as `[MM:SS.mmm --> MM:SS.mmm] text` lines (after its name where
    there are several inputs). Plain paths are named by `asr.writers.output_stems`. The
    decoding arguments are `transcribe_sources`'.

    An input that cannot be read or decoded is reported on stderr (named, with the reason)
    and the others go on.

    Returns:
        The names of the inputs that failed.
    """
    formats = expand_formats(formats)
    items = list(inputs) if all(isinstance(i, Input) for i in inputs) else file_inputs(inputs)
    failed = []
    with tqdm(total=len(items), desc="files", unit="file", disable=not progress) as bar:
        for group in _batches(items, batch_size):
            audios = [item.audio for item in group]
            results = transcribe_sources(
                recognizer,
                audios,
                options=options,
                lm=lm,
                timestamps=timestamps,
                batch_size=batch_size,
                segmenter=segmenter,
                progress=progress,
            )
            for item, result in zip(group, results):
                if result.error is not None:
                    _say(f"asr transcribe: error: {item.name}: {result.error.reason}\n", sys.stderr)
                    failed.append(item.name)
                elif out_dir is None:
                    text = timed_lines(result.transcript)
                    _say((f"{item.name}\n" if len(items) > 1 else "") + text)
                else:
                    _write(result.transcript, item, Path(out_dir), formats, words_per_cue)
                    _say(f"{item.name}\t{result.transcript.text}\n")
            bar.update(len(group))
    return failed


def _write(
    result: Transcript, item: Input, out_dir: Path, formats: Sequence[str], words_per_cue: int
) -> None:
    """`out_dir/<stem>.<format>` for each format."""
    stem = out_dir / item.stem
    stem.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        write_transcript(result, path, fmt, audio=item.name, words_per_cue=words_per_cue)


def _say(text: str, file: IO[str] | None = None) -> None:
    """Write `text` now (to stdout by default), above any progress bar."""
    file = file or sys.stdout
    tqdm.write(text, file=file, end="")
    file.flush()
