"""Waveform -> features: level, log-mel, MFCC, spectrogram, Kaldi fbank, CMVN, SpecAugment."""

from __future__ import annotations

from torch import Tensor, nn

from asr.frontends.features import (
    MFCC,
    WINDOWS,
    KaldiFbank,
    LinearSpectrogram,
    LogMelFilterbank,
    num_frames,
    zero_padding,
)
from asr.frontends.normalize import (
    CMVNStats,
    GlobalCMVN,
    LevelNormalizer,
    UtteranceCMVN,
    accumulate_cmvn_stats,
    check_cmvn_stats,
)
from asr.frontends.specaugment import SpecAugment

__all__ = [
    "CMVNStats",
    "Frontend",
    "GlobalCMVN",
    "KaldiFbank",
    "LevelNormalizer",
    "LinearSpectrogram",
    "LogMelFilterbank",
    "MFCC",
    "SpecAugment",
    "UtteranceCMVN",
    "WINDOWS",
    "accumulate_cmvn_stats",
    "features_of",
    "num_frames",
    "zero_padding",
]


class Frontend(nn.Module):
    """Optional level normalisation, features, optional normalisation, optional augmentation.

    Args:
        features: waves -> features (`LogMelFilterbank`, `MFCC`, `KaldiFbank`, ...).
        normalize: e.g. `GlobalCMVN`; before `augment`, so a 0 mask is the corpus mean.
        augment: e.g. `SpecAugment` (acts in training mode only).
        level: waves -> waves, e.g. `LevelNormalizer` (its CMVN stats: `asr cmvn --config`).
    """

    def __init__(
        self,
        features: nn.Module,
        normalize: nn.Module | None = None,
        augment: nn.Module | None = None,
        level: nn.Module | None = None,
    ):
        super().__init__()
        check_cmvn_stats(features, level, normalize)
        self.level, self.features = level, features
        self.normalize, self.augment = normalize, augment
        self.output_dim: int = features.output_dim

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)`, wave_lens `(B,)`. Returns: feats `(B, T', output_dim)`, lengths."""
        if self.level is not None:
            wave, wave_lens = self.level(wave, wave_lens)
        feats, feat_lens = self.features(wave, wave_lens)
        if self.normalize is not None:
            feats, feat_lens = self.normalize(feats, feat_lens)
        if self.augment is not None:
            feats, feat_lens = self.augment(feats, feat_lens)
        return feats, feat_lens


def features_of(frontend: nn.Module) -> nn.Module:
    """The feature module of a `Frontend`, or the frontend itself where a config gives a bare
    one (`LogMelFilterbank`...)."""
    return getattr(frontend, "features", frontend)
