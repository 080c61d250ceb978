"""Gather what the explorer page shows from a decode folder of `asr evaluate`, an output
folder of `asr transcribe`, or a training run folder, and write the page."""

from __future__ import annotations

import base64
import csv
import io
import itertools
import logging
import math
import os
import re
import tempfile
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from asr.audio import AudioError, audio_info, frame_range, load_audio
from asr.explore import MAX_MEGABYTES
from asr.explore.page import build_page
from asr.explore.records import (
    LAYOUT,
    MAPS_SUFFIX,
    METRICS,
    PAGE,
    RECORDS,
    ctc_frames,
    loads,
    read_attention,
    read_json,
    read_layout,
    read_maps,
    read_records,
    record_problem,
)
from asr.metrics import WordAlignment
from asr.text import SPACE_PIECE
from asr.timing import word_index
from asr.writers import file_there, write_text_atomically

log = logging.getLogger(__name__)

MIN_RATE, MAX_RATE = 1000, 768_000  # sample rates a layout may give (Hz)
ENVELOPE_COLUMNS = 1000
MAX_SPECTROGRAM_FRAMES = 6000  # longer audio is pooled in time to this many columns
SPECTROGRAM_RANGE_DB = 80.0
# Lossy WebP keeps a spectrogram within a level or two of 255 in a fraction of its deflated
# bytes: most of a page's weight otherwise. Browsers decode it natively.
SPECTROGRAM_WEBP_QUALITY = 90
WEBP_MAX_SIDE = 16383
MAX_EMBEDDED_SECONDS = 1800.0  # recordings longer than this are linked, where browsers play them
LEFT_OUT = "maps left out"  # the flag of a row past the page's size limit (explorer.js too)
PNG_URI = "data:image/png;base64,"  # an attention plot's, on a training run's page
STDIN = "-"  # the audio of `asr transcribe -`, which keeps no copy of it
STDIN_NOTE = "audio from standard input: not kept"
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
OPUS_BITRATE = 24000
# What browsers play from a link; other files (e.g. NIST SPHERE) are embedded as Opus.
PLAYABLE = {".wav", ".ogg", ".oga", ".opus", ".mp3", ".flac", ".m4a", ".webm", ".weba", ".mp4"}
SUMMARY_KEYS = ("wer", "cer", "substitutions", "deletions", "insertions", "reference_words",
                "utterances", "sentence_errors")  # fmt: skip
CURVES = ("train/loss_epoch", "val/loss", "val/att_loss", "val/ctc_loss", "val/acc", "val/wer",
          "val/cer")  # fmt: skip


def folder_kind(folder: Path) -> str:
    """The kind of `folder`: decode, transcribe or training; ValueError lists what each holds."""
    if (folder / RECORDS).is_file() or "wer" in read_json(folder / METRICS):
        return "decode"  # metrics.json alone: an `asr evaluate` that kept no records
    if _run_logs(folder, quiet=True):  # warned of where the page is built
        return "training"
    damaged = []
    for path in folder.rglob("*.json"):
        try:
            _read_transcript(path)
        except _NotTranscript:
            continue
        except ValueError as err:
            damaged.append(f"{path}: {err}")
            continue
        return "transcribe"
    raise ValueError(
        f"{folder}: not a decode folder (utterances.jsonl of `asr evaluate`), a transcription "
        "folder (<name>.json of `asr transcribe --output-dir`) or a training run (metrics.csv)"
        + "".join(f"; {line}" for line in sorted(damaged)[:1])
    )


