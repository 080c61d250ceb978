"""JSON Lines manifests with NeMo's keys (`audio_filepath`, `duration`, `text`, optional `id`,
`speaker`, `offset`); every line is validated and bad lines are reported, never dropped."""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import logging
import math
import os
import re
import stat
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from asr.audio import AudioError, audio_info, load_audio
from asr.text import json_line, surrogate_problem, unreadable

logger = logging.getLogger(__name__)

REQUIRED_KEYS = ("audio_filepath", "duration", "text")
MAX_LISTED = 20
DURATION_TOLERANCE = 0.1  # seconds a manifest's duration may exceed the audio's length
MIN_DURATION = 0.1  # seconds: shorter utterances are bad lines for training (data.min_duration)


@dataclass(frozen=True)
class Utterance:
    """One manifest line."""

    audio_filepath: str  # absolute once read (relative paths resolve against the manifest)
    duration: float  # seconds of audio used, from `offset`
    text: str
    id: str | None = None  # unique utterance id; `utt_id` derives one when absent
    speaker: str | None = None
    offset: float = 0.0  # start of the segment in the audio file, seconds

    @property
    def utt_id(self) -> str:
        """`id`, or a stable id made of the file's stem and a hash of its path and offset.

        >>> Utterance("/a/an251.wav", 1.0, "YES", id="fash-an251-b").utt_id
        'fash-an251-b'
        >>> Utterance("/a/an251.wav", 1.0, "YES").utt_id.startswith("an251-")
        True
        """
        if self.id is not None:
            return self.id
        key = f"{self.audio_filepath}|{float(self.offset)!r}"
        stem = re.sub(r"[\s\\]+", "_", Path(self.audio_filepath).stem)  # an id is one word
        return f"{stem}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class BadEntry:
    """A problem found at `location` ("file:line", or the file alone)."""

    location: str
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


class ManifestError(ValueError):
    """A manifest with bad lines; `entries` holds every one of them."""

    def __init__(self, entries: Sequence[BadEntry]) -> None:
        self.entries = list(entries)
        super().__init__(format_bad_entries(self.entries))

    def __reduce__(self):  # pickled whole: a worker process hands it back to its parent
        return type(self), (self.entries,)


LISTED = 5  # names a message lists before "and N more"


def some_of(names: Sequence[str]) -> str:
    """The first few names, and how many more (for messages)."""
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def format_bad_entries(entries: Sequence[BadEntry], limit: int = MAX_LISTED) -> str:
    """One entry per line, the first `limit` of them, then how many more there are.

    >>> print(format_bad_entries([BadEntry("m.jsonl:3", "invalid JSON")]))
    m.jsonl:3: invalid JSON
    >>> print(format_bad_entries([BadEntry(f"m.jsonl:{i}", "bad") for i in (1, 2, 3)], limit=2))
    3 bad entries:
      m.jsonl:1: bad
      m.jsonl:2: bad
      ... and 1 more
    """
    if len(entries) == 1:
        return str(entries[0])
    lines = [f"{len(entries)} bad entries:"] + [f"  {entry}" for entry in entries[:limit]]
    if len(entries) > limit:
        lines.append(f"  ... and {len(entries) - limit} more")
    return "\n".join(lines)


class Tokenizer(Protocol):
    """What `validate_manifest` needs of a tokenizer."""

    def oov(self, text: str) -> list[str]: ...

    def encode(self, text: str) -> list[int]: ...


@dataclass
class ValidationReport:
    """Outcome of `validate_manifest`: the usable utterances and every problem found."""

    good: list[Utterance]
    bad: list[BadEntry]
    manifest: str = ""

    @property
    def ok(self) -> bool:
        return not self.bad

    def summary(self) -> str:
        return f"{self.manifest}: {len(self.good)} good, {len(self.bad)} bad"

    def raise_if_bad(self) -> None:
        """Raise a ManifestError listing the problems, if there are any."""
        if self.bad:
            raise ManifestError(self.bad)

    def lines(self) -> list[str]:
        """The summary and every problem, a line each (as `asr validate-data --report` writes)."""
        return [self.summary()] + [str(entry) for entry in self.bad]


def read_manifest(path: str | os.PathLike, skip_bad: bool = False) -> list[Utterance]:
    """Read and validate a manifest; bad lines raise a ManifestError (`skip_bad`: a warning)."""
    numbered, bad = _parse_manifest(Path(path))
    entries = [entry for _, entry in bad]
    if entries and not skip_bad:
        raise ManifestError(entries)
    if entries:
        logger.warning("skipped bad manifest lines: %s", format_bad_entries(entries))
    return [utterance for _, utterance in numbered]


