"""Normalisation: the recording level of waves, and feature means and variances (CMVN)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from asr.frontends.features import check_batch, must_be, zero_padding
from asr.models.interfaces import lengths_to_mask


def _masked_mean_var(x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
    """Per-utterance mean and (population) variance over valid frames, each `(B, 1, D)`.

    In float64: a constant band then has exactly its value as mean and no variance, where
    float32 rounding (which depends on the padded length) would be divided by the std floor.
    """
    valid = lengths_to_mask(x_lens, x.size(1))[:, :, None]  # (B, T, 1)
    x64 = x.double()
    count = x_lens.clamp(min=1)[:, None, None].to(x64.dtype)
    mean = (x64 * valid).sum(1, keepdim=True) / count
    var = (((x64 - mean) * valid) ** 2).sum(1, keepdim=True) / count
    return mean.to(x.dtype), var.to(x.dtype)


class UtteranceCMVN(nn.Module):
    """Per-utterance mean (and optionally variance) normalisation over valid frames only.

    Args:
        norm_means: subtract each utterance's mean.
        norm_vars: divide by each utterance's standard deviation.
        std_floor: smallest standard deviation divided by.
    """

    def __init__(self, norm_means: bool = True, norm_vars: bool = False, std_floor: float = 1e-5):
        super().__init__()
        if norm_vars and (need := must_be(std_floor)):  # a constant band: NaN or zero features
            raise ValueError(f"std_floor ({std_floor}) must be {need}")
        self.norm_means, self.norm_vars, self.std_floor = norm_means, norm_vars, std_floor

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D)`, x_lens `(B,)`. Returns: normalised `(B, T, D)` and `x_lens`."""
        check_batch(x, x_lens, ndim=3)
        mean, var = _masked_mean_var(x, x_lens)
        if self.norm_means:
            x = x - mean
        if self.norm_vars:
            x = x / var.sqrt().clamp(min=self.std_floor)
        return zero_padding(x, x_lens), x_lens


UNKNOWN_LEVEL = "unknown"


