"""`asr transcribe` spread over processes: under torchrun, or started by `--workers N`.

A planner (rank 0, or the `--workers` parent) expands the inputs, leaves out those already
written in the output folder, and deals the rest to the ranks, balanced by duration. Each rank
writes its inputs' files (whole or not at all: `asr.writers.write_text_atomically`) and appends
one line per input to its part, `OUT/transcripts.rank<R>.jsonl`. When all ranks are done the
planner merges the parts and what earlier runs recorded into `OUT/transcripts.jsonl`, and lists
every input that failed, on whichever rank. The planner holds `OUT/transcripts.lock` meanwhile,
so that a second run into the same folder is refused rather than mixed into the parts.

`python -m asr.cli.parallel` is a `--workers` child: it reads its share from stdin.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import heapq
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from asr.audio import AudioError, audio_info
from asr.cli.console import warnings_said_by
from asr.cli.inputs import (
    Input,
    check_layout_free,
    expand_inputs,
    refuse_references_in_the_way,
    written_formats,
)
from asr.cli.numbers import check_search_arguments
from asr.files import remove_partials
from asr.results import BatchResult, round_ms
from asr.writers import FORMATS, file_there, write_text_atomically

MERGED = "transcripts.jsonl"  # a manifest of what the output folder holds, one line per input
PART = "transcripts.rank{rank}.jsonl"  # one rank's lines, until they are merged
PARTS = "transcripts.rank*.jsonl"
LOCK = "transcripts.lock"  # held by the run writing the folder's records
NOT_RUN = "not transcribed: its process stopped before it (see the errors above)"
# Ranks that finish early wait at the barrier for the others; a rank that dies makes torchrun
# stop the group, so the wait needs no tighter bound.
BARRIER_TIMEOUT = timedelta(days=1)
POLL_SECONDS = 0.5  # how often the --workers parent counts what its children wrote

# `_transcribe_inputs(args, inputs, on_result)` of `asr.cli`: loads the model and transcribes.
TranscribeInputs = Callable[
    [argparse.Namespace, list[Input], Callable[[Input, BatchResult], None]], Any
]


@dataclass(frozen=True)
class World:
    """Where this process stands among those sharing the work."""

    rank: int = 0  # this process, 0 to size - 1
    size: int = 1  # processes in all
    local_rank: int = 0  # this process among those on this machine (its GPU)
    local_size: int = 1  # processes on this machine: they share its cores


@dataclass
class Plan:
    """What each rank transcribes, decided once by the planner."""

    run: str  # this run's id, on each line its ranks write
    inputs: list[Input]  # every input named, in order (the merged manifest's order)
    shares: list[list[Input]]  # per rank, the inputs not yet written, in input order
    failures: list[str]  # `name: reason` of arguments that named no usable input
    formats: list[str]  # the files each input gets
    # of the shares, inputs whose files are there but not all listed by their records
    unlisted: int = 0


@dataclass
class Outcome:
    """What `transcribe_spread` reports to the command."""

    failures: list[str] = field(default_factory=list)  # `name: reason`, from every rank
    total: int = 0  # inputs named, good and bad
    status: int = 0  # 2 where a process stopped short (its error is printed above); 130: Ctrl-C


def launched_world(environ: Mapping[str, str] = os.environ) -> World | None:
    """The world a launcher such as torchrun set in the environment; None where none did.

    >>> launched_world({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    World(rank=1, size=2, local_rank=1, local_size=2)
    >>> launched_world({}) is None
    True

    Args:
        environ: the environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).

    Returns:
        This process's `World`, or None without WORLD_SIZE.
    """
    if "WORLD_SIZE" not in environ:
        return None
    try:
        size = int(environ["WORLD_SIZE"])
        rank = int(environ.get("RANK", "0"))
        local_rank = int(environ.get("LOCAL_RANK", rank))
        local_size = int(environ.get("LOCAL_WORLD_SIZE", size))
    except ValueError:
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        given = {name: environ[name] for name in names if name in environ}
        raise ValueError(f"RANK and WORLD_SIZE must be whole numbers, got {given}") from None
    if not 0 <= rank < size:
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {size}")
    return World(rank, size, local_rank, local_size)


def spreads(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `asr transcribe` shares its inputs out: `--workers` or a launcher's world.

    Args:
        args: the command's arguments.
        environ: where a launcher's RANK and WORLD_SIZE would be.

    Returns:
        True to run `transcribe_spread`; False for one process (also one printing, under a
        launcher's world of one).

    Raises:
        ValueError: `--workers` under a launcher, fewer than one worker, or several
            processes without `--output-dir`.
    """
    world = launched_world(environ)
    if args.workers is not None and world is not None:
        raise ValueError(
            f"--workers starts its own processes; under torchrun (WORLD_SIZE={world.size}) "
            "leave it out"
        )
    size = args.workers if world is None else world.size
    if size is None:
        return False
    if size < 1:
        raise ValueError(f"--workers must be at least 1, got {size}")
    if args.output_dir is None:
        if size > 1:
            raise ValueError(
                f"{size} processes share the inputs through --output-dir (each input's files "
                f"and one merged {MERGED}): give one"
            )
        return False  # one process printing: nothing to share
    if "-" in args.audio:
        raise ValueError("-: audio on stdin cannot be shared out; save it to a file first")
    return True


def split_by_duration(durations: Sequence[float], parts: int) -> list[list[int]]:
    """Deal indices to `parts` shares of near-equal total duration, the same way every time.

    Longest first, each to the share with the least so far (the lower share on ties); each
    share then lists its indices in order.

    >>> split_by_duration([5.0, 1.0, 4.0, 2.0, 3.0], 2)
    [[0, 1, 3], [2, 4]]
    >>> split_by_duration([1.0], 3)
    [[0], [], []]

    Args:
        durations: seconds of each item.
        parts: how many shares (at least 1).

    Returns:
        `parts` lists of indices into `durations`; together each index once.
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    loads = [(0.0, rank) for rank in range(parts)]
    shares: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(durations)), key=lambda i: (-durations[i], i)):
        load, rank = heapq.heappop(loads)
        shares[rank].append(index)
        heapq.heappush(loads, (load + durations[index], rank))
    return [sorted(share) for share in shares]


def input_seconds(item: Input) -> float:
    """An input's duration: its manifest's, else its file header's.

    Args:
        item: the input.

    Returns:
        Seconds; 0 where unreadable (it fails when transcribed, and is reported then).
    """
    clip = item.audio
    if clip.duration is not None:
        return float(clip.duration)
    try:
        return max(0.0, audio_info(clip.path).duration - clip.offset)
    except (AudioError, OSError, ValueError):
        return 0.0


def threads_per_process(
    threads: int | None, processes: int, environ: Mapping[str, str] = os.environ
) -> int | None:
    """Intra-op threads for each of `processes` on this machine: `threads` where given, else
    None where OMP_NUM_THREADS is set (PyTorch follows it), else the cores shared out.

    >>> threads_per_process(3, 2), threads_per_process(None, 2, {"OMP_NUM_THREADS": "4"})
    (3, None)

    Args:
        threads: `--threads`, or None.
        processes: the processes sharing this machine's cores.
        environ: where OMP_NUM_THREADS would be.

    Returns:
        The threads to set, or None to leave PyTorch's own.
    """
    if threads is not None:
        return threads
    if "OMP_NUM_THREADS" in environ:
        return None
    return max(1, _cores() // processes)


def _cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# --------------------------------------------------------------------------- records


def output_record(
    item: Input, text: str, duration: float, formats: Sequence[str]
) -> dict[str, Any]:
    """The merged manifest's line for a transcribed input.

    Args:
        item: the input.
        text: its transcript's text.
        duration: seconds of audio it had (used where its manifest gave none).
        formats: the files written for it.

    Returns:
        The manifest line's own fields, then the audio's absolute path, offset and duration,
        `id` (the manifest's, else the output stem), the hypothesis as `pred_text` (`text`
        stays the reference, as in NeMo's manifests) and the files, relative to the folder.
    """
    stem = item.stem.as_posix()
    own = dict(item.fields or {})
    clip = item.audio
    return {
        **own,
        "audio_filepath": "-" if item.name == "-" else os.path.abspath(clip.path),  # stdin
        "offset": clip.offset,
        "duration": clip.duration if clip.duration is not None else _round_ms(duration),
        "id": own.get("id", stem),
        "pred_text": text,
        "files": [f"{stem}.{fmt}" for fmt in formats],
    }


def _round_ms(seconds: float | None) -> float | None:
    """As the transcripts' own files give a duration (None: an earlier record's, unknown)."""
    return None if seconds is None else round_ms(seconds)


def _json_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file; lines cut short by a killed process are left out."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM of an editor's saving
    except FileNotFoundError:
        return []
    objects = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    return objects


def _stem_of(record: Mapping[str, Any]) -> str | None:
    """The output stem a merged record's files share (`a/1.txt` -> `a/1`)."""
    files = record.get("files")
    if isinstance(files, list) and files and isinstance(files[0], str):
        return files[0].rsplit(".", 1)[0]
    return None


@dataclass
class Records:
    """What an output folder's merged manifest and parts say, latest first."""

    written: dict[str, dict] = field(default_factory=dict)  # stem -> its record
    # by input name: a missing file may share its stem with another input
    fresh: set[str] = field(default_factory=set)  # inputs written by the run asked about
    errors: dict[str, str] = field(default_factory=dict)  # input -> its failure in that run


def read_records(out: Path, run: str | None = None) -> Records:
    """The records in an output folder.

    Args:
        out: the folder: its merged manifest is read, then the parts of every run in run
            order (a later line for a stem replaces an earlier one).
        run: the run whose failures and fresh stems are wanted (None: none).

    Returns:
        The records by output stem, and `run`'s fresh inputs and failures, by input name.
    """
    records = Records()
    for record in _json_lines(out / MERGED):
        stem = _stem_of(record)
        if stem is not None:
            records.written[stem] = record
    lines = [line for part in sorted(out.glob(PARTS)) for line in _json_lines(part)]
    for line in sorted(lines, key=lambda line: str(line.get("run"))):  # stable within a run
        stem = line.get("stem")
        if not isinstance(stem, str):
            continue
        name = str(line.get("name", stem))
        if isinstance(line.get("record"), dict):
            earlier = records.written.get(stem)
            records.written[stem] = _with_earlier_files(line["record"], earlier, out)
            if line.get("run") == run:
                records.fresh.add(name)
        elif line.get("run") == run and run is not None:
            records.errors[name] = f"{name}: {line.get('error')}"
    return records


def _with_earlier_files(record: dict, earlier: dict | None, out: Path) -> dict:
    """A later record of an output stem, listing too the files an earlier record of the same
    recording listed (a run with other formats leaves them there). Where the text changed and
    the audio file did since those files were written, another recording may have taken its
    name: its files not written again are left out of the line, not removed (a chmod of the
    audio and another model's text look the same)."""
    if earlier is None or not _same_record_audio(record, earlier):
        return record
    files = [*earlier.get("files", []), *record.get("files", [])]
    if earlier.get("pred_text") != record.get("pred_text"):
        audio = str(record.get("audio_filepath"))
        written = set(record.get("files", []))
        files = [f for f in files if f in written or _unchanged_since(audio, [out / f])]
    return {**record, "files": list(dict.fromkeys(files))}


def _same_record_audio(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether two records are of the same recording and span (standard input's, "-", are
    never known to be)."""
    keys = ("audio_filepath", "offset", "duration")
    known = one.get("audio_filepath") != "-"
    return known and all(one.get(key) == other.get(key) for key in keys)


def is_written(item: Input, out: Path, suffixes: Sequence[str], records: Records) -> bool:
    """Whether an input needs no transcribing.

    Args:
        item: the input.
        out: the output folder.
        suffixes: the files asked for (formats, and the explorer's maps).
        records: what `read_records(out)` found.

    Returns:
        True where it has a record of the same audio and span (another recording that maps to
        the same output name is transcribed over it) and every file asked for (files are only
        ever whole), each format's listed by the record (not another recording's file).
    """
    return _files_there(item, out, suffixes, records, listed=True)


def _files_there(
    item: Input, out: Path, suffixes: Sequence[str], records: Records, listed: bool
) -> bool:
    """Whether an input has a record of the same audio and span and every file asked for; with
    `listed`, each format's file listed by that record too."""
    stem = item.stem.as_posix()
    record = records.written.get(stem)
    if record is None or not _same_audio(record, item):
        return False
    names = set(record.get("files") or ()) if listed else None
    return all(
        file_there(out / f"{stem}.{suffix}")
        and (names is None or suffix not in FORMATS or f"{stem}.{suffix}" in names)
        for suffix in suffixes
    ) and _unchanged_since(item.audio.path, [out / f"{stem}.{suffix}" for suffix in suffixes])


def listed(records: Records) -> set[str]:
    """The files the records list as written in their folder (paths below it)."""
    return {name for r in records.written.values() for name in r.get("files") or ()}


def _same_audio(record: dict, item: Input) -> bool:
    clip = item.audio
    return (
        record.get("audio_filepath") == os.path.abspath(clip.path)
        and record.get("offset", 0.0) == clip.offset
        and (clip.duration is None or record.get("duration") == clip.duration)
    )


def _unchanged_since(audio: str, files: Sequence[Path]) -> bool:
    """Whether the audio file has not changed since every file written of it: not replaced by
    another recording. By the inodes' change times, which copying over it, `cp -a`, `mv` and
    relinking a link all set (a modification time can be kept, or lie in the future)."""
    try:
        changed = max(os.stat(audio).st_ctime_ns, os.lstat(audio).st_ctime_ns)
        return all(changed <= os.stat(file).st_ctime_ns for file in files)
    except OSError:  # gone: it fails when transcribed, if it is
        return True


# --------------------------------------------------------------------------- planner


def make_plan(args: argparse.Namespace, size: int) -> Plan:
    """Expand the command's inputs, leave out those written, deal the rest to the ranks.

    Args:
        args: the command's arguments (`--output-dir` given).
        size: how many ranks.

    Returns:
        The plan, with a new run id.
    """
    out = Path(args.output_dir)
    _check_ours(out)
    formats = written_formats(args.format, args.explorer)
    with tempfile.TemporaryDirectory(prefix="asr-transcribe-") as scratch:  # stdin is refused
        inputs, failures = expand_inputs(args.audio, scratch, manifests=args.manifest)
    if args.explorer:
        check_layout_free(out, [item.stem for item in inputs])
    from asr.explore.records import MAPS_SUFFIX

    records = read_records(out)
    wanted = [*formats, *([MAPS_SUFFIX.lstrip(".")] if args.explorer else [])]
    pending = [item for item in inputs if not is_written(item, out, wanted, records)]
    outputs = [(item.audio.path, item.stem) for item in pending]
    refuse_references_in_the_way(outputs, out, formats, listed(records))
    unlisted = sum(_files_there(item, out, wanted, records, listed=False) for item in pending)
    shares = split_by_duration([input_seconds(item) for item in pending], size)
    run = f"{time.time_ns():020d}"  # sorts as the runs happened
    plan = [[pending[i] for i in share] for share in shares]
    return Plan(run, inputs, plan, failures, formats, unlisted)


@contextlib.contextmanager
def writing(out: Path) -> Iterator[int]:
    """Hold an output folder for one run: another run into it is refused, naming it. The lock
    (`fcntl.flock` on `out/transcripts.lock`) ends with the processes that hold it, so a
    killed run leaves the folder free.

    Args:
        out: the output folder, made where missing.

    Yields:
        The lock's file descriptor, for the processes writing the parts to hold too.
    """
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    while True:
        lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise ValueError(
                f"{out}: another `asr transcribe` is writing into this folder: wait for it to "
                "end, or give another --output-dir"
            ) from None
        if _is_file_of(lock, path):  # not one a run that ended meanwhile removed
            break
        os.close(lock)
    try:
        remove_partials(out)  # of runs killed as they wrote
        yield lock
    finally:
        path.unlink(missing_ok=True)  # while held: a run that opened it finds it gone, retries
        os.close(lock)
        if made and not any(out.iterdir()):  # a run refused before writing leaves no folder
            out.rmdir()


def _is_file_of(descriptor: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(descriptor), os.stat(path))
    except FileNotFoundError:
        return False


def _announce(plan: Plan, out: Path) -> None:
    """Say on stderr which arguments failed, how many inputs are already written, and how
    many are written again though their files are there."""
    for failure in plan.failures:
        print(f"asr transcribe: error: {failure}", file=sys.stderr)
    skipped = len(plan.inputs) - sum(len(share) for share in plan.shares)
    if skipped:
        print(
            f"asr transcribe: {skipped} of {len(plan.inputs)} inputs already written in {out}: "
            "skipped",
            file=sys.stderr,
        )
    if plan.unlisted:
        print(
            f"asr transcribe: {plan.unlisted} inputs whose files are in {out} are transcribed "
            f"again: their lines in {MERGED} do not list every file asked for (an older "
            "asr's, or another recording's of the same name)",
            file=sys.stderr,
        )


def merge(plan: Plan, out: Path) -> list[str]:
    """Write `out/transcripts.jsonl` from the parts and earlier records; remove the parts.

    The manifest lists the plan's inputs in order, then inputs of earlier runs; a record
    whose files are all gone is left out, and its missing files are left out of `files`, as
    are those of a recording since replaced under its name, not written again. An
    input left as written takes its manifest line's fields as they are now (a corrected
    reference text, say).

    Args:
        plan: the run's plan; its ranks are done.
        out: the output folder.

    Returns:
        `name: reason` for each input that failed: the plan's own failures, then each input
        of the shares without a record from this run.
    """
    parts = sorted(out.glob(PARTS))
    records = read_records(out, plan.run)
    ordered: dict[str, Input | None] = {item.stem.as_posix(): item for item in plan.inputs}
    # An earlier run's record of an input now written under another name (the folder its
    # outputs mirror moved) is left out: a line per recording.
    by_path: dict[str, list[Input]] = {}
    for item in plan.inputs:
        by_path.setdefault(os.path.abspath(item.audio.path), []).append(item)
    for stem, record in records.written.items():
        now = by_path.get(str(record.get("audio_filepath")), [])
        if stem not in ordered and not any(_same_audio(record, item) for item in now):
            ordered[stem] = None
    lines = []
    for stem, item in ordered.items():
        record = records.written.get(stem)
        if record is None:
            continue
        if item is not None and item.fields and _same_audio(record, item):
            own = output_record(item, record.get("pred_text", ""), record.get("duration"), ())
            record = {**own, "files": record.get("files", [])}
        files = [f for f in record.get("files", []) if (out / f).is_file()]
        if files:
            lines.append(json.dumps({**record, "files": files}, ensure_ascii=False) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / MERGED, "".join(lines))
    for part in parts:
        part.unlink()
    failed = [
        records.errors.get(item.name, f"{item.name}: {NOT_RUN}")
        for share in plan.shares
        for item in share
        if item.name not in records.fresh
    ]
    return plan.failures + failed


# --------------------------------------------------------------------------- a rank's work


def run_share(
    transcribe: TranscribeInputs,
    args: argparse.Namespace,
    share: list[Input],
    run: str,
    rank: int,
    formats: Sequence[str],
) -> None:
    """Transcribe one rank's share into `args.output_dir`, a line per input in its part.

    Args:
        transcribe: `asr.cli._transcribe_inputs`.
        args: the command's arguments for this rank (threads, quiet).
        share: the rank's inputs.
        run: the run's id.
        rank: the rank, naming its part.
        formats: the files each input gets.
    """
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not share:
        return
    # the command's own warnings are said once, by the first rank
    args = argparse.Namespace(**{**vars(args), "format": list(formats), "warns": rank == 0})
    path = out / PART.format(rank=rank)
    torn = path.is_file() and path.stat().st_size > 0 and not _ends_a_line(path)
    with open(path, "a", encoding="utf-8") as part:
        if torn:
            part.write("\n")  # after the line a killed run cut short

        def note(item: Input, result: BatchResult) -> None:
            line: dict[str, Any] = {"run": run, "stem": item.stem.as_posix(), "name": item.name}
            if result.transcript is not None:
                text, seconds = result.transcript.text, result.transcript.duration
                line["record"] = output_record(item, text, seconds, formats)
            else:
                line["error"] = result.error.reason
            part.write(json.dumps(line) + "\n")  # ASCII: file names that are not UTF-8 too
            part.flush()  # a killed run keeps what it finished

        transcribe(args, share, note)


def holds_records(out: Path) -> bool:
    """Whether a folder holds the records of a run spread over processes: its merged manifest,
    or the parts of one that was killed (which the next spread run trusts as well).

    Raises:
        ValueError: its `transcripts.jsonl` is not one this command wrote.
    """
    _check_ours(out)
    return (out / MERGED).is_file() or any(out.glob(PARTS))


def _check_ours(out: Path) -> None:
    """ValueError where `out/transcripts.jsonl` holds lines other than this command's records
    (someone's manifest of that name), which merging would write over."""
    path = out / MERGED
    try:
        text: str | None = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return
    except UnicodeDecodeError:
        text = None  # not a manifest at all
    if text is None or not all(_is_record(line) for line in text.splitlines() if line.strip()):
        raise ValueError(
            f"{path}: not a manifest this command wrote (a line without pred_text and files), "
            "and the command keeps its own there: move it, or give another --output-dir"
        )


def _is_record(line: str) -> bool:
    """Whether a JSON line is a merged manifest's record (see `output_record`)."""
    try:
        value = json.loads(line)
    except ValueError:
        return False
    files = value.get("files") if isinstance(value, dict) else None
    return (
        isinstance(files, list)
        and all(isinstance(name, str) for name in files)
        and isinstance(value.get("pred_text"), str)
    )


def rewrite_merged(
    args: argparse.Namespace, transcribe: TranscribeInputs, inputs: list[Input]
) -> int:
    """One process writing every input again into a folder that holds the records of a run
    spread over processes (`holds_records`): the merged manifest's lines of those inputs are
    replaced, so that it and the files agree, and a later spread run does not skip on stale
    lines. The caller holds the folder (`writing`).

    Args:
        args: the command's arguments (`--output-dir` given).
        transcribe: `asr.cli._transcribe_inputs`.
        inputs: the inputs, all transcribed.

    Returns:
        How many of them failed.
    """
    out = Path(args.output_dir)
    formats = written_formats(args.format, args.explorer)
    plan = Plan(f"{time.time_ns():020d}", inputs, [inputs], [], formats)
    run_share(transcribe, args, inputs, plan.run, 0, formats)
    return len(merge(plan, out))


def _ends_a_line(path: Path) -> bool:
    """Whether a file that is not empty ends with a newline."""
    with open(path, "rb") as file:
        file.seek(-1, os.SEEK_END)
        return file.read(1) == b"\n"


def transcribe_spread(
    args: argparse.Namespace,
    transcribe: TranscribeInputs,
    environ: Mapping[str, str] = os.environ,
) -> Outcome:
    """Run `asr transcribe` as one rank of a launcher's world, or as the `--workers` parent.

    Args:
        args: the command's arguments (`--output-dir` given).
        transcribe: `asr.cli._transcribe_inputs`, called as `(args, inputs, on_result)`.
        environ: where the launcher's RANK and WORLD_SIZE are.

    Returns:
        On rank 0 or the parent, every failure; on other ranks, nothing.
    """
    world = launched_world(environ)
    if world is None:
        return _parent(args, transcribe, environ)
    return _rank(args, transcribe, world, environ)


def _rank(
    args: argparse.Namespace,
    transcribe: TranscribeInputs,
    world: World,
    environ: Mapping[str, str],
) -> Outcome:
    """One process of torchrun's: rank 0 plans and merges; all transcribe their share."""
    import torch
    import torch.distributed as dist

    shared = world.size > 1
    if shared:
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    out = Path(args.output_dir)
    held = contextlib.ExitStack()  # rank 0 holds the folder until it has merged
    try:
        plan: Plan | None = None
        error: Exception | None = None
        if world.rank == 0:
            try:
                check_search_arguments(args)  # said once, not by every rank
                held.enter_context(writing(out))
                plan = make_plan(args, world.size)
            except (ValueError, OSError) as raised:  # said by rank 0; the others stop quietly
                error = raised
        if shared:
            box = [plan]
            dist.broadcast_object_list(box, src=0)
            plan = box[0]
        if error is not None:
            raise error
        if plan is None:
            return Outcome(status=2)  # rank 0 could not plan, and says why
        if world.rank == 0:
            _announce(plan, out)
        if torch.cuda.is_available():
            torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
        threads = threads_per_process(args.threads, world.local_size, environ)
        quiet = args.quiet or world.rank > 0  # one progress bar: rank 0's
        mine = argparse.Namespace(**{**vars(args), "threads": threads, "quiet": quiet})
        run_share(transcribe, mine, plan.shares[world.rank], plan.run, world.rank, plan.formats)
        if shared:
            dist.barrier()
        if world.rank != 0:
            return Outcome()
        return Outcome(merge(plan, out), len(plan.inputs) + len(plan.failures))
    finally:
        held.close()
        if shared:
            dist.destroy_process_group()


# --------------------------------------------------------------------------- --workers


def _parent(
    args: argparse.Namespace, transcribe: TranscribeInputs, environ: Mapping[str, str]
) -> Outcome:
    """Check the options, hold the output folder, and run the workers."""
    check_search_arguments(args)  # said once, not by every worker
    with writing(Path(args.output_dir)) as lock:
        return _workers(args, transcribe, environ, lock)


def _workers(
    args: argparse.Namespace,
    transcribe: TranscribeInputs,
    environ: Mapping[str, str],
    lock: int,
) -> Outcome:
    """Plan, start a child per non-empty share, relay its output, show progress, merge. The
    children hold `lock` too: a parent killed leaves the folder held while they write."""
    out = Path(args.output_dir)
    plan = make_plan(args, args.workers)
    _announce(plan, out)
    threads = threads_per_process(args.threads, args.workers, environ)
    child_args = argparse.Namespace(
        **{**vars(args), "workers": None, "threads": threads, "quiet": True}
    )
    jobs = [
        (rank, (transcribe, child_args, share, plan.run, rank, plan.formats))
        for rank, share in enumerate(plan.shares)
        if share
    ]
    children: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    interrupted, closed = 0, threading.Event()  # closed: a reader of our output went away
    # SIGTERM (timeout, systemd, scancel) stops the children as Ctrl-C does, not orphans them
    terminating = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if terminating else None
    try:
        for rank, job in jobs:
            child = _start_child(rank, job, threads, lock)
            children.append(child)
            relays += [_relay(child.stdout, sys.stdout, closed),
                       _relay(child.stderr, sys.stderr, closed)]  # fmt: skip
        _follow(children, out, sum(len(s) for s in plan.shares), args.quiet, closed)
    except KeyboardInterrupt:  # the children stop too: what they finished stays written
        interrupted = 130
    except Terminated:
        interrupted = 128 + signal.SIGTERM
    finally:
        if terminating:
            signal.signal(signal.SIGTERM, previous)
        for child in children:
            if child.poll() is None:
                child.terminate()
            child.wait()
        for relay in relays:
            relay.join()
    failures = merge(plan, out)  # what was written, interrupted or not
    if closed.is_set():  # as `| head` ends a command: quietly, what is written kept
        raise BrokenPipeError
    if interrupted:
        print(
            f"asr transcribe: interrupted: the same command transcribes the rest into {out}",
            file=sys.stderr,
        )
        return Outcome(status=interrupted)  # the unfinished are not failures; a re-run lists them
    stopped = [(rank, c.returncode) for (rank, _), c in zip(jobs, children) if c.returncode]
    for rank, code in stopped:
        print(f"asr transcribe: error: worker {rank} exited with status {code}", file=sys.stderr)
    return Outcome(failures, len(plan.inputs) + len(plan.failures), 2 if stopped else 0)


class Terminated(Exception):
    """SIGTERM reached the `--workers` parent."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def _start_child(rank: int, job: tuple, threads: int | None, lock: int) -> subprocess.Popen:
    """`python -m asr.cli.parallel` with its job pickled on stdin, importing this same asr,
    holding the output folder's `lock` (a file descriptor) with its parent."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"  # its lines reach the parent as they are printed
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)  # also for the libraries below PyTorch
    command = [sys.executable, "-m", "asr.cli.parallel", "--rank", str(rank)]
    # Ctrl-C reaches the whole process group, and the parent stops its children itself: they
    # ignore it (inherited, Python leaves it so), else each printed a traceback of its imports
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        pipe = subprocess.PIPE
        child = subprocess.Popen(
            command, stdin=pipe, stdout=pipe, stderr=pipe, env=env, pass_fds=(lock,)
        )
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    assert child.stdin is not None
    child.stdin.write(pickle.dumps(job))
    child.stdin.close()
    return child


def _relay(source: IO[bytes] | None, target: IO[str], closed: threading.Event) -> threading.Thread:
    """A thread copying a child's lines to `target`, above the progress bar. Where `target`
    is a pipe its reader closed, it sets `closed` and drains the rest, so the child never
    blocks on a full pipe."""

    def copy() -> None:
        assert source is not None
        for line in source:
            if closed.is_set():
                continue
            try:
                tqdm.write(line.decode("utf-8", "replace"), file=target, end="")
                target.flush()
            except BrokenPipeError:
                closed.set()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def _follow(
    children: list[subprocess.Popen], out: Path, total: int, quiet: bool, stop: threading.Event
) -> None:
    """Wait for the children (or `stop`), counting the lines their parts grow by as progress."""
    read = {part: part.stat().st_size for part in out.glob(PARTS)}  # earlier runs' lines
    with tqdm(total=total, desc="files", unit="file", disable=quiet) as bar:
        while True:
            running = any(child.poll() is None for child in children)
            for part in out.glob(PARTS):
                with open(part, "rb") as file:
                    file.seek(read.get(part, 0))
                    grown = file.read()
                read[part] = read.get(part, 0) + len(grown)
                bar.update(min(grown.count(b"\n"), total - bar.n))
            if not running or stop.is_set():
                return
            time.sleep(POLL_SECONDS)


def worker_main(stdin: IO[bytes] | None = None) -> int:
    """A `--workers` child: run the job its parent pickled onto stdin.

    Args:
        stdin: where the job is (default: this process's stdin).

    Returns:
        The exit status: 0, or 2 where it stopped short (its error printed).
    """
    transcribe, args, share, run, rank, formats = pickle.load(stdin or sys.stdin.buffer)
    try:
        with warnings_said_by("transcribe"):  # as one process says them
            run_share(transcribe, args, share, run, rank, formats)
    except (ValueError, FileNotFoundError) as error:
        print(f"asr transcribe: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a parent that is not a main thread lets it through
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
