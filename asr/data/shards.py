"""Training data as WebDataset tar shards, read as a stream.

`write_shards` stores a manifest's audio files unchanged (segments with an `offset` are cut
and stored as FLAC) beside a `<key>.json` of each utterance's text, duration, speaker and id,
and writes `shards.json`: per shard its file, size and utterance durations.

`ShardedSpeechDataset` streams them: each epoch permutes the shards from (seed, epoch), splits
them over ranks and then DataLoader workers, and passes each (rank, worker) stream through a
seeded shuffle buffer and a length bucketer. The same pipeline run on the index alone plans
every stream's batches, so every stream yields the same number of batches (the longest
plan's; shorter streams start over) and a resume skips exactly the batches already trained.
Audio is decoded only for batches that are yielded.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import soundfile
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from tqdm import tqdm

from asr.audio import load_audio_with_rate, resample, sample_problem, states_frames
from asr.data.augment import WaveAugmenter
from asr.data.dataset import TextEncoder, check_speed_factors
from asr.data.manifest import (
    DURATION_TOLERANCE,
    MIN_DURATION,
    Utterance,
    format_bad_entries,
    validate_manifest,
)
from asr.data.sampler import LengthGrid
from asr.perturb import change_speed, other_indices, speed_seconds
from asr.text import has_word_character

logger = logging.getLogger(__name__)

INDEX_NAME = "shards.json"
INDEX_FORMAT = "asr-shards"
INDEX_VERSION = 2
DURATION_DECIMALS = 3  # the index's durations, in ms
SHARD_NAME = "shard-{:06d}.tar"
DEFAULT_SHARD_HOURS = 1.0
DEFAULT_SHUFFLE_BUFFER = 500
# a file up to this much longer than its utterance is stored whole; a longer one, the segment
WHOLE_FILE_SLACK = 0.01
# (member suffix, format, subtype) of a segment by its file's subtype: its bits kept, floats
# beyond ±1 too (FLAC holds integers)
SEGMENT_FORMATS = {
    "PCM_24": ("flac", "FLAC", "PCM_24"),
    "PCM_32": ("wav", "WAV", "FLOAT"),
    "FLOAT": ("wav", "WAV", "FLOAT"),
    "DOUBLE": ("wav", "WAV", "FLOAT"),
}
FASTEST_KEPT = 32  # fastest-spoken utterances kept in the index for the output length bound
# Draws of one epoch: kept apart by the last element of their seeds.
_SHARD_ORDER, _SHUFFLE, _SPEED, _AUGMENT = 0, 1, 2, 3

T = TypeVar("T")
# (shard's position in the index, utterance's position in the shard, its tar sample or None)
Member = tuple[int, int, "dict[str, bytes] | None"]
Role = tuple[int, int]  # (rank, worker)


class ShardError(ValueError):
    """Shards that cannot be read as their index says; the message names the file."""


# ----------------------------------------------------------------------------- the index


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the index lists it."""

    file: str  # name inside the shard folder
    bytes: int  # size of the tar file
    durations: np.ndarray  # (N,) seconds of each utterance, in tar order, rounded to ms
    keys: tuple[str, ...] | None = None  # each sample's key, in tar order (None: not recorded)

    @property
    def count(self) -> int:
        return len(self.durations)

    @property
    def seconds(self) -> float:
        return float(self.durations.sum())


@dataclass(frozen=True)
class ShardIndex:
    """`shards.json` of a shard folder: what planning an epoch needs, no audio."""

    folder: Path
    shards: tuple[ShardInfo, ...]
    sample_rates: tuple[int, ...]  # the rates of the stored audio
    words: tuple[str, ...]  # the texts' distinct words, for the tokenizer's vocabulary check
    wordless: tuple[str, ...]  # texts without a letter or digit: maybe empty targets
    fastest: tuple[Utterance, ...]  # the highest characters per second (text, duration, id)

    @property
    def offsets(self) -> np.ndarray:
        """`(S + 1,)` global index of each shard's first utterance, then the total."""
        return np.cumsum([0] + [shard.count for shard in self.shards])

    @property
    def durations(self) -> np.ndarray:
        """`(N,)` every utterance's duration in seconds, shard after shard."""
        if not self.shards:
            return np.zeros(0)
        return np.concatenate([shard.durations for shard in self.shards])

    def path(self, shard: int) -> Path:
        return self.folder / self.shards[shard].file

    @cached_property  # each step checkpoint records it
    def identity(self) -> str:
        """A digest of the shards' files, sizes and durations: a folder written again (other
        shards, another plan of batches) has another."""
        digest = hashlib.sha256()
        for shard in self.shards:
            digest.update(f"{shard.file}:{shard.bytes}:".encode())
            digest.update(np.round(shard.durations, DURATION_DECIMALS).tobytes())
        return digest.hexdigest()[:16]

    def check_files(self) -> None:
        """Raise a ShardError naming every shard file that is missing or not the indexed size."""
        problems = []
        for k, shard in enumerate(self.shards):
            path = self.path(k)
            if not path.is_file():
                problems.append(f"{path}: shard file not found")
            elif path.stat().st_size != shard.bytes:
                size = path.stat().st_size
                problems.append(f"{path}: {size} bytes, the index says {shard.bytes}")
        if problems:
            raise ShardError(
                "\n".join(problems) + f"\n(index {self.folder / INDEX_NAME}; rewrite the shards "
                "with `asr shard`)"
            )