@dataclass(frozen=True, eq=False)
class CMVNStats:
    """Feature statistics accumulated over frames; `+` merges two accumulations.

    >>> s = accumulate_cmvn_stats(torch.tensor([[[1.0], [3.0], [9.0]]]), torch.tensor([2]))
    >>> s.count, s.mean.tolist(), s.std.tolist()
    (2, [2.0], [1.0])
    """

    count: int  # number of frames accumulated
    sum: Tensor  # (D,) float64 per-dimension sum of the frames
    sum_sq: Tensor  # (D,) float64 per-dimension sum of squares
    std_floor: float = 1e-5  # smallest standard deviation reported by `std`
    # LevelNormalizer target of the audio (None: as recorded); UNKNOWN_LEVEL where not stored
    level_dbfs: float | None | str = UNKNOWN_LEVEL
    sample_rate: int | None = None  # of the audio the features were taken from (None: unknown)
    signature: tuple[float, ...] | None = None  # `features_signature` of their features

    def __post_init__(self) -> None:
        if self.sum.dim() != 1 or self.sum.shape != self.sum_sq.shape:
            raise ValueError(
                f"sum {tuple(self.sum.shape)} and sum_sq {tuple(self.sum_sq.shape)} must be (D,)"
            )
        if self.count < 0:
            raise ValueError(f"negative frame count {self.count}")

    @property
    def dim(self) -> int:
        return self.sum.numel()

    @property
    def mean(self) -> Tensor:
        """`(D,)` float64 mean per dimension."""
        if self.count == 0:
            raise ValueError("no frames accumulated: the mean is undefined")
        return self.sum / self.count

    @property
    def std(self) -> Tensor:
        """`(D,)` float64 population standard deviation, at least `std_floor`."""
        var = self.sum_sq / self.count - self.mean**2
        return var.clamp(min=self.std_floor**2).sqrt()

    def __add__(self, other: CMVNStats) -> CMVNStats:
        if other.dim != self.dim:
            raise ValueError(f"cannot add stats of dimension {self.dim} and {other.dim}")
        total, total_sq = self.sum + other.sum, self.sum_sq + other.sum_sq
        count = self.count + other.count
        return CMVNStats(
            count, total, total_sq, self.std_floor, self.level_dbfs, self.sample_rate,
            self.signature,
        )  # fmt: skip

    def save(self, path: str | Path) -> None:
        """Write the statistics as JSON (exact float64 round trip)."""
        data = {
            "count": self.count,
            "sum": self.sum.double().tolist(),
            "sum_sq": self.sum_sq.double().tolist(),
            "std_floor": self.std_floor,
            "level_dbfs": self.level_dbfs,
            "sample_rate": self.sample_rate,
        }
        if self.signature is not None:
            data["features_signature"] = list(self.signature)
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CMVNStats:
        """Read statistics written by `save`; a malformed file raises ValueError naming it."""
        if not Path(path).is_file():
            what = "a folder, not" if Path(path).is_dir() else "no"
            raise FileNotFoundError(f"{path}: {what} CMVN statistics file (asr cmvn writes one)")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON CMVN stats ({e.msg})") from e
        except (UnicodeDecodeError, RecursionError) as e:  # a binary file (Kaldi's cmvn.ark)
            raise ValueError(f"{path}: not JSON CMVN stats (asr cmvn writes them): {e}") from None
        try:
            return cls._from_json(data)
        except KeyError as e:
            raise ValueError(f"{path}: bad CMVN stats: no {e} key") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: bad CMVN stats: {e}") from e

    @classmethod
    def _from_json(cls, data: object) -> CMVNStats:
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        count, std_floor = data["count"], data.get("std_floor", 1e-5)
        level = data.get("level_dbfs", UNKNOWN_LEVEL)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TypeError(f"'count' must be a positive integer (frames), got {count!r}")
        total = torch.tensor(data["sum"], dtype=torch.float64)
        total_sq = torch.tensor(data["sum_sq"], dtype=torch.float64)
        if not (total.isfinite().all() and total_sq.isfinite().all()):
            raise ValueError("non-finite values in 'sum' or 'sum_sq'")
        level = level if level in (None, UNKNOWN_LEVEL) else float(level)
        rate = data.get("sample_rate")
        if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or rate < 1):
            raise TypeError(f"'sample_rate' must be a whole number of Hz, got {rate!r}")
        signature = data.get("features_signature")
        if signature is not None:
            signature = tuple(float(x) for x in signature)
            if len(signature) != total.numel():
                raise ValueError(
                    f"'features_signature' has {len(signature)} values, 'sum' {total.numel()}"
                )
        if (
            isinstance(std_floor, bool)
            or not isinstance(std_floor, (int, float))
            or not (0 < std_floor < math.inf)
        ):  # else every band's deviation would be clamped up to it, or none floored
            raise ValueError(f"'std_floor' must be a positive number, got {std_floor!r}")
        stats = cls(count, total, total_sq, float(std_floor), level, rate, signature)
        if not (stats.mean.float().isfinite().all() and stats.std.float().isfinite().all()):
            raise ValueError("its mean or standard deviation is past float32's range")
        return stats


SIGNATURE_DECIMALS = 4
# Mean absolute difference of two signatures past which the features are of another kind or
# scale (Kaldi fbank against log-mel: 20; log magnitude against log power: 2); another hop,
# Hann or Hamming window, FFT size or band edge moves log features by 0.7 at most, and leaves
# the statistics fit to use.
SIGNATURE_TOLERANCE = 1.0
# Features not on a log scale are small numbers whose kinds differ by less: how widely the
# means spread over the features tells them apart (magnitude against power: 7.5 times, log
# magnitude against log power: 2), where the changes above spread them 1.12 times at most.
SIGNATURE_SPREAD_RATIO = 1.5


