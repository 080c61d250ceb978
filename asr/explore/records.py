"""What `asr evaluate` keeps of each decoded utterance for the explorer: `utterances.jsonl`
(texts, word and token times, n-best, CTC path) and `attention.npz` (every decoder layer and
head's cross-attention, 8 bits), beside its metrics.json. `asr transcribe --explorer` keeps
each input's maps beside its transcript instead, per decoded segment (`<stem>.explore.npz`)."""

from __future__ import annotations

import errno
import json
import math
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from tokenize import TokenError
from typing import TYPE_CHECKING, Any

import numpy as np

from asr.data.manifest import decode_line_of
from asr.files import write_atomically
from asr.writers import file_there

if TYPE_CHECKING:
    from asr.results import Decoded, Transcript

RECORDS = "utterances.jsonl"
ATTENTION = "attention.npz"
LAYOUT = "explore.json"
METRICS = "metrics.json"  # asr evaluate's scores, beside the records
PAGE = "explorer.html"  # the page `asr explore` writes into the folder by default
MAPS_SUFFIX = ".explore.npz"  # beside a transcript's <stem>.json: its segments' maps
# What reading a file that is no whole .npz raises: not a zip (np.load takes it for a pickle:
# ValueError), cut off (EOFError), damaged data (zlib.error), zip flags (RuntimeError) or an
# array's header (TokenError).
NPZ_ERRORS = (zipfile.BadZipFile, ValueError, EOFError, zlib.error, RuntimeError, TokenError)


def quantized_attention(attention: np.ndarray) -> np.ndarray:
    """`(K, L, T)` attention as uint8, each row scaled so that its largest value is 255.

    >>> quantized_attention(np.array([[[0.1, 0.4], [0.0, 0.0]]])).tolist()
    [[[64, 255], [0, 0]]]
    """
    attention = np.asarray(attention, dtype=np.float32)
    peak = attention.max(axis=-1, keepdims=True)
    scaled = np.divide(attention, peak, out=np.zeros_like(attention), where=peak > 0)
    return np.rint(255 * np.clip(scaled, 0, 1)).astype(np.uint8)


def ctc_frames(starts: Iterable[int], ends: Iterable[int], num_frames: int) -> np.ndarray:
    """Per encoder frame the index of the token emitted there, -1 for blank.

    >>> ctc_frames([1, 3], [2, 5], 6).tolist()
    [-1, 0, -1, 1, 1, -1]
    """
    frames = np.full(num_frames, -1, dtype=np.int16)
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        frames[start : max(end, start + 1)] = index
    return frames


