"""What `asr transcribe` reads and writes: the recordings its arguments name (files, folders,
globs, manifests, stdin) and the loop that transcribes them into files or onto the terminal."""

from __future__ import annotations

import glob
import html
import itertools
import json
import os
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from tqdm import tqdm

from asr.audio import AUDIO_SUFFIXES, AudioError, audio_files
from asr.data.manifest import decode_line, manifest_base, manifest_lines, read_clip
from asr.results import BatchResult, Decoded, Transcript
from asr.search import LanguageModel, SearchOptions
from asr.segment import Clip, SegmenterOptions, Span
from asr.text import unreadable
from asr.transcribe import TRANSCRIBE_BATCH_SIZE, batches, transcribe_sources
from asr.writers import (
    expand_formats,
    output_stems,
    shorten_arrows,
    timed_lines,
    unwritten,
    write_outputs,
)

if TYPE_CHECKING:
    from asr.recognizer import Recognizer

DEFAULT_FORMATS = ("txt", "json")  # what --output-dir gets without --format


def written_formats(formats: Sequence[str] | None, explorer: bool) -> list[str]:
    """The files each input gets: `--format`'s (else the default), and the json that
    `--explorer` reads."""
    return expand_formats([*(formats or DEFAULT_FORMATS), *(["json"] if explorer else [])])


@dataclass(frozen=True)
class Input:
    """One recording to transcribe: a file, a line of a manifest, or what came on stdin."""

    audio: Clip  # what to read
    name: str  # its path, "-" for stdin, "path@start-end" (ms) for a clip
    stem: PurePath  # its outputs' path under the output directory, without suffix
    fields: Mapping[str, Any] | None = None  # a manifest line's own fields (id, text...)
    line: str | None = None  # `manifest:line` of a manifest's clip


class Found(NamedTuple):
    """What an argument names, before output stems are given."""

    audio: Clip
    name: str
    path: str  # the path its output stem comes from
    base: str | None  # that path's base folder, or None
    fields: Mapping[str, Any] | None = None  # a manifest line's own fields
    line: str | None = None  # `manifest:line`


def expand_inputs(
    arguments: Sequence[str],
    scratch: str | os.PathLike,
    stdin: IO[bytes] | None = None,
    unique_stems: bool = True,
    manifests: Sequence[str] = (),
) -> tuple[list[Input], list[str]]:
    """The `Input`s that `asr transcribe` arguments name, and a `name: reason` per bad one.

    Args:
        arguments: files, folders, glob patterns, `.jsonl` manifests and `-` (stdin).
        scratch: a folder for what comes on stdin.
        stdin: where `-` reads (default: the process's stdin).
        unique_stems: refuse two inputs whose output files would be the same.
        manifests: manifests named by `--manifest` (read as manifests whatever their suffix),
            after `arguments`.

    Returns:
        The inputs in order, each once, and the failures.
    """
    found: list[Found] = []
    failures: list[str] = []
    for argument in arguments:
        found += _expand(argument, Path(scratch), stdin, failures)
    for manifest in manifests:
        found += _manifest_inputs(Path(manifest), failures)
    found = _name_spans(found)
    first: dict[tuple, Found] = {}
    kept = []
    for item in found:
        key = (os.path.abspath(item.audio.path), _span(item.audio))  # as outputs are named
        if key not in first:
            first[key] = item
            kept.append(item)
        elif None not in (item.line, first[key].line) and item.line != first[key].line:
            failures.append(  # two manifest lines; a file also named otherwise is simply once
                f"{item.line}: the same audio as {first[key].line}: transcribed once, under "
                "that line"
            )
    # Files named that are missing fail later; they must not move the shared folder the
    # others' outputs mirror their paths below (/missing.wav would put them under out/tmp/...).
    # A manifest's lines always count: restoring a file then leaves the others' outputs put.
    counted = [f.line is not None or os.path.exists(f.audio.path) for f in kept]
    there = [f for f, ok in zip(kept, counted) if ok]
    stems = iter(output_stems([f.path for f in there], [f.base for f in there], unique_stems,
                              [f.name for f in there]))  # fmt: skip
    inputs = [
        Input(f.audio, f.name, next(stems) if ok else PurePath(Path(f.path).stem), f.fields, f.line)
        for f, ok in zip(kept, counted)
    ]
    return inputs, failures


