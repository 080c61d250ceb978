"""Corpus preparation: a corpus on disk -> `<out>/<split>.jsonl` manifests and `summary.json`,
which lists every input left out (`left_out` reads back the broken ones)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import tarfile
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from asr.audio import AUDIO_SUFFIXES, AudioError, audio_files, audio_info, unlistable
from asr.data.manifest import (
    LONGEST_ID,
    MIN_DURATION,
    Utterance,
    decode_line_of,
    manifest_lines,
    some_of,
    write_manifest,
)

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike
# summary.json lists of broken inputs
BROKEN_KEYS = ("unusable_audio", "missing_audio", "bad_transcripts", "unlisted_folders")


@dataclass(frozen=True)
class SplitSummary:
    """Size of one prepared split."""

    utterances: int
    hours: float
    speakers: int

    @classmethod
    def of(cls, utterances: Sequence[Utterance]) -> SplitSummary:
        hours = sum(utterance.duration for utterance in utterances) / 3600
        return cls(len(utterances), hours, len({utterance.speaker for utterance in utterances}))


def format_summary(summaries: dict[str, SplitSummary]) -> str:
    """A small table, one row per split.

    >>> splits = {"train": SplitSummary(848, 0.7, 40), "test": SplitSummary(130, 0.1, 10)}
    >>> print(format_summary(splits))
    split  utterances  hours  speakers
    train         848   0.70        40
    test          130   0.10        10
    """
    header = ("split", "utterances", "hours", "speakers")
    rows = [
        (name, str(s.utterances), f"{s.hours:.2f}", str(s.speakers))
        for name, s in summaries.items()
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def prepare_corpus(
    corpus: str, data_dir: PathLike, out_dir: PathLike, **options: Any
) -> dict[str, SplitSummary]:
    """Prepare the corpus `CORPORA[corpus]` from `data_dir` into `out_dir`; split -> summary."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(sorted(CORPORA))}")
    for option in options:
        if option not in inspect.signature(CORPORA[corpus]).parameters:
            takers = [name for name, prepare in sorted(CORPORA.items())
                      if option in inspect.signature(prepare).parameters]  # fmt: skip
            of = f"; it is an option of {' and '.join(takers)}" if takers else ""
            raise ValueError(f"{corpus} takes no option --{option.replace('_', '-')}{of}")
    return CORPORA[corpus](data_dir, out_dir, **options)


class _Entry(NamedTuple):
    id: str
    audio: Path
    text: str
    speaker: str


AN4_LAYOUT = (
    "the CMU AN4 corpus: a directory with etc/an4_train.transcription, "
    "etc/an4_test.transcription and wav/ (or its parent), an AN4 .tar.gz, "
    "or a folder holding exactly one such tarball"
)
EXTRACTED = "extracted.json"  # in raw/: the record of the tarball extracted there
EXTRACTED_DIR = "tarball"  # in raw/: that extraction, replaced by another tarball's
AN4_SPLITS = {  # split -> (transcription file in etc/, audio directory in wav/)
    "train": ("an4_train.transcription", "an4_clstk"),
    "test": ("an4_test.transcription", "an4test_clstk"),
}


def prepare_an4(
    data_dir: PathLike, out_dir: PathLike, dev_size: int = 100
) -> dict[str, SplitSummary]:
    """CMU AN4 (a directory or tarball), split into train, dev and test as ESPnet's recipe does."""
    if dev_size < 0:
        raise ValueError(f"dev_size must be >= 0, got {dev_size}")
    data_dir, out_dir = _absolute(data_dir), _absolute(out_dir)
    root = _an4_root(data_dir, out_dir)
    missing, bad_text, measured, held_out, untranscribed = [], [], {}, set(), []
    for split in AN4_SPLITS:
        entries, missing_here, bad_here, named, untranscribed_here = _an4_entries(root, split)
        if split == "train":  # by name, over lines left out too: mending one moves none
            held_out = set(_hold_out(sorted(set(named)), dev_size)[0])
        measured[split] = _measure(entries, f"an4 {split}")
        missing += missing_here
        bad_text += bad_here
        untranscribed += untranscribed_here
    (pool, unusable), (test, unusable_test) = measured["train"], measured["test"]
    pool = sorted(pool, key=lambda u: u.utt_id)
    splits = _by_split(pool, dict.fromkeys(held_out, "dev"), default="train")
    splits["test"] = sorted(test, key=lambda u: u.utt_id)
    report = {"missing_audio": missing, "bad_transcripts": bad_text,
              "missing_transcripts": untranscribed}  # fmt: skip
    return _write_splits(
        out_dir, "an4", root, splits, unusable_audio=unusable + unusable_test, **report
    )


def _an4_root(data_dir: Path, out_dir: Path) -> Path:
    """The directory holding `etc/` and `wav/`, extracting a tarball if given one."""
    if data_dir.is_file() and _is_tarball(data_dir):
        return _extract_an4(data_dir, out_dir / "raw")
    for candidate in (data_dir, data_dir / "an4"):
        if _is_an4_root(candidate):
            return candidate
    tarballs = sorted(p for p in data_dir.iterdir() if _is_tarball(p)) if data_dir.is_dir() else []
    if len(tarballs) == 1:
        return _extract_an4(tarballs[0], out_dir / "raw")
    found = f"; found {len(tarballs)} tarballs" if tarballs else ""
    raise ValueError(f"{data_dir}: expected {AN4_LAYOUT}{found}")