def is_shard_folder(path: str | os.PathLike) -> bool:
    """Whether a data path names shards rather than a manifest: a folder, its shards.json, or
    a path not yet written that does not end in .jsonl (its error then speaks of shards).

    Args:
        path: `data.train_manifest` as configured.

    Returns:
        True for shards, False for a JSONL manifest.

    >>> is_shard_folder("data/missing/train.jsonl"), is_shard_folder("data/missing/shards")
    (False, True)
    """
    path = Path(path)
    if path.is_dir() or path.name == INDEX_NAME:
        return True
    return not path.exists() and path.suffix.lower() != ".jsonl"


def read_index(path: str | os.PathLike) -> ShardIndex:
    """Read a shard folder's index.

    Args:
        path: the shard folder, or its shards.json.

    Returns:
        The index: shard files, sizes and durations (no audio is read).

    Raises:
        ShardError: the index is missing or unreadable.
    """
    path = Path(path)
    folder = path.parent if path.name == INDEX_NAME else path
    index_path = folder / INDEX_NAME
    try:
        record = json.loads(index_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ShardError(
            f"{index_path}: shard index not found (write shards with `asr shard --manifest M "
            f"--out {folder}`)"
        ) from None
    except (OSError, ValueError) as error:
        raise ShardError(f"{index_path}: unreadable shard index ({error})") from None
    if not isinstance(record, dict) or record.get("format") != INDEX_FORMAT:
        raise ShardError(f"{index_path}: not a shard index of `asr shard`")
    if record.get("version") != INDEX_VERSION:
        raise ShardError(
            f"{index_path}: index version {record.get('version')!r}, this asr reads "
            f"{INDEX_VERSION}: write the shards again with `asr shard` (a recipe's shard "
            "stage: --force)"
        )
    for shard in record["shards"]:
        keys = shard.get("keys")  # None in an index of before they were listed
        if keys is not None and shard["durations"] and not (  # an empty one: named below
            isinstance(keys, list) and len(keys) == len(shard["durations"])
            and all(isinstance(key, str) for key in keys)
        ):  # fmt: skip
            raise ShardError(
                f"{index_path}: the keys of {shard['file']} are not one per utterance: write "
                "the shards again with `asr shard`"
            )
    shards = tuple(
        ShardInfo(s["file"], int(s["bytes"]), np.asarray(s["durations"], dtype=np.float64),
                  None if s.get("keys") is None else tuple(s["keys"]))
        for s in record["shards"]
    )  # fmt: skip
    empty = [shard.file for shard in shards if not len(shard.durations)]
    if empty:  # a stream given only it would yield nothing, and its ranks wait on it
        raise ShardError(
            f"{index_path}: {empty[0]} holds no utterance: write the shards again with `asr shard`"
        )
    fastest = tuple(Utterance("", float(d), t, id=i) for t, d, i in record["fastest"])
    return ShardIndex(
        folder, shards, tuple(record["sample_rates"]), tuple(record["words"]),
        tuple(record["wordless"]), fastest,
    )  # fmt: skip


# ----------------------------------------------------------------------------- writing


def write_shards(
    manifest: str | os.PathLike,
    out: str | os.PathLike,
    shard_hours: float = DEFAULT_SHARD_HOURS,
    progress: bool = False,
) -> ShardIndex:
    """Write a manifest's utterances as WebDataset tar shards and their index.

    Each utterance is `<key>.<suffix>` (the audio file's bytes unchanged; a segment with an
    offset, or a format libsndfile cannot read, decoded and stored as FLAC) and `<key>.json`
    (id, text, duration, speaker). Shards follow the manifest's order and hold at most
    `shard_hours` of audio each (an utterance longer than that has a shard of its own).

    Args:
        manifest: JSONL manifest; its lines and audio headers are checked first (as
            `validate_manifest` does), and a bad one stops it before a shard is written.
        out: shard folder; `shards.json` is written last (an earlier set's removed first), so
            a reader never sees a partial set.
        shard_hours: most audio per shard, hours.
        progress: a progress bar on stderr.

    Returns:
        The index written.
    """
    if not shard_hours > 0:
        raise ValueError(f"shard_hours must be > 0, got {shard_hours}")
    import webdataset

    report = validate_manifest(manifest, check_audio=True)
    if report.bad:
        raise ValueError(
            f"{format_bad_entries(report.bad)}\n{report.summary()}: fix or leave out these lines "
            "(`asr validate-data` lists them)"
        )
    utterances = report.good
    if not utterances:
        raise ValueError(f"{manifest}: no utterances to shard")
    short = sum(u.duration < MIN_DURATION for u in utterances)
    if short:  # `asr fit` refuses the folder then, not each of them
        logger.warning(
            "%s: %d utterance(s) shorter than %g s, which `asr fit` refuses by default "
            "(data.min_duration): `asr validate-data --manifest %s` names them",
            manifest, short, MIN_DURATION, manifest,
        )  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # an earlier set's index goes first: stopped halfway, shards of this set would otherwise
    # pass for that set's (a tar's size is rounded to whole records)
    (out / INDEX_NAME).unlink(missing_ok=True)
    groups = _group_by_seconds([u.duration for u in utterances], shard_hours * 3600)
    keys = _member_keys([u.utt_id for u in utterances])
    records, rates = [], set()
    bar = tqdm(total=len(utterances), desc="shards", unit="utt", disable=not progress)
    for number, (start, stop) in enumerate(groups):
        name = SHARD_NAME.format(number)
        partial = out / (name + ".partial")
        try:
            with webdataset.TarWriter(str(partial), encoder=False, mtime=0) as writer:
                for utterance, key in zip(utterances[start:stop], keys[start:stop]):
                    suffix, data, rate = _stored_audio(utterance)
                    rates.add(rate)
                    writer.write({"__key__": key, suffix: data, "json": _member_json(utterance)})
                    bar.update()
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, out / name)
        durations = [round(u.duration, DURATION_DECIMALS) for u in utterances[start:stop]]
        size = (out / name).stat().st_size
        records.append({"file": name, "bytes": size, "utterances": stop - start,
                        "seconds": round(sum(durations), 3), "durations": durations,
                        "keys": keys[start:stop]})  # fmt: skip
    bar.close()
    _write_index(out, manifest, records, sorted(rates), utterances)
    written = {record["file"] for record in records}
    pattern = SHARD_NAME.replace("{:06d}", "*")
    # an earlier, larger set's shards, and the partial shard of a run killed while writing it
    for stale in [*out.glob(pattern), *out.glob(pattern + ".partial")]:
        if stale.name not in written:
            stale.unlink()
    return read_index(out)


