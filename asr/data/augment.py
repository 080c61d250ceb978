"""Waveform augmentation for training (reverberation, noise, telephone band, gain), configured
under the data module's ``augment`` and drawn per item from ``(seed, epoch, index)``."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np
from torch import Tensor

from asr import perturb
from asr.audio import AudioError, audio_files, audio_info, load_audio

NOISE_KINDS = (*perturb.NOISE_COLORS, "babble", "files")

log = logging.getLogger(__name__)

# Babble talkers are other items of the dataset: `others(rng, count)` returns that many.
OtherWaves = Callable[[np.random.Generator, int], list[Tensor]]


@dataclass(frozen=True)
class NoiseAugment:
    """Additive noise at a signal-to-noise ratio drawn uniformly from `snr_db`."""

    prob: float = 0.0  # chance an utterance gets noise
    snr_db: tuple[float, float] = (0.0, 30.0)  # range of the SNR drawn, dB
    kinds: tuple[str, ...] = ("white", "pink", "brown", "babble")  # drawn uniformly per item
    babble_talkers: tuple[int, int] = (3, 7)  # range (inclusive) of utterances mixed as babble
    folder: str | None = None  # noise files (searched recursively) for the kind "files"


@dataclass(frozen=True)
class ReverbAugment:
    """Convolution with a room impulse response: simulated, or drawn from `folder`."""

    prob: float = 0.0  # chance an utterance is reverberated
    rt60: tuple[float, float] = (0.2, 0.9)  # range of simulated reverberation times, seconds
    folder: str | None = None  # impulse-response files used instead of simulated rooms


@dataclass(frozen=True)
class NarrowbandAugment:
    """A telephone channel: 8 kHz sampling (a band up to 4 kHz), 300 Hz high-pass, optionally
    mu-law coded."""

    prob: float = 0.0  # chance an utterance goes through the channel
    mu_law_prob: float = 0.5  # chance, given the channel, of 8-bit mu-law coding


@dataclass(frozen=True)
class GainAugment:
    """A level change drawn uniformly from `db` (moot behind a `LevelNormalizer` frontend)."""

    prob: float = 0.0  # chance an utterance's level changes
    db: tuple[float, float] = (-30.0, 10.0)  # range of the gain, dB


@dataclass(frozen=True)
class WaveAugment:
    """The augmentations a training set's waveforms get; each is off at probability 0."""

    noise: NoiseAugment = field(default_factory=NoiseAugment)
    reverb: ReverbAugment = field(default_factory=ReverbAugment)
    narrowband: NarrowbandAugment = field(default_factory=NarrowbandAugment)
    gain: GainAugment = field(default_factory=GainAugment)
    start_epoch: int = 0  # the first epoch (from 0) whose items are augmented

    def __post_init__(self) -> None:
        if not (isinstance(self.start_epoch, int) and self.start_epoch >= 0):
            raise ValueError(f"augment.start_epoch must be >= 0, got {self.start_epoch}")
        for name in ("noise", "reverb", "narrowband", "gain"):
            prob = getattr(self, name).prob
            if not 0.0 <= prob <= 1.0:
                raise ValueError(f"augment.{name}.prob must be in [0, 1], got {prob}")
        mu_law_prob = self.narrowband.mu_law_prob
        if not 0.0 <= mu_law_prob <= 1.0:
            raise ValueError(f"augment.narrowband.mu_law_prob must be in [0, 1], got {mu_law_prob}")
        _check_range("augment.noise.snr_db", self.noise.snr_db)
        _check_range("augment.reverb.rt60", self.reverb.rt60, positive=True)
        _check_range("augment.gain.db", self.gain.db)
        _check_noise_kinds(self.noise)

    @classmethod
    def from_dict(cls, config: dict) -> WaveAugment:
        """From plain dicts and lists, as a YAML file holds them."""
        parts = {"noise": NoiseAugment, "reverb": ReverbAugment,
                 "narrowband": NarrowbandAugment, "gain": GainAugment}  # fmt: skip
        known = [f.name for f in dataclass_fields(cls)]
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"augment: unknown keys {unknown}; known: {known}")

        def build(name: str, value):
            if name not in parts:
                return value
            return parts[name](**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in value.items()})  # fmt: skip

        return cls(**{name: build(name, value) for name, value in config.items()})

    @property
    def active(self) -> bool:
        return any(getattr(self, n).prob > 0 for n in ("noise", "reverb", "narrowband", "gain"))