def _spread(signature: Tensor) -> float:
    """How widely a signature's means spread about their own mean."""
    return float((signature - signature.mean()).abs().mean())


def features_signature(features: nn.Module, sample_rate: int) -> tuple[float, ...]:
    """The mean features of one second of a fixed signal (a tone in noise): what tells apart
    features of the same count that CMVN statistics are not interchangeable between (log-mel
    and Kaldi fbank, another log offset or scale), where a hop or window alone changes little."""
    generator = torch.Generator().manual_seed(0)
    t = torch.arange(sample_rate, dtype=torch.float64) / sample_rate
    noise = torch.randn(sample_rate, generator=generator, dtype=torch.float64)
    wave = (0.1 * torch.sin(2 * math.pi * 440 * t) + 0.01 * noise).float()
    device = next(iter([*features.parameters(), *features.buffers()]), wave).device
    training = features.training
    features.eval()  # no dither
    try:
        with torch.no_grad():
            lens = torch.tensor([sample_rate], device=device)
            feats, lens = features(wave[None].to(device), lens)
    finally:
        features.train(training)
    mean = feats[0, : int(lens[0])].double().mean(0).cpu()
    return tuple(round(float(x), SIGNATURE_DECIMALS) for x in mean)


def accumulate_cmvn_stats(
    feats: Tensor, feat_lens: Tensor, stats: CMVNStats | None = None
) -> CMVNStats:
    """`stats` (or None) plus the valid frames of feats `(B, T, D)`, feat_lens `(B,)`."""
    check_batch(feats, feat_lens, ndim=3)
    valid = lengths_to_mask(feat_lens, feats.size(1))
    frames = feats[valid].double()  # (N, D)
    batch = CMVNStats(int(valid.sum()), frames.sum(0).cpu(), (frames**2).sum(0).cpu())
    return batch if stats is None else stats + batch