def _expand(
    argument: str, scratch: Path, stdin: IO[bytes] | None, failures: list[str]
) -> list[Found]:
    """What one argument names (see `expand_inputs`); its problems go to `failures`."""
    if argument == "-":
        return _stdin_input(scratch, stdin or sys.stdin.buffer, failures)
    if os.path.isdir(argument):
        unlisted = len(failures)
        files = _audio_files(Path(argument), failures)
        if not files and len(failures) == unlisted:  # else what it holds was not seen
            failures.append(f"{argument}: no audio files in this folder ({_suffixes()})")
        return [Found(Clip(f), f, f, argument) for f in files]
    if _is_pattern(argument) and not os.path.exists(argument):
        return _glob_inputs(argument, failures)
    if argument.lower().endswith(".jsonl") and os.path.isfile(argument):
        return _manifest_inputs(Path(argument), failures)
    if argument.lower().endswith(".json") and os.path.isfile(argument):  # never audio
        failures.append(
            f"{argument}: JSON, not audio: give a manifest of JSON lines so named (NeMo's "
            f"manifest.json) as --manifest {argument}"
        )
        return []
    return [Found(Clip(argument), argument, argument, os.path.dirname(argument))]


def _suffixes() -> str:
    return "suffixes " + " ".join(AUDIO_SUFFIXES)


def _audio_files(folder: Path, failures: list[str]) -> list[str]:
    """The audio files under `folder` (folders named like audio left out), sorted; a folder
    that cannot be listed goes to `failures`."""
    return [str(p) for p in audio_files(folder, unlisted=failures) if p.is_file()]


def _is_pattern(argument: str) -> bool:
    return any(char in argument for char in "*?[")


def _glob_inputs(pattern: str, failures: list[str]) -> list[Found]:
    """Audio files matching `pattern` (and in folders it matches), named below its fixed part."""
    parts = Path(pattern).parts
    fixed = list(itertools.takewhile(lambda part: not _is_pattern(part), parts[:-1]))
    base = str(Path(*fixed)) if fixed else "."
    files = []
    for match in sorted(glob.glob(pattern, recursive=True)):
        if os.path.isdir(match):
            files += _audio_files(Path(match), failures)
        elif Path(match).suffix.lower() in AUDIO_SUFFIXES:
            files.append(match)
    if not files:
        failures.append(f"{pattern}: no audio files match ({_suffixes()})")
    return [Found(Clip(f), f, f, base) for f in files]


def _manifest_inputs(manifest: Path, failures: list[str]) -> list[Found]:
    """The clips a manifest's lines name; its bad lines go to `failures` as `file:line: why`."""
    try:
        lines = manifest_lines(manifest.read_bytes())
    except OSError as error:
        failures.append(f"{manifest}: {unreadable(error, 'manifest')}")
        return []
    clips, fields, where, bad = [], [], [], 0
    base = manifest_base(manifest)
    for number, line in lines:
        try:
            path, offset, duration, record = read_clip(decode_line(line), base)
        except ValueError as error:
            failures.append(f"{manifest}:{number}: {error}")
            bad += 1
        else:
            clips.append(Clip(path, offset, duration))
            fields.append(record)
            where.append(f"{manifest}:{number}")
    if not clips and not bad:
        failures.append(f"{manifest}: no lines")
    paths = [Path(clip.path) for clip in clips]
    return [
        Found(clip, str(path), str(path), str(path.parent), own, line)
        for clip, path, own, line in zip(clips, paths, fields, where)
    ]


def _name_spans(found: list[Found]) -> list[Found]:
    """`found`, with the manifest lines of a recording that several lines name, in any of the
    manifests, told apart by their spans (`a.wav` -> `a@1500-3500.wav`); lines of one span
    are one input (the later are refused as repeats), named as the recording."""
    spans = {(os.path.abspath(f.audio.path), _span(f.audio)) for f in found if f.line is not None}
    spans_of = Counter(path for path, _ in spans)
    named = []
    for item in found:
        if item.line is None or spans_of[os.path.abspath(item.audio.path)] == 1:
            named.append(item)
            continue
        path, span = Path(item.audio.path), _span(item.audio)
        own = path.with_name(f"{path.stem}{span}{path.suffix}")
        named.append(item._replace(name=f"{path}{span}", path=str(own)))
    return named


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
    return [Found(Clip(str(path)), "-", str(path), None)]


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
    on_result: Callable[[Input, BatchResult], None] | None = None,
    explorer: bool = False,
) -> list[str]:
    """Transcribe inputs into `out_dir/<stem>.<format>` files, or onto stdout; the failed names.

    `on_result(input, result)` is called for each input once its files are written (or its
    failure is reported). `explorer`: also keep, for `asr explore out_dir`, the cross-attention
    and CTC path of each decoded segment (`<stem>.explore.npz`), and the json the page reads
    whatever `formats` says.
    """
    if explorer:
        from asr.explore.records import segment_maps

        if out_dir is None:
            raise ValueError("the explorer's maps are kept in an output folder: give out_dir")
    items = list(inputs) if all(isinstance(i, Input) for i in inputs) else file_inputs(inputs)
    if explorer:
        formats = start_explorer(out_dir, recognizer, formats, [item.stem for item in items])
    formats = expand_formats(formats)
    failed = []
    maps: dict[int, list] = defaultdict(list)  # the segments' maps of the group's inputs

    def keep(index: int, span: Span, transcript: Transcript, decoded: Decoded) -> None:
        maps[index].append((span, segment_maps(transcript, decoded)))

    with tqdm(total=len(items), desc="files", unit="file", disable=not progress) as bar:
        for group in batches(items, batch_size):
            audios = [item.audio for item in group]
            maps.clear()
            results = transcribe_sources(
                recognizer,
                audios,
                options=options,
                lm=lm,
                timestamps=timestamps,
                batch_size=batch_size,
                segmenter=segmenter,
                progress=progress,
                on_decoded=keep if explorer else None,
            )
            for index, (item, result) in enumerate(zip(group, results)):
                if result.error is None and out_dir is not None:
                    try:
                        _write(item, result.transcript, out_dir, formats, words_per_cue,
                               maps.pop(index, []) if explorer else None)  # fmt: skip
                    except OSError as error:  # a name too long, a folder in a file's place...
                        why = unwritten(error)
                        result = BatchResult(result.name, None, AudioError(item.name, why))
                if result.error is not None:
                    said = (
                        f"{item.line}: audio {item.name}"
                        if item.line
                        else item.name or repr(item.name)
                    )
                    _say(f"asr transcribe: error: {said}: {result.error.reason}\n", sys.stderr)
                    failed.append(item.name)
                elif out_dir is None:
                    text = timed_lines(result.transcript)
                    _say((f"{item.name}\n" if len(items) > 1 else "") + text)
                else:
                    _say(f"{item.name}\t{result.transcript.text}\n")
                if on_result is not None:
                    on_result(item, result)
            bar.update(len(group))
    return failed


