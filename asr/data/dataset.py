"""Speech dataset with speed perturbation and augmentation drawn from (seed, epoch, index), the
padded `Batch`, collate and DataLoader helpers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler

from asr.audio import load_audio
from asr.data.augment import WaveAugmenter
from asr.data.manifest import Utterance
from asr.perturb import change_speed, other_indices, speed_ratio, speed_seconds
from asr.text import PAD_ID

_AUGMENT_STREAM = 1  # keeps augmentation draws apart from the speed-factor draw


class TextEncoder(Protocol):
    """What the dataset needs from a tokenizer (asr.text.Tokenizer fits)."""

    pad_id: int

    def encode(self, text: str) -> list[int]: ...


class SpeechDataset(Dataset[dict[str, Any]]):
    """Manifest utterances as ``id``/``wave``/``text``/``tokens`` dicts, optionally perturbed."""

    def __init__(
        self,
        utterances: Sequence[Utterance],
        tokenizer: TextEncoder | None = None,
        sample_rate: int = 16000,
        speed_perturb: Sequence[float] | None = None,
        seed: int = 0,
        cache_audio: bool = False,
        augment: WaveAugmenter | None = None,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.utterances = list(utterances)
        self.tokenizer = tokenizer
        self.sample_rate = sample_rate
        self.speed_perturb = check_speed_factors(speed_perturb)
        self.seed = seed
        self._cache: dict[tuple[int, float], Tensor] | None = {} if cache_audio else None
        self.augment = augment
        if getattr(augment, "mixes_utterances", False) and len(utterances) < 2:
            raise ValueError(
                "augment.noise.kinds has babble, which mixes other utterances in: this dataset "
                "has one (leave babble out of the kinds)"
            )
        # In shared memory so DataLoader workers (persistent ones too) see set_epoch.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return len(self.utterances)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = range(len(self))[index]  # IndexError out of range; negative indices resolved
        utterance = self.utterances[index]
        wave = self._wave(index, self.speed_factor(index))
        if self.augment is not None and self.augment.applies_in(self.epoch):
            wave = self._augmented(wave, index)
        item: dict[str, Any] = {"id": utterance.utt_id, "wave": wave, "text": utterance.text}
        if self.tokenizer is not None:
            item["tokens"] = torch.tensor(self.tokenizer.encode(utterance.text), dtype=torch.long)
        return item

    def _wave(self, index: int, factor: float) -> Tensor:
        """Item `index`'s waveform at speed `factor`, from the cache when it holds it."""
        key = (index, factor)
        if self._cache is not None and key in self._cache:
            return self._cache[key]
        utterance = self.utterances[index]
        wave = load_audio(
            utterance.audio_filepath,
            sample_rate=self.sample_rate,
            offset=utterance.offset,
            duration=utterance.duration,
        )
        wave = change_speed(wave, factor)
        if self._cache is not None:
            self._cache[key] = wave
        return wave

    def _augmented(self, wave: Tensor, index: int) -> Tensor:
        """`wave` of item `index` augmented with this epoch's draws (babble: other items)."""
        rng = np.random.default_rng([self.seed, self.epoch, index, _AUGMENT_STREAM])

        def others(rng: np.random.Generator, count: int) -> list[Tensor]:
            return [self._wave(j, 1.0) for j in other_indices(rng, len(self), count, index)]

        return self.augment(wave, rng, others if len(self) > 1 else None)

    @property
    def epoch(self) -> int:
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose speed factors items use (visible to running workers)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._epoch.fill_(epoch)

    def speed_factor(self, index: int, epoch: int | None = None) -> float:
        """The speed factor of item `index` in `epoch` (default: the current one)."""
        if not self.speed_perturb:
            return 1.0
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng([self.seed, epoch, index])
        return self.speed_perturb[int(rng.integers(len(self.speed_perturb)))]

    @property
    def durations(self) -> list[float]:
        """Manifest durations in seconds, before speed perturbation."""
        return [utterance.duration for utterance in self.utterances]

    def lengths(self, epoch: int | None = None) -> list[float]:
        """Seconds each item lasts in `epoch` after speed perturbation: ``duration / factor``
        to the sample the resampler rounds up to."""
        epoch = self.epoch if epoch is None else epoch
        factors = np.array([self.speed_factor(k, epoch) for k in range(len(self.utterances))])
        return speed_seconds(np.array(self.durations), factors, self.sample_rate).tolist()