def _is_an4_root(directory: Path) -> bool:
    etc = directory / "etc"
    has_transcripts = all((etc / name).is_file() for name, _ in AN4_SPLITS.values())
    return has_transcripts and (directory / "wav").is_dir()


def _is_tarball(path: Path) -> bool:
    return path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar"))


def _extract_an4(tarball: Path, raw: Path) -> Path:
    """Extract an AN4 tarball into `raw`/EXTRACTED_DIR (once per tarball) and return the AN4
    root inside it; another tarball (path, size or time) replaces that folder, which is this
    function's alone."""
    identity = _file_identity(tarball)
    marker, target = raw / EXTRACTED, raw / EXTRACTED_DIR
    earlier = _read_marker(marker)
    root = earlier.get("root")
    if earlier.get("tarball") == identity and isinstance(root, str) and _is_an4_root(raw / root):
        return raw / root
    # into a folder beside it first: a tarball refused or cut short leaves the earlier
    # extraction, which manifests written from it name, as it was
    partial = raw / f"{EXTRACTED_DIR}.partial"
    for folder in (target, partial):
        if tarball.resolve().is_relative_to(folder.resolve()):
            raise ValueError(f"{tarball}: move it out of {folder}, where its extraction goes")
    logger.info("extracting %s into %s", tarball, target)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        try:
            with tarfile.open(tarball) as archive:
                members = archive.getmembers()
                inner = [m.name for m in members if m.name.endswith("etc/an4_train.transcription")]
                if len(inner) != 1:
                    raise ValueError(
                        f"{tarball}: expected one AN4 distribution inside, found {len(inner)}"
                    )
                _extract_all(archive, partial)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:  # cut short
            raise ValueError(f"{tarball}: cannot read the tarball ({error})") from error
        inside = Path(inner[0]).parent.parent
        if not _is_an4_root(partial / inside):
            raise ValueError(
                f"{tarball}: expected {AN4_LAYOUT}; the tarball's {inside.as_posix()} is not"
            )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    marker.unlink(missing_ok=True)  # until the new extraction is in place
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
    root_inside = (Path(EXTRACTED_DIR) / inside).as_posix()
    marker.write_text(json.dumps({"tarball": identity, "root": root_inside}) + "\n")
    return raw / root_inside


def _file_identity(path: Path) -> dict[str, Any]:
    """What tells one tarball from another of the same name: its real path, size and time."""
    status = path.stat()
    return {"path": str(path.resolve()), "bytes": status.st_size, "mtime_ns": status.st_mtime_ns}


