"""Waveform -> features: level, log-mel, MFCC, linear spectrogram, Kaldi fbank, CMVN, SpecAugment.

Every module follows `forward(x, x_lens) -> (y, y_lens)`, batch first with absolute lengths:
`features` (waves -> features), `normalize` (level and CMVN), `specaugment`; `Frontend` chains
them. Configs name the classes from here (`asr.frontends.LogMelFilterbank`).
"""

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
    check_cmvn_level,
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
    "num_frames",
    "zero_padding",
]


class Frontend(nn.Module):
    """Optional level normalisation, features, optional normalisation, optional augmentation.

    Normalising before augmenting means a masked cell with `mask_value=0` equals the corpus
    mean, as in Park et al. Each part follows `forward(x, x_lens) -> (y, y_lens)`.

    Args:
        features: waves -> features (`LogMelFilterbank`, `MFCC`, `KaldiFbank`, ...).
        normalize: e.g. `GlobalCMVN` or `UtteranceCMVN`.
        augment: e.g. `SpecAugment` (acts in training mode only).
        level: waves -> waves before the features, e.g. `LevelNormalizer`; its CMVN
            statistics must then be computed through it (`asr cmvn --target-dbfs`).
    """

    def __init__(
        self,
        features: nn.Module,
        normalize: nn.Module | None = None,
        augment: nn.Module | None = None,
        level: nn.Module | None = None,
    ):
        super().__init__()
        check_cmvn_level(level, normalize)
        self.level, self.features = level, features
        self.normalize, self.augment = normalize, augment
        self.output_dim: int = features.output_dim

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Waves to (normalised, augmented) features.

        Args:
            wave: `(B, T)` samples.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', output_dim)` float32, zero beyond `feat_lens`; feat_lens `(B,)`.
        """
        if self.level is not None:
            wave, wave_lens = self.level(wave, wave_lens)
        feats, feat_lens = self.features(wave, wave_lens)
        if self.normalize is not None:
            feats, feat_lens = self.normalize(feats, feat_lens)
        if self.augment is not None:
            feats, feat_lens = self.augment(feats, feat_lens)
        return feats, feat_lens
