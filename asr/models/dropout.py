"""Opt-in dropout whose CPU mask costs a quarter of the random numbers of `nn.Dropout`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16  # 16-bit uniforms


def fast_dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability `p`, scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    # via uint8: a bool -> bf16 cast or a `where` is far slower on CPU
    keep = _keep_mask(x, p).view(torch.uint8).to(x.dtype)
    return x * (1.0 / (1.0 - p)) * keep


def _keep_mask(x: Tensor, p: float) -> Tensor:
    """Boolean, shaped as `x`, True with probability 1 - p (to 1/65536)."""
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    uniforms = words.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    return uniforms >= round(p * _LEVELS) - _LEVELS // 2


class FastDropout(nn.Dropout):
    """`nn.Dropout` with the mask of `fast_dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return fast_dropout(x, self.p, self.training)


def use_fast_dropout(model: nn.Module) -> int:
    """Swap every `nn.Dropout` in `model` for a `FastDropout` in place; returns how many."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, FastDropout(child.p))
                swapped += 1
    return swapped