@dataclass
class Batch:
    """A padded batch. Lightning moves it to the device as a dataclass; `to` does it by hand."""

    ids: list[str]
    texts: list[str]
    waves: Tensor  # (B, T) float32, zero-padded
    wave_lens: Tensor  # (B,) int64, samples
    tokens: Tensor | None = None  # (B, L) int64, padded with pad_id, no sos/eos
    token_lens: Tensor | None = None  # (B,) int64

    def __len__(self) -> int:
        return len(self.ids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on `device`."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in pinned memory (called by DataLoader when ``pin_memory=True``)."""
        return self._map_tensors(Tensor.pin_memory)

    def _map_tensors(self, fn) -> Batch:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **changes)


def collate(
    items: Sequence[dict[str, Any]],
    pad_id: int = PAD_ID,
    wave_length: Callable[[int], int] | None = None,
    token_length: Callable[[int], int] | None = None,
) -> Batch:
    """Pad items into a `Batch` (waves with zeros, tokens with `pad_id`), to the given lengths."""
    if not items:
        raise ValueError("collate got an empty list of items")
    ids = [item["id"] for item in items]
    with_tokens = ["tokens" in item for item in items]
    if any(with_tokens) and not all(with_tokens):
        missing = [i for i, has in zip(ids, with_tokens, strict=True) if not has]
        raise ValueError(f"collate: items {missing[:5]} lack 'tokens' while others have them")
    waves, wave_lens = _pad([item["wave"] for item in items], 0.0, "wave", ids, wave_length)
    batch = Batch(ids=ids, texts=[item["text"] for item in items], waves=waves, wave_lens=wave_lens)
    if all(with_tokens):
        batch.tokens, batch.token_lens = _pad(
            [item["tokens"] for item in items], pad_id, "tokens", ids, token_length
        )
    return batch


def _pad(
    seqs: list[Tensor],
    value: float,
    name: str,
    ids: list[str],
    padded_length: Callable[[int], int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Right-pad 1-D tensors to `(B, padded_length(max_len))`; also return their lengths `(B,)`."""
    for utt_id, seq in zip(ids, seqs, strict=True):
        if seq.dim() != 1:
            raise ValueError(f"collate: '{name}' of {utt_id} must be 1-D, got {tuple(seq.shape)}")
    lens = torch.tensor([len(seq) for seq in seqs], dtype=torch.long)
    padded = pad_sequence(seqs, batch_first=True, padding_value=value)
    if padded_length is not None:
        extra = padded_length(padded.shape[1]) - padded.shape[1]
        if extra < 0:
            raise ValueError(f"collate: padded {name} length is shorter than the longest {name}")
        padded = torch.nn.functional.pad(padded, (0, extra), value=value)
    return padded, lens


def round_up(length: int, multiple: int) -> int:
    """`length` rounded up to a multiple of `multiple`.

    >>> round_up(17, 8), round_up(16, 8)
    (24, 16)
    """
    return -(-length // multiple) * multiple


def make_dataloader(
    dataset: SpeechDataset,
    sampler: Sampler[list[int]],
    num_workers: int = 0,
    pin_memory: bool = False,
    pad_id: int | None = None,
) -> DataLoader:
    """DataLoader over `dataset` with `sampler` as its batch sampler and `collate`."""
    if pad_id is None:
        pad_id = getattr(dataset.tokenizer, "pad_id", PAD_ID)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=partial(collate, pad_id=pad_id),
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )


def set_loader_epoch(loader: DataLoader, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on the loader's batch sampler and dataset (Lightning does not)."""
    for part in (loader.batch_sampler, loader.dataset):
        set_epoch = getattr(part, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def check_speed_factors(factors: Sequence[float] | None) -> tuple[float, ...]:
    """Speed factors as a tuple; empty when perturbation is off."""
    if factors is None:
        return ()
    factors = tuple(float(f) for f in factors)
    if not factors:
        raise ValueError("speed_perturb must list at least one factor (or be None)")
    bad = [f for f in factors if not (math.isfinite(f) and f > 0)]
    if bad:
        raise ValueError(f"speed_perturb factors must be finite and > 0, got {bad}")
    for factor in factors:
        speed_ratio(factor)  # now, not in a loader worker mid-epoch
    return () if factors == (1.0,) else factors