def explore(
    folder: str | os.PathLike,
    out: str | os.PathLike | None = None,
    link_audio: bool = False,
    progress: bool = True,
    max_mb: float | None = MAX_MEGABYTES,
    compare: str | os.PathLike | None = None,
) -> Path:
    """Write the explorer page of `folder` (default `folder/explorer.html`); returns its path.

    Args:
        folder: a decode folder of `asr evaluate`, an output folder of `asr transcribe`, or a
            training run folder (its `default_root_dir`, or a `logs/version_N` inside).
        out: the HTML file to write.
        link_audio: link the audio files by relative path instead of embedding them as Opus,
            where a browser plays their format.
        progress: show a progress bar.
        max_mb: megabytes of pictures, maps and embedded audio the page may hold (0 or None:
            no limit). They are kept for the worst utterances first (by WER, with `compare`
            the higher of the two), else in order; rows past the limit keep their text and a
            link to their audio, flagged `LEFT_OUT`. A training run's page keeps the attention
            plots of as many epochs as fit, spread evenly from the first to the last.
        compare: another decode folder of the same utterances (B), shown beside this one (A):
            its WER and CER, each utterance's WER and hypothesis against the reference, and
            the difference with a paired bootstrap interval.

    Raises:
        ValueError: `folder` is none of the three, or its records cannot be read, `max_mb` is
            negative, `out` cannot be written, or `compare` is given and either folder is not a
            decode folder.
    """
    folder = Path(folder)
    _check_folder(
        folder,
        str(folder),
        "a decode folder of `asr evaluate`, an output folder of `asr transcribe --output-dir` or "
        "a training run folder",
    )
    if max_mb is not None and not max_mb >= 0:
        raise ValueError(f"--max-mb is megabytes, 0 for no limit: got {max_mb}")
    out = Path(out) if out is not None else folder / PAGE
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; name the HTML file to write")
    if out.exists() and out.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--out {out} exists and is not an HTML page: it is left as it is")
    kind = folder_kind(folder)
    _check_writable(out, given=out != folder / PAGE)
    other = Path(compare) if compare is not None else None
    if other is not None:
        _check_folder(other, f"--compare {other}", "a decode folder of `asr evaluate`")
    if other is not None and not (kind == "decode" and _is_decode(other)):
        raise ValueError(f"to compare, {folder} and {other} must both be decode folders")
    for side in (folder, other) if other is not None else ():
        if not (side / RECORDS).is_file():
            raise ValueError(
                f"{side}: no {RECORDS} (an `asr evaluate` that kept no records) to compare"
            )
    gather = {
        "decode": partial(decode_data, compare=other),
        "transcribe": transcribe_data,
        "training": training_data,
    }
    data = gather[kind](folder, _Media(out.parent, link_audio, _Budget(max_mb)), progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # a full disk or a Ctrl-C leaves the earlier page whole, not half of this one
        write_text_atomically(out, build_page(data))
    except OSError as err:
        raise ValueError(f"{out}: cannot write the page ({err.strerror or err})") from None
    return out


def _check_folder(folder: Path, named: str, wanted: str) -> None:
    """ValueError where `folder` (`named` so in it) is a file (it asks for `wanted`) or absent."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{named} is a file, not a folder: give {wanted}")
    if not folder.is_dir():
        raise ValueError(f"{named}: no such folder")


def _check_writable(out: Path, given: bool = True) -> None:
    """ValueError, before the page is built, where `out` (`given` as --out, else the folder's
    own page) cannot be written: a page there takes no writing, or its nearest existing folder
    is a file or takes no new file."""
    named, hint = (f"--out {out}", "") if given else (str(out), ": give --out elsewhere")
    if out.is_file():  # written over in place
        try:
            with open(out, "ab"):
                pass
        except OSError as err:
            raise ValueError(f"{named}: cannot write it ({err.strerror}){hint}") from None
        return
    here = next(p for p in (out.parent, *out.parent.parents) if p.exists() or p == p.parent)
    if not here.is_dir():
        raise ValueError(f"{named}: {here} is a file, not a folder")
    try:  # as the page will be written: permissions alone miss read-only places, even as root
        with tempfile.NamedTemporaryFile(dir=here, prefix=".explorer-", suffix=".html"):
            pass
    except OSError as err:
        raise ValueError(f"{named}: cannot write in {here} ({err.strerror}){hint}") from None


def _is_decode(folder: Path) -> bool:
    try:
        return folder_kind(folder) == "decode"
    except ValueError:
        return False


def _compared(
    utterances: list[dict[str, Any]], folder: Path, other: Path
) -> tuple[dict[str, Any], list[str]]:
    """`other`'s decode of the same utterances (B) beside `folder`'s (A): each utterance's
    `compare` set (B's hypothesis and its scores against B's reference, as its metrics.json
    has them, else A's; None where B lacks the utterance); returns the page's `compare` (both
    names, B's summary, how many utterances have fewer or more word errors in B, and WER(B) -
    WER(A) with its 95 % interval) and notes on the utterances either lacks or on references
    that differ."""
    from asr.metrics import wer_difference_interval

    theirs = {str(r.get("id", "")): r for r in read_records(other)}
    both, own_refs, words, words_b, errors_a, errors_b = 0, 0, [], [], [], []
    for utterance in utterances:
        record = theirs.get(utterance["id"])
        if record is None:
            utterance["compare"] = None
            continue
        hyp, ref = record.get("hyp", ""), record.get("ref")
        if ref is None:  # B kept no reference: A's is the utterance's
            ref = utterance["ref"]
        elif utterance["ref"] is not None and ref != utterance["ref"]:
            own_refs += 1  # B's model normalises text otherwise: its metrics.json scored this
        scores = _scores(ref, hyp)
        utterance["compare"] = {"hyp": hyp, **{k: scores[k] for k in ("wer", "errors", "ops")}}
        both += 1
        if utterance["errors"] is not None:
            words.append(len(utterance["ref_words"]))
            words_b.append(len(scores["ref_words"]))
            errors_a.append(sum(utterance["errors"].values()))
            errors_b.append(sum(scores["errors"].values()))
    a, b = np.asarray(errors_a, dtype=int), np.asarray(errors_b, dtype=int)
    scored = sum(words) > 0 and sum(words_b) > 0  # no rate over no reference words
    # each decode's WER over its own references' words
    difference = 100 * (b.sum() / max(sum(words_b), 1) - a.sum() / max(sum(words), 1))
    interval = wer_difference_interval(words, a, b, words_b=words_b) if scored else (math.nan,)
    ours = {u["id"] for u in utterances}
    missing = [(len(ours) - both, f"of {len(ours)} utterances not in {other}"),
               (len(set(theirs) - ours), f"utterances of {other} not in this decode")]  # fmt: skip
    apart = any(count for count, _ in missing)  # B - A is over the utterances both hold
    missing.append((own_refs, f"utterances with another reference in {other}, scored by it"))
    notes = [f"{count} {what}" for count, what in missing if count]
    compare = {
        "title_a": "/".join(folder.resolve().parts[-2:]),  # e.g. the model's folder and split
        "title": "/".join(other.resolve().parts[-2:]),
        "summary": _summary(other),
        "fewer_errors": int((b < a).sum()),
        "more_errors": int((b > a).sum()),
        "same_errors": int((b == a).sum()),
        "wer_difference": round(float(difference), 2) if scored else None,
        "shared": both if apart else None,  # the utterances B - A is over, where sets differ
        "interval": [round(x, 2) for x in interval] if math.isfinite(sum(interval)) else None,
    }
    return compare, notes


def _summary(folder: Path) -> dict[str, Any] | None:
    """The WER, CER and counts in a decode folder's metrics.json, if any."""
    metrics = read_json(folder / METRICS)
    return {k: metrics[k] for k in SUMMARY_KEYS if k in metrics} or None


def decode_data(
    folder: Path, media: _Media, progress: bool, compare: Path | None = None
) -> dict[str, Any]:
    """A row per decoded utterance, its arrays for the worst first (by its WER, or B's where
    `compare` names another decode of them, B, and that is higher) while the page has room."""
    notes: list[str] = []
    summary = _summary(folder)
    failures = read_json(folder / METRICS).get("failures")
    if isinstance(failures, list) and failures:  # not in the records: the page says so
        shown = "; ".join(map(str, failures[:3])) + ("; ..." if len(failures) > 3 else "")
        notes.append(f"{len(failures)} manifest line(s) not scored (metrics.json): {shown}")
    if not (folder / RECORDS).is_file():
        notes.append("no utterances.jsonl: decoded by an `asr evaluate` that kept no records")
        return _page("decode", folder, notes, summary, [])
    layout = read_layout(folder)
    maps = read_attention(folder)
    records = list(read_records(folder))
    if maps is None and records:
        notes.append("no attention saved (a CTC-only model, or the ONNX backend)")
    media.sample_rate = _sample_rate(layout, folder)
    utterances = [_decode_fields(r, layout) for r in records]
    compared = None
    if compare is not None:
        compared, missing = _compared(utterances, folder, compare)
        notes += missing

    def worst(u: dict[str, Any]) -> float:
        return max(_worst_wer(u), _worst_wer(u.get("compare") or {}))

    worst_first = sorted(range(len(records)), key=lambda i: -worst(utterances[i]))
    recordings: dict[str, float | None] = {}
    for i in _bar(worst_first, progress, "explore"):
        record = records[i]
        where = (record.get("audio"), record.get("offset", 0.0), record.get("duration"))
        arrays = partial(_record_arrays, record, maps, layout)  # read only if the page has room
        recording = partial(_recording_seconds, *where, recordings)
        utterances[i] |= media.row(*where, arrays, utterances[i]["flags"], recording)
    notes += media.notes(utterances, "utterances", "the worst utterances")
    return _page("decode", folder, notes, summary, utterances) | {"compare": compared}


def _recording_seconds(
    path: str | None, offset: float, duration: float | None, known: dict[str, float | None]
) -> float | None:
    """The length of the recording a record is a stretch of, from its header (once per file:
    `known`); None for a record that names no stretch (no offset, no duration), or a header
    that cannot be read (its row then says why)."""
    if not path or (not offset and duration is None):
        return None
    if not Path(path).is_file():  # a pipe would block the read; a file gone: its row says so
        return None
    if path not in known:
        try:
            known[path] = audio_info(path).duration
        except (AudioError, OSError):
            known[path] = None
    return known[path]


def _decode_fields(record: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """An utterance's row but its audio and arrays."""
    ref, hyp = record.get("ref"), record.get("hyp", "")
    words = [_word(w) for w in record.get("words", [])]
    utterance = (
        {
            "id": str(record.get("id", "")),
            "speaker": record.get("speaker"),
            "duration": record.get("duration"),
            "ref": ref,
            "hyp": hyp,
            "words": words,
            "nbest": record.get("nbest", []),
            "flags": _flags(record),
            "confidence": _mean_confidence(words),
        }
        | _alignment_fields(record.get("tokens", []), layout)
        | _scores(ref, hyp)
    )
    return utterance


def _record_arrays(
    record: dict[str, Any], maps: dict[str, np.ndarray] | None, layout: dict[str, Any]
) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """A decoded utterance's cross-attention and CTC path arrays."""
    key, ctc = record.get("attention"), record.get("ctc")
    return _map_arrays(
        maps[key] if maps is not None and key in maps else None,
        ctc_frames(ctc["starts"], ctc["ends"], ctc["frames"]) if ctc else None,
        layout,
    )


def _alignment_fields(tokens: list[dict[str, Any]], layout: dict[str, Any]) -> dict[str, Any]:
    """An utterance's token times and how its attention maps split by layer and head."""
    return {
        "tokens": [
            {"piece": t["piece"], "start": t.get("start"), "end": t.get("end")} for t in tokens
        ],
        "timing_heads": layout.get("timing_heads"),
        "layers": layout.get("layers"),
        "heads": layout.get("heads"),
        "attention_kind": layout.get("attention"),
    }


def _map_arrays(
    attention: np.ndarray | None, ctc: np.ndarray | None, layout: dict[str, Any]
) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """The cross-attention and CTC path arrays of an utterance, on encoder frames."""
    per_frame = {"seconds": layout.get("frame_seconds")}
    named = {"attention": attention, "ctc": ctc}
    return {name: (array, per_frame) for name, array in named.items() if array is not None}


def transcribe_data(folder: Path, media: _Media, progress: bool) -> dict[str, Any]:
    """One row per transcript `<name>.json`, or per segment (`<name>#k`) of one decoded in
    several, no reference; attention and the CTC path where `asr transcribe --explorer` kept
    them (`<name>.explore.npz`)."""
    notes = ["transcripts without references: no WER"]
    layout = read_layout(folder)
    if _is_transcript(layout):  # the transcript of an input named explore.wav, no layout
        layout = {}
    media.sample_rate = _sample_rate(layout, folder)
    utterances: list[dict[str, Any]] = []
    without_maps = 0
    for path in _bar(sorted(folder.rglob("*.json")), progress, "explore"):
        name = path.relative_to(folder).with_suffix("").as_posix()
        try:
            transcript = _read_transcript(path)
        except ValueError as err:
            if path != folder / LAYOUT:
                notes.append(f"{path.relative_to(folder).as_posix()}: skipped, {err}")
            continue
        # no maps file: transcribed without --explorer (with it, an empty one keeps none)
        kept = file_there(path.with_suffix(MAPS_SUFFIX))
        try:
            maps = read_maps(path)
        except (OSError, ValueError) as err:
            notes.append(f"{name}: its attention is not readable ({err})")
            maps, kept = [], False
        source = transcript.get("audio") or ""
        # absolute, or relative to where `asr transcribe` ran (else to this folder)
        audio_path = source
        if source not in ("", STDIN) and not Path(source).exists():
            audio_path = str(folder / source)
        start = transcript.get("offset") or 0.0  # a manifest line's, where its times start
        rows = _transcript_rows(name, transcript, maps)
        without_maps += 0 if kept else len(rows)
        for row in rows:
            at = start + row.offset  # in the file
            fields = row.fields | {"start": round(at, 3) if row.segment else None}
            fields |= _alignment_fields(row.tokens, layout)
            arrays = partial(_map_arrays, row.maps.get("attention"), row.maps.get("ctc"), layout)
            where = (audio_path, at, row.duration)
            fields |= media.row(*where, arrays, fields["flags"], transcript.get("duration"))
            utterances.append(fields)
    if without_maps:
        notes.append(
            f"{without_maps} of {len(utterances)} transcripts or segments without attention: "
            "`asr transcribe --explorer` keeps it"
        )
    notes += media.notes(utterances, "transcripts or segments", "the first ones")
    return _page("transcribe", folder, notes, None, utterances)


@dataclass
class _Row:
    """A row of a transcription folder's page: a transcript, or one segment of it."""

    fields: dict[str, Any]
    tokens: list[dict[str, Any]]  # times from `offset`
    offset: float  # where its audio starts in the input (seconds)
    duration: float | None
    maps: dict[str, Any]  # its `segment_maps` (`asr.explore.records`), or none
    segment: bool = True  # one of several rows of its transcript, or one on part of it


def _transcript_rows(
    name: str, transcript: dict[str, Any], maps: list[dict[str, Any]]
) -> list[_Row]:
    """The rows of a transcript: itself where it is one segment, else one per segment, each on
    its decoded span's audio (its maps' span where kept, else its own bounds), its tokens those
    its maps hold (the attention's rows) or else the transcript's within its bounds."""
    segments = transcript.get("segments") or []
    words = [_word(w) for w in transcript.get("words", [])]
    tokens = transcript.get("tokens", [])
    if len(segments) <= 1 and all(m["span"][0] == 0 for m in maps):
        kept = maps[0] if len(maps) == 1 else {}
        duration = transcript.get("duration")
        whole = segments[0] if segments else {}
        fields = _transcript_fields(name, duration, transcript.get("text", ""), words, whole)
        return [_Row(fields, tokens, 0.0, duration, kept, segment=False)]
    rows = []
    width = len(str(len(segments)))
    counted = _counted_out(segments, words, tokens)
    for k, segment in enumerate(segments):
        low, high = segment["start"], segment["end"]
        # the map most over it, and of two (windows overlap) the one closest to its bounds
        kept = max(maps, key=lambda m: _fit(m["span"], (low, high)), default={})
        if kept and _overlap(kept["span"], (low, high)) <= 0:
            kept = {}
        start, end = kept["span"] if kept else (low, high)
        if kept and "pieces" in kept:
            own = [
                {"piece": str(piece), "start": float(a), "end": float(b)}
                for piece, (a, b) in zip(kept["pieces"], kept["times"])
            ]
        else:
            mine = counted[1][k] if counted else [t for t in tokens if _within(t, low, high)]
            own = _unpadded([_shifted(t, start) for t in mine])
        mine = counted[0][k] if counted else [w for w in words if _within(w, low, high)]
        inside = [_shifted(w, start) for w in mine]
        row_id = f"{name}#{k + 1:0{width}d}"
        fields = _transcript_fields(row_id, end - start, segment.get("text", ""), inside, segment)
        rows.append(_Row(fields, own, start, end - start, kept))
    return rows


def _transcript_fields(
    utt_id: str,
    duration: float | None,
    text: str,
    words: list[dict[str, Any]],
    segment: dict[str, Any],
) -> dict[str, Any]:
    """A row's fields but its tokens and audio: `text` and `words`, the score, alternatives
    and repair of `segment` (the transcript's one segment, if any, for a whole transcript)."""
    flags = [f"repaired: {segment['repaired']}"] if segment.get("repaired") else []
    alternatives = [
        {"text": a.get("text", ""), "score": a.get("score")}
        for a in segment.get("alternatives", [])
    ]
    return {
        "id": utt_id,
        "speaker": None,
        "duration": duration,
        "ref": None,
        "hyp": text,
        "words": words,
        "nbest": [{"text": text, "score": segment.get("score")}, *alternatives] if segment else [],
        "flags": flags + ([] if text else ["empty"]),
        "confidence": _mean_confidence(words),
        "wer": None,
        "errors": None,
        "ops": None,
        "ref_words": None,
    }


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def _fit(span: tuple[float, float], segment: tuple[float, float]) -> tuple[float, float]:
    """How well a map's span fits a segment: their overlap, then its share of their union."""
    overlap = _overlap(span, segment)
    union = max(span[1], segment[1]) - min(span[0], segment[0])
    return overlap, overlap / union if union > 0 else 0.0


def _counted_out(
    segments: list[dict[str, Any]], words: list[dict[str, Any]], tokens: list[dict[str, Any]]
) -> tuple[list[list], list[list]] | None:
    """Each segment's words and tokens, counted out by the words of its text: a transcript's
    are its segments' in order, which times held to touching segments' bounds cannot part (a
    last token at the end of one, a first at the start of the next). A space goes with the
    word before it, a token of no word (`<unk>`) with the word it follows, or else with the
    segment its time lies in. None where the counts disagree (a transcript made otherwise)."""
    counts = [len(str(segment.get("text") or "").split()) for segment in segments]
    index = word_index([str(t.get("piece", "")) for t in tokens])
    spelt = max((w for w in index if w is not None), default=-1) + 1
    if sum(counts) != len(words) or (tokens and spelt != len(words)):
        return None
    row_of = [k for k, n in enumerate(counts) for _ in range(n)]
    first = list(itertools.accumulate(counts, initial=0))
    token_rows: list[list] = [[] for _ in segments]
    bounds = [(segment["start"], segment["end"]) for segment in segments]
    row, worded = 0, False  # worded: the token before is of a word
    for token, word in zip(tokens, index):
        if word is not None:
            row = row_of[word]
        elif token.get("piece") != SPACE_PIECE and not worded:  # else of the word before
            row = next((k for k, b in enumerate(bounds) if _within(token, *b)), row)
        token_rows[row].append(token)
        worded = word is not None or (worded and token.get("piece") != SPACE_PIECE)
    return [words[first[k] : first[k + 1]] for k in range(len(segments))], token_rows


def _within(item: dict[str, Any], low: float, high: float) -> bool:
    """Whether a word or token (times in the input) lies in [low, high) by its midpoint."""
    start, end = item.get("start"), item.get("end")
    return start is not None and end is not None and low <= (start + end) / 2 < high


def _unpadded(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row's tokens without spaces at its edges (the space put between two segments')."""
    spoken = [k for k, t in enumerate(tokens) if t["piece"] != SPACE_PIECE]
    return tokens[spoken[0] : spoken[-1] + 1] if spoken else []


def _shifted(item: dict[str, Any], offset: float) -> dict[str, Any]:
    """A word or token with its times from `offset`."""
    return item | {
        key: round(item[key] - offset, 3) for key in ("start", "end") if item.get(key) is not None
    }


def training_data(folder: Path, media: _Media, progress: bool) -> dict[str, Any]:
    """Curves by epoch from metrics.csv, and the attention plots of each epoch (of as many
    epochs as the page has room for), from every version of the run's logs."""
    logs = _run_logs(folder)
    notes: list[str] = []
    plots: dict[str, dict[int, Path]] = defaultdict(dict)  # by epoch: a resumed run's replace
    for version in logs:
        for png in sorted(version.glob("attention/epoch*_*.png")):
            match = re.fullmatch(r"epoch(\d+)_(.+)", png.stem)
            if match and not match.group(2).endswith("_heads"):
                plots[match.group(2)][int(match.group(1))] = png
    if not plots:
        notes.append(f"no attention plots in {', '.join(str(v / 'attention') for v in logs)}")
    kept, left_out = _epochs_within(plots, media.budget)
    notes += left_out
    training = {
        "curves": _curves([version / "metrics.csv" for version in logs]),
        "plots": [
            {"utterance": u, "epochs": [_plot(e, by_epoch[e]) for e in kept if e in by_epoch]}
            for u, by_epoch in sorted(plots.items())
        ],
    }
    return _page("training", folder, notes, None, []) | {"training": training}


def _epochs_within(
    plots: dict[str, dict[int, Path]], budget: _Budget
) -> tuple[list[int], list[str]]:
    """The epochs whose plots the page keeps: all where `budget` holds them, else as many as
    it holds spread evenly over the run (the first and last always); and a note on the rest."""
    size: dict[int, int] = defaultdict(int)  # an epoch's plots as the page's data URIs
    for by_epoch in plots.values():
        for epoch, png in by_epoch.items():
            size[epoch] += len(PNG_URI) + 4 * -(-png.stat().st_size // 3)
    epochs, total = sorted(size), sum(size.values())
    if len(epochs) <= 2 or total <= budget.left:
        budget.left -= total
        return epochs, []
    fits, over = 2, len(epochs)  # `over` epochs' plots do not fit; 2 are kept whatever they take
    while over - fits > 1:
        middle = (fits + over) // 2
        if sum(size[e] for e in _spread(epochs, middle)) <= budget.left:
            fits = middle
        else:
            over = middle
    kept = _spread(epochs, fits)
    budget.left -= sum(size[e] for e in kept)
    return kept, [
        f"{len(epochs) - len(kept)} of {len(epochs)} epochs' attention plots left out: the page "
        f"keeps those of {len(kept)} epochs spread evenly from the first to the last, up to "
        f"{budget.megabytes:g} MB (`asr explore FOLDER --max-mb {math.ceil(total / 1e6)}`, or "
        "0: for all)"
    ]


def _spread(items: list[int], count: int) -> list[int]:
    """`count` (at least 2) of `items`, evenly spread from the first to the last.

    >>> _spread([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    [0, 3, 6, 9]
    """
    return [items[i] for i in np.linspace(0, len(items) - 1, count).round().astype(int)]


def _plot(epoch: int, png: Path) -> dict[str, Any]:
    return {"epoch": epoch, "image": PNG_URI + base64.b64encode(png.read_bytes()).decode()}


def _page(
    kind: str, folder: Path, notes: list[str], summary: dict | None, utterances: list[dict]
) -> dict[str, Any]:
    return {
        "title": f"asr explore: {folder.resolve().name}",
        "kind": kind,
        "notes": notes,
        "summary": summary,
        "utterances": utterances,
        "training": None,
        "compare": None,
    }


def _bar(items: list, progress: bool, desc: str) -> Iterable:
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="utt", disable=not progress or len(items) < 20)


def _word(word: dict[str, Any]) -> dict[str, Any]:
    confidence = word.get("confidence")
    return {
        "w": word.get("word", ""),
        "start": word.get("start"),
        "end": word.get("end"),
        "conf": confidence if confidence is not None else word.get("probability"),
    }


def _mean_confidence(words: list[dict[str, Any]]) -> float | None:
    values = [w["conf"] for w in words if w["conf"] is not None]
    return round(sum(values) / len(values), 4) if values else None


def _flags(record: dict[str, Any]) -> list[str]:
    flags = [f"repaired: {record['repaired']}"] if record.get("repaired") else []
    if record.get("finished") is False:
        flags.append("length-bounded")
    if not record.get("hyp"):
        flags.append("empty")
    return flags


def _worst_wer(scores: dict[str, Any]) -> float:
    """Scores' WER for the order of maps: words said against an empty reference go first."""
    if scores.get("wer") is None:
        return math.inf if any((scores.get("errors") or {}).values()) else 0.0
    return scores["wer"]


def _scores(ref: str | None, hyp: str) -> dict[str, Any]:
    """Per-utterance WER, S/D/I and the word alignment ops for the page."""
    if ref is None:
        return {"wer": None, "errors": None, "ops": None, "ref_words": None}
    alignment = WordAlignment.of(ref, hyp)
    ops: list[list[Any]] = []
    kinds = {"equal": "C", "substitute": "S", "delete": "D", "insert": "I"}
    for chunk in alignment.chunks:
        refs = range(chunk.ref_start_idx, chunk.ref_end_idx)
        hyps = range(chunk.hyp_start_idx, chunk.hyp_end_idx)
        kind = kinds[chunk.type]
        if kind == "D":
            ops += [["D", alignment.ref[r], None] for r in refs]
        elif kind == "I":
            ops += [["I", None, h] for h in hyps]
        else:
            ops += [[kind, alignment.ref[r], h] for r, h in zip(refs, hyps)]
    errors = alignment.errors
    return {
        "wer": round(100 * errors.rate, 2) if math.isfinite(errors.rate) else None,
        "errors": {"sub": errors.substitutions, "del": errors.deletions, "ins": errors.insertions},
        "ops": ops,
        "ref_words": [{"w": w, "start": None, "end": None} for w in alignment.ref],
    }


def _pack(arrays: dict[str, tuple[np.ndarray | _Picture, dict[str, Any]]]) -> dict[str, Any]:
    """The arrays as one deflated, base64 blob and their offsets (uint8 or little-endian int16;
    a picture: its WebP file, of `bytes` bytes)."""
    if not arrays:
        return {"blob": None, "arrays": {}}
    chunks, index, offset = [], {}, 0
    for name, (array, extra) in arrays.items():
        if isinstance(array, _Picture):
            raw, shape, dtype = array.data, array.shape, "uint8"
            extra = extra | {"encoding": "webp", "bytes": len(raw)}
        else:
            dtype = "int16" if array.dtype == np.int16 else "uint8"
            raw = np.ascontiguousarray(array, "<i2" if dtype == "int16" else np.uint8).tobytes()
            shape = array.shape
        index[name] = {"offset": offset, "shape": list(shape), "dtype": dtype} | extra
        chunks.append(raw)
        offset += len(raw) + (-len(raw)) % 2  # int16 views need even offsets
        chunks.append(b"\0" * ((-len(raw)) % 2))
    blob = base64.b64encode(zlib.compress(b"".join(chunks), 6)).decode("ascii")
    return {"blob": blob, "arrays": index}


@dataclass
class _Audio:
    """An utterance's audio on the page: its src (data URI or link), why there is none, and
    the arrays drawn from it."""

    src: str | None = None
    note: str | None = None
    arrays: dict[str, tuple[np.ndarray | _Picture, dict[str, Any]]] = field(default_factory=dict)
    offset: float = 0.0  # where the utterance starts in a linked file, for the player's clock

    def fields(self) -> dict[str, Any]:
        return {"audio": self.src, "audio_note": self.note, "audio_offset": self.offset}


class _Budget:
    """The bytes of pictures, maps and embedded audio a page may still take."""

    def __init__(self, megabytes: float | None) -> None:
        self.megabytes = megabytes or None
        self.left = megabytes * 1e6 if megabytes else math.inf

    def room(self) -> bool:
        """Whether the next row may embed its own."""
        return self.left > 0

    def spend(self, row: dict[str, Any]) -> dict[str, Any]:
        """`row`, its blob and embedded audio taken from what is left."""
        audio = row.get("audio") or ""
        self.left -= len(row.get("blob") or "") + (len(audio) if audio.startswith("data:") else 0)
        return row


class _Media:
    """Audio for the page: embedded as Opus or linked, with its envelope and log-mel picture
    (read at `sample_rate`, which the folder's layout sets), while `budget` lasts."""

    def __init__(self, page_dir: Path, link: bool, budget: _Budget) -> None:
        self.page_dir, self.link, self.budget = page_dir, link, budget
        self.sample_rate = 16000
        self.missing: dict[str, None] = {}  # each file once, however many rows it has
        self.unread: dict[str, None] = {}  # stretches of files that read, as "path (why)"
        self._mel = None

    def row(
        self,
        path: str | None,
        offset: float,
        duration: float | None,
        arrays: Callable[[], dict[str, tuple[np.ndarray, dict[str, Any]]]],
        flags: list[str],
        recording: float | Callable[[], float | None] | None = None,
    ) -> dict[str, Any]:
        """A row's audio fields and blob: its audio (see `add`), its pictures and `arrays()`;
        past the budget, a link to its audio alone and `flags` with `LEFT_OUT`."""
        if not self.budget.room():
            return self.link_only(path, offset).fields() | _pack({}) | {"flags": [*flags, LEFT_OUT]}
        audio = self.add(path, offset, duration, recording)
        return self.budget.spend(audio.fields() | _pack(arrays() | audio.arrays))

    def link_only(self, path: str | None, offset: float) -> _Audio:
        """A link to the audio, where a browser plays it, without reading it."""
        if not path or path == STDIN:
            return _Audio(note=STDIN_NOTE if path == STDIN else "no audio file recorded")
        if not Path(path).is_file():
            self.missing[path] = None
            return _Audio(note=f"audio not found: {path}")
        return self._linked(path, offset, {})

    def add(
        self,
        path: str | None,
        offset: float,
        duration: float | None,
        recording: float | Callable[[], float | None] | None = None,
    ) -> _Audio:
        """The audio of `path` from `offset` for `duration` (to its end if None), part of a
        recording `recording` seconds long (the same stretch if None; a callable: read only
        where needed)."""
        if not path or path == STDIN:
            return _Audio(note=STDIN_NOTE if path == STDIN else "no audio file recorded")
        if Path(path).exists() and not Path(path).is_file():  # a pipe of the folder's maker
            self.missing[path] = None
            return _Audio(note=f"audio not a regular file: {path}")
        try:
            wave = load_audio(path, self.sample_rate, offset or 0.0, duration).numpy()
        except (AudioError, OSError) as err:
            return self._unread(path, offset or 0.0, duration, err)
        arrays = {"envelope": (_envelope(wave), {})}
        arrays["spectrogram"] = self._spectrogram(wave)
        seconds = len(wave) / self.sample_rate
        long = seconds > MAX_EMBEDDED_SECONDS
        if not long:  # read (a header, from a callable) only where the stretch can be embedded
            whole = recording() if callable(recording) else recording
            long = (whole or 0.0) > MAX_EMBEDDED_SECONDS
        # Audio in a format no browser plays is embedded, unless it is too long to embed.
        if (self.link or long) and (_playable(path) or seconds > MAX_EMBEDDED_SECONDS):
            return self._linked(path, offset, arrays)
        return _Audio(src=_opus_uri(wave, self.sample_rate), arrays=arrays)

    def _unread(self, path: str, offset: float, duration: float | None, err: Exception) -> _Audio:
        """The note of a row whose audio could not be read, its file or stretch kept for the
        page's notes: a stretch past the end of a file that reads is not a missing file."""
        outside = _outside(path, offset, duration)
        if outside is None:
            self.missing[path] = None
            return _Audio(note=f"audio not found or unreadable: {path} ({err})")
        self.unread[f"{path} ({outside})"] = None
        return _Audio(note=f"audio stretch not readable: {path} ({outside})")

    def _linked(self, path: str, offset: float, arrays) -> _Audio:
        if not _playable(path):
            return _Audio(note=f"{path}: a browser cannot play this format", arrays=arrays)
        # from the folders as given, not their symlinks' targets: the page is opened as given
        src = os.path.relpath(os.path.abspath(path), os.path.abspath(self.page_dir))
        src = "/".join(_quote(part) for part in Path(src).as_posix().split("/"))
        if offset:
            src += f"#t={offset:.3f}"
        return _Audio(src=src, arrays=arrays, offset=offset or 0.0)

    def _spectrogram(self, wave: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        import torch

        from asr.frontends import LogMelFilterbank

        rate = self.sample_rate
        # 25 ms windows every 10 ms at any rate: the picture's columns are 10 ms of the time axis
        win, hop = round(0.025 * rate), round(0.010 * rate)
        if self._mel is None or self._mel.sample_rate != rate:
            n_fft = max(512, 1 << (win - 1).bit_length())
            self._mel = LogMelFilterbank(rate, n_fft, win, hop, n_mels=80)
        x = torch.from_numpy(np.pad(wave, (0, max(0, win - len(wave)))))[None]
        with torch.inference_mode():
            mel, _ = self._mel(x, torch.tensor([x.shape[1]]))
        db = 10 / np.log(10) * mel[0].numpy().T  # (n_mels, T)
        pool = max(1, -(-db.shape[1] // MAX_SPECTROGRAM_FRAMES))
        if pool > 1:
            cut = db.shape[1] // pool * pool
            db = db[:, :cut].reshape(db.shape[0], -1, pool).mean(axis=2)
        top = db.max() if db.size else 0.0
        scaled = np.clip((db - top + SPECTROGRAM_RANGE_DB) / SPECTROGRAM_RANGE_DB, 0, 1)
        image = np.rint(255 * scaled).astype(np.uint8)
        return _picture(image), {"seconds": pool * hop / rate}

    def notes(self, utterances: list[dict[str, Any]], rows: str, kept: str) -> list[str]:
        """What the page lacks: audio of standard input, missing or outside its file, and which
        of its `rows` (`utterances`) are past its budget (their arrays went to `kept`)."""
        notes = []
        from_stdin = sum(u["audio_note"] == STDIN_NOTE for u in utterances)
        if from_stdin:
            notes.append(
                f"{from_stdin} of {len(utterances)} {rows} transcribed from standard input "
                "(`-`): its audio was not kept"
            )
        if self.missing:
            shown = ", ".join(list(self.missing)[:3]) + (" ..." if len(self.missing) > 3 else "")
            notes.append(f"{len(self.missing)} audio file(s) missing or unreadable: {shown}")
        if self.unread:
            shown = "; ".join(list(self.unread)[:3]) + (" ..." if len(self.unread) > 3 else "")
            notes.append(f"{len(self.unread)} audio stretch(es) could not be read: {shown}")
        left_out = sum(LEFT_OUT in u["flags"] for u in utterances)
        if left_out:
            notes.append(
                f"{left_out} of {len(utterances)} {rows} without their pictures and maps "
                f"(flagged '{LEFT_OUT}'): the page keeps them for {kept}, up to "
                f"{self.budget.megabytes:g} MB (`asr explore FOLDER --max-mb 0`: for all)"
            )
        return notes


def _outside(path: str, offset: float, duration: float | None) -> str | None:
    """Why the stretch of `path` from `offset` for `duration` lies outside the audio its header
    states; None where the header does not read or states no samples (the file's fault)."""
    try:
        info = audio_info(path)
    except (AudioError, OSError):
        return None
    if not info.num_frames:
        return None
    try:
        frame_range(path, info.num_frames, info.sample_rate, offset, duration)
    except AudioError as err:
        return err.reason
    return None


def _playable(path: str) -> bool:
    return Path(path).suffix.lower() in PLAYABLE


@dataclass
class _Picture:
    """A 2-D uint8 array (rows x columns) stored as a grey WebP picture."""

    data: bytes
    shape: tuple[int, int]


def _picture(image: np.ndarray) -> np.ndarray | _Picture:
    """`image` as a lossy WebP picture, or itself where WebP cannot hold it."""
    from PIL import Image, features

    if not all(0 < n <= WEBP_MAX_SIDE for n in image.shape) or not features.check("webp"):
        return image
    out = io.BytesIO()
    # method 0: the encoder's fastest; its slower methods make spectrograms hardly smaller
    Image.fromarray(image).save(out, "WEBP", quality=SPECTROGRAM_WEBP_QUALITY, method=0)
    return _Picture(out.getvalue(), image.shape)


def _quote(part: str) -> str:
    """`part` of a path as a URL: its bytes on disk, so a name that is not UTF-8 leads there."""
    from urllib.parse import quote

    return quote(os.fsencode(part))


def _envelope(wave: np.ndarray, columns: int = ENVELOPE_COLUMNS) -> np.ndarray:
    """`(columns, 2)` uint8 minimum and maximum of each stretch of `wave`, 128 = zero."""
    if len(wave) == 0:
        return np.full((1, 2), 128, dtype=np.uint8)
    columns = min(columns, len(wave))
    edges = np.linspace(0, len(wave), columns + 1).astype(int)
    low = np.minimum.reduceat(wave, edges[:-1])
    high = np.maximum.reduceat(wave, edges[:-1])
    peak = max(float(np.abs(wave).max()), 1e-6)
    pairs = np.stack([low, high], axis=1) / peak
    return np.rint(127.5 + 127.5 * np.clip(pairs, -1, 1)).astype(np.uint8)


def _opus_uri(wave: np.ndarray, sample_rate: int) -> str:
    """`wave` as an Ogg Opus data URI (FFmpeg's libopus, 24 kbit/s, complexity 5: a fifth of
    the encoding time of its default for the same size)."""
    from fractions import Fraction

    import av

    rate = sample_rate if sample_rate in OPUS_RATES else 48000
    if rate != sample_rate:
        from asr.audio import as_waveform

        wave = as_waveform(wave, sample_rate, rate).numpy()
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=rate, layout="mono")
        stream.bit_rate = OPUS_BITRATE
        stream.codec_context.options = {"compression_level": "5"}
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(wave, dtype=np.float32)[None], format="flt", layout="mono"
        )
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return "data:audio/ogg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_transcript(data: Any) -> bool:
    """Whether `data` is what `asr transcribe` writes as `<name>.json`: an object with its text
    and segments (transcribe mirrors the inputs' folders, so any name, in subfolders too)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("text"), str)
        and isinstance(data.get("segments"), list)
    )


class _NotTranscript(ValueError):
    """A JSON file that is not meant as a transcript (not one that is damaged)."""


def _read_transcript(path: Path) -> dict[str, Any]:
    """The transcript `path`; ValueError says why it is none (`_NotTranscript`: an object
    without text and segments, or no object)."""
    try:
        data = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"not readable ({err})") from None
    if not isinstance(data, dict) or not {"text", "segments"} <= data.keys():
        what = "no text and segments" if isinstance(data, dict) else "not a JSON object"
        raise _NotTranscript(f"not a transcript of `asr transcribe` ({what})")
    if not _is_transcript(data):
        raise ValueError(
            "not a transcript of `asr transcribe` (its text must be a text and its segments a list)"
        )
    problem = record_problem(data)
    if problem is not None:
        raise ValueError(f"not a transcript of `asr transcribe` ({problem})")
    segments = data["segments"]
    for k, segment in enumerate(segments, start=1):  # of several, a row each on its stretch
        if not isinstance(segment, dict):
            raise ValueError(f"not a transcript of `asr transcribe` (segment {k} is no object)")
        bounds = [segment.get(b) for b in ("start", "end")]
        if len(segments) > 1 and not all(_seconds(b) for b in bounds):
            raise ValueError(
                f"not a transcript of `asr transcribe` (segment {k} has no start and end in "
                "seconds)"
            )
        alternatives = segment.get("alternatives", [])  # n-best: a row's texts each
        if not isinstance(alternatives, list) or not all(
            isinstance(t, dict) and isinstance(t.get("text", ""), str)
            for t in [segment, *alternatives]
        ):
            raise ValueError(
                f"not a transcript of `asr transcribe` (segment {k}: its text and alternatives "
                "must be texts)"
            )
    return data


def _seconds(value: Any) -> bool:
    """Whether `value` is a finite number (JSON's NaN and Infinity are read as None)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _run_logs(folder: Path, quiet: bool = False) -> list[Path]:
    """The folders of a run's metrics.csv, every logs/version_N of its last run in order (a
    resumed run logs into a new one), or the folder itself; none: empty."""
    from asr.plotting import csv_logs  # as `asr curves` finds them (matplotlib: not at import)

    return [path.parent for path in csv_logs(folder, quiet)]


def _sample_rate(layout: dict[str, Any], folder: Path) -> int:
    """The rate the folder's layout gives its audio at (16 kHz where it says none)."""
    rate = layout.get("sample_rate", 16000)
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise ValueError(f"{folder / LAYOUT}: sample_rate {rate!r} is not a sample rate")
    return rate


def _curves(paths: list[Path]) -> dict[str, Any]:
    """Per epoch, the last value of each series of `CURVES` logged in it (in the last of
    `paths` that logs it): None where it logged none (the page's line passes over it, as
    validation every n epochs leaves), "nan", "inf" or "-inf" where it is not finite (a gap)."""
    from asr.plotting import log_lines  # as `asr curves` reads them (matplotlib: not at import)

    values: dict[str, dict[int, list[float | str]]] = defaultdict(lambda: defaultdict(list))
    for path in paths:
        reader = csv.DictReader(log_lines(path))
        for row in reader:
            if not row.get("epoch"):
                continue
            try:
                epoch = int(float(row["epoch"]))
                logged = {name: float(row[name]) for name in CURVES if row.get(name)}
            except (TypeError, ValueError, OverflowError):  # inf: no whole epoch
                where = f"{path}:{reader.line_num}"
                raise ValueError(f"{where}: a value that is not a number") from None
            for name, value in logged.items():
                values[name][epoch].append(value if math.isfinite(value) else str(value))
    epochs = sorted({e for series in values.values() for e in series})
    series = {
        name.removesuffix("_epoch"): [by_epoch[e][-1] if by_epoch.get(e) else None for e in epochs]
        for name, by_epoch in values.items()
    }
    return {"epoch": epochs, "series": series}
