"""Opt-in dropout whose CPU mask costs a quarter of the random numbers of `nn.Dropout`.

On CPU, `nn.Dropout` draws one number per element from the serial generator (`bernoulli_`),
a large share of a small model's training step. Here each 64-bit draw gives four 16-bit
uniforms, so the drop probability is `p` rounded to a multiple of 1/65536. Elsewhere (CUDA)
`torch.nn.functional.dropout` runs unchanged.

Models are built with `nn.Dropout`; `use_fast_dropout(model)` swaps each one for
`FastDropout`. The training modules do so with `fast_dropout: true` (docs/performance.md).
"""

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
    # The mask as 0/1 in x's dtype (through uint8: a bool -> bf16 cast or a `where` is far
    # slower on CPU), so that forward and backward are plain multiplications.
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
    """Swap every `nn.Dropout` inside `model` for a `FastDropout` of the same `p`, in place.

    Returns:
        How many were swapped.
    """
    swapped = 0
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, FastDropout(child.p))
                swapped += 1
    return swapped
