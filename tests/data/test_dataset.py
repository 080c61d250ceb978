"""SpeechDataset (loading, speed perturbation), Batch, collate and make_dataloader."""

from __future__ import annotations

import math
from collections import Counter
from functools import partial

import numpy as np
import pytest
import soundfile
import torch

from asr.audio import load_audio
from asr.data.dataset import (
    Batch,
    SpeechDataset,
    collate,
    make_dataloader,
    round_up,
    set_loader_epoch,
)
from asr.data.manifest import Utterance
from asr.data.sampler import DynamicBucketSampler, LengthGrid

SR = 16000


class FakeTokenizer:
    """Characters to ids 4.. (ids 0-3 are special), like asr.text's character tokenizer."""

    pad_id = 1
    eos_id = 3

    def encode(self, text: str) -> list[int]:
        return [4 + ord(ch) % 60 for ch in text]


def write_sine(path, seconds: float, freq: float = 440.0, sample_rate: int = SR) -> Utterance:
    t = np.arange(round(seconds * sample_rate)) / sample_rate
    soundfile.write(path, 0.5 * np.sin(2 * np.pi * freq * t), sample_rate, subtype="PCM_16")
    return Utterance(str(path), seconds, f"utt {path.stem}", id=path.stem)


@pytest.fixture
def utterances(tmp_path) -> list[Utterance]:
    """Six short sine-wave WAVs of different lengths."""
    return [write_sine(tmp_path / f"u{k}.wav", 0.2 + 0.07 * k) for k in range(6)]


def peak_frequency(wave: torch.Tensor, sample_rate: int = SR) -> float:
    spectrum = torch.fft.rfft(wave * torch.hann_window(len(wave))).abs()
    return float(spectrum.argmax()) * sample_rate / len(wave)


def test_items_hold_id_wave_text_and_tokens(utterances):
    dataset = SpeechDataset(utterances, tokenizer=FakeTokenizer())
    assert len(dataset) == len(utterances)
    for utterance, item in zip(utterances, dataset, strict=True):
        assert item["id"] == utterance.id and item["text"] == utterance.text
        assert item["wave"].dtype == torch.float32 and item["wave"].dim() == 1
        assert len(item["wave"]) == round(utterance.duration * SR)
        assert torch.equal(item["wave"], load_audio(utterance.audio_filepath))
        assert item["tokens"].dtype == torch.long
        assert item["tokens"].tolist() == FakeTokenizer().encode(utterance.text)
    assert "tokens" not in SpeechDataset(utterances)[0]


def test_negative_and_out_of_range_indices(utterances):
    dataset = SpeechDataset(utterances)
    assert dataset[-1]["id"] == utterances[-1].id
    with pytest.raises(IndexError):
        dataset[len(utterances)]


def test_segment_offset_and_duration_are_honoured(tmp_path):
    whole = write_sine(tmp_path / "long.wav", 1.0)
    segment = Utterance(whole.audio_filepath, 0.25, "seg", id="seg", offset=0.5)
    wave = SpeechDataset([segment])[0]["wave"]
    assert torch.equal(wave, load_audio(whole.audio_filepath)[8000:12000])


def test_durations_are_nominal_and_lengths_follow_the_epochs_speed_factors(utterances):
    dataset = SpeechDataset(utterances * 4, speed_perturb=[0.9, 1.0, 1.1], seed=3)
    nominal = [u.duration for u in utterances * 4]
    assert dataset.durations == nominal
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        factors = [dataset.speed_factor(i) for i in range(len(dataset))]
        assert dataset.lengths() == dataset.lengths(epoch)
        assert dataset.lengths() == pytest.approx(
            [d / f for d, f in zip(nominal, factors, strict=True)], abs=1 / SR
        )
        for index in range(len(dataset)):  # to the sample: a shape grid pads by the count
            assert len(dataset[index]["wave"]) == round(dataset.lengths()[index] * SR)
    dataset.set_epoch(0)
    assert dataset.lengths(1) != dataset.lengths(), "another epoch, other factors"
    assert SpeechDataset(utterances).lengths() == pytest.approx([u.duration for u in utterances])


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_speed_perturb_scales_length_by_inverse_factor_and_pitch_by_factor(tmp_path, factor):
    utterance = write_sine(tmp_path / "a.wav", 1.0, freq=500.0)
    wave = SpeechDataset([utterance], speed_perturb=[factor])[0]["wave"]
    assert len(wave) == math.ceil(SR / factor)
    assert peak_frequency(wave) == pytest.approx(500.0 * factor, abs=2.0)