class GlobalCMVN(nn.Module):
    """Normalise with fixed corpus statistics: `(x - mean) / std` on valid frames.

    Args:
        stats_path: JSON file written by `CMVNStats.save` / `compute_cmvn_stats`.
        mean: `(D,)` mean, instead of `stats_path`.
        std: `(D,)` standard deviation, instead of `stats_path` (default ones).
        norm_means: subtract the mean.
        norm_vars: divide by the standard deviation.
    """

    def __init__(
        self,
        stats_path: str | None = None,
        mean: Tensor | None = None,
        std: Tensor | None = None,
        norm_means: bool = True,
        norm_vars: bool = True,
    ):
        super().__init__()
        if (stats_path is None) == (mean is None):
            raise ValueError("give exactly one of stats_path or mean (and std)")
        self.stats_path, self.level_dbfs, self.sample_rate = stats_path, UNKNOWN_LEVEL, None
        self.signature: tuple[float, ...] | None = None
        if stats_path is not None:
            stats = CMVNStats.load(stats_path)
            mean, std, self.level_dbfs = stats.mean, stats.std, stats.level_dbfs
            self.sample_rate, self.signature = stats.sample_rate, stats.signature
        std = torch.ones_like(mean) if std is None else std
        if mean.dim() != 1 or std.shape != mean.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and std {tuple(std.shape)} must be (D,)")
        if not bool((std > 0).all()):
            raise ValueError(f"std must be positive ({stats_path or 'std tensor'})")
        self.register_buffer("mean", mean.float().clone())
        self.register_buffer("std", std.float().clone())
        self.norm_means, self.norm_vars = norm_means, norm_vars
        self.output_dim = mean.numel()

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D)`, x_lens `(B,)`. Returns: normalised `(B, T, D)` and `x_lens`."""
        check_batch(x, x_lens, ndim=3)
        if x.size(2) != self.output_dim:
            raise ValueError(f"features have dimension {x.size(2)}, stats {self.output_dim}")
        if self.norm_means:
            x = x - self.mean
        if self.norm_vars:
            x = x / self.std
        return zero_padding(x, x_lens), x_lens


class LevelNormalizer(nn.Module):
    """Scale each utterance to one RMS level (mean removed), so recording loudness is unseen.

    Args:
        target_dbfs: RMS level every utterance is brought to, in dB re full scale.
        floor_dbfs: levels below this count as silence and are not amplified to the target.
    """

    def __init__(self, target_dbfs: float = -26.0, floor_dbfs: float = -100.0):
        super().__init__()
        if floor_dbfs >= target_dbfs:
            raise ValueError(f"floor_dbfs {floor_dbfs} must be below target_dbfs {target_dbfs}")
        if not -300 < floor_dbfs < target_dbfs <= 0:  # powers of ten that float64 holds
            raise ValueError(
                f"target_dbfs {target_dbfs} must be at most 0 (full scale), floor_dbfs "
                f"{floor_dbfs} above -300"
            )
        self.target_dbfs, self.floor_dbfs = target_dbfs, floor_dbfs

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)`, wave_lens `(B,)`. Returns: scaled `(B, T)` and `wave_lens`."""
        check_batch(wave, wave_lens, ndim=2)
        x = zero_padding(wave.double()[:, :, None], wave_lens)[:, :, 0]  # (B, T)
        mean, var = _masked_mean_var(x[:, :, None], wave_lens)  # (B, 1, 1) each
        floor = 10 ** (self.floor_dbfs / 10)
        gain = (10 ** (self.target_dbfs / 10) / var[:, 0].clamp(min=floor)).sqrt()  # (B, 1)
        scaled = ((x - mean[:, 0]) * gain)[:, :, None]  # a DC offset is no sound: removed
        return zero_padding(scaled, wave_lens)[:, :, 0].to(wave.dtype), wave_lens


def check_cmvn_stats(
    features: nn.Module, level: nn.Module | None, normalize: nn.Module | None
) -> None:
    """Raise ValueError, naming the file, if `normalize`'s statistics are of another feature
    count or sample rate than `features` give, or were taken at another level than `level`'s."""
    if not isinstance(normalize, GlobalCMVN):
        return
    where = normalize.stats_path or "the normaliser's statistics"
    if normalize.output_dim != features.output_dim:
        raise ValueError(
            f"{where}: statistics of {normalize.output_dim} features, but the features have "
            f"{features.output_dim}: take them through this config (asr cmvn --config)"
        )
    rate = getattr(features, "sample_rate", None)
    if None not in (normalize.sample_rate, rate) and normalize.sample_rate != rate:
        raise ValueError(
            f"{where}: statistics of {normalize.sample_rate} Hz audio, but the features take "
            f"{rate} Hz: take them through this config (asr cmvn --config)"
        )
    if normalize.signature is not None and rate is not None:
        now = torch.tensor(features_signature(features, rate), dtype=torch.float64)
        then = torch.tensor(normalize.signature, dtype=torch.float64)
        apart = float((now - then).abs().mean())
        ratio = _spread(now) / max(_spread(then), 1e-12)
        wider = max(ratio, 1 / max(ratio, 1e-12))
        if apart > SIGNATURE_TOLERANCE or wider > SIGNATURE_SPREAD_RATIO:
            raise ValueError(
                f"{where}: statistics of other features than this frontend's (their means on a "
                f"test signal lie {apart:.2g} apart, spread {ratio:.2g} times as widely: "
                "another kind or scale): take them through this config (asr cmvn --config)"
            )
    if normalize.level_dbfs == UNKNOWN_LEVEL:
        return
    target = level.target_dbfs if isinstance(level, LevelNormalizer) else None
    if normalize.level_dbfs != target:

        def said(dbfs: float | None) -> str:
            return "audio as recorded" if dbfs is None else f"audio at {dbfs:g} dBFS"

        raise ValueError(
            f"{normalize.stats_path}: CMVN statistics of {said(normalize.level_dbfs)}, but the "
            f"frontend gives {said(target)}: recompute them through this config (asr cmvn "
            "--config)"
        )