def write_manifest(path: str | os.PathLike, utterances: Iterable[Utterance]) -> None:
    """Write utterances as JSON Lines (UTF-8, one object per line, None fields left out)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8") as file:
            for number, utterance in enumerate(utterances, start=1):
                record = {k: v for k, v in asdict(utterance).items() if v is not None}
                try:
                    file.write(json.dumps(record, ensure_ascii=False) + "\n")
                except UnicodeEncodeError as error:  # a path of other bytes than UTF-8
                    raise ValueError(
                        f"{path}:{number}: not valid UTF-8 ({error.reason}): {ascii(record)}"
                    ) from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, path)  # readers never see a half-written manifest


def validate_manifest(
    path: str | os.PathLike,
    tokenizer: Tokenizer | None = None,
    check_audio: bool | Literal["full"] = True,
    require_text: bool = True,
    min_duration: float = 0.0,
) -> ValidationReport:
    """Check every line, its text and (headers, or with "full" samples) its audio."""
    if check_audio not in (True, False, "full"):
        raise ValueError(f"check_audio must be True, False or 'full', got {check_audio!r}")
    path = Path(path)
    numbered, bad = _parse_manifest(path)
    good = []
    for number, utterance in numbered:
        problems = _text_problems(utterance, tokenizer, require_text)
        if utterance.duration < min_duration:
            problems.append(f"duration {utterance.duration:.3f} s is below {min_duration:g} s")
        if check_audio:
            full = check_audio == "full"
            problems = _audio_problems(utterance, full, min_duration) + problems
        if problems:
            bad.append((number, BadEntry(f"{path}:{number}", "; ".join(problems))))
        else:
            good.append(utterance)
    bad.sort(key=lambda item: item[0])
    return ValidationReport(good, [entry for _, entry in bad], manifest=str(path))


def _parse_manifest(path: Path) -> tuple[list[tuple[int, Utterance]], list[tuple[int, BadEntry]]]:
    """Parse every line: (line number, utterance) for good ones, (line number, entry) for bad."""
    base = Path(as_the_os_reads(os.path.join(os.getcwd(), manifest_base(path))))
    good: list[tuple[int, Utterance]] = []
    bad: list[tuple[int, BadEntry]] = []
    first_line_of: dict[str, int] = {}
    for number, line in manifest_lines(_read_bytes(path)):
        try:
            utterance = _parse_line(line, base)
        except _LineError as error:
            bad.append((number, BadEntry(f"{path}:{number}", str(error))))
            continue
        first = first_line_of.setdefault(utterance.utt_id, number)
        if first != number:
            reason = f"duplicate id {utterance.utt_id!r} (first on line {first})"
            bad.append((number, BadEntry(f"{path}:{number}", reason)))
            continue
        good.append((number, utterance))
    return good, bad


# Manifests read from anonymous pipes (`<(...)`, a piped /dev/stdin), by pipe: such a pipe
# gives its bytes once, and a command that reads its manifest twice (`finalize`,
# `robustness`) found it empty. A named FIFO is read afresh: its writer may send anew.
_PIPED: dict[str, bytes] = {}


def manifest_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of manifest `path`; an anonymous pipe's as it gave them the first time in
    this process. ManifestError where it cannot be read."""
    return _read_bytes(Path(path))


def _read_bytes(path: Path) -> bytes:
    try:
        pipe = os.path.basename(os.path.realpath(path))  # /dev/fd/63: /proc/.../pipe:[1234]
        if not (pipe.startswith("pipe:[") and stat.S_ISFIFO(os.stat(path).st_mode)):
            return path.read_bytes()
        if pipe not in _PIPED:
            _PIPED[pipe] = path.read_bytes()
        return _PIPED[pipe]
    except OSError as error:
        raise ManifestError([BadEntry(str(path), unreadable(error, "manifest"))]) from None


class _LineError(Exception):
    """Why one manifest line is bad."""


def manifest_lines(data: bytes) -> Iterable[tuple[int, bytes]]:
    """(line number, line) of a manifest's non-blank lines, a UTF-8 BOM left out; split as
    bytes (\n, \r\n or \r), since text may hold U+2028 or U+0085 unescaped."""
    data = data.removeprefix(codecs.BOM_UTF8)
    return [(n, line) for n, line in enumerate(data.splitlines(), start=1) if line.strip()]


