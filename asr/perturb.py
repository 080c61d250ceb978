"""Waveform degradations (level, speed, noise, reverberation, telephone band) as pure functions
of a mono waveform and a seeded numpy `Generator`, for training and robustness evaluation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
import torchaudio.functional as AF
from torch import Tensor

from asr.levels import SILENT_DB

NOISE_COLORS = {"white": 0.0, "pink": 1.0, "brown": 2.0}  # power spectrum ~ 1 / f**exponent
TELEPHONE_RATE = 8000
TELEPHONE_LOW_HZ = 300.0
REVERB_ENERGY_PER_SECOND = 8.0  # reverberant tail energy per second of rt60, direct path = 1
_POWER_FLOOR = 1e-20


def power(wave: Tensor) -> Tensor:
    """Mean square of `wave` after removing its mean (a DC offset is not signal)."""
    centred = wave.double() - wave.double().mean()
    return (centred**2).mean()


def rms_dbfs(wave: Tensor) -> float:
    """Root-mean-square level in dBFS (a full-scale sine is -3 dBFS).

    >>> round(rms_dbfs(torch.full((100,), 0.1) * torch.tensor([1.0, -1.0]).repeat(50)), 1)
    -20.0
    """
    return 10 * math.log10(max(float(power(wave)), _POWER_FLOOR))


def change_gain(wave: Tensor, db: float) -> Tensor:
    return wave * (10 ** (db / 20))


def change_speed(wave: Tensor, factor: float) -> Tensor:
    """`wave` `(..., T)` played `factor` times faster by resampling: `(..., ceil(T / factor))`.

    >>> change_speed(torch.zeros(1000), 0.9).shape
    torch.Size([1112])
    """
    ratio = speed_ratio(factor)
    if ratio == 1:
        return wave
    return AF.resample(wave, ratio.numerator, ratio.denominator)


def speed_seconds(seconds: np.ndarray, factors: np.ndarray, sample_rate: int) -> np.ndarray:
    """Seconds of audio lasting `seconds` once `change_speed` plays it `factors` times faster,
    to the sample it rounds up to (a batch shape grid pads by that count).

    >>> speed_seconds(np.array([1.0, 1.0]), np.array([1.1, 1.0]), 16000).tolist()
    [0.909125, 1.0]
    """
    samples = np.round(np.asarray(seconds, dtype=np.float64) * sample_rate).astype(np.int64)
    out = samples.copy()
    for factor in np.unique(factors):
        ratio, chosen = speed_ratio(float(factor)), factors == factor
        out[chosen] = -(-samples[chosen] * ratio.denominator // ratio.numerator)  # ceil
    return out / sample_rate


def speed_ratio(factor: float) -> Fraction:
    """`factor` as the ratio of whole numbers a resampler takes, its denominator at most 100
    (which keeps the kernel small); ValueError for one that is not such a ratio (1.005 would be
    1) or lies outside [0.1, 10].

    >>> speed_ratio(1.1), speed_ratio(0.95)
    (Fraction(11, 10), Fraction(19, 20))
    """
    ratio = Fraction(factor).limit_denominator(100)
    if not 0.1 <= factor <= 10 or abs(ratio - Fraction(factor)) > 1e-9:
        raise ValueError(
            f"speed factor {factor:g}: give one in [0.1, 10] with at most two decimals (it is "
            "resampled as a ratio of whole numbers up to 100)"
        )
    return ratio


def colored_noise(num_samples: int, color: str, rng: np.random.Generator) -> Tensor:
    """Gaussian noise `(num_samples,)` float32 with a white, pink or brown spectrum, unit power.

    >>> noise = colored_noise(16000, "pink", np.random.default_rng(0))
    >>> noise.shape, round(float(power(noise)), 3)
    (torch.Size([16000]), 1.0)
    """
    if color not in NOISE_COLORS:
        raise ValueError(f"noise color must be one of {sorted(NOISE_COLORS)}, got {color!r}")
    exponent = NOISE_COLORS[color]
    size = _fft_size(num_samples) if exponent and num_samples > 1 else num_samples
    noise = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    if size != num_samples or exponent:
        spectrum = torch.fft.rfft(noise)
        bins = torch.arange(spectrum.numel(), dtype=torch.float32).clamp(min=1.0)
        noise = torch.fft.irfft(spectrum / bins ** (exponent / 2), n=size)[:num_samples]
    return noise / power(noise).sqrt().clamp(min=1e-10).float()


def pad_silence(wave: Tensor, seconds: float, sample_rate: int, rng: np.random.Generator) -> Tensor:
    """`wave` with 0 to `seconds` of digital silence, split at random between its two ends.

    >>> padded = pad_silence(torch.ones(10), 1.0, 100, np.random.default_rng(0))
    >>> padded.numel() >= 10, float(padded.sum())
    (True, 10.0)
    """
    total = round(float(rng.uniform(0.0, seconds)) * sample_rate)
    before = round(float(rng.uniform(0.0, 1.0)) * total)
    return torch.nn.functional.pad(wave, (before, total - before))


def fit_length(noise: Tensor, num_samples: int, rng: np.random.Generator) -> Tensor:
    """`noise` cut or repeated to `num_samples`, starting at a random offset."""
    if noise.numel() == 0:
        raise ValueError("cannot fit an empty noise signal to a length")
    repeats = -(-(num_samples + noise.numel()) // noise.numel())
    start = int(rng.integers(noise.numel()))
    return noise.repeat(repeats)[start : start + num_samples]


def add_noise(
    wave: Tensor, noise: Tensor, snr_db: float, reference: Tensor | None = None
) -> Tensor:
    """`wave` plus `noise` at `snr_db` relative to `reference`'s power (default `wave`'s)."""
    if noise.shape != wave.shape:
        raise ValueError(f"noise {tuple(noise.shape)} and wave {tuple(wave.shape)} differ")
    signal = float(power(wave if reference is None else reference))
    noise_power = float(power(noise))
    if not (signal > _POWER_FLOOR and noise_power > _POWER_FLOOR):  # NaN too: no samples
        return wave.clone()  # no level to set the ratio by
    scale = math.sqrt(signal / (noise_power * 10 ** (snr_db / 10)))
    noise = noise.double() - noise.double().mean()  # its offset is no noise: not added
    return (wave + scale * noise.to(wave.dtype)).to(wave.dtype)


def babble(talkers: list[Tensor], num_samples: int, rng: np.random.Generator) -> Tensor:
    """Babble noise `(num_samples,)`: other utterances at equal level and random offsets, summed
    without their offsets; a stretch of a talker quieter than SILENT_DB (digital silence, or
    its dither) adds nothing, where brought to a talker's level it would be loud hiss.

    >>> mix = babble([torch.full((8,), -0.5)], 8, np.random.default_rng(0))
    >>> float(mix.abs().max())
    0.0
    """
    if not talkers:
        raise ValueError("babble needs at least one talker")
    mix = torch.zeros(num_samples)
    for talker in talkers:
        talker = fit_length(talker.float(), num_samples, rng)
        level = float(power(talker))
        if level > 10 ** (SILENT_DB / 10):
            mix += ((talker - talker.mean()) / math.sqrt(level)).float()
    return mix


def other_indices(rng: np.random.Generator, size: int, count: int, index: int) -> list[int]:
    """Up to `count` distinct indices of `range(size)` other than `index`, for babble.

    >>> 2 in other_indices(np.random.default_rng(0), 5, 4, 2)
    False
    """
    picks = rng.choice(size - 1, size=min(count, size - 1), replace=False)
    return [int(j) + (j >= index) for j in picks]


def synthetic_rir(rt60: float, sample_rate: int, rng: np.random.Generator) -> Tensor:
    """Room impulse response: direct path 1.0, then Gaussian reflections fading 60 dB by `rt60`."""
    if rt60 <= 0:
        raise ValueError(f"rt60 must be > 0 seconds, got {rt60}")
    length = max(2, math.ceil(rt60 * sample_rate))
    t = torch.arange(length, dtype=torch.float32) / sample_rate
    decay = torch.exp(-3 * math.log(10) * t / rt60)
    tail = torch.from_numpy(rng.standard_normal(length).astype(np.float32)) * decay
    # Reverberant energy grows with rt60, as for a talker at a fixed distance.
    tail *= math.sqrt(REVERB_ENERGY_PER_SECOND * rt60) / tail.norm().clamp(min=1e-10)
    tail[0] = 1.0
    return tail


def reverberate(wave: Tensor, rir: Tensor, keep_level: bool = True) -> Tensor:
    """`wave` convolved with `rir`, cut to its length and (`keep_level`) level; words keep
    their timing."""
    if rir.dim() != 1 or rir.numel() == 0:
        raise ValueError(
            f"a room impulse response must be 1-D and non-empty, got {tuple(rir.shape)}"
        )
    rir = rir[int(rir.abs().argmax()) :].to(torch.float32)  # the direct path at time 0
    size = _fft_size(wave.numel() + rir.numel() - 1)
    spectrum = torch.fft.rfft(wave.float(), size) * torch.fft.rfft(rir, size)
    wet = torch.fft.irfft(spectrum, size)[: wave.numel()]
    if not keep_level:
        return wet.to(wave.dtype)
    return (wet * level_gain(wave, wet)).to(wave.dtype)


def level_gain(wave: Tensor, changed: Tensor) -> Tensor:
    """The factor that brings `changed` back to `wave`'s power."""
    return (power(wave) / power(changed).clamp(min=_POWER_FLOOR)).sqrt().float()