@dataclass
class RecordWriter:
    """Collects utterance records and attention maps, then writes them into a decode folder."""

    out_dir: Path
    layout: dict[str, Any]  # decoder layers and heads, timing heads, frame periods
    records: list[dict[str, Any]] = field(default_factory=list)
    maps: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, record: dict[str, Any], attention: np.ndarray | None) -> None:
        if attention is not None and attention.size:
            self.maps[str(len(self.records))] = quantized_attention(attention)
            record = record | {"attention": str(len(self.records))}
        self.records.append(record)

    def write(self, order: Iterable[str] | None = None) -> None:
        """Write the records (in the order of the ids `order`, else as added)."""
        records = self.records
        if order is not None:
            rank = {utt_id: i for i, utt_id in enumerate(order)}
            records = sorted(records, key=lambda r: rank.get(r["id"], len(rank)))
        with open(self.out_dir / RECORDS, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        path = self.out_dir / ATTENTION
        if self.maps:
            np.savez_compressed(path, **self.maps)
        elif path.exists():
            path.unlink()  # a stale file from an earlier decode with attention
        (self.out_dir / PAGE).unlink(missing_ok=True)  # the page of an earlier decode
        write_layout(self.out_dir, self.layout)


def remove_records(out_dir: Path) -> None:
    """Remove an earlier decode's records and page from `out_dir`, for a decode that keeps
    none: they would pass for this one's in `asr explore`."""
    for name in (RECORDS, ATTENTION, LAYOUT, PAGE):
        (out_dir / name).unlink(missing_ok=True)


def loads(text: str) -> Any:
    """JSON `text` with NaN and infinities (which Python's json writes, or a number past a
    double's range as 1e999) read as None: absent, and no number a page's JSON can hold."""
    return json.loads(text, parse_constant=lambda _: None, parse_float=_finite, parse_int=_whole)


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _whole(text: str) -> int | float | None:
    """An integer; past a double's exact ones (as the page reads numbers), a float or None."""
    return int(text) if len(text) < 16 else _finite(text)


def read_records(folder: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of a decode folder, in order; ValueError names the file and line."""
    path = Path(folder) / RECORDS
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            line = decode_line_of(path, number, raw)
            if not line.strip():
                continue
            try:
                record = loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from None
            problem = record_problem(record)
            if problem is not None:
                raise ValueError(f"{path}:{number}: {problem}")
            yield record


# The values of a record (or of its words and tokens) its audio is read, its scores counted
# and its rows drawn by, where given.
_NUMBER, _TEXT = ((int, float), "a number"), (str, "a text")
_VALUES = {"offset": _NUMBER, "duration": _NUMBER, "audio": (str, "a path"), "ref": _TEXT,
           "hyp": _TEXT}  # fmt: skip
_ITEM_VALUES = {"start": _NUMBER, "end": _NUMBER, "confidence": _NUMBER, "probability": _NUMBER,
                "word": _TEXT, "piece": _TEXT}  # fmt: skip


# a record of days of encoder frames: a damaged file, not a decode (and not an array to make)
MOST_CTC_FRAMES = 10**7


def record_problem(record: Any) -> str | None:
    """What keeps the page from reading a record or transcript: its lists' shapes and the
    values its audio, scores and rows are read by, not every value."""
    if not isinstance(record, dict):
        return "not a JSON object"
    problem = _value_problem(record, _VALUES)
    if problem is not None:
        return problem
    for key, needed in (("tokens", "piece"), ("words", None)):
        items = record.get(key, [])
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and (needed is None or needed in item) for item in items
        ):
            return f"{key}: expected a list of objects" + (f" with a {needed!r}" if needed else "")
        for k, item in enumerate(items, start=1):
            problem = _value_problem(item, _ITEM_VALUES)
            if problem is not None:
                return f"{key} {k}: {problem}"
    if "hyp" in record and record["hyp"] is None:  # a reference may be none, a hypothesis not
        return "hyp: expected a text"
    ctc = record.get("ctc")
    if ctc is not None and not (
        isinstance(ctc, dict)
        and _frame(ctc.get("frames"), MOST_CTC_FRAMES)
        and all(isinstance(ctc.get(k), list) for k in ("starts", "ends"))
        and len(ctc["starts"]) == len(ctc["ends"])
        and all(_frame(f, ctc["frames"]) for k in ("starts", "ends") for f in ctc[k])
    ):
        return (
            "ctc: expected 'starts' and 'ends' of one length, frame numbers within a number of "
            f"'frames' (at most {MOST_CTC_FRAMES})"
        )
    return None


def _frame(value: Any, most: int) -> bool:
    """Whether `value` is a whole number in [0, most] (JSON's true and false are none)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _value_problem(
    values: dict[str, Any], kinds: dict[str, tuple[type | tuple, str]]
) -> str | None:
    for key, (kind, wanted) in kinds.items():
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            return f"{key}: expected {wanted}"  # JSON's true and false are no numbers
    return None


def read_layout(folder: str | os.PathLike) -> dict[str, Any]:
    return read_json(Path(folder) / LAYOUT)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a decode folder ({} when absent, NaN as None); ValueError names
    a bad one."""
    if not path.is_file():
        return {}
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def read_attention(folder: str | os.PathLike) -> dict[str, np.ndarray] | None:
    """The attention maps of a decode folder by record key, or None when it has none."""
    path = Path(folder) / ATTENTION
    if not path.is_file():
        return None
    arrays = _npz_arrays(path)
    if arrays is None:
        raise ValueError(f"{path}: not an .npz archive")
    return arrays


def _npz_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """Every array of the .npz archive `path`; None where it is no whole one."""
    try:
        with np.load(path) as archive:
            return {key: archive[key] for key in archive.files}
    except NPZ_ERRORS:
        return None
    except OSError as err:
        if err.errno != errno.EINVAL:  # EINVAL: a damaged zip's offsets seek before its start
            raise
        return None


def write_layout(folder: str | os.PathLike, layout: dict[str, Any]) -> None:
    """`folder/explore.json`, replaced whole: the processes of a spread transcription each
    write it."""
    path = Path(folder) / LAYOUT
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{LAYOUT}.{os.getpid()}")
    scratch.write_text(json.dumps(layout, indent=1) + "\n")
    os.replace(scratch, path)


def segment_maps(transcript: Transcript, decoded: Decoded) -> dict[str, np.ndarray]:
    """A decoded segment's maps, small: its cross-attention `(K, L+1, T)` in 8 bits, its CTC
    path (`ctc_frames`), and its tokens' pieces and `(L, 2)` times from the segment's start
    (the rows of the attention, which the joined transcript may have cut at an overlap)."""
    arrays = {
        "pieces": np.array(transcript.pieces, dtype=str),
        "times": np.array([transcript.token_starts, transcript.token_ends], np.float32).T,
    }
    attention = decoded.hypothesis.attention
    if attention is not None and attention.numel():
        arrays["attention"] = quantized_attention(attention.float().cpu().numpy())
    try:
        ctc = decoded.ctc_path()
        arrays["ctc"] = ctc_frames(ctc.start_frames, ctc.end_frames, ctc.num_frames)
    except ValueError:  # no CTC head, or more tokens than frames
        pass
    return arrays


def write_maps(
    stem: str | os.PathLike, segments: Iterable[tuple[tuple[float, float], dict[str, np.ndarray]]]
) -> None:
    """An input's maps as `<stem>.explore.npz`, whole or not at all: `spans` `(S, 2)` (each
    decoded segment's start and end in the input, seconds, in order) and the `segment_maps`
    of segment k as `<name>_<k>`. Written also where no segment kept a map (spans alone), so
    a re-run of `--explorer` finds the input done."""
    segments = sorted(segments, key=lambda item: item[0][0])
    path = Path(f"{stem}{MAPS_SUFFIX}")
    arrays = {"spans": np.array([span for span, _ in segments], np.float64).reshape(-1, 2)}
    for k, (_, maps) in enumerate(segments):
        arrays |= {f"{name}_{k}": array for name, array in maps.items()}

    def save(partial: Path) -> None:
        with open(partial, "wb") as f:  # a file: to a name, numpy would add .npz
            np.savez_compressed(f, **arrays)

    write_atomically(path, save)


def read_maps(transcript: str | os.PathLike) -> list[dict[str, Any]]:
    """The maps kept beside a transcript `<stem>.json`, one dict per decoded segment in order:
    its `span` and the arrays of `segment_maps` (none kept: empty); ValueError names a file
    that is not such an archive."""
    path = Path(transcript).with_suffix(MAPS_SUFFIX)
    if not file_there(path):
        return []
    arrays = _npz_arrays(path)
    if arrays is None:
        raise ValueError(f"{path.name} is not an .npz archive")
    if "spans" not in arrays:
        raise ValueError(f"{path.name} has no segment spans: `asr transcribe --explorer` again")
    segments = [{"span": tuple(map(float, span))} for span in arrays.pop("spans")]
    for key, array in arrays.items():
        name, _, k = key.rpartition("_")
        if k.isdigit() and int(k) < len(segments):
            segments[int(k)][name] = array
    return segments