def decode_line(line: bytes) -> str:
    """A manifest line as text; ValueError naming the first byte that is not UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"not valid UTF-8 (byte 0x{line[error.start]:02x} at column {error.start + 1})"
        raise ValueError(reason) from None


def decode_line_of(path: str | os.PathLike, number: int, line: bytes) -> str:
    """`decode_line` of line `number` of a file, its ValueError naming `path:number`."""
    try:
        return decode_line(line)
    except ValueError as error:
        raise ValueError(f"{path}:{number}: {error}") from None


def _parse_line(line: bytes, base: Path) -> Utterance:
    try:
        text = decode_line(line)
    except ValueError as error:
        raise _LineError(str(error)) from None
    return _utterance_from(_json_record(text), base)


def _json_record(text: str) -> Any:
    try:
        return json_line(text)
    except ValueError as error:
        raise _LineError(str(error)) from None


def manifest_base(path: str | os.PathLike) -> Path:
    """The folder a manifest's relative audio paths name from: its own; for one read through
    /dev or /proc (`<(...)`, /dev/stdin), the file's behind it, or the working folder for a pipe,
    whose /dev/fd is no folder of the user's."""
    path = Path(path)
    if Path(os.path.abspath(path)).parts[1:2] not in (("dev",), ("proc",)):
        return path.parent
    real = Path(os.path.realpath(path))
    return real.parent if real.is_file() else Path()


def as_the_os_reads(path: str | os.PathLike) -> str:
    """`path` normalised to where the OS finds it: a `..` after a link leads out of the link's
    target, not back to the folder of the link, as `os.path.normpath` would have it."""
    path = os.fspath(path)
    folded = os.path.normpath(path)
    if ".." not in Path(path).parts:
        return folded
    folder, name = os.path.split(path)
    real = _real_folder(folder)
    if _real_folder(os.path.dirname(folded)) == real:
        return folded  # spelt as ever where folding leads to the same folder
    return os.path.join(real, name)


@functools.lru_cache(maxsize=4096)  # a manifest's lines share a few folders
def _real_folder(folder: str) -> str:
    return os.path.realpath(folder)


def read_clip(
    line: str, base: str | os.PathLike
) -> tuple[str, float, float | None, dict[str, Any]]:
    """(path, offset, duration or None, all its fields) of a line to transcribe; ValueError
    says what is bad."""
    try:
        record = _json_record(line)
        if not isinstance(record, dict):
            raise _LineError(f"expected a JSON object, got {_json_type(record)}")
        duration = record.get("duration")
        problems = [
            _path_problem(record.get("audio_filepath")),
            _number_problem("offset", record.get("offset", 0.0), allow_zero=True),
            None if duration is None else _number_problem("duration", duration, allow_zero=False),
        ]
    except _LineError as error:
        raise ValueError(str(error)) from None
    problems = [problem for problem in problems if problem]
    if problems:
        raise ValueError("; ".join(problems))
    path = as_the_os_reads(os.path.join(base, record["audio_filepath"]))
    offset = float(record.get("offset", 0.0))
    return path, offset, None if duration is None else float(duration), record


def _utterance_from(record: Any, base: Path) -> Utterance:
    """Check keys and types of one decoded line, collecting every problem."""
    if not isinstance(record, dict):
        raise _LineError(f"expected a JSON object, got {_json_type(record)}")
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise _LineError("missing key(s): " + ", ".join(repr(key) for key in missing))
    problems = [
        _path_problem(record["audio_filepath"]),
        _number_problem("duration", record["duration"], allow_zero=False),
        surrogate_problem(record["text"])
        if isinstance(record["text"], str)
        else _type_problem("text", "a string", record),
        _number_problem("offset", record.get("offset", 0.0), allow_zero=True),
        _label_problem("id", record.get("id")) or _id_problem(record.get("id")),
        _label_problem("speaker", record.get("speaker")),
    ]
    problems = [problem for problem in problems if problem]
    if problems:
        raise _LineError("; ".join(problems))
    return Utterance(
        audio_filepath=as_the_os_reads(os.path.join(base, record["audio_filepath"])),
        duration=float(record["duration"]),
        text=record["text"],
        id=_optional_str(record.get("id")),
        speaker=_optional_str(record.get("speaker")),
        offset=float(record.get("offset", 0.0)),
    )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _path_problem(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    return f"'audio_filepath' must be a non-empty string, got {json.dumps(value)}"


def _number_problem(key: str, value: Any, allow_zero: bool) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key!r} must be a number, got {_json_value(value)}"
    if isinstance(value, int) and not -1e308 < value < 1e308:  # no float holds it
        return f"{key!r} must be finite, got an integer of {len(str(abs(value)))} digits"
    if not math.isfinite(value):
        return f"{key!r} must be finite, got {value}"
    if value < 0 or (value == 0 and not allow_zero):
        return f"{key!r} must be {'>= 0' if allow_zero else '> 0'}, got {value}"
    return None