def telephone(wave: Tensor, sample_rate: int, mu_law: bool = True) -> Tensor:
    """`wave` through a phone line: 8 kHz, high-passed at 300 Hz, optionally mu-law coded."""
    narrow = AF.resample(wave.float(), sample_rate, TELEPHONE_RATE)
    # The biquad and the codec clip at full scale.
    scale = max(float(narrow.abs().max()) * 1.1, 1.0)
    narrow = AF.highpass_biquad(narrow / scale, TELEPHONE_RATE, TELEPHONE_LOW_HZ)
    if mu_law:
        narrow = AF.mu_law_decoding(AF.mu_law_encoding(narrow, 256), 256)
    wide = AF.resample(narrow * scale, TELEPHONE_RATE, sample_rate)
    return _fit_exactly(wide, wave.numel()).to(wave.dtype)


def _fft_size(n: int) -> int:
    """The smallest 2**a * 3**b * 5**c >= `n`: large prime factors make FFTs slow.

    >>> _fft_size(65599), _fft_size(1024)
    (65610, 1024)
    """
    best = 1 << (n - 1).bit_length()
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            size = power35
            while size < n:
                size *= 2
            best, power35 = min(best, size), power35 * 3
        power5 *= 5
    return best


def _fit_exactly(wave: Tensor, num_samples: int) -> Tensor:
    if wave.numel() >= num_samples:
        return wave[:num_samples]
    return torch.nn.functional.pad(wave, (0, num_samples - wave.numel()))