def test_speed_factors_reproducible_from_seed_epoch_index(utterances):
    factors = (0.9, 1.0, 1.1)
    first = SpeechDataset(utterances * 10, speed_perturb=factors, seed=5)
    second = SpeechDataset(utterances * 10, speed_perturb=factors, seed=5)
    other_seed = SpeechDataset(utterances * 10, speed_perturb=factors, seed=6)

    def plan(dataset: SpeechDataset, epoch: int) -> list[float]:
        dataset.set_epoch(epoch)
        return [dataset.speed_factor(i) for i in range(len(dataset))]

    assert plan(first, 0) == plan(second, 0)
    assert plan(first, 3) == plan(second, 3)
    assert plan(first, 0) != plan(first, 1)
    assert plan(first, 0) != plan(other_seed, 0)
    assert set(plan(first, 2)) == set(factors)
    # the waveform follows the factor
    first.set_epoch(1)
    for index in (0, 7, 13):
        expected = math.ceil(round(utterances[index % 6].duration * SR) / first.speed_factor(index))
        assert len(first[index]["wave"]) == expected


def test_no_speed_perturb_leaves_waves_alone(utterances):
    for factors in (None, [1.0]):
        dataset = SpeechDataset(utterances, speed_perturb=factors)
        dataset.set_epoch(4)
        assert dataset.speed_factor(0) == 1.0
        assert torch.equal(dataset[0]["wave"], load_audio(utterances[0].audio_filepath))


def test_cached_items_equal_loaded_ones_and_each_wave_is_read_once(utterances, monkeypatch):
    factors = (0.9, 1.0, 1.1)
    plain = SpeechDataset(utterances, FakeTokenizer(), speed_perturb=factors, seed=2)
    cached = SpeechDataset(utterances, FakeTokenizer(), speed_perturb=factors, seed=2,
                           cache_audio=True)  # fmt: skip
    reads = Counter()

    def counted_load(path, *args, **kwargs):
        reads[path] += 1
        return load_audio(path, *args, **kwargs)

    monkeypatch.setattr("asr.data.dataset.load_audio", counted_load)
    drawn = set()
    for epoch in range(6):
        plain.set_epoch(epoch)
        cached.set_epoch(epoch)
        for index in range(len(plain)):
            expected, item = plain[index], cached[index]
            assert torch.equal(item["wave"], expected["wave"]), (epoch, index)
            assert torch.equal(item["tokens"], expected["tokens"])
            drawn.add((index, cached.speed_factor(index)))
    loads_by_plain = 6 * len(utterances)
    assert sum(reads.values()) == loads_by_plain + len(drawn)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"speed_perturb": []},
        {"speed_perturb": [0.9, 0.0]},
        {"speed_perturb": [float("inf")]},
        {"sample_rate": 0},
        {"seed": -1},
    ],
)
def test_bad_dataset_arguments_raise_value_error(utterances, kwargs):
    with pytest.raises(ValueError):
        SpeechDataset(utterances, **kwargs)


def test_missing_audio_error_names_the_file(tmp_path):
    missing = Utterance(str(tmp_path / "nowhere.wav"), 1.0, "x", id="x")
    with pytest.raises(ValueError, match="nowhere.wav"):
        SpeechDataset([missing])[0]


# ----------------------------------------------------------------------------- collate


def random_items(count: int, seed: int, with_tokens: bool = True) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    items = []
    for k in range(count):
        item = {
            "id": f"utt{k}",
            "text": f"text {k}",
            "wave": torch.randn(int(torch.randint(1, 50, (1,), generator=g)), generator=g),
        }
        if with_tokens:
            item["tokens"] = torch.randint(4, 30, (int(torch.randint(0, 9, (1,), generator=g)),))
        items.append(item)
    return items


GRID_PADDING = {
    "wave_length": partial(LengthGrid(1.3).samples, sample_rate=10),
    "token_length": partial(round_up, multiple=4),
}


@pytest.mark.parametrize("padding", [{}, GRID_PADDING], ids=["longest", "grid"])
def test_collate_shapes_lengths_and_padding_values(padding):
    for seed in range(10):
        items = random_items(1 + seed % 5, seed)
        batch = collate(items, pad_id=7, **padding)
        wave_lens = [len(item["wave"]) for item in items]
        token_lens = [len(item["tokens"]) for item in items]
        wave_length = padding.get("wave_length", lambda n: n)(max(wave_lens))
        token_length = padding.get("token_length", lambda n: n)(max(token_lens))
        assert isinstance(batch, Batch) and len(batch) == len(items)
        assert batch.ids == [item["id"] for item in items]
        assert batch.texts == [item["text"] for item in items]
        assert batch.waves.shape == (len(items), wave_length)
        assert batch.tokens.shape == (len(items), token_length)
        assert batch.wave_lens.dtype == batch.token_lens.dtype == torch.int64
        assert batch.wave_lens.tolist() == wave_lens and batch.token_lens.tolist() == token_lens
        for row, item in enumerate(items):
            n, m = wave_lens[row], token_lens[row]
            assert torch.equal(batch.waves[row, :n], item["wave"])
            assert not batch.waves[row, n:].any()
            assert torch.equal(batch.tokens[row, :m], item["tokens"])
            assert (batch.tokens[row, m:] == 7).all()


