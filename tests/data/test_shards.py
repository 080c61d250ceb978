"""WebDataset shards (asr.data.shards): writing and the index, the stream's plan against what
it yields, its split over ranks and workers, exact resume, bad shards; `asr shard`; and
`asr fit` on shards, in one process, under DDP and killed then resumed (slow)."""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import warnings
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import soundfile
import test_lightning
import torch
from conftest import REPO, encode_audio, run_forked, without_sample_count

from asr.audio import audio_info, load_audio
from asr.cli import main
from asr.data.dataset import collate
from asr.data.manifest import Utterance, read_manifest, write_manifest
from asr.data.sampler import LengthGrid
from asr.data.shards import (
    INDEX_NAME,
    ShardedSpeechDataset,
    ShardError,
    StreamOptions,
    _group_by_seconds,
    _stored_audio,
    bucketed,
    check_vocabulary,
    decode_audio,
    read_index,
    role_shards,
    stream_loader,
    tar_samples,
    write_shards,
)
from asr.lightning import ASRDataModule
from asr.text import CharTokenizer

SR = 16000
WORDS = ["YES", "NO", "GO", "STOP", "ONE", "TWO", "SIX"]
# (suffix, soundfile format and subtype, rate); m4a: a format libsndfile cannot read
FORMATS = [
    (".wav", {"subtype": "PCM_16"}, SR),
    (".flac", {"format": "FLAC", "subtype": "PCM_16"}, SR),
    (".opus", {"format": "OGG", "subtype": "OPUS"}, SR),
    (".sph", {"format": "NIST", "subtype": "PCM_16"}, SR),
    (".wav", {"subtype": "PCM_16"}, 8000),
    (".m4a", None, SR),
]
SHARD_SECONDS = 6.0


def _wave(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * rng.uniform(150, 900) * t)
    return (tone + 0.02 * rng.standard_normal(len(t))).astype(np.float32)