class WaveAugmenter:
    """Applies a `WaveAugment` to waveforms; its noise and impulse-response files load up front."""

    def __init__(self, config: WaveAugment, sample_rate: int) -> None:
        self.config, self.sample_rate = config, sample_rate
        self.noise_files = _audio_files(config.noise.folder, "augment.noise.folder")
        rir_files = _audio_files(config.reverb.folder, "augment.reverb.folder")
        self.rirs = [_load_rir(path, sample_rate) for path in rir_files]
        self._silent_noise: set[str] = set()  # files said to have added nothing

    @property
    def mixes_utterances(self) -> bool:
        """Whether babble noise may mix other utterances of the dataset into one."""
        return self.config.noise.prob > 0 and "babble" in self.config.noise.kinds

    def applies_in(self, epoch: int) -> bool:
        """Whether items of `epoch` are augmented (not before the config's `start_epoch`)."""
        return epoch >= self.config.start_epoch

    def __call__(
        self, wave: Tensor, rng: np.random.Generator, others: OtherWaves | None = None
    ) -> Tensor:
        """`wave` `(T,)` augmented, same length and dtype, never modified in place."""
        c = self.config
        if rng.random() < c.reverb.prob:
            wave = perturb.reverberate(wave, self._rir(rng))
        if rng.random() < c.noise.prob:
            wave = perturb.add_noise(
                wave, self._noise(wave, rng, others), rng.uniform(*c.noise.snr_db)
            )
        if rng.random() < c.narrowband.prob:
            mu_law = rng.random() < c.narrowband.mu_law_prob
            wave = perturb.telephone(wave, self.sample_rate, mu_law=mu_law)
        if rng.random() < c.gain.prob:
            wave = perturb.change_gain(wave, rng.uniform(*c.gain.db))
        return wave

    def _rir(self, rng: np.random.Generator) -> Tensor:
        if self.rirs:
            return self.rirs[int(rng.integers(len(self.rirs)))]
        return perturb.synthetic_rir(rng.uniform(*self.config.reverb.rt60), self.sample_rate, rng)

    def _noise(self, wave: Tensor, rng: np.random.Generator, others: OtherWaves | None) -> Tensor:
        kinds = self.config.noise.kinds
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "babble":
            if others is None:
                raise ValueError("babble noise needs other utterances; this dataset gives none")
            low, high = self.config.noise.babble_talkers
            talkers = others(rng, int(rng.integers(low, high + 1)))
            return perturb.babble(talkers, wave.numel(), rng)
        if kind == "files":
            return self._file_noise(wave.numel(), rng)
        return perturb.colored_noise(wave.numel(), kind, rng)

    def _file_noise(self, num_samples: int, rng: np.random.Generator) -> Tensor:
        """A random stretch of a random noise file, `num_samples` long (repeated if short)."""
        path, duration = self.noise_files[int(rng.integers(len(self.noise_files)))]
        seconds = num_samples / self.sample_rate
        offset = rng.uniform(0.0, max(0.0, duration - seconds))
        noise = load_audio(path, self.sample_rate, offset=offset, duration=min(seconds, duration))
        noise = perturb.fit_length(noise, num_samples, rng)
        if not float(perturb.power(noise)) > 0.0 and path not in self._silent_noise:
            # Whole files are not read up front (a noise corpus is hours): said when drawn.
            self._silent_noise.add(path)
            log.warning(
                "augment.noise.folder: %s is silent where drawn (or one constant value): "
                "it adds no noise to the utterances that draw it",
                path,
            )
        return noise


def _check_range(name: str, bounds: Sequence[float], positive: bool = False) -> None:
    if len(bounds) != 2 or not all(map(math.isfinite, bounds)) or bounds[0] > bounds[1]:
        raise ValueError(f"{name} must be [low, high] with low <= high, got {list(bounds)}")
    if positive and bounds[0] <= 0:
        raise ValueError(f"{name} must be > 0, got {list(bounds)}")


def _check_noise_kinds(noise: NoiseAugment) -> None:
    unknown = [k for k in noise.kinds if k not in NOISE_KINDS]
    if unknown or not noise.kinds:
        raise ValueError(f"augment.noise.kinds must be among {list(NOISE_KINDS)}, got {unknown}")
    if ("files" in noise.kinds) != (noise.folder is not None):
        raise ValueError("augment.noise: list 'files' in kinds exactly when a folder is given")
    low, high = noise.babble_talkers
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(
            f"augment.noise.babble_talkers must be 1 <= low <= high, got {[low, high]}"
        )


def _audio_files(folder: str | None, key: str) -> list[tuple[str, float]]:
    """(path, seconds) of every audio file under `folder`, each header checked."""
    if folder is None:
        return []
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{key}: {folder} is not a directory")
    try:
        paths = audio_files(root)
    except ValueError as error:  # a folder that cannot be listed
        raise ValueError(f"{key}: {error}") from None
    if not paths:
        raise ValueError(f"{key}: no audio files under {folder}")
    files = []
    for path in paths:
        try:
            info = audio_info(path)
        except AudioError as error:
            raise ValueError(f"{key}: {error}") from error
        if info.duration <= 0:
            raise ValueError(f"{key}: {path} holds no samples")
        files.append((str(path), info.duration))
    return files


def _load_rir(path_and_duration: tuple[str, float], sample_rate: int) -> Tensor:
    path = path_and_duration[0]
    try:
        rir = load_audio(path, sample_rate)
    except AudioError as error:
        raise ValueError(f"augment.reverb.folder: {error}") from error
    if float(rir.abs().max()) == 0.0:
        raise ValueError(f"augment.reverb.folder: {path}: the impulse response is silent")
    return rir
