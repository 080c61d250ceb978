"""SpecAugment (Park et al. 2019): time warp, frequency masks and time masks on features."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from asr.frontends.features import check_batch
from asr.models.interfaces import lengths_to_mask


def _uniform_ints(high: Tensor) -> Tensor:
    """Independent integers uniform in `[0, high]` (inclusive), same shape as `high`."""
    return (torch.rand(high.shape, device=high.device) * (high + 1)).floor().long()


def _band_mask(starts: Tensor, widths: Tensor, size: int) -> Tensor:
    """`(B, N)` bands `[start, start + width)` -> `(B, size)` True where any band covers."""
    pos = torch.arange(size, device=starts.device)[None, None, :]  # (1, 1, size)
    inside = (pos >= starts[..., None]) & (pos < (starts + widths)[..., None])  # (B, N, size)
    return inside.any(dim=1)


class SpecAugment(nn.Module):
    """Time warp, frequency and time masks within each utterance's length, in training only.

    Args:
        time_warp: maximum warp distance W in frames; 0 disables.
        freq_masks: number of frequency masks.
        freq_width: maximum width F of a frequency mask (width uniform in [0, F]); at the
            features' count or more, a mask may cover every channel.
        time_masks: number of time masks.
        time_width: maximum time-mask width, a fraction of the length if below 1, else frames
            (as ESPnet's widths: a mask may then cover an utterance that is no longer).
        mask_value: value written into masked cells (0 is the mean of normalised features).
    """

    def __init__(
        self,
        time_warp: int = 5,
        freq_masks: int = 2,
        freq_width: int = 27,
        time_masks: int = 2,
        time_width: int | float = 0.05,
        mask_value: float = 0.0,
    ):
        super().__init__()
        sizes = dict(
            time_warp=time_warp,
            freq_masks=freq_masks,
            freq_width=freq_width,
            time_masks=time_masks,
            time_width=time_width,
        )
        for name, size in sizes.items():
            if not (math.isfinite(size) and size >= 0):
                raise ValueError(f"SpecAugment: {name} ({size}) must be finite and >= 0")
            if name != "time_width" and not float(size).is_integer():  # counts and bins
                raise ValueError(f"SpecAugment: {name} ({size}) must be a whole number")
        if not math.isfinite(mask_value):
            raise ValueError(f"SpecAugment mask_value must be finite, got {mask_value}")
        self.time_warp, self.mask_value = int(time_warp), mask_value
        self.freq_masks, self.freq_width = int(freq_masks), int(freq_width)
        self.time_masks, self.time_width = int(time_masks), time_width

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D)`, x_lens `(B,)`. Returns: augmented `(B, T, D)` and `x_lens`."""
        if not self.training:
            return x, x_lens
        check_batch(x, x_lens, ndim=3)
        if self.time_warp > 0:
            x = self._warp(x, x_lens)
        mask = self._freq_mask(x)[:, None, :] | self._time_mask(x, x_lens)[:, :, None]
        valid = lengths_to_mask(x_lens, x.size(1))[:, :, None]  # (B, T, 1)
        return x.masked_fill(mask & valid, self.mask_value), x_lens

    def max_time_width(self, length: Tensor) -> Tensor:
        """Largest time-mask width for utterances of `length` frames.

        >>> SpecAugment(time_width=0.05).max_time_width(torch.tensor([10, 100])).tolist()
        [0, 5]
        >>> SpecAugment(time_width=40).max_time_width(torch.tensor([10, 100])).tolist()
        [10, 40]
        """
        if isinstance(self.time_width, float) and self.time_width < 1:
            return (length * self.time_width).floor().long()
        return length.clamp(max=int(self.time_width))

    def _freq_mask(self, x: Tensor) -> Tensor:
        """`(B, D)` True on masked feature channels."""
        batch, dim = x.size(0), x.size(2)
        shape = (batch, self.freq_masks)
        widths = _uniform_ints(torch.full(shape, min(self.freq_width, dim), device=x.device))
        starts = _uniform_ints(dim - widths)
        return _band_mask(starts, widths, dim)

    def _time_mask(self, x: Tensor, x_lens: Tensor) -> Tensor:
        """`(B, T)` True on masked frames, each mask inside its utterance's length."""
        lens = x_lens.to(x.device)[:, None].expand(-1, self.time_masks)  # (B, N)
        widths = _uniform_ints(self.max_time_width(lens))
        starts = _uniform_ints(lens - widths)
        return _band_mask(starts, widths, x.size(1))

    def _warp(self, x: Tensor, x_lens: Tensor) -> Tensor:
        """Time-warp each utterance's valid frames; utterances of <= 2W + 1 frames are kept."""
        out = x.clone()
        for b, length in enumerate(x_lens.tolist()):
            if length < 2 * self.time_warp + 2:
                continue
            centre = int(torch.randint(self.time_warp + 1, length - self.time_warp, ()))
            shift = int(torch.randint(-self.time_warp, self.time_warp + 1, ()))
            out[b, :length] = _warp_one(x[b, :length], centre, centre + shift)
        return out


def _resize_time(x: Tensor, length: int) -> Tensor:
    y = F.interpolate(x.t()[None], size=length, mode="linear", align_corners=False)  # (1, D, L)
    return y[0].t()


def _warp_one(x: Tensor, centre: int, new_centre: int) -> Tensor:
    """Move frame boundary `centre` of `(L, D)` frames to `new_centre`, keeping length L."""
    left = _resize_time(x[:centre], new_centre)
    right = _resize_time(x[centre:], x.size(0) - new_centre)
    return torch.cat([left, right])