def _write(path: Path, wave: np.ndarray, rate: int, options: dict | None) -> Path:
    if options is None:
        return encode_audio(path, wave, rate)
    soundfile.write(path, wave, rate, **options)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Thirty utterances of 0.3-1.6 s in every format (one ending in m4a), two of them
    segments of a longer WAV (`offset`), and their manifest."""
    root = tmp_path_factory.mktemp("shard_corpus")
    rng = np.random.default_rng(0)
    utterances = []
    for k in range(28):
        suffix, options, rate = FORMATS[k % len(FORMATS)]
        seconds = round(float(rng.uniform(0.3, 1.6)), 2)
        path = _write(root / f"u{k:02d}{suffix}", _wave(rng, seconds, rate), rate, options)
        text = " ".join(rng.choice(WORDS, size=1 + k % 3))
        seconds = min(seconds, audio_info(path).duration)
        utterances.append(Utterance(str(path), seconds, text, f"u{k:02d}.s{k % 3}", f"s{k % 3}"))
    long = _write(root / "long.wav", _wave(rng, 4.0, SR), SR, {"subtype": "PCM_16"})
    for k, (offset, seconds) in enumerate([(0.5, 1.2), (2.25, 1.5)]):
        utterances.append(Utterance(str(long), seconds, "GO GO", f"seg{k}", "s9", offset=offset))
    write_manifest(root / "train.jsonl", utterances)
    return {"root": root, "manifest": root / "train.jsonl"}


@pytest.fixture(scope="module")
def shards(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    write_shards(corpus["manifest"], out, shard_hours=SHARD_SECONDS / 3600)
    return out


def _ids_by_member(folder: Path) -> dict[tuple[int, int], str]:
    """(shard, position) -> utterance id, read from the tar files."""
    index = read_index(folder)
    return {
        (s, p): json.loads(sample["json"])["id"]
        for s in range(len(index.shards))
        for p, sample in enumerate(tar_samples(index.path(s)))
    }


OPTIONS = StreamOptions(max_batch_seconds=3.0, num_buckets=3, shuffle_buffer=5, seed=7)


def _stream(folder: Path, world: int = 1, rank: int = 0, workers: int = 0, **options):
    index = read_index(folder)
    dataset = ShardedSpeechDataset(
        index, None, StreamOptions(**{**OPTIONS.__dict__, **options}), SR, world, rank, workers
    )
    return dataset


def _epoch(dataset: ShardedSpeechDataset, epoch: int, resume_at: int | None = None) -> list:
    """The utterance ids of each batch the DataLoader yields in `epoch`."""
    dataset.set_epoch(epoch)
    if resume_at is not None:
        dataset.load_state_dict({"epoch": epoch, "batches_yielded": resume_at, "seed": 7})
    return [batch.ids for batch in stream_loader(dataset, collate)]


# ----------------------------------------------------------------------------- writing


def test_shards_keep_the_files_bytes_and_the_manifests_texts_and_durations(corpus, shards):
    utterances = read_manifest(corpus["manifest"])
    index = read_index(shards)
    samples = [s for k in range(len(index.shards)) for s in tar_samples(index.path(k))]
    assert len(samples) == len(utterances)
    for utterance, sample in zip(utterances, samples, strict=True):
        meta = json.loads(sample["json"])
        assert "." not in sample["__key__"], "WebDataset splits the suffix at the first dot"
        assert meta == {"id": utterance.utt_id, "text": utterance.text,
                        "duration": utterance.duration, "speaker": utterance.speaker}  # fmt: skip
        suffix = Path(utterance.audio_filepath).suffix
        if utterance.offset or suffix == ".m4a":
            wave, rate = soundfile.read(io.BytesIO(sample["flac"]), dtype="float32")
            expected = load_audio(utterance.audio_filepath, None, utterance.offset,
                                  utterance.duration)  # fmt: skip
            assert rate == SR and np.abs(wave - expected.numpy()).max() < 1e-4
        else:
            assert sample[suffix[1:]] == Path(utterance.audio_filepath).read_bytes()
    durations = np.concatenate([shard.durations for shard in index.shards])
    assert durations.tolist() == [round(u.duration, 3) for u in utterances]
    assert index.sample_rates == (8000, SR)


def test_each_shard_holds_at_most_shard_hours_in_manifest_order(corpus, shards):
    record = json.loads((shards / INDEX_NAME).read_text())
    assert len(record["shards"]) >= 5
    for shard in record["shards"]:
        assert shard["seconds"] <= SHARD_SECONDS and shard["utterances"] == len(shard["durations"])
        assert (shards / shard["file"]).stat().st_size == shard["bytes"]
    assert _group_by_seconds([5, 1, 9, 2, 2], 6) == [(0, 2), (2, 3), (3, 5)], "long: alone"


def test_a_segment_is_stored_alone_with_its_files_bits(tmp_path):
    """A segment from the start of a long recording is the segment, not the recording; 24-bit
    and float samples (beyond ±1 too) are kept as they were."""
    rng = np.random.default_rng(3)
    loud = tmp_path / "loud.wav"
    soundfile.write(loud, 1.5 * _wave(rng, 6.0, SR) / 0.3, SR, subtype="FLOAT")  # peaks ~1.5
    fine = tmp_path / "fine.wav"
    soundfile.write(fine, _wave(rng, 3.0, SR), SR, subtype="PCM_24")
    utterances = [
        Utterance(str(loud), 1.0, "GO", "loud0"),
        Utterance(str(fine), 1.0, "GO", "fine1", offset=1.0),
        Utterance(str(fine), 3.0, "GO", "fine_all"),
    ]
    write_manifest(tmp_path / "m.jsonl", utterances)
    write_shards(tmp_path / "m.jsonl", tmp_path / "shards")
    samples = {json.loads(s["json"])["id"]: s for s in _all_samples(tmp_path / "shards")}
    for utterance in utterances:
        sample = samples[utterance.id]
        [data] = [v for k, v in sample.items() if k != "json" and not k.startswith("_")]
        expected = load_audio(utterance.audio_filepath, SR, utterance.offset, utterance.duration)
        wave = decode_audio(data, utterance.duration, SR)
        assert torch.equal(wave, expected), utterance.id
        if utterance.id == "fine_all":
            assert data == fine.read_bytes()
        else:
            assert len(data) < 2 * 4 * SR * utterance.duration, "the segment alone"
    assert float(decode_audio(samples["loud0"]["wav"], 1.0, SR).abs().max()) > 1.2


@pytest.mark.parametrize(
    ("value", "said"), [(np.nan, "NaN or infinite"), (1e30, r"within ±1, got 1e\+30")]
)
def test_a_member_of_unusable_samples_is_refused_as_its_file_would_be(tmp_path, value, said):
    """Shards hold files' bytes as they are: their samples are judged when decoded."""
    wave = _wave(np.random.default_rng(5), 1.0, SR)
    wave[100] = value
    soundfile.write(tmp_path / "glitch.wav", wave, SR, subtype="FLOAT")
    with pytest.raises(ValueError, match=said):
        decode_audio((tmp_path / "glitch.wav").read_bytes(), 1.0, SR)


@pytest.mark.parametrize("suffix", ["wav", "flac"])
def test_a_file_whose_header_gives_no_sample_count_is_stored_decodable(tmp_path, suffix):
    """libsndfile reads no samples of such a file, which the stream decodes with: its copy is
    written whole as FLAC."""
    soundfile.write(tmp_path / f"whole.{suffix}", _wave(np.random.default_rng(4), 1.5, SR), SR)
    unstated = tmp_path / f"unstated.{suffix}"
    unstated.write_bytes(without_sample_count(tmp_path / f"whole.{suffix}"))
    write_manifest(tmp_path / "m.jsonl", [Utterance(str(unstated), 1.5, "GO", "unstated")])
    write_shards(tmp_path / "m.jsonl", tmp_path / "shards")
    [sample] = _all_samples(tmp_path / "shards")
    assert set(sample) - {"json", "__key__", "__url__"} == {"flac"}
    expected = load_audio(unstated, SR)
    assert torch.equal(decode_audio(sample["flac"], 1.5, SR), expected)


@pytest.mark.parametrize("k", range(len(FORMATS)))
def test_a_member_decodes_as_load_audio_reads_its_file(corpus, shards, k):
    utterance = read_manifest(corpus["manifest"])[k]
    sample = next(s for s in _all_samples(shards) if json.loads(s["json"])["id"] == utterance.id)
    data = next(v for key, v in sample.items() if not key.startswith("_") and key != "json")
    wave = decode_audio(data, utterance.duration, SR)
    expected = load_audio(utterance.audio_filepath, SR, 0.0, utterance.duration)
    assert wave.shape == expected.shape
    tolerance = 1e-4 if utterance.audio_filepath.endswith(".m4a") else 0.0  # 16-bit FLAC copy
    assert torch.allclose(wave, expected, atol=tolerance, rtol=0)