def _group_by_seconds(durations: Sequence[float], limit: float) -> list[tuple[int, int]]:
    """Consecutive `[start, stop)` runs of at most `limit` seconds (at least one item each).

    >>> _group_by_seconds([2, 2, 3, 5, 1], 4)
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    groups, start, total = [], 0, 0.0
    for k, duration in enumerate(durations):
        if k > start and total + duration > limit:
            groups.append((start, k))
            start, total = k, 0.0
        total += duration
    groups.append((start, len(durations)))
    return groups


def _member_keys(ids: Sequence[str]) -> list[str]:
    """Tar keys from utterance ids: no dots (WebDataset splits the suffix at the first), unique.

    >>> _member_keys(["a.b", "a_b-2", "a_b", "c/d"])
    ['a_b', 'a_b-2', 'a_b-2-2', 'c_d']
    """
    keys, seen = [], set()
    for k, utt_id in enumerate(ids):
        key = re.sub(r"[^\w-]", "_", utt_id) or "utt"
        while key in seen:  # a renamed key may be another id's own
            key = f"{key}-{k}"
        seen.add(key)
        keys.append(key)
    return keys


def _member_json(utterance: Utterance) -> bytes:
    record = {"id": utterance.utt_id, "text": utterance.text, "duration": utterance.duration}
    if utterance.speaker is not None:
        record["speaker"] = utterance.speaker
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def _stored_audio(utterance: Utterance) -> tuple[str, bytes, int]:
    """(member suffix, bytes, sample rate): the file as it is where the utterance is all of it,
    else the segment as FLAC of the file's bit depth (float samples: as float WAV; a format
    libsndfile cannot read: 16-bit FLAC)."""
    path = Path(utterance.audio_filepath)
    subtype = "PCM_16"
    if utterance.offset == 0:
        data = path.read_bytes()
        try:  # from the file, not the bytes: a signal in soundfile's callbacks would be lost
            info = soundfile.info(str(path))
        except Exception:  # libsndfile cannot read this format: stored as FLAC
            pass
        else:
            stated = states_frames(info.frames)  # else read whole and stored as FLAC
            if stated and info.frames / info.samplerate <= utterance.duration + WHOLE_FILE_SLACK:
                return path.suffix.lower().lstrip(".") or "wav", data, info.samplerate
            subtype = info.subtype
    else:
        with contextlib.suppress(Exception):  # a format libsndfile cannot read: 16 bits
            subtype = soundfile.info(str(path)).subtype
    wave, rate = load_audio_with_rate(path, None, utterance.offset, utterance.duration)
    kind = SEGMENT_FORMATS.get(subtype, ("flac", "FLAC", "PCM_16"))
    with tempfile.TemporaryDirectory(prefix="asr-shard-") as scratch:  # a file, not BytesIO:
        encoded = Path(scratch) / f"segment.{kind[0]}"  # no Python callbacks to lose a signal in
        soundfile.write(encoded, wave.numpy(), rate, format=kind[1], subtype=kind[2])
        return kind[0], encoded.read_bytes(), rate


def _write_index(
    out: Path, manifest: str | os.PathLike, records: list, rates: list, utterances: list
) -> None:
    # Words, not characters: normalising joins a character to its neighbours (a combining
    # accent, an apostrophe inside a word), and no text ever spans two words.
    words = sorted({word for u in utterances for word in u.text.split()})
    wordless = sorted({u.text for u in utterances if not has_word_character(u.text)})
    fastest = sorted(utterances, key=lambda u: (-len(u.text) / u.duration, u.utt_id))
    index = {
        "format": INDEX_FORMAT,
        "version": INDEX_VERSION,
        "manifest": str(manifest),
        "sample_rates": rates,
        "utterances": len(utterances),
        "seconds": round(sum(r["seconds"] for r in records), 3),
        "words": words,
        "wordless": wordless,
        "fastest": [[u.text, u.duration, u.utt_id] for u in fastest[:FASTEST_KEPT]],
        "shards": records,
    }
    partial = out / (INDEX_NAME + ".partial")
    partial.write_text(json.dumps(index, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, out / INDEX_NAME)


# ----------------------------------------------------------------------------- the pipeline


def epoch_shard_order(num_shards: int, seed: int, epoch: int) -> list[int]:
    """The shards' order in `epoch`: a permutation drawn from (seed, epoch).

    Args:
        num_shards: shards in the index.
        seed: the data seed.
        epoch: the epoch.

    Returns:
        The shards' positions in the index, in the order the epoch reads them.
    """
    rng = np.random.default_rng([seed, epoch, _SHARD_ORDER])
    return [int(k) for k in rng.permutation(num_shards)]


def role_shards(order: Sequence[int], role: Role, world: int, workers: int) -> list[int]:
    """The shards a (rank, worker) stream reads: `order[rank::world][worker::workers]`.

    A worker left without a shard of its own reads a sibling's (the rank's shard `worker`
    modulo their count), so that it still has batches to give.

    Args:
        order: the epoch's shard order (`epoch_shard_order`).
        role: (rank, worker).
        world: ranks.
        workers: streams per rank (DataLoader workers, at least 1).

    Returns:
        The stream's shards, in reading order.

    >>> role_shards([5, 2, 7], (1, 1), world=2, workers=2)
    [2]
    """
    rank, worker = role
    of_rank = list(order[rank::world])
    own = of_rank[worker::workers]
    return own if own or not of_rank else of_rank[worker % len(of_rank) :: workers]


def shuffled(items: Iterable[T], size: int, rng: np.random.Generator) -> Iterator[T]:
    """`items` through a shuffle buffer of `size`: each new item takes a random held one's
    place, which is yielded; the rest come out shuffled at the end.

    Args:
        items: the stream.
        size: items held (0 or 1: no shuffling).
        rng: the stream's generator; the same draws give the same order.

    Returns:
        The items, each once, shuffled within about `size` of their place.

    >>> sorted(shuffled(range(10), 4, np.random.default_rng(0))) == list(range(10))
    True
    >>> list(shuffled(range(4), 0, np.random.default_rng(0)))
    [0, 1, 2, 3]
    """
    if size <= 1:
        yield from items
        return
    buffer: list[T] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        k = int(rng.integers(size))
        buffer[k], item = item, buffer[k]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def bucketed(
    items: Iterable[T],
    length: Callable[[T], float],
    edges: Sequence[float],
    max_batch_length: float,
    max_batch_size: int | None = None,
) -> Iterator[list[T]]:
    """Batches of items of similar length: each bucket (bounded by `edges`) is yielded when
    one more item would make its padded cost `count x longest` exceed `max_batch_length`
    (or its count exceed `max_batch_size`); partial buckets are flushed at the end, in order.

    Args:
        items: the stream.
        length: an item's length as the budget counts it (seconds, padded).
        edges: increasing upper bounds of the buckets but the last.
        max_batch_length: budget of `count x longest` per batch.
        max_batch_size: most items per batch (None: no limit).

    Returns:
        Batches (lists of items); every item in exactly one.

    >>> list(bucketed([1, 9, 2, 8, 1], float, [5], max_batch_length=16))
    [[9], [1, 2, 1], [8]]
    """
    buckets: list[list[T]] = [[] for _ in range(len(edges) + 1)]
    longest = [0.0] * len(buckets)
    for item in items:
        n = length(item)
        b = bisect.bisect_left(edges, n)
        full = max_batch_size is not None and len(buckets[b]) >= max_batch_size
        if buckets[b] and (full or (len(buckets[b]) + 1) * max(longest[b], n) > max_batch_length):
            yield buckets[b]
            buckets[b], longest[b] = [], 0.0
        buckets[b].append(item)
        longest[b] = max(longest[b], n)
    yield from (bucket for bucket in buckets if bucket)


def bucket_edges(durations: np.ndarray, num_buckets: int) -> list[float]:
    """Upper edges of `num_buckets` duration quantiles (fewer where durations repeat).

    Args:
        durations: `(N,)` seconds.
        num_buckets: buckets wanted.

    Returns:
        Increasing edges, at most `num_buckets - 1`.

    >>> bucket_edges(np.array([1.0, 2.0, 3.0, 4.0]), 2)
    [2.5]
    """
    if len(durations) == 0 or num_buckets <= 1:
        return []
    quantiles = np.quantile(durations, np.arange(1, num_buckets) / num_buckets)
    return sorted({float(q) for q in quantiles})


# ----------------------------------------------------------------------------- the stream


@dataclass(frozen=True)
class StreamOptions:
    """How the training stream batches the shards."""

    max_batch_seconds: float  # padded seconds per batch: count x longest (speed-perturbed)
    max_batch_size: int | None = None  # most utterances per batch
    num_buckets: int = 20  # duration buckets: quantiles of the index's durations
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER  # utterances held (as bytes) per stream
    speed_perturb: Sequence[float] | None = None  # speed factors drawn per utterance and epoch
    seed: int = 0  # shard order, shuffle buffers, speed factors and augmentation


class ShardedSpeechDataset(IterableDataset):
    """Batches of ``id``/``wave``/``text``/``tokens`` item dicts streamed from shards, for a
    DataLoader with ``batch_size=None`` and `collate` as its collate function.

    Args:
        index: the shard index (`read_index`); its files are checked here.
        tokenizer: encodes the texts into ``tokens``; None: items without tokens.
        options: batching, shuffling and perturbation settings.
        sample_rate: audio is resampled to this rate.
        num_replicas: DDP world size.
        rank: this process's rank.
        num_workers: the DataLoader's worker processes (0: in this process).
        augment: waveform augmentation (babble talkers: the other utterances of the batch).
        grid: batch cost at the grid's padded lengths (the collate function pads to it).
    """

    def __init__(
        self,
        index: ShardIndex,
        tokenizer: TextEncoder | None,
        options: StreamOptions,
        sample_rate: int = 16000,
        num_replicas: int = 1,
        rank: int = 0,
        num_workers: int = 0,
        augment: WaveAugmenter | None = None,
        grid: LengthGrid | None = None,
    ) -> None:
        _check_stream(index, options, num_replicas, rank, num_workers)
        index.check_files()
        self.index = index
        self.tokenizer = tokenizer
        self.options = options
        self.speed_perturb = check_speed_factors(options.speed_perturb)
        self.sample_rate = sample_rate
        self.num_replicas, self.rank = num_replicas, rank
        self.num_workers = num_workers
        self.augment = augment
        self.grid = grid
        self._offsets = index.offsets
        self._durations = index.durations
        self._edges = bucket_edges(self._durations, options.num_buckets)
        self._counts: tuple[int, dict[Role, int]] | None = None
        self._factors: tuple[int, np.ndarray, np.ndarray] | None = None  # epoch, factors, lengths
        self._logged_repeats = False
        # Shared memory, so DataLoader workers see the epoch and resume point set here:
        # [epoch, batches to skip, then batches yielded per worker].
        self._state = torch.zeros(2 + self.streams, dtype=torch.int64).share_memory_()
        if rank == 0 and self.borrowing_streams():
            logger.warning(
                "%d shards over %d rank(s) x %d stream(s): streams %s have no shard of their own "
                "and read a sibling's (their utterances come twice an epoch); write at least "
                "%d shards (a smaller `asr shard --shard-hours`)",
                len(index.shards), num_replicas, self.streams, self.borrowing_streams(),
                num_replicas * self.streams,
            )  # fmt: skip

    # ------------------------------------------------------------------ epoch and position

    @property
    def streams(self) -> int:
        """Streams of this rank: one per DataLoader worker (one without workers)."""
        return max(self.num_workers, 1)

    @property
    def epoch(self) -> int:
        return int(self._state[0])

    @property
    def seed(self) -> int:
        return self.options.seed

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to stream; a pending resume point holds for its own epoch."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._state[1:] = 0
        self._state[0] = epoch

    def state_dict(self) -> dict[str, Any]:
        """Position for mid-epoch resume: the epoch, the batches yielded (prefetched too), and
        the streams they were dealt to (another count deals other batches)."""
        yielded = int(self._state[1] + self._state[2:].sum())
        return {
            "epoch": self.epoch,
            "batches_yielded": yielded,
            "seed": self.options.seed,
            "streams": self.streams,
            "index": self.index.identity,
            "plan": self.plan_digest(),
        }

    def plan_digest(self) -> str:
        """A digest of what deals the epoch's batches but the shards (`index`) and streams:
        the batching options and grid. A resume under others would skip batches of another
        plan, leaving utterances untrained."""
        options = replace(self.options, speed_perturb=list(self.options.speed_perturb or []))
        grid = None if self.grid is None else self.grid.ratio
        return hashlib.blake2b(repr((options, grid)).encode(), digest_size=8).hexdigest()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position (and the seed): the next iteration skips the batches yielded."""
        missing = {"epoch", "batches_yielded", "seed"} - set(state)
        if missing:
            raise ValueError(f"stream state_dict lacks keys {sorted(missing)}")
        if int(state["seed"]) != self.options.seed:
            self.options = replace(self.options, seed=int(state["seed"]))
            self._counts = self._factors = None
        self._state[0] = int(state["epoch"])
        self._state[1] = int(state["batches_yielded"])
        self._state[2:] = 0

    def __len__(self) -> int:
        """Batches this rank yields in the whole epoch (a resumed iteration yields fewer)."""
        return self.streams * self.batches_per_stream()

    # ------------------------------------------------------------------ planning

    def batches_per_stream(self, epoch: int | None = None) -> int:
        """M: the most batches any (rank, worker) stream plans; every stream yields M."""
        return max(self.plan_counts(epoch).values())

    def plan_counts(self, epoch: int | None = None) -> dict[Role, int]:
        """Batches of every (rank, worker) stream's own pass over its shards, from the index."""
        epoch = self.epoch if epoch is None else epoch
        if self._counts is None or self._counts[0] != epoch:
            counts = {
                role: sum(1 for _ in self._batches(epoch, role, read=False))
                for role in self._roles()
            }
            self._counts = (epoch, counts)
            self._log_repeats(epoch, counts)
        return self._counts[1]

    def planned_batches(self, epoch: int, role: Role) -> list[list[tuple[int, int]]]:
        """The (shard, position) members of each batch of a stream's own pass, from the index."""
        return [[m[:2] for m in batch] for batch in self._batches(epoch, role, read=False)]

    def global_index(self, shard: int, position: int) -> int:
        """The utterance's position in the whole index (its speed and augmentation draws)."""
        return int(self._offsets[shard]) + position

    def borrowing_streams(self) -> list[Role]:
        """The (rank, worker) streams that have no shard of their own (see `role_shards`)."""
        shards = len(self.index.shards)
        per_rank = [
            len(range(rank, shards, self.num_replicas)) for rank in range(self.num_replicas)
        ]
        return [(r, w) for r, w in self._roles() if w >= per_rank[r]]

    def _roles(self) -> list[Role]:
        return [(r, w) for r in range(self.num_replicas) for w in range(self.streams)]

    def _batches(self, epoch: int, role: Role, read: bool) -> Iterator[list[Member]]:
        """A stream's pipeline: its shards' members, shuffled, bucketed. Without `read`, the
        members carry no sample: the plan, from the index alone."""
        order = epoch_shard_order(len(self.index.shards), self.options.seed, epoch)
        shards = role_shards(order, role, self.num_replicas, self.streams)
        members = self._read(shards) if read else self._members(shards)
        rng = np.random.default_rng([self.options.seed, epoch, *role, _SHUFFLE])
        lengths = self._lengths(epoch)
        o = self.options

        def length(member: Member) -> float:
            seconds = lengths[self.global_index(member[0], member[1])]
            return seconds if self.grid is None else self.grid.edge(seconds)

        stream = shuffled(members, o.shuffle_buffer, rng)
        return bucketed(stream, length, self._edges, o.max_batch_seconds, o.max_batch_size)

    def _members(self, shards: list[int]) -> Iterator[Member]:
        for shard in shards:
            for position in range(self.index.shards[shard].count):
                yield shard, position, None

    def _read(self, shards: list[int]) -> Iterator[Member]:
        """Members with their tar samples; those the tar file cannot give come with None.
        A sample lost whole (corrupt headers) leaves its place empty: the next ones are
        placed by their keys, which the index lists in tar order (by their durations in an
        index of before it did)."""
        for shard in shards:
            samples, path = tar_samples(self.index.path(shard)), self.index.path(shard)
            info = self.index.shards[shard]
            sample = None
            for position in range(info.count):
                if sample is None:
                    try:
                        sample = next(samples, None)
                    except Exception as error:  # a truncated file: the rest of it is lost
                        sample, samples = None, iter(())
                        logger.warning("%s: unreadable after member %d (%s)", path, position, error)
                if sample is not None and not _sample_at(sample, info, position):
                    yield shard, position, None  # lost: the sample is a later member's
                    continue
                yield shard, position, sample
                sample = None

    def _lengths(self, epoch: int) -> np.ndarray:
        """`(N,)` seconds of every utterance in `epoch`, after its speed factor."""
        return self._draws(epoch)[1]

    def _speed_factors(self, epoch: int) -> np.ndarray:
        """`(N,)` every utterance's speed factor in `epoch`."""
        return self._draws(epoch)[0]

    def _draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._factors is None or self._factors[0] != epoch:
            factors = np.ones(len(self._durations))
            if self.speed_perturb:
                rng = np.random.default_rng([self.options.seed, epoch, _SPEED])
                drawn = rng.integers(len(self.speed_perturb), size=len(factors))
                factors = np.asarray(self.speed_perturb)[drawn]
            seconds = speed_seconds(self._durations, factors, self.sample_rate)
            self._factors = (epoch, factors, seconds)
        return self._factors[1], self._factors[2]

    def _log_repeats(self, epoch: int, counts: dict[Role, int]) -> None:
        """Say once (rank 0, main process) how many batches streams repeat to even out."""
        if self.rank != 0 or get_worker_info() is not None:
            return
        most = max(counts.values())
        repeated = sum(most - n for n in counts.values())
        if not repeated:
            return
        log = logger.debug if self._logged_repeats else logger.warning
        self._logged_repeats = True
        log(
            "epoch %d: the %d (rank, worker) streams plan %d to %d batches; shorter streams "
            "start over to give %d each (%d repeated batches in all; more, smaller or more "
            "even shards repeat fewer)",
            epoch, len(counts), min(counts.values()), most, most, repeated,
        )  # fmt: skip

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        if info is not None and info.num_workers != self.streams:
            raise ValueError(
                f"the DataLoader has {info.num_workers} workers; this dataset was planned "
                f"for num_workers={self.num_workers}"
            )
        epoch, resume_at = self.epoch, int(self._state[1])
        # The DataLoader takes batches from its workers in turn: worker w now plays the
        # stream whose turn the resumed position k + w was, from that stream's batch.
        role = (self.rank, (resume_at + worker) % self.streams)
        start = (resume_at + worker) // self.streams
        return self._yield(epoch, role, start, worker)

    def _yield(self, epoch: int, role: Role, start: int, slot: int) -> Iterator[list[dict]]:
        """Batches `start` to M - 1 of a stream that starts over after its own pass."""
        total, own = self.batches_per_stream(epoch), self.plan_counts(epoch)[role]
        if not own:
            return
        # Whole passes before the one holding batch `start - 1` (the fallback) are not read.
        position = (start - 1) // own * own if start else 0
        previous: list[Member] = []
        owed: list[Member] = []  # a stream's first batch, where none of it decoded
        while position < total:
            for batch in self._batches(epoch, role, read=True):
                if position >= total:
                    break
                if position >= start:
                    items = self._decoded(epoch, batch, previous)
                    if items is None:  # the first: the next batch is trained in its place
                        owed = batch
                    else:
                        for _ in range(2 if owed else 1):
                            self._state[2 + slot] += 1
                            yield items
                        if owed:
                            logger.warning("a batch lost every utterance: the next batch is "
                                           "trained in its place too")  # fmt: skip
                            owed = []
                previous = batch
                position += 1
        if owed:  # a stream of one batch, none of it decoded
            raise self._undecodable(owed, "the stream's one batch")

    def _decoded(
        self, epoch: int, batch: list[Member], previous: list[Member]
    ) -> list[dict] | None:
        """The items of `batch` that decode; if none does, the previous batch's again; None
        for a stream's first batch (no previous) that decodes to nothing."""
        items = self._items(epoch, batch)
        if items:
            return items
        if not previous:
            return None
        items = self._items(epoch, previous)
        if not items:
            raise self._undecodable(batch + previous, "two successive batches")
        logger.warning("a batch lost every utterance: the previous batch is trained again")
        return items

    def _undecodable(self, members: list[Member], what: str) -> ShardError:
        names = sorted({str(self.index.path(m[0])) for m in members})
        return ShardError(
            f"no utterance of {what} could be decoded (shards {names}); check the shards or "
            "write them again"
        )

    def _items(self, epoch: int, batch: list[Member]) -> list[dict[str, Any]]:
        """The batch's items that decode, speed-changed, then augmented."""
        decoded = [(member, self._decode(member)) for member in batch]
        decoded = [(member, item) for member, item in decoded if item is not None]
        # Babble talkers are the batch's other waves at speed 1, as SpeechDataset's are.
        raw = [item["wave"] for _, item in decoded]
        factors = self._speed_factors(epoch)
        augment = self.augment is not None and self.augment.applies_in(epoch)
        for k, (member, item) in enumerate(decoded):
            index = self.global_index(member[0], member[1])
            item["wave"] = change_speed(item["wave"], float(factors[index]))
            if augment:
                item["wave"] = self._augmented(epoch, index, item["wave"], raw, k)
        return [item for _, item in decoded]

    def _decode(self, member: Member) -> dict[str, Any] | None:
        """The item of one member (its waveform as stored), or None, logged, if it fails."""
        shard, position, sample = member
        if sample is None:
            keys = self.index.shards[shard].keys
            named = f"member {position}" if keys is None else keys[position]
            logger.warning(
                "%s: %s could not be read (a corrupt or truncated tar file); utterance skipped",
                self.index.path(shard), named,
            )  # fmt: skip
            return None
        try:
            meta = json.loads(sample["json"])
            suffix = next((k for k in sample if not k.startswith("_") and k != "json"), None)
            if suffix is None:
                raise ValueError("no audio member")
            wave = decode_audio(sample[suffix], float(meta["duration"]), self.sample_rate)
            item = {"id": meta["id"], "wave": wave, "text": meta["text"]}
            if self.tokenizer is not None:
                item["tokens"] = torch.tensor(self.tokenizer.encode(item["text"]), dtype=torch.long)
        except Exception as error:  # whatever a corrupt member raises, it costs one utterance
            logger.warning(
                "%s: %s cannot be decoded (%s); utterance skipped",
                self.index.path(shard), sample.get("__key__"), error,
            )  # fmt: skip
            return None
        return item

    def _augmented(self, epoch: int, index: int, wave: Tensor, raw: list[Tensor], k: int) -> Tensor:
        """`wave` augmented with its (seed, epoch, index) draws; babble: the batch's others."""
        rng = np.random.default_rng([self.options.seed, epoch, index, _AUGMENT])

        def others(rng: np.random.Generator, count: int) -> list[Tensor]:
            # An utterance alone in its batch babbles over itself, at other offsets.
            picks = other_indices(rng, len(raw), count, k) if len(raw) > 1 else [k]
            return [raw[j] for j in picks]

        return self.augment(wave, rng, others)

    # ------------------------------------------------------------------ size for Lightning

    @property
    def durations(self) -> list[float]:
        """Every utterance's duration in seconds (from the index)."""
        return self._durations.tolist()

    @property
    def utterances(self) -> list[Utterance]:
        """The only utterances held in memory: the index's fastest-spoken, for the output
        length bound (`asr.search.fastest_speech`)."""
        return list(self.index.fastest)