def test_collate_default_pad_id_is_one():
    items = random_items(4, seed=1)
    batch = collate(items)
    for row, length in enumerate(batch.token_lens.tolist()):
        assert (batch.tokens[row, length:] == 1).all()


def test_batch_of_one_equals_the_unpadded_item():
    (item,) = random_items(1, seed=3)
    batch = collate([item])
    assert torch.equal(batch.waves[0], item["wave"]) and torch.equal(
        batch.tokens[0], item["tokens"]
    )
    assert batch.wave_lens.tolist() == [len(item["wave"])]


def test_collate_without_tokens_for_inference():
    batch = collate(random_items(3, seed=2, with_tokens=False))
    assert batch.tokens is None and batch.token_lens is None
    assert batch.waves.shape[0] == 3


def test_collate_rejects_empty_mixed_and_non_1d():
    with pytest.raises(ValueError, match="empty"):
        collate([])
    mixed = random_items(2, seed=0)
    del mixed[1]["tokens"]
    with pytest.raises(ValueError, match="utt1"):
        collate(mixed)
    flat = random_items(2, seed=0)
    flat[0]["wave"] = flat[0]["wave"][None]
    with pytest.raises(ValueError, match="utt0"):
        collate(flat)


def test_batch_to_moves_every_tensor_and_keeps_the_rest():
    batch = collate(random_items(3, seed=4))
    moved = batch.to("meta")
    assert isinstance(moved, Batch) and moved.ids == batch.ids and moved.texts == batch.texts
    for name in ("waves", "wave_lens", "tokens", "token_lens"):
        assert getattr(moved, name).device.type == "meta"
        assert getattr(batch, name).device.type == "cpu"
    inference = collate(random_items(2, seed=4, with_tokens=False)).to("meta")
    assert inference.waves.device.type == "meta" and inference.tokens is None


@pytest.mark.slow  # importing Lightning takes seconds
def test_lightning_moves_batch_to_device():
    from lightning.fabric.utilities.apply_func import move_data_to_device

    batch = collate(random_items(2, seed=5))
    moved = move_data_to_device(batch, torch.device("meta"))
    assert isinstance(moved, Batch) and moved.tokens.device.type == "meta"


# ------------------------------------------------------------------------- dataloader


def test_dataloader_with_bucket_sampler_yields_every_utterance_once(utterances):
    dataset = SpeechDataset(utterances, tokenizer=FakeTokenizer())
    sampler = DynamicBucketSampler(dataset.lengths(), max_batch_length=1.2, num_buckets=2)
    loader = make_dataloader(dataset, sampler)
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert Counter(i for batch in batches for i in batch.ids) == Counter(u.id for u in utterances)
    for batch in batches:
        assert len(batch) * batch.wave_lens.max() / SR <= 1.2 + 1e-9
        assert batch.tokens is not None


def test_persistent_workers_follow_set_epoch(utterances):
    """The epoch lives in shared memory: persistent workers draw the new epoch's factors, and
    the sampler packs the perturbed lengths within its budget."""
    dataset = SpeechDataset(utterances, speed_perturb=(0.8, 1.0, 1.25), seed=1)
    sampler = DynamicBucketSampler(dataset.lengths, max_batch_length=0.5, shuffle=False)
    loader = make_dataloader(dataset, sampler, num_workers=1)
    index_of = {u.id: k for k, u in enumerate(utterances)}
    for epoch in (0, 1, 2):
        set_loader_epoch(loader, epoch)
        assert dataset.epoch == sampler.epoch == epoch
        for batch in loader:
            for utt_id, length in zip(batch.ids, batch.wave_lens.tolist(), strict=True):
                k = index_of[utt_id]
                nominal = round(utterances[k].duration * SR)
                assert length == math.ceil(nominal / dataset.speed_factor(k)), (epoch, utt_id)
            assert len(batch) == 1 or len(batch) * batch.wave_lens.max() <= 0.5 * SR + len(batch)


@pytest.mark.needs_corpus
def test_an4_files_load_and_batch(an4_dir):
    fileids = (an4_dir / "etc" / "an4_train.fileids").read_text().split()[:4]
    utterances = []
    for fileid in fileids:
        path = an4_dir / "wav" / f"{fileid}.wav"
        info = soundfile.info(str(path))
        utterances.append(Utterance(str(path), info.frames / info.samplerate, "X", id=fileid))
    dataset = SpeechDataset(utterances, speed_perturb=[0.9])
    batch = collate([dataset[k] for k in range(len(dataset))])
    for row, utterance in enumerate(utterances):
        frames = soundfile.info(utterance.audio_filepath).frames
        assert batch.wave_lens[row] == math.ceil(frames / 0.9)
    plain = SpeechDataset(utterances)[0]["wave"]
    assert torch.equal(plain, load_audio(utterances[0].audio_filepath))