def _all_samples(folder: Path) -> list[dict]:
    index = read_index(folder)
    return [s for k in range(len(index.shards)) for s in tar_samples(index.path(k))]


def test_asr_shard_writes_shards_and_says_how_to_train_on_them(corpus, tmp_path, capsys):
    out = tmp_path / "shards"
    assert main(["shard", "--manifest", str(corpus["manifest"]), "--out", str(out),
                 "--shard-hours", "0.002", "--quiet"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "30 utterances" in printed and f"data.train_manifest: {out}" in printed
    assert len(read_index(out).shards) == len(list(out.glob("shard-*.tar"))) >= 3
    assert main(["shard", "--manifest", str(tmp_path / "nope.jsonl"), "--out", str(out)]) == 2
    assert "manifest not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["shard", "--help"])
    assert "WebDataset" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the pipeline


def test_the_bucketer_keeps_each_batch_within_the_budget():
    lengths = np.random.default_rng(0).uniform(0.2, 3.0, size=200)
    batches = list(bucketed(range(200), lambda i: lengths[i], [1.0, 2.0], 6.0, max_batch_size=5))
    assert sorted(i for b in batches for i in b) == list(range(200))
    for batch in batches:
        assert len(batch) <= 5
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 6.0


def test_role_shards_split_over_ranks_then_workers_and_lend_to_empty_workers():
    order = [4, 0, 3, 1, 2]
    assert role_shards(order, (0, 0), 2, 2) == [4, 2] and role_shards(order, (0, 1), 2, 2) == [3]
    assert role_shards(order, (1, 0), 2, 2) == [0] and role_shards(order, (1, 1), 2, 2) == [1]
    assert role_shards([5, 2, 7], (1, 1), 2, 2) == [2], "no shard of its own: a sibling's"


@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 0), (2, 2), (3, 1)])
def test_the_plan_from_the_index_is_what_the_stream_yields(shards, world, workers):
    """The loader takes the workers' batches in turn: position p is worker p mod W's
    (p div W)-th batch, each stream's own pass planned from the index and started over."""
    names = _ids_by_member(shards)
    for rank in range(world):
        dataset = _stream(shards, world, rank, workers, speed_perturb=(0.9, 1.0, 1.1))
        streams, total = dataset.streams, dataset.batches_per_stream(3)
        plans = {w: dataset.planned_batches(3, (rank, w)) for w in range(streams)}
        expected = [
            [names[m] for m in plans[p % streams][(p // streams) % len(plans[p % streams])]]
            for p in range(streams * total)
        ]
        assert _epoch(dataset, 3) == expected
        assert len(dataset) == len(expected)


def test_every_utterance_once_an_epoch_over_ranks_and_workers_plus_the_repeats(shards, caplog):
    names = _ids_by_member(shards)
    world, workers = 2, 2
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        datasets = [_stream(shards, world, rank, workers) for rank in range(world)]
        counts = datasets[0].plan_counts(1)
    assert not datasets[0].borrowing_streams(), "enough shards for every stream"
    own = [m for role in counts for b in datasets[0].planned_batches(1, role) for m in b]
    assert sorted(own) == sorted(names), "the streams' own passes: every utterance once"
    most = max(counts.values())
    repeated = Counter()
    for role, n in counts.items():
        plan = datasets[0].planned_batches(1, role)
        repeated.update(names[m] for k in range(n, most) for m in plan[k % n])
    seen = Counter(i for d in datasets for batch in _epoch(d, 1) for i in batch)
    assert seen == Counter(names.values()) + repeated
    assert repeated, "uneven streams for this test to bite"
    assert "start over" in caplog.text


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_equal_batch_counts_on_every_rank_with_uneven_shards(corpus, tmp_path, workers, caplog):
    out = _three_shards(corpus["manifest"], tmp_path / "three")
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        datasets = [_stream(out, 2, rank, workers) for rank in range(2)]
    epochs = [_epoch(d, 0) for d in datasets]
    assert len(epochs[0]) == len(epochs[1]) == len(datasets[0]) == len(datasets[1]) > 0
    if workers == 2:
        assert "have no shard of their own" in caplog.text, "rank 1's second worker borrows"


def test_epochs_differ_and_an_epoch_streams_the_same_twice(shards):
    first, again = _stream(shards, 2, 1, 2), _stream(shards, 2, 1, 2)
    assert _epoch(first, 0) == _epoch(again, 0)
    assert _epoch(first, 1) == _epoch(again, 1) != _epoch(first, 0)
    assert _epoch(_stream(shards, seed=8), 0) != _epoch(_stream(shards), 0), "the seed counts"


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_at_k_yields_exactly_the_rest_of_the_epoch(shards, workers):
    full = _epoch(_stream(shards, 2, 1, workers, speed_perturb=(0.9, 1.1)), 2)
    for k in sorted({1, 2, 3, len(full) // 2, len(full) - 2, len(full) - 1}):
        resumed = _stream(shards, 2, 1, workers, speed_perturb=(0.9, 1.1))
        assert _epoch(resumed, 2, resume_at=k) == full[k:], f"resumed at {k}"
    moved_on = _stream(shards, 2, 1, workers, speed_perturb=(0.9, 1.1))
    moved_on.load_state_dict({"epoch": 1, "batches_yielded": 3, "seed": 7})
    assert _epoch(moved_on, 2) == full, "a resume point holds for its own epoch"


def test_resumed_waves_equal_the_uninterrupted_ones(shards):
    """Speed factors and the decoded audio, not just the ids, continue where they stopped."""
    options = {"speed_perturb": (0.9, 1.0, 1.1)}
    dataset = _stream(shards, workers=0, **options)
    dataset.set_epoch(1)
    full = list(stream_loader(dataset, collate))
    resumed = _stream(shards, workers=0, **options)
    resumed.load_state_dict({"epoch": 1, "batches_yielded": 2, "seed": 7})
    for a, b in zip(full[2:], stream_loader(resumed, collate), strict=True):
        assert a.ids == b.ids and torch.equal(a.waves, b.waves)
    lengths = [int(n) for batch in full for n in batch.wave_lens]
    assert len(set(lengths)) > 1


def test_batches_stay_within_the_budget_on_the_grid(shards):
    grid = LengthGrid(1.2)
    dataset = ShardedSpeechDataset(read_index(shards), None, OPTIONS, SR, grid=grid)
    wave_length = partial(grid.samples, sample_rate=SR)
    for batch in stream_loader(dataset, partial(collate, wave_length=wave_length)):
        assert len(batch) == 1 or batch.waves.shape[1] * len(batch) <= 3.0 * SR * 1.001
        assert batch.waves.shape[1] == wave_length(int(batch.wave_lens.max()))


# ----------------------------------------------------------------------------- bad shards


def _corrupt(folder: Path, shard: int, member: int) -> str:
    """Overwrite the start of a member's audio (the size stays): returns its key."""
    path = read_index(folder).path(shard)
    with tarfile.open(path) as tar:
        audio = [m for m in tar.getmembers() if not m.name.endswith(".json")][member]
    with open(path, "r+b") as file:
        file.seek(audio.offset_data)
        file.write(b"\0" * 64)
    return audio.name.split(".")[0]


def test_a_member_that_decodes_short_of_its_duration_is_refused():
    """Opus skips pages it cannot read: a member corrupt inside decodes, shorter than the
    index says, and would be trained with the whole transcript. Up to the manifests' 0.1 s
    tolerance it passes."""
    second = io.BytesIO()
    soundfile.write(second, np.zeros(16000, dtype=np.float32) + 0.1, 16000, format="WAV")
    assert decode_audio(second.getvalue(), 1.05, 16000).numel() == 16000
    with pytest.raises(ValueError, match=r"decodes to 1.000 s, not the 1.500 s its index says"):
        decode_audio(second.getvalue(), 1.5, 16000)


def test_a_corrupt_member_is_skipped_and_named_in_the_log(shards, tmp_path, caplog):
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    key = _corrupt(broken, 1, 2)
    full = _epoch(_stream(shards), 0)
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        dataset = _stream(broken)
        epoch = _epoch(dataset, 0)
    assert len(epoch) == len(full) == len(dataset), "the batch count does not change"
    lost = Counter(i for b in full for i in b) - Counter(i for b in epoch for i in b)
    assert list(lost) == [json.loads(_member_json(broken, 1, 2))["id"]]
    assert f"{broken / 'shard-000001.tar'}: {key} cannot be decoded" in caplog.text


@pytest.mark.parametrize("part", ["json", "audio"])
def test_a_corrupt_tar_header_costs_its_member_alone(shards, tmp_path, caplog, part):
    """Read as a stream, tar ends at a bad header as at the archive's end: every member after
    it was lost, and each said to be missing from a tar file that ended early."""
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    path = read_index(broken).path(1)
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(".json") == (part == "json")]
    with open(path, "r+b") as file:
        file.seek(members[1].offset)
        file.write(bytes(range(256)) * 2)  # a header block of garbage: its checksum fails
    key = members[1].name.split(".")[0]
    full = _epoch(_stream(shards), 0)
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        epoch = _epoch(_stream(broken), 0)
    lost = Counter(i for b in full for i in b) - Counter(i for b in epoch for i in b)
    assert list(lost) == [json.loads(_member_json(shards, 1, 1))["id"]]
    assert f"{path}: {key} cannot be decoded" in caplog.text and "ended early" not in caplog.text


@pytest.mark.parametrize("keys", [True, False], ids=["by key", "by duration"])
def test_a_sample_lost_whole_leaves_its_place_and_the_next_keep_theirs(
    shards, tmp_path, caplog, keys
):
    """Garbage over one sample's headers (a disk sector): the next samples had been placed one
    member early, taking another utterance's duration, speed and augmentation draws. They are
    placed by the keys the index lists, or by its durations in an index without keys."""
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    record = json.loads((broken / INDEX_NAME).read_text())
    for shard in record["shards"]:
        if not keys:  # as written before indexes held them
            del shard["keys"]
    if keys:  # durations alike, as segments of one length: they could not place the samples
        record["shards"][1]["durations"][1:4] = [record["shards"][1]["durations"][2]] * 3
    (broken / INDEX_NAME).write_text(json.dumps(record))
    assert (read_index(broken).shards[1].keys is None) != keys
    if keys:  # keys that are not one per utterance are refused, not passed over
        for wrong in (record["shards"][1]["keys"][1:], None, 3):
            other = tmp_path / f"other{wrong is None}{wrong == 3}"
            shutil.copytree(broken, other)
            bad = json.loads((other / INDEX_NAME).read_text())
            bad["shards"][1]["keys"] = wrong
            (other / INDEX_NAME).write_text(json.dumps(bad))
            if wrong is None:
                assert read_index(other).shards[1].keys is None
                continue
            with pytest.raises(ShardError, match="are not one per utterance: write the shards"):
                read_index(other)
    path = read_index(broken).path(1)
    with tarfile.open(path) as tar:
        members = tar.getmembers()  # json, audio of each sample in turn
    with open(path, "r+b") as file:
        file.seek(members[2].offset)  # sample 1's json header and data, and its audio header
        file.write((bytes(range(256)) * 64)[: members[3].offset_data - members[2].offset])
    ids = [json.loads(_member_json(shards, 1, p))["id"] for p in range(4)]
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        placed = list(_stream(broken)._read([1]))
    found = [None if s is None or "json" not in s else json.loads(s["json"])["id"]
             for _, _, s in placed[:4]]  # fmt: skip
    assert found == [ids[0], None, ids[2], ids[3]]
    lost = Counter(i for b in _epoch(_stream(shards), 0) for i in b)
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        lost -= Counter(i for b in _epoch(_stream(broken), 0) for i in b)
    assert list(lost) == [ids[1]]
    named = read_index(broken).shards[1].keys[1] if keys else "member 1"  # else its place
    assert f"{path}: {named} could not be read (a corrupt or truncated tar file)" in caplog.text


def test_a_corrupt_header_after_an_extended_one_costs_its_member_alone(tmp_path):
    """Keys not in ASCII (or long) get PAX headers: a bad header after one raised a ReadError
    that ignore_zeros does not step over, and the rest of the shard was lost."""
    path = tmp_path / "pax.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for k in range(4):
            for suffix, data in (("json", b"{}"), ("wav", bytes(1000))):
                info = tarfile.TarInfo(f"café{k}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        json_of_1 = [m for m in tar.getmembers() if m.name == "café1.json"][0]
    with open(path, "r+b") as file:  # the ustar header that follows the PAX header
        file.seek(json_of_1.offset_data - tarfile.BLOCKSIZE)
        file.write(bytes(range(256)) * 2)
    samples = list(tar_samples(path))
    assert [s["__key__"] for s in samples] == ["café0", "café1", "café2", "café3"]
    assert "json" not in samples[1] and "wav" in samples[1], "the member lost alone"


def _member_json(folder: Path, shard: int, position: int) -> bytes:
    samples = list(tar_samples(read_index(folder).path(shard)))
    return samples[position]["json"]


def test_a_batch_that_loses_every_utterance_trains_the_previous_one_again(shards, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    dataset = _stream(shards, max_batch_seconds=0.1)  # one utterance per batch
    plan = dataset.planned_batches(0, (0, 0))
    shard, position = plan[3][0]
    _corrupt(broken, shard, position)
    full, epoch = _epoch(dataset, 0), _epoch(_stream(broken, max_batch_seconds=0.1), 0)
    assert epoch[3] == full[2] and epoch[:3] + epoch[4:] == full[:3] + full[4:]


def test_a_first_batch_that_loses_every_utterance_trains_the_next_in_its_place(shards, tmp_path):
    """With no batch before it, the next is trained twice; the count is as planned, and a
    resume after the first batch is exact. Two in a row lost: an error naming the shards."""
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    dataset = _stream(shards, max_batch_seconds=0.1)  # one utterance per batch
    plan = dataset.planned_batches(0, (0, 0))
    _corrupt(broken, *plan[0][0])
    full, epoch = _epoch(dataset, 0), _epoch(_stream(broken, max_batch_seconds=0.1), 0)
    assert epoch[0] == epoch[1] == full[1] and epoch[2:] == full[2:]
    resumed = _epoch(_stream(broken, max_batch_seconds=0.1), 0, resume_at=1)
    assert resumed == epoch[1:]
    _corrupt(broken, *plan[1][0])
    with pytest.raises(ShardError, match="no utterance of two successive batches could be"):
        _epoch(_stream(broken, max_batch_seconds=0.1), 0)


def test_a_missing_or_resized_shard_or_index_is_an_error_before_training(corpus, shards, tmp_path):
    tokenizer = CharTokenizer.train(WORDS)
    tokenizer.save(tmp_path / "tokenizer")
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)

    def setup(folder: Path) -> None:
        data = ASRDataModule(str(folder), str(corpus["manifest"]), str(tmp_path / "tokenizer"))
        data.setup("fit")

    setup(broken)
    (broken / "shard-000002.tar").unlink()
    missing = re.escape(f"{broken / 'shard-000002.tar'}: shard file not found")
    with pytest.raises(ShardError, match=missing):
        setup(broken)
    shutil.copy(shards / "shard-000001.tar", broken / "shard-000002.tar")
    with pytest.raises(ShardError, match="shard-000002.tar: .* bytes, the index says"):
        setup(broken)
    record = json.loads((shards / INDEX_NAME).read_text())
    record["shards"][1] |= {"durations": [], "utterances": 0}  # its rank would wait forever
    (broken / INDEX_NAME).write_text(json.dumps(record))
    with pytest.raises(ShardError, match="shard-000001.tar holds no utterance: write the shards"):
        setup(broken)
    (broken / INDEX_NAME).unlink()
    with pytest.raises(ShardError, match=re.escape(f"{broken / INDEX_NAME}: shard index not")):
        setup(broken)
    with pytest.raises(ShardError, match="shard index not found .*asr shard --manifest"):
        setup(tmp_path / "never_written")
    with pytest.raises(ShardError, match="cannot feed 40 ranks"):
        _stream(shards, world=40)


def test_a_resume_point_of_other_loader_workers_restarts_its_epoch(
    corpus, shards, tmp_path, caplog
):
    """Each loader worker streams batches of its own: skipping the batches another worker
    count dealt dropped some utterances and repeated others without a word."""
    from types import SimpleNamespace

    from lightning.pytorch.loops.progress import _BatchProgress

    CharTokenizer.train(WORDS).save(tmp_path / "tokenizer")
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=_BatchProgress()))
    trainer = SimpleNamespace(current_epoch=1, world_size=1, is_global_zero=True, global_rank=0,
                              fit_loop=loop)  # fmt: skip

    def batches(saved: dict | None, **options) -> int:
        data = ASRDataModule(str(shards), str(corpus["manifest"]), str(tmp_path / "tokenizer"),
                             **{"max_batch_seconds": 3.0, "num_workers": 0} | options)  # fmt: skip
        data.trainer = trainer
        data.setup("fit")
        if saved is not None:
            data.load_state_dict({"train_sampler": saved, "world_size": 1})
        with caplog.at_level(logging.WARNING):
            return len(list(data.train_dataloader()))

    whole, position = batches(None), {"epoch": 1, "batches_yielded": 2, "seed": 0}
    assert batches(position | {"streams": 1}) == whole - 2
    assert "starts again" not in caplog.text
    assert batches(position | {"streams": 2}) == whole
    said = "resumed with 1 loader worker streams from a checkpoint of 2: epoch 1 starts again"
    assert said in caplog.text
    caplog.clear()  # shards written again: other batches, as another worker count deals
    assert batches(position | {"streams": 1, "index": "0123456789abcdef"}) == whole
    assert "resumed on shards written again since the checkpoint" in caplog.text
    caplog.clear()  # other batching options: batches of another plan, never trained whole
    data = ASRDataModule(str(shards), str(corpus["manifest"]), str(tmp_path / "tokenizer"),
                         max_batch_seconds=3.0, num_workers=0)  # fmt: skip
    data.setup("fit")
    planned = data.train_dataloader().dataset.state_dict() | position  # as a checkpoint saves
    assert batches(planned) == whole - 2
    assert batches(planned, max_batch_seconds=6.0) == batches(None, max_batch_seconds=6.0)
    assert "resumed with other batches than the checkpoint's" in caplog.text


def test_writing_again_into_the_folder_leaves_no_earlier_shard(corpus, tmp_path):
    out = tmp_path / "shards"
    many = write_shards(corpus["manifest"], out, shard_hours=SHARD_SECONDS / 3600)
    assert len(many.shards) > 1
    write_shards(corpus["manifest"], out, shard_hours=1.0)
    assert sorted(p.name for p in out.glob("*.tar")) == ["shard-000000.tar"]


def test_a_partial_shard_of_a_killed_run_is_removed_by_the_next(corpus, tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    (out / "shard-000004.tar.partial").write_bytes(b"cut short")
    write_shards(corpus["manifest"], out, shard_hours=1.0)
    assert sorted(p.name for p in out.iterdir()) == ["shard-000000.tar", INDEX_NAME]


TERMINATED_WHILE_WRITING = """
import os, signal, sys
import asr.data.shards
from asr.cli import main

stored, calls = asr.data.shards._stored_audio, []


def stored_then_terminated(utterance):
    calls.append(utterance)
    if len(calls) == 12:  # inside the third shard
        os.kill(os.getpid(), signal.SIGTERM)
    return stored(utterance)


asr.data.shards._stored_audio = stored_then_terminated
sys.exit(main(sys.argv[1:]))
"""


def test_asr_shard_terminated_removes_the_shard_it_was_writing(corpus, tmp_path):
    """...and the index of an earlier set it was writing over: the shards it had replaced may
    have that set's sizes, and would pass for that set's, other texts in them."""
    out = tmp_path / "shards"
    write_shards(corpus["manifest"], out, shard_hours=SHARD_SECONDS / 3600)
    args = ["shard", "--manifest", str(corpus["manifest"]), "--out", str(out),
            "--shard-hours", str(SHARD_SECONDS / 3600), "--quiet"]  # fmt: skip
    result = run_forked(TERMINATED_WHILE_WRITING, args)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert f"asr shard: terminated; the same command writes {out} again" in result.stderr
    assert not list(out.glob("*.partial")) and not (out / INDEX_NAME).exists()
    assert list(out.glob("shard-*.tar")), "the shards written before it stay"


TERMINATED_IN_A_CALLBACK = """
import os, signal, sys
import asr.data.shards
from asr.cli import main

stored, calls, then = asr.data.shards._stored_audio, [], sys.argv.pop()


def stored_terminated_unheard(utterance):
    calls.append(utterance)
    if len(calls) == 2:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:  # as cffi swallows what soundfile's callbacks raise
            if then == "then-fails":
                raise RuntimeError("what the lost signal left behind")
    return stored(utterance)


asr.data.shards._stored_audio = stored_terminated_unheard
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("then", ["then-goes-on", "then-fails"])
def test_asr_shard_terminated_inside_a_callback_still_stops_so(corpus, tmp_path, then):
    """A SIGTERM whose exception a C library's callback swallows still ends the run as
    terminated (status 143), whether the run goes on or later fails for it."""
    out = tmp_path / "shards"
    args = ["shard", "--manifest", str(corpus["manifest"]), "--out", str(out), "--quiet", then]
    result = run_forked(TERMINATED_IN_A_CALLBACK, args)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert f"asr shard: terminated; the same command writes {out} again" in result.stderr
    assert "Traceback" not in result.stderr and not (out / INDEX_NAME).exists()


def test_a_segment_is_encoded_through_a_file(tmp_path, monkeypatch):
    """soundfile writes a BytesIO through Python callbacks, where an exception a signal
    raises is lost: a segment is encoded to a file instead."""
    wave = np.sin(np.arange(SR) / 7).astype(np.float32) / 2
    soundfile.write(tmp_path / "long.wav", wave, SR)
    write = soundfile.write

    def to_files_only(file, *args, **kwargs):
        assert isinstance(file, (str, os.PathLike)), f"written to {file!r}"
        return write(file, *args, **kwargs)

    monkeypatch.setattr(soundfile, "write", to_files_only)
    segment = Utterance(str(tmp_path / "long.wav"), 0.5, "YES", "seg", offset=0.25)
    suffix, data, rate = _stored_audio(segment)
    stored, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    assert (suffix, rate) == ("flac", SR) and np.abs(stored - wave[4000:12000]).max() < 1e-4


def test_asr_shard_warns_of_utterances_fit_refuses_as_too_short(tmp_path, caplog):
    path = tmp_path / "short.wav"
    soundfile.write(path, np.zeros(160, dtype=np.float32), SR)
    write_manifest(tmp_path / "m.jsonl", [Utterance(str(path), 0.01, "YES", "short")])
    with caplog.at_level(logging.WARNING, logger="asr.data.shards"):
        write_shards(tmp_path / "m.jsonl", tmp_path / "shards")
    assert "1 utterance(s) shorter than 0.1 s, which `asr fit` refuses" in caplog.text
    assert f"`asr validate-data --manifest {tmp_path / 'm.jsonl'}` names them" in caplog.text


def test_shards_with_utterances_too_short_to_train_on_are_refused(corpus, shards, tmp_path):
    """As a manifest's lines below data.min_duration are, before training, counted."""
    tokenizer = CharTokenizer.train(WORDS)
    tokenizer.save(tmp_path / "tokenizer")
    data = ASRDataModule(str(shards), str(corpus["manifest"]), str(tmp_path / "tokenizer"),
                         min_duration=0.5)  # fmt: skip
    short = int((read_index(shards).durations < 0.5).sum())
    assert short
    with pytest.raises(ValueError, match=f"{shards}: {short} of its 30 utterances are shorter "
                       r"than data.min_duration \(0.5 s\)"):  # fmt: skip
        data.setup("fit")


def test_the_data_module_streams_shards_with_tokens(corpus, shards, tmp_path):
    CharTokenizer.train(WORDS).save(tmp_path / "tokenizer")
    tokenizer, dev = str(tmp_path / "tokenizer"), str(corpus["manifest"])
    data = ASRDataModule(str(shards), dev, tokenizer, max_batch_seconds=3.0, num_workers=0,
                         speed_perturb=[0.9, 1.1])  # fmt: skip
    data.setup("fit")
    batches = list(data.train_dataloader())
    assert len(batches) == len(data.datasets["train"]) > 0
    assert sum(len(b) for b in batches) >= 30 and all(b.tokens is not None for b in batches)
    CharTokenizer.train(["YES"]).save(tmp_path / "small")
    with pytest.raises(ShardError, match="outside the tokenizer's vocabulary"):
        ASRDataModule(str(shards), str(corpus["manifest"]), str(tmp_path / "small")).setup("fit")


@pytest.mark.parametrize(
    "texts, error",
    [
        # A loose accent on its own would combine with its neighbour in a list of characters.
        (["CAFE\u0301 ONE", "NAI\u0308VE TWO"], None),
        # An apostrophe inside a word is kept, and not in the tokenizer's vocabulary.
        (["NO'NO", "YES"], "outside the tokenizer's vocabulary: \"'\""),
        (["YES", "..."], r"1 distinct texts leave no tokens .* e\.g\. '\.\.\.'"),
        (["YES", "\u02bc"], r"1 distinct texts leave no tokens"),  # a letter to Unicode
    ],
)
def test_the_vocabulary_check_of_shards_judges_each_text(corpus, tmp_path, texts, error):
    """As validate-data judges a manifest's lines against the tokenizer."""
    lines = read_manifest(corpus["manifest"])[: len(texts)]
    write_manifest(tmp_path / "m.jsonl", [replace(u, text=t) for u, t in zip(lines, texts)])
    index = write_shards(tmp_path / "m.jsonl", tmp_path / "shards")
    tokenizer = CharTokenizer.train(["CAFÉ NAÏVE ONE TWO YES NO"])
    if error is None:
        check_vocabulary(index, tokenizer)
        check_vocabulary(read_index(tmp_path / "shards"), tokenizer)
    else:
        with pytest.raises(ShardError, match=error):
            check_vocabulary(read_index(tmp_path / "shards"), tokenizer)


def test_an_index_of_another_version_asks_for_the_shards_again(shards, tmp_path):
    shutil.copytree(shards, tmp_path / "old")
    record = json.loads((tmp_path / "old" / "shards.json").read_text())
    (tmp_path / "old" / "shards.json").write_text(json.dumps({**record, "version": 1}))
    with pytest.raises(ShardError, match="index version 1, .* write the shards again"):
        read_index(tmp_path / "old")


# ----------------------------------------------------------------------------- asr fit


def _three_shards(manifest: str | Path, out: Path) -> Path:
    """A manifest written as three shards (the smallest shard size that gives three)."""
    durations = [u.duration for u in read_manifest(manifest)]
    limit = next(h for h in np.arange(0.5, 60, 0.1) if len(_group_by_seconds(durations, h)) == 3)
    write_shards(manifest, out, shard_hours=float(limit) / 3600)
    assert len(read_index(out).shards) == 3
    return out


tiny_an4 = test_lightning.tiny_an4  # the fixture: nine AN4 utterances, config, tokenizer


@pytest.fixture(scope="module")
def an4(tiny_an4, tmp_path_factory):
    """`tiny_an4` with its training set in three shards."""
    shards = _three_shards(tiny_an4["train"], tmp_path_factory.mktemp("an4_shards"))
    return {**tiny_an4, "shards": str(shards)}


def _fit_args(an4: dict[str, str], root: Path) -> list[str]:
    return [
        "fit", "--config", an4["config"],
        "--data.train_manifest", an4["shards"],
        "--data.val_manifest", an4["dev"],
        "--data.tokenizer", an4["tokenizer"],
        "--trainer.default_root_dir", str(root),
    ]  # fmt: skip


@pytest.mark.needs_corpus
@pytest.mark.timeout(600)
def test_fit_trains_on_shards_and_checkpoints_the_stream_position(an4, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(_fit_args(an4, tmp_path) + ["--data.speed_perturb", "[0.9, 1.0, 1.1]"])
    # the stream's length is exact, so Lightning's caution about it is not shown
    assert not [w for w in caught if "`IterableDataset` has `__len__`" in str(w.message)]
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] > 0
    assert last["ASRDataModule"]["train_sampler"]["epoch"] == 1
    assert last["asr"]["segment_seconds"] is not None


DDP_SCRIPT = """
import json, sys
from asr.train import run_lightning_cli

cli = run_lightning_cli(sys.argv[1:])
trainer = cli.trainer
checksum = float(sum(p.double().sum() for p in cli.model.parameters()))
report = {"rank": trainer.global_rank, "world": trainer.world_size, "checksum": checksum,
          "batches": trainer.num_training_batches, "steps": trainer.global_step}
with open(f"{trainer.default_root_dir}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(report, f)
"""


@pytest.mark.slow
@pytest.mark.needs_corpus
@pytest.mark.timeout(600)
def test_ddp_over_three_shards_ends_with_equal_batch_counts(an4, tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    args = _fit_args(an4, tmp_path) + ["--trainer.strategy", "ddp", "--trainer.devices", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert reports[0]["batches"] == reports[1]["batches"] > 0, "equal batch counts per rank"
    assert reports[0]["steps"] == reports[1]["steps"] > 0
    assert reports[0]["checksum"] == reports[1]["checksum"], "ranks hold the same weights"


@pytest.mark.slow
@pytest.mark.needs_corpus
@pytest.mark.timeout(900)
def test_sigkill_mid_epoch_then_resume_on_shards_equals_the_uninterrupted_run(an4, tmp_path):
    def args(root: Path) -> list[str]:
        base = test_lightning._augmented_args(an4, root)
        return base + ["--data.train_manifest", an4["shards"], "--data.max_batch_seconds", "5"]

    main(args(tmp_path / "full"))
    folder = tmp_path / "full" / "checkpoints"
    full = torch.load(folder / "last.ckpt", weights_only=True)
    # Speed perturbation packs each epoch into a different number of batches.
    ends = [torch.load(next(folder.glob(f"epoch00{e}*.ckpt")), weights_only=True)["global_step"]
            for e in (0, 1)]  # fmt: skip
    kill_at = ends[0] + 3
    assert kill_at < ends[1], "the kill must fall inside the second epoch"

    killed_root = tmp_path / "killed"
    proc = test_lightning.fit_then_signal(args(killed_root), kill_at)
    assert proc.returncode == -9, proc.stderr[-3000:]
    last = killed_root / "checkpoints" / "last.ckpt"
    killed = torch.load(last, weights_only=True)
    position = killed["ASRDataModule"]["train_sampler"]
    assert position["epoch"] == 1 and position["batches_yielded"] == 3

    main(args(killed_root) + ["--ckpt_path", "last"])
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] == full["global_step"]
    for name, value in full["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), f"{name} differs after resume"


def test_shard_sizes_follow_the_utterances(corpus, shards):
    """The index's totals agree with its per-utterance durations."""
    index = read_index(shards)
    record = json.loads((shards / INDEX_NAME).read_text())
    assert record["utterances"] == sum(s.count for s in index.shards) == 30
    assert math.isclose(record["seconds"], sum(s.seconds for s in index.shards), abs_tol=1e-6)


def test_bad_audio_stops_it_before_a_shard_is_written(corpus, tmp_path, capsys):
    lines = corpus["manifest"].read_text().splitlines()
    record = json.loads(lines[2])
    lines[2] = json.dumps({**record, "audio_filepath": str(tmp_path / "gone.wav")})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "shards"
    assert main(["shard", "--manifest", str(manifest), "--out", str(out), "--quiet"]) == 2
    assert f"{manifest}:3: audio {tmp_path / 'gone.wav'}: file not found" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