def _label_problem(key: str, value: Any) -> str | None:
    """ids and speakers: non-empty strings; integers are accepted and become strings."""
    if isinstance(value, str) and value:
        return surrogate_problem(value, key)  # written to shards, reports and file names
    if value is None or type(value) is int:
        return None
    return f"{key!r} must be a non-empty string, got {_json_value(value)}"


LONGEST_ID = 200  # bytes: a file name holds 255, and ids get suffixes (`_heads.png`)


def _id_problem(value: Any) -> str | None:
    """An id names files (alignment plots) and starts Kaldi-format lines (hyp.txt)."""
    if not isinstance(value, str):
        return None
    if any(c.isspace() or c in "/\\" or unicodedata.category(c) == "Cc" for c in value):
        return (
            "'id' must have no spaces, control characters, '/' or '\\' (it names files), got "
            f"{json.dumps(value)}"
        )
    if len(value.encode()) > LONGEST_ID:
        return f"'id' must be at most {LONGEST_ID} bytes long (it names files), got {value[:40]}..."
    return None


def _type_problem(key: str, expected: str, record: dict) -> str:
    return f"{key!r} must be {expected}, got {_json_value(record[key])}"


def _json_value(value: Any) -> str:
    """`string "x"`, `number 3`, `null`: a JSON value with its type, once."""
    return "null" if value is None else f"{_json_type(value)} {json.dumps(value)}"


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _text_problems(
    utterance: Utterance, tokenizer: Tokenizer | None, require_text: bool
) -> list[str]:
    if require_text and not utterance.text.strip():
        return ["empty transcript"]
    unknown = list(dict.fromkeys(tokenizer.oov(utterance.text))) if tokenizer else []
    if unknown:
        return ["outside the tokenizer's vocabulary: " + " ".join(repr(c) for c in unknown)]
    if require_text and tokenizer and not tokenizer.encode(utterance.text):
        return ["no tokens left after the tokenizer's normalisation (an empty target)"]
    return []


def _audio_problems(utterance: Utterance, full: bool, min_duration: float = 0.0) -> list[str]:
    """What is wrong with the audio segment an utterance points at (empty list: nothing), of
    which less than `min_duration` seconds is there."""
    path, offset = utterance.audio_filepath, utterance.offset
    try:
        info = audio_info(path)
    except AudioError as error:
        return [f"audio {error}"]
    if info.num_frames == 0:
        return [f"audio {path}: empty (0 samples)"]
    if offset >= info.duration:
        return [f"offset {offset:.3f} s is beyond the end of audio {path} ({info.duration:.3f} s)"]
    if offset + utterance.duration > info.duration + DURATION_TOLERANCE:
        return [
            f"duration {utterance.duration:.3f} s from offset {offset:.3f} s exceeds "
            f"audio {path} ({info.duration:.3f} s)"
        ]
    # the line may say up to DURATION_TOLERANCE more than the audio holds: what is there counts,
    # in samples (0.7 - 0.6 s is below 0.1 s in floats)
    rate = info.sample_rate
    there = min(round(utterance.duration * rate), info.num_frames - round(offset * rate))
    if there < round(min_duration * rate) <= round(utterance.duration * rate):
        return [
            f"audio {path} holds {there / rate:.3f} s from offset {offset:.3f} s, below "
            f"{min_duration:g} s (its line says {utterance.duration:.3f} s)"
        ]
    if full:
        try:
            wave = load_audio(path, sample_rate=None, offset=offset, duration=utterance.duration)
        except AudioError as error:
            return [f"audio {error}"]
        decoded = len(wave) / info.sample_rate
        if decoded + DURATION_TOLERANCE < utterance.duration:  # a cut file whose header says more
            return [
                f"audio {path} decodes to {decoded:.3f} s from offset {offset:.3f} s, not the "
                f"{utterance.duration:.3f} s its line and header say (cut short?)"
            ]
    return []