def _read_marker(marker: Path) -> dict[str, Any]:
    """The record of `_extract_an4` (empty when there is none, or it is unreadable)."""
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _extract_all(archive: tarfile.TarFile, destination: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # refuses absolute paths, links out of the tree, ...
        archive.extractall(destination, filter="data")
    else:
        archive.extractall(destination)


def _an4_entries(
    root: Path, split: str
) -> tuple[list[_Entry], list[str], list[str], list[str], list[str]]:
    """The split's entries, the audio not found, `file:line: reason` of unusable lines, the
    id of every line that names one (usable or not: what the split is drawn over), and the
    audio (relative to `root`) no line names."""
    transcription, audio_dir = AN4_SPLITS[split]
    path = root / "etc" / transcription
    entries, missing, bad_text, first_line_of, named, undecoded = [], [], [], {}, [], []
    for number, line in _transcript_lines(path, bad_text, undecoded):
        if not line.strip():
            continue
        location = f"{path}:{number}"
        try:
            text, source = _parse_an4_line(line, location)
        except ValueError as error:
            bad_text.append(str(error))
            continue
        first, speaker, last = source.split("-")
        utterance_id = f"{speaker}-{first}-{last}"
        named.append(utterance_id)
        problem = _transcript_problem(text, utterance_id, first_line_of, f"line {number}")
        if problem:
            bad_text.append(f"{location}: {problem}")
            continue
        audio = _existing(root / "wav" / audio_dir / speaker / source, (".wav", ".sph"))
        if audio is None:
            missing.append(f"{root / 'wav' / audio_dir / speaker / source}.{{wav,sph}}")
            continue
        entries.append(_Entry(utterance_id, audio, text, audio.parent.name))
    for line in undecoded:  # its id, where its bad bytes are in the words, is drawn over
        with contextlib.suppress(ValueError):
            first, speaker, last = _parse_an4_line(line, "")[1].split("-")
            named.append(f"{speaker}-{first}-{last}")
    folder, unlisted = root / "wav" / audio_dir, []  # none there: each line's audio is missing
    found = audio_files(folder, (".wav", ".sph"), unlisted) if folder.is_dir() else []
    missing += unlisted  # what lines name may be there
    _warn_left_out(f"an4 {split}", missing, bad_text)
    said = set()  # `speaker/first-speaker-last`, where each line's audio is
    for utterance_id in named:
        speaker, first, last = utterance_id.split("-")
        said.add(f"{speaker}/{first}-{speaker}-{last}")
    untranscribed = [
        audio.relative_to(root).as_posix()
        for audio in found
        if audio.relative_to(folder).with_suffix("").as_posix() not in said
    ]
    _warn_some(f"an4 {split}", untranscribed, "audio file(s) no transcription line names, left out")
    return entries, missing, bad_text, named, untranscribed


def _transcript_problem(
    text: str, utterance_id: str, first_at: dict[str, str], here: str
) -> str | None:
    """Why a transcript line is left out: no words, or an id given before. `first_at` maps
    each id to the line that gave it first ("line 3", "line 3 of FILE")."""
    if not text:
        return f"{utterance_id}: transcript is empty"
    first = first_at.setdefault(utterance_id, here)
    return f"{utterance_id} is already on {first}" if first != here else None


def _warn_left_out(description: str, missing: list[str], bad_text: list[str]) -> None:
    if missing:
        logger.warning("%s: audio missing for %d: %s", description, len(missing), some_of(missing))
    if bad_text:
        logger.warning(
            "%s: %d unusable transcript(s): %s", description, len(bad_text), some_of(bad_text)
        )


def _parse_an4_line(line: str, location: str) -> tuple[str, str]:
    """`<s> YES </s> (an251-fash-b)` -> ("YES", "an251-fash-b")."""
    match = re.fullmatch(r"\s*(.*?)\s*\(([^()\s-]+-[^()\s-]+-[^()\s-]+)\)\s*", line)
    if match is None:
        raise ValueError(f"{location}: expected '<s> WORDS </s> (an251-fash-b)', got {line!r}")
    words = match.group(1).split()
    if words[:1] == ["<s>"]:
        words = words[1:]
    if words[-1:] == ["</s>"]:
        words = words[:-1]
    return " ".join(words), match.group(2)


def _hold_out(train: list[str], dev_size: int) -> tuple[list[str], list[str]]:
    """The first `dev_size` utterance ids as dev, the rest as train (10% if too few)."""
    if 0 < len(train) <= dev_size:
        size = max(1, len(train) // 10) if len(train) > 1 else 0
        logger.warning(
            "only %d training utterances, not more than dev_size=%d: holding out %d as dev",
            len(train),
            dev_size,
            size,
        )
        dev_size = size
    return train[:dev_size], train[dev_size:]


LIBRISPEECH_LAYOUT = (
    "LibriSpeech: <split>/<speaker>/<chapter>/<speaker>-<chapter>.trans.txt with the audio "
    "beside it (.flac, or any suffix the loader reads: Mini LibriSpeech's .opus), in this "
    "directory or in its LibriSpeech/ subdirectory"
)


def prepare_librispeech(
    data_dir: PathLike, out_dir: PathLike, splits: Sequence[str] | None = None
) -> dict[str, SplitSummary]:
    """LibriSpeech: a manifest per split directory, also pooled into train, dev and test
    (with a split folder of the pool's own name). Named `splits` leave those an earlier
    preparation from the same folder wrote beside them, and the pools they do not join."""
    data_dir, out_dir = _absolute(data_dir), _absolute(out_dir)
    root = data_dir / "LibriSpeech" if (data_dir / "LibriSpeech").is_dir() else data_dir
    found = _librispeech_splits(root)
    if not found:
        raise ValueError(f"{data_dir}: expected {LIBRISPEECH_LAYOUT}; found no split directory")
    chosen = list(found) if splits is None else list(dict.fromkeys(splits))
    unknown = [name for name in chosen if name not in found]
    if unknown:
        raise ValueError(
            f"{root}: split(s) {', '.join(unknown)} not found; found {', '.join(found)}"
        )
    kept, carried = _kept_librispeech(out_dir, root, found, chosen) if splits else ([], {})
    prepared, unusable, missing, bad_text, untranscribed, unlisted = {}, [], [], [], [], []
    for name in chosen:
        unlisted += _unlisted_chapters(found[name])
        entries, missing_here, bad_here, untranscribed_here = _librispeech_entries(found[name])
        prepared[name], unusable_here = _measure(entries, f"librispeech {name}")
        unusable += unusable_here
        missing += missing_here
        bad_text += bad_here
        untranscribed += [f"{name}/{path}" for path in untranscribed_here]
    for pool in ("train", "dev", "test"):
        members = [name for name in chosen if name == pool or name.startswith(f"{pool}-")]
        if pool in members and len(members) > 1:
            logger.warning(
                "librispeech: the split folder %s is pooled with %s into %s.jsonl",
                pool,
                ", ".join(name for name in members if name != pool),
                pool,
            )
        if members != [pool] and members:
            prepared[pool] = _pooled({name: prepared[name] for name in members}, pool)
            left = [name for name in kept if name == pool or name.startswith(f"{pool}-")]
            if left:
                logger.warning(
                    "librispeech: %s.jsonl holds %s, not %s prepared before (name it in "
                    "--splits to pool it)",
                    pool,
                    ", ".join(members),
                    ", ".join(left),
                )
    report = {"unusable_audio": unusable, "missing_audio": missing, "bad_transcripts": bad_text,
              "missing_transcripts": untranscribed, "unlisted_folders": unlisted}  # fmt: skip
    for key, entries in carried.items():
        report[key] += entries
    keep = splits is not None  # one split at a time: the others stay
    return _write_splits(out_dir, "librispeech", root, prepared, keep_earlier=keep, **report)


def _kept_librispeech(
    out_dir: Path, root: Path, found: dict[str, Path], chosen: list[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The split folders of `root` an earlier preparation into `out_dir` wrote and this one
    leaves (their manifests stay), and what it left out of them, by summary key."""
    record = _earlier_record(out_dir)
    earlier = _earlier_splits(record, "librispeech", root)
    kept = [name for name in found if name not in chosen and earlier.get(name) is not None
            and (out_dir / f"{name}.jsonl").is_file()]  # fmt: skip
    heads = tuple(p for name in kept for p in (f"{found[name]}{os.sep}", f"{name}/"))
    carried = {}
    for key, entries in record.items():
        if key not in ("corpus", "source", "splits") and isinstance(entries, list):
            carried[key] = [e for e in entries if isinstance(e, str) and e.startswith(heads)]
    return kept, carried


def _unlisted_chapters(split_dir: Path) -> list[str]:
    """`folder: why` of each speaker or chapter folder of a split that cannot be listed, which
    the transcripts' glob passes over unsaid."""
    unlisted: list[str] = []
    for root, folders, _ in os.walk(split_dir, followlinks=True, onerror=unlistable(unlisted)):
        if len(Path(root).relative_to(split_dir).parts) >= 2:  # a chapter: nothing below
            folders.clear()
    _warn_some(split_dir.name, unlisted, UNLISTED)
    return unlisted


UNLISTED = "folder(s) that cannot be listed, what they hold left out"


def _warn_some(description: str, items: list[str], what: str) -> None:
    """`description: N what: some of items`, where there are any."""
    if items:
        logger.warning("%s: %d %s: %s", description, len(items), what, some_of(items))


def _pooled(splits: dict[str, list[Utterance]], pool: str) -> list[Utterance]:
    """The splits' utterances in one list, each id once: Mini LibriSpeech's train-clean-5 is
    part of train-clean-100, and both unpack into one LibriSpeech folder."""
    first_split_of: dict[str, str] = {}
    pooled = []
    for name, utterances in splits.items():
        repeated: Counter[str] = Counter()
        for utterance in utterances:
            first = first_split_of.setdefault(utterance.utt_id, name)
            if first == name:
                pooled.append(utterance)
            else:
                repeated[first] += 1
        for first, count in repeated.items():
            logger.warning(
                "librispeech %s: %d utterance(s) also in %s, taken into %s.jsonl once",
                name,
                count,
                first,
                pool,
            )
    return pooled


def _librispeech_splits(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    return {
        path.name: path
        for path in sorted(root.iterdir())
        if path.is_dir() and next(path.glob("*/*/*.trans.txt"), None) is not None
    }


def _librispeech_entries(
    split_dir: Path,
) -> tuple[list[_Entry], list[str], list[str], list[str]]:
    """The split's entries, the audio not found, `file:line: reason` of unusable lines, and
    the audio files (relative to `split_dir`) no transcript line names."""
    entries, missing, bad_text = [], [], []
    first_at: dict[str, str] = {}  # over the whole split: ids are unique in a corpus
    named: set[Path] = set()  # `chapter/id` of every transcript line, usable or not
    for transcripts in sorted(split_dir.glob("*/*/*.trans.txt")):
        speaker, undecoded = transcripts.parent.parent.name, []
        for number, line in _transcript_lines(transcripts, bad_text, undecoded):
            if not line.strip():
                continue
            utterance_id, *rest = line.split(maxsplit=1)  # a tab after the id, as a space
            text = rest[0] if rest else ""
            named.add(transcripts.parent / utterance_id)
            text = " ".join(text.split())  # a form feed or other control space: a space
            here = f"line {number} of {transcripts}"
            problem = _transcript_problem(text, utterance_id, first_at, here)
            if problem:
                bad_text.append(f"{transcripts}:{number}: {problem}")
                continue
            audio = _audio_beside(transcripts.parent, utterance_id)
            if audio is not None:
                entries.append(_Entry(utterance_id, audio, text, speaker))
            else:
                missing.append(str(transcripts.parent / f"{utterance_id}.*"))  # any suffix
        named.update(transcripts.parent / line.split()[0] for line in undecoded if line.split())
    _warn_left_out(split_dir.name, missing, bad_text)
    untranscribed = [
        path.relative_to(split_dir).as_posix()
        for path in sorted(split_dir.glob("*/*/*"))
        if path.suffix.lower() in AUDIO_SUFFIXES and path.with_suffix("") not in named
    ]
    _warn_some(split_dir.name, untranscribed, "audio file(s) no .trans.txt line names, left out")
    return entries, missing, bad_text, untranscribed


def _audio_beside(folder: Path, stem: str) -> Path | None:
    """`folder/stem.flac`, else the file of that stem with another audio suffix, if any."""
    return _existing(folder / stem, (".flac", *AUDIO_SUFFIXES))


YESNO_NAME = re.compile(r"[01](?:_[01])*")  # one label per word: 1 = "ken" (yes), 0 = "lo" (no)
YESNO_TRAIN = 31  # the first 31 recordings (sorted by name) train, the rest test
YESNO_DEV = 5  # the last 5 of the training recordings


def prepare_yesno(data_dir: PathLike, out_dir: PathLike) -> dict[str, SplitSummary]:
    """The yes/no corpus (labels in the file names), split as Kaldi's yesno example does."""
    data_dir, out_dir = _absolute(data_dir), _absolute(out_dir)
    directory = data_dir / "waves_yesno" if (data_dir / "waves_yesno").is_dir() else data_dir
    waves = sorted(directory.glob("*.wav")) if directory.is_dir() else []
    labelled = [path for path in waves if YESNO_NAME.fullmatch(path.stem)]
    if len(labelled) <= YESNO_TRAIN:
        raise ValueError(
            f"{data_dir}: expected the yes/no corpus, 60 recordings named like "
            f"0_1_1_0_1_0_0_1.wav (here or in waves_yesno/); found {len(labelled)}"
        )
    ignored = [path.name for path in waves if path not in labelled]
    if ignored:
        logger.warning(
            "%s: ignoring .wav files not named by labels: %s", directory, some_of(ignored)
        )
    entries = [_Entry(path.stem, path, _yesno_text(path.stem), "yesno") for path in labelled]
    utterances, unusable = _measure(entries, "yesno")
    # split by name before the unreadable are left out, so that none moves to another split
    split_of = {path.stem: "train" for path in labelled[: YESNO_TRAIN - YESNO_DEV]}
    split_of |= {path.stem: "dev" for path in labelled[YESNO_TRAIN - YESNO_DEV : YESNO_TRAIN]}
    splits = _by_split(utterances, split_of, default="test")
    extra = {"ignored_files": ignored, "unusable_audio": unusable}
    return _write_splits(out_dir, "yesno", directory, splits, **extra)


def _yesno_text(stem: str) -> str:
    """Labels to words.

    >>> _yesno_text("0_1_1")
    'NO YES YES'
    """
    return " ".join("YES" if label == "1" else "NO" for label in stem.split("_"))


FOLDER_LAYOUT = (
    f"audio files ({', '.join(AUDIO_SUFFIXES)}) anywhere below it, each with a same-stem .txt "
    "transcript beside it"
)


def prepare_folder(
    data_dir: PathLike,
    out_dir: PathLike,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    split_file: PathLike | None = None,
) -> dict[str, SplitSummary]:
    """Audio files with same-stem `.txt` transcripts, split at random or by `split_file`."""
    data_dir, out_dir = _absolute(data_dir), _absolute(out_dir)
    if not data_dir.is_dir():
        raise ValueError(f"{data_dir}: expected a directory with {FOLDER_LAYOUT}")
    problem = _name_problem(data_dir)
    if problem:
        raise ValueError(problem)
    unlisted: list[str] = []
    found = audio_files(data_dir, (*AUDIO_SUFFIXES, ".txt"), unlisted)  # one walk of a tree
    _warn_some(str(data_dir), unlisted, UNLISTED)
    audio = [path for path in found if path.suffix.lower() != ".txt"]
    if not audio:
        raise ValueError(f"{data_dir}: expected {FOLDER_LAYOUT}; found no audio")
    # a.TXT too, as a.WAV is audio: the walk matches suffixes in any case
    texts = {path.with_suffix(""): path for path in found if path.suffix.lower() == ".txt"}
    entries, missing, bad_text, named = _folder_entries(data_dir, audio, texts)
    if missing:
        logger.warning(
            "%s: %d audio file(s) without a transcript (same-stem .txt) left out: %s",
            data_dir,
            len(missing),
            some_of(missing),
        )
    _warn_left_out(str(data_dir), [], bad_text)
    stems = {path.with_suffix("") for path in audio}
    no_audio = [
        path.relative_to(data_dir).as_posix()
        for path in found
        if path.suffix.lower() == ".txt" and path.with_suffix("") not in stems
    ]
    if no_audio:  # a README.txt too: listed, but no broken input
        logger.warning(
            "%s: %d .txt file(s) without same-stem audio: %s",
            data_dir,
            len(no_audio),
            some_of(no_audio),
        )
    if not entries:
        raise ValueError(
            f"{data_dir}: expected {FOLDER_LAYOUT}; no audio file has a usable transcript"
        )
    if split_file is None:  # by name, over files left out too: mending one moves none
        split_of = _random_split(named, dev_fraction, test_fraction, seed)
    utterances, unusable = _measure(entries, "folder")
    if split_file is None:
        splits = _by_split(sorted(utterances, key=lambda u: u.utt_id), split_of)
    else:
        splits = _assigned_split(utterances, Path(split_file))
    extra = {
        "missing_transcripts": missing,
        "transcripts_without_audio": no_audio,
        "bad_transcripts": bad_text,
        "unusable_audio": unusable,
        "unlisted_folders": unlisted,
    }
    return _write_splits(out_dir, "folder", data_dir, splits, **extra)


def _folder_entries(
    root: Path, audio: list[Path], texts: dict[Path, Path]
) -> tuple[list[_Entry], list[str], list[str], list[str]]:
    """Entries with a usable transcript, audio without one, `transcript: reason` lines, and
    the id of every file with a transcript file (usable or not: what a split is drawn over).
    Paths that spell one id (`x/y-z.wav`, `x-y/z.wav`) each get a hash of their path in it,
    so that no file added takes another's id; two audio files of one transcript (`a.wav`,
    `a.flac`) are refused."""
    missing, transcribed, audio_of = [], [], {}  # audio_of: each transcript's audio
    for path in audio:
        transcript = texts.get(path.with_suffix(""))  # by stem: `texts`, each file's transcript
        if transcript is None or not transcript.is_file():
            missing.append(path.relative_to(root).as_posix())
            continue
        relative = path.relative_to(root).with_suffix("").as_posix()
        plain = _as_id(relative)
        first = audio_of.setdefault(transcript, path)
        if first != path:
            raise ValueError(f"{first} and {path} both give utterance id {plain!r}")
        transcribed.append((path, transcript, relative, plain))
    spelt = Counter(plain for *_, plain in transcribed)
    # the speaker: its folder below the root, as ids name it ("alice-session1"): folders
    # of one name under two others (alice/session1, bob/session1) are not one speaker, nor
    # are folders spelling one name (bob/s1, bob-s1), which get a hash of their path in it
    folders = {Path(relative).parent.as_posix() for _, _, relative, _ in transcribed}
    plain_speaker = {f: _as_id(f) if f != "." else root.name for f in folders}
    voices = Counter(plain_speaker.values())
    speaker_of = {
        f: _as_id(f, hashed=True) if f != "." and voices[name] > 1 else name
        for f, name in plain_speaker.items()
    }
    entries, bad_text, named = [], [], []
    for path, transcript, relative, plain in transcribed:
        utterance_id = _as_id(relative, hashed=True) if spelt[plain] > 1 else plain
        named.append(utterance_id)
        try:
            text = _read_transcript(transcript)
        except ValueError as error:
            bad_text.append(str(error))
            continue
        speaker = speaker_of[Path(relative).parent.as_posix()]
        entries.append(_Entry(utterance_id, path, text, speaker))
    return entries, missing, bad_text, named


def _as_id(relative: str, hashed: bool = False) -> str:
    """A relative path as one word without slashes: "alice smith/Recording 1" ->
    "alice_smith-Recording_1" (a backslash or control character in a file's name too: it
    would name files); one longer than ids may be is cut, a hash of the path ending it (every
    one where `hashed`)."""
    word = re.sub(r"[\s\x00-\x1f\x7f-\x9f]+", "_", relative).replace("/", "-").replace("\\", "-")
    spelt = word.encode(errors="surrogateescape")  # a name not UTF-8 is left out later
    if len(spelt) <= LONGEST_ID and not hashed:
        return word
    tail = "-" + hashlib.sha1(relative.encode(errors="surrogateescape")).hexdigest()[:10]
    head = spelt[: LONGEST_ID - len(tail)].decode(errors="ignore")  # whole characters
    return head + tail


def _transcript_lines(
    path: Path, bad_text: list[str], undecoded: list[str] | None = None
) -> Iterator[tuple[int, str]]:
    """`(number, line)` of a corpus's transcript file, a leading byte-order mark left out; a
    line that is not UTF-8 goes to `bad_text` as `file:line: why` (and to `undecoded`, its
    bad bytes replaced), the others on."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            yield number, raw.decode("utf-8")
        except UnicodeDecodeError as error:
            where = f"byte 0x{raw[error.start]:02x} at column {error.start + 1}"
            bad_text.append(f"{path}:{number}: transcript is not valid UTF-8 ({where})")
            if undecoded is not None:
                undecoded.append(raw.decode("utf-8", "replace"))


def _read_transcript(path: Path) -> str:
    """A transcript file's words on one line; ValueError says why a file is unusable."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read transcript ({error.strerror})") from error
    try:
        # Notepad's "UTF-8 with BOM" too; decoded with it, so an error's offset is the file's
        text = " ".join(data.decode("utf-8").removeprefix("\ufeff").split())
    except UnicodeDecodeError as error:
        reason = f"byte 0x{data[error.start]:02x} at offset {error.start}"
        raise ValueError(f"{path}: transcript is not valid UTF-8 ({reason})") from error
    if not text:
        raise ValueError(f"{path}: transcript is empty")
    return text


def _random_split(
    ids: list[str], dev_fraction: float, test_fraction: float, seed: int
) -> dict[str, str]:
    """Each utterance id's split: `test_fraction` and `dev_fraction` of them drawn by `seed`.
    Ids are ranked by a hash of each (a shuffle's order would change whole for one id added
    or removed): one added or removed moves at most one other across each boundary."""
    if not (0 <= dev_fraction and 0 <= test_fraction and dev_fraction + test_fraction < 1):
        raise ValueError(
            f"need dev_fraction, test_fraction >= 0 with a sum below 1, "
            f"got {dev_fraction} and {test_fraction}"
        )
    ranked = sorted(
        set(ids),
        key=lambda i: hashlib.sha256(f"{seed}\0{i}".encode(errors="surrogateescape")).digest(),
    )
    # each boundary rounded on its own, so that one id more or less moves each by one at most
    num_test = round(len(ranked) * test_fraction)
    num_held = round(len(ranked) * (test_fraction + dev_fraction))
    return {
        i: "test" if k < num_test else "dev" if k < num_held else "train"
        for k, i in enumerate(ranked)
    }


def _assigned_split(utterances: list[Utterance], split_file: Path) -> dict[str, list[Utterance]]:
    """Splits named by a `<utterance-id> <split>` file that covers every utterance. Ids are
    matched in one Unicode form: a folder name from macOS (NFD) and the same id typed (NFC)
    look alike."""
    given = {u.utt_id for u in utterances}
    ids = {_nfc(i) for i in given}
    if len(ids) < len(given):  # two names alike on Linux, not the same
        spelt = Counter(_nfc(i) for i in given)
        alike = sorted(i for i, count in spelt.items() if count > 1)
        raise ValueError(
            f"{split_file}: ids that differ in their Unicode form alone, which a split file "
            f"cannot tell apart: {some_of(alike)}; rename one of each"
        )
    assignment = _read_split_file(split_file, ids)
    unassigned = [u.utt_id for u in utterances if _nfc(u.utt_id) not in assignment]
    _raise_if_any(unassigned, f"{split_file}: no split given for")
    unknown = sorted(set(assignment) - ids)
    if unknown:
        logger.warning("%s: ids of no prepared utterance: %s", split_file, some_of(unknown))
    split_of = {u.utt_id: assignment[_nfc(u.utt_id)] for u in utterances}
    return _by_split(utterances, split_of, names=())


def _nfc(utterance_id: str) -> str:
    return unicodedata.normalize("NFC", utterance_id)


def _by_split(
    utterances: list[Utterance],
    split_of: dict[str, str],
    default: str | None = None,
    names: Sequence[str] = ("train", "dev", "test"),
) -> dict[str, list[Utterance]]:
    """The utterances of each split, in their order: `names` first (kept though empty), then
    any other `split_of` names an id by (`default` for ids it does not name)."""
    splits: dict[str, list[Utterance]] = {name: [] for name in names}
    for utterance in utterances:
        splits.setdefault(split_of.get(utterance.utt_id, default), []).append(utterance)
    return splits


def _read_split_file(path: Path, ids: set[str]) -> dict[str, str]:
    """`{id: split}` (ids in NFC) of a split file; a line starting with `#` is a comment,
    unless it starts with one of `ids` (a file named `#take1.wav`)."""
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a split file")
    if not path.is_file():
        raise ValueError(f"{path}: split file not found")
    assignment: dict[str, str] = {}
    for number, raw in manifest_lines(path.read_bytes()):
        line = decode_line_of(path, number, raw)
        fields = line.split()  # none where the line holds Unicode spaces alone
        if fields:
            fields[0] = _nfc(fields[0])
        if not fields or fields[0].startswith("#") and fields[0] not in ids:
            continue
        if len(fields) != 2 or not re.fullmatch(r"[\w.-]+", fields[1]) or fields[1] == "summary":
            hash_id = f" ({fields[0]} is an utterance id; write comments as '# ...')"
            raise ValueError(
                f"{path}:{number}: expected '<utterance-id> <split-name>', got {line!r}"
                + (hash_id if fields[0].startswith("#") else "")
            )
        if assignment.setdefault(fields[0], fields[1]) != fields[1]:
            raise ValueError(f"{path}:{number}: {fields[0]!r} is already in another split")
    return assignment


def _measure(entries: Sequence[_Entry], description: str) -> tuple[list[Utterance], list[str]]:
    """Utterances with durations from the audio headers, and `path: reason` for unusable audio."""
    utterances, unusable = [], []
    for entry in tqdm(entries, desc=description, unit="file"):
        problem = _name_problem(entry.audio)
        if problem:
            unusable.append(problem)
            continue
        try:
            info = audio_info(entry.audio)
        except AudioError as error:
            unusable.append(str(error))
            continue
        if info.num_frames == 0:
            unusable.append(f"{entry.audio}: audio is empty (0 samples)")
            continue
        utterances.append(
            Utterance(str(entry.audio), info.duration, entry.text, entry.id, entry.speaker)
        )
    if unusable:
        logger.warning(
            "%s: %d unusable audio file(s) left out: %s",
            description,
            len(unusable),
            some_of(unusable),
        )
    short = [
        f"{u.audio_filepath} ({u.duration:.3f} s)" for u in utterances if u.duration < MIN_DURATION
    ]
    if short:  # kept: the minimum is training's to apply (data.min_duration), said here early
        logger.warning(
            "%s: %d recording(s) shorter than the %g s asr fit takes by default (data.min_duration;"
            " data.skip_bad leaves them out): %s",
            description,
            len(short),
            MIN_DURATION,
            some_of(short),
        )
    return utterances, unusable


def _name_problem(path: Path) -> str | None:
    """Why a manifest (UTF-8) cannot name `path`: a name of other bytes, which Linux allows and
    Python holds as lone surrogates; the path is shown with those bytes as `\\xe9`."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError as error:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        byte = os.fsencode(str(path)[error.start])[0]
        where = f"byte 0x{byte:02x}"
        return f"{shown}: name is not valid UTF-8 ({where}), as a manifest needs: rename it"
    return None


def _write_splits(
    out_dir: Path,
    corpus: str,
    source: Path,
    splits: dict[str, list[Utterance]],
    keep_earlier: bool = False,
    **report: Any,
) -> dict[str, SplitSummary]:
    """Write each non-empty split's manifest and `summary.json`; return the summaries.

    The manifests of splits an earlier preparation into `out_dir` wrote and this one does not
    are removed, so that no old dev or test set is left beside a train set that now holds it;
    with `keep_earlier`, those of an earlier preparation of this corpus from `source` stay,
    and `summary.json` lists them still."""
    if not any(splits.values()):
        left = [f"{key}: {some_of(value)}" for key, value in report.items() if value]
        raise ValueError(f"{source}: no usable utterance ({'; '.join(left) or 'none found'})")
    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = _earlier_splits(_earlier_record(out_dir), corpus, source if keep_earlier else None)
    summaries = {}
    for name, utterances in splits.items():
        if utterances:
            write_manifest(out_dir / f"{name}.jsonl", utterances)
            summaries[name] = SplitSummary.of(utterances)
    for name, summary in earlier.items():
        if summary is not None and name not in summaries:
            if (out_dir / f"{name}.jsonl").is_file():
                summaries[name] = summary
    for name in set(earlier) - set(summaries):
        if (out_dir / f"{name}.jsonl").is_file():
            logger.warning(
                "removing %s, a split of the earlier preparation", out_dir / f"{name}.jsonl"
            )
            (out_dir / f"{name}.jsonl").unlink()
    record = {
        "corpus": corpus,
        "source": str(source),
        "splits": {name: asdict(summary) for name, summary in summaries.items()},
        **report,
    }
    summary_path = out_dir / "summary.json"
    summary_path.write_text(
        json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    logger.info("prepared %s in %s:\n%s", corpus, out_dir, format_summary(summaries))
    return summaries


def _earlier_record(out_dir: Path) -> dict[str, Any]:
    """The `summary.json` an earlier preparation wrote into `out_dir` (empty when it is absent
    or unreadable)."""
    try:
        record = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _earlier_splits(
    record: dict[str, Any], corpus: str, source: Path | None
) -> dict[str, SplitSummary | None]:
    """The splits an earlier preparation's `record` lists, each with its summary where that
    preparation was of `corpus` from `source`."""
    try:
        names = [str(name) for name in record["splits"]]
    except (KeyError, TypeError):
        return {}
    same = record.get("corpus") == corpus and record.get("source") == str(source)
    earlier: dict[str, SplitSummary | None] = dict.fromkeys(names)
    for name, summary in (
        record["splits"].items() if same and isinstance(record["splits"], dict) else ()
    ):
        with contextlib.suppress(TypeError, ValueError):
            earlier[str(name)] = SplitSummary(**summary)
    return earlier


def left_out(out_dir: PathLike) -> list[str]:
    """`path: reason` of every broken input the last preparation into `out_dir` left out."""
    record = json.loads((Path(out_dir) / "summary.json").read_text(encoding="utf-8"))
    return [problem for key in BROKEN_KEYS for problem in record.get(key, [])]


def _existing(stem: Path, suffixes: Sequence[str]) -> Path | None:
    """The first of `stem` + suffix that is a file, the suffix in any case (`.FLAC`, `.Sph`)."""
    found = next(
        (p for p in (stem.with_name(stem.name + s) for s in suffixes) if p.is_file()), None
    )
    if found is not None or not stem.parent.is_dir():
        return found
    spelt = {
        path.name[len(stem.name) :].lower(): path
        for path in stem.parent.iterdir()
        if path.name.startswith(stem.name)
    }
    return next((spelt[s] for s in suffixes if s in spelt and spelt[s].is_file()), None)


def _raise_if_any(names: Sequence[str], prefix: str) -> None:
    if names:
        raise ValueError(f"{prefix} {len(names)}: {some_of(names)}")


def _absolute(path: PathLike) -> Path:
    return Path(os.path.abspath(path))


CORPORA: dict[str, Callable[..., dict[str, SplitSummary]]] = {
    "an4": prepare_an4,
    "librispeech": prepare_librispeech,
    "yesno": prepare_yesno,
    "folder": prepare_folder,
}