def _write(
    item: Input,
    transcript: Transcript,
    out_dir: str | os.PathLike,
    formats: Sequence[str],
    words_per_cue: int,
    maps: list | None,
) -> None:
    """An input's files in `out_dir`, and its explorer maps (None: none are kept)."""
    stem = Path(out_dir) / item.stem
    keep_explorer_maps(stem, out_dir, maps)
    # a manifest line's json names its file and offset, for the explorer
    audio = item.name if item.fields is None else item.audio.path
    write_outputs(transcript, stem, formats, audio, words_per_cue, item.audio.offset)


def _references_in_the_way(
    outputs: Iterable[tuple[str, PurePath]],
    out_dir: str | os.PathLike,
    formats: Sequence[str],
    listed: Container[str] = (),
) -> list[str]:
    """The files the outputs would replace that lie beside their own audio under its name
    (`d/u.txt` for `d/u.wav`: a reference transcript, in the layout `asr prepare folder`
    reads; `film.srt` for `film.m4a`: subtitles) and that neither `listed` nor a json output
    of the same audio beside them, of the same words, shows `asr transcribe` wrote.

    Args:
        outputs: each input's audio file and output stem.
        out_dir: the output folder.
        formats: the files asked for.
        listed: files the folder's records list as written there (paths below it).

    Returns:
        Those files' paths.
    """
    found = []
    for audio, stem in outputs:
        for kind in expand_formats(formats):
            if f"{stem.as_posix()}.{kind}" in listed:
                continue
            path = Path(out_dir) / f"{stem}.{kind}"
            beside = Path(audio).with_suffix(f".{kind}")
            try:
                if not (path.is_file() and beside.is_file() and path.samefile(beside)):
                    continue
            except OSError:  # a name too long to be a file: none is in the way
                continue
            if not _written_from(Path(out_dir) / f"{stem}.json", audio, path, kind):
                found.append(str(path))
    return found