def _check_stream(
    index: ShardIndex, options: StreamOptions, world: int, rank: int, workers: int
) -> None:
    if not options.max_batch_seconds > 0:
        raise ValueError(f"max_batch_seconds must be > 0, got {options.max_batch_seconds}")
    if options.shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer must be >= 0, got {options.shuffle_buffer}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {workers}")
    if len(index.shards) < world:
        raise ShardError(
            f"{index.folder}: {len(index.shards)} shard(s) cannot feed {world} ranks; write "
            "at least one per rank (a smaller `asr shard --shard-hours`)"
        )


def _sample_at(sample: dict[str, Any], shard: ShardInfo, position: int) -> bool:
    """Whether a tar sample is the shard's member at `position`: by its key, or where the
    index has none, by its duration (a sample without a duration is taken as that member)."""
    if shard.keys is not None:
        key = sample.get("__key__")
        return key == shard.keys[position] or key not in shard.keys[position:]
    try:
        duration = round(float(json.loads(sample["json"])["duration"]), DURATION_DECIMALS)
    except Exception:  # whatever a corrupt json raises: its decoding names it
        return True
    durations = shard.durations
    return duration == durations[position] or duration not in durations[position:]


def tar_samples(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The samples of a WebDataset tar file, grouped by key as WebDataset does.

    Args:
        path: a tar file written by `write_shards` (or any WebDataset tar).

    Returns:
        `{"__key__": key, "__url__": path, suffix: bytes, ...}` per sample, in tar order.
    """
    from webdataset.tariterators import group_by_keys

    yield from group_by_keys(_tar_files(path))


def _tar_files(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The regular files of a tar file as WebDataset's grouping takes them. Past a corrupt
    header, tarfile's stream mode ends as at the archive's end, losing every member after it:
    read seekable, with `ignore_zeros`, it steps over the bad block to the next header, so the
    one member is lost (and named: its sample lacks a part)."""
    import tarfile

    size = os.path.getsize(path)
    with tarfile.open(path, mode="r:", ignore_zeros=True) as tar:
        while True:
            try:
                info = tar.next()
            except tarfile.ReadError:
                if tar.offset >= size:  # the file ends inside a member: the rest is lost
                    raise
                tar.offset += tarfile.BLOCKSIZE  # a bad header after an extended (PAX) one,
                continue  # which ignore_zeros does not step over
            if info is None:
                return
            if info.isreg():
                data = tar.extractfile(info)
                yield {
                    "fname": info.name,
                    "data": data.read() if data else b"",
                    "__url__": str(path),
                }
            tar.members = []  # held for random access, which a stream needs not


def decode_audio(data: bytes, duration: float, sample_rate: int | None) -> Tensor:
    """`duration` seconds from the start of an audio file's bytes, as `asr.audio.load_audio`
    reads the file.

    Args:
        data: the file's bytes (any format libsndfile reads: WAV, FLAC, Ogg Opus, SPHERE...).
        duration: seconds to read from the start (the manifest's duration).
        sample_rate: resample to this rate; None: the file's own.

    Returns:
        Mono float32 `(T,)`.

    Raises:
        ValueError: the bytes do not decode, or decode to nothing, to less than `duration`
            or to unusable samples.
    """
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as file:
            rate = file.samplerate
            frames = file.read(max(1, round(duration * rate)), dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as error:
        raise ValueError(f"unreadable or corrupt audio ({error})") from error
    wave = torch.from_numpy(frames.mean(axis=1, dtype=np.float32))
    if wave.numel() == 0:
        raise ValueError("no samples could be decoded")
    decoded = wave.numel() / rate
    if decoded + DURATION_TOLERANCE < duration:  # a codec that skips what it cannot read
        raise ValueError(
            f"decodes to {decoded:.3f} s, not the {duration:.3f} s its index says (cut short?)"
        )
    problem = sample_problem(wave)
    if problem is not None:
        raise ValueError(problem)
    if sample_rate is None or sample_rate == rate:
        return wave
    return resample(wave, rate, sample_rate)


def stream_loader(
    dataset: ShardedSpeechDataset, collate_fn: Callable[[list], Any], seed: int = 0
) -> DataLoader:
    """A DataLoader over the stream's batches, with as many workers as the stream plans for.

    Args:
        dataset: the stream.
        collate_fn: pads a list of items into a batch (`asr.data.dataset.collate`).
        seed: seeds the workers' base seed (the global RNG is left alone).

    Returns:
        The DataLoader; `len()` is the rank's batches in the epoch.
    """
    workers = dataset.num_workers
    return DataLoader(
        dataset,
        batch_size=None,
        collate_fn=collate_fn,
        num_workers=workers,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(seed),
    )


def check_vocabulary(index: ShardIndex, tokenizer: Any) -> None:
    """Raise a ShardError naming what the tokenizer cannot encode: characters outside its
    vocabulary, and texts it normalises to nothing (empty targets), as validate-data does.

    Args:
        index: the shard index (its `words` and `wordless` texts).
        tokenizer: asr.text.Tokenizer.
    """
    unknown = list(dict.fromkeys(ch for word in index.words for ch in tokenizer.oov(word)))
    if unknown:
        raise ShardError(
            f"{index.folder}: texts hold characters outside the tokenizer's vocabulary: "
            + " ".join(repr(ch) for ch in unknown)
        )
    # Only a text without a letter or digit can normalise to nothing.
    empty = [text for text in index.wordless if not tokenizer.encode(text)]
    if empty:
        raise ShardError(
            f"{index.folder}: {len(empty)} distinct texts leave no tokens after the tokenizer's "
            f"normalisation (empty targets), e.g. {empty[0]!r}: shard a manifest without them "
            "(asr validate-data --tokenizer names them)"
        )