def _written_from(path: Path, audio: str, output: Path, kind: str) -> bool:
    """Whether `path` is a json transcript `asr transcribe` wrote of `audio` (by its name: the
    folder may have moved since) with the words of `output`, of format `kind` (a json alone,
    of `--format json`, says nothing of a txt or subtitles beside it)."""
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
        words = _words_of(kind, output.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(written, dict):
        return False
    named = written.get("audio")
    return (
        isinstance(named, str)
        and os.path.basename(named) == os.path.basename(audio)
        and (kind == "json" or shorten_arrows(str(written.get("text"))).split() == words)
    )


def _words_of(kind: str, text: str) -> list[str]:
    r"""The words of an output of format `kind` (a json's: none looked for), as asr writes
    them (a subtitle cue's lines after its timing line), arrows shortened as SubRip's are.

    >>> _words_of("srt", "1\n00:00:00,500 --> 00:00:01,250\nYES 42\n\n2\n00:00:02,000 --> "
    ...           "00:00:02,500\nGO\n\n")
    ['YES', '42', 'GO']
    >>> _words_of("vtt", "WEBVTT\n\n00:00:00.500 --> 00:00:01.250\nR&amp;B --&gt;\n\n")
    ['R&B', '->']
    >>> _words_of("tsv", "start\tend\ttext\n500\t1250\tYES NO\n")
    ['YES', 'NO']
    """
    if kind == "txt":
        said = [text]
    elif kind == "tsv":
        said = [line.split("\t", 2)[-1] for line in text.splitlines()[1:]]
    else:
        said = []
        for cue in text.split("\n\n"):  # a number (srt), a timing line, then the text
            lines = cue.splitlines()
            timing = next((i for i, line in enumerate(lines) if "-->" in line), len(lines))
            said += [html.unescape(t) if kind == "vtt" else t for t in lines[timing + 1 :]]
    return shorten_arrows(" ".join(said)).split()


def refuse_references_in_the_way(
    outputs: Iterable[tuple[str, PurePath]],
    out_dir: str | os.PathLike,
    formats: Sequence[str],
    listed: Container[str] = (),
) -> None:
    """Stop before a run overwrites a reference beside its audio (`_references_in_the_way`,
    whose arguments these are), naming the files."""
    files = _references_in_the_way(outputs, out_dir, formats, listed)
    if files:
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise ValueError(
            f"{shown}: a transcript beside its audio that asr transcribe did not write (a "
            "reference, as `asr prepare folder` reads, or subtitles?) would be overwritten: "
            "give another --output-dir, or remove the files if they are outputs of an earlier "
            "run (one without json among its --format leaves nothing that shows it wrote them)"
        )


def keep_explorer_maps(stem: Path, out_dir: str | os.PathLike, maps: list | None) -> None:
    """Before an input's files, whose presence means done: its explorer maps, or (None) the
    removal of what an earlier `--explorer` run kept of it, which no longer matches. A page
    built before shows the folder as it was: it goes (an `--explorer` run builds it anew)."""
    from asr.explore.records import MAPS_SUFFIX, PAGE, write_maps
    from asr.writers import file_there

    (Path(out_dir) / PAGE).unlink(missing_ok=True)
    if maps is not None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        write_maps(stem, maps)
        return
    kept = Path(f"{stem}{MAPS_SUFFIX}")
    if file_there(kept):
        kept.unlink()


def start_explorer(
    out_dir: str | os.PathLike,
    recognizer: Recognizer,
    formats: Sequence[str],
    stems: Iterable[str | os.PathLike],
) -> list[str]:
    """Ready `out_dir` for `asr explore`: the model's layout of its maps (explore.json); the
    formats to write, with the json the page reads (see `check_layout_free` for `stems`).
    ValueError where the folder holds maps of a model of another layout: the page reads all
    of them by the one layout."""
    from asr.evaluate import record_layout
    from asr.explore.records import MAPS_SUFFIX, read_layout, write_layout

    check_layout_free(out_dir, stems)
    layout = json.loads(json.dumps(record_layout(recognizer)))  # as read back: lists
    try:
        before = read_layout(out_dir)
    except ValueError:  # not JSON: no maps can be read by it
        before = {}
    read_by = ("layers", "heads", "attention", "frame_seconds", "sample_rate")
    other = [k for k in read_by if before.get(k, layout[k]) != layout[k]]
    if other and any(Path(out_dir).rglob(f"*{MAPS_SUFFIX}")):
        changes = ", ".join(f"{k} {before[k]!r}, not {layout[k]!r}" for k in other)
        raise ValueError(
            f"{out_dir} holds explorer maps of another model ({before.get('checkpoint')}: "
            f"{changes}), which the page would read as this one's: give another --output-dir"
        )
    write_layout(out_dir, layout)
    return [*formats, "json"]


def check_layout_free(out_dir: str | os.PathLike, stems: Iterable[str | os.PathLike]) -> None:
    """ValueError where an input's transcript, by its output stem among `stems`, would be
    written over the layout of the explorer's maps in `out_dir`."""
    from asr.explore.records import LAYOUT

    if PurePath(LAYOUT).with_suffix("") in map(PurePath, stems):
        raise ValueError(
            f"an input named {PurePath(LAYOUT).stem}.* would write its transcript over "
            f"{os.path.join(out_dir, LAYOUT)}, where --explorer keeps the layout of its maps: "
            "rename the file, or give its folder's parent"
        )


def write_explorer(out_dir: str | os.PathLike, progress: bool) -> None:
    """Write `out_dir/explorer.html` and say where."""
    from asr.explore.build import explore

    print(f"explorer: {explore(out_dir, progress=progress)}", file=sys.stderr)


def _say(text: str, file: IO[str] | None = None) -> None:
    """Write `text` now (to stdout by default), above any progress bar."""
    file = file or sys.stdout
    tqdm.write(text, file=file, end="")
    file.flush()
