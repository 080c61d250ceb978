"""CTC head on the encoder output (Graves et al. 2006), for joint CTC/attention training."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.text import BLANK_ID


class CTCHead(nn.Module):
    """Linear projection of encoder frames to token log-probabilities, blank at id 0."""

    def __init__(self, vocab_size: int, encoder_dim: int, dropout: float = 0.0):
        super().__init__()
        self.vocab_size = vocab_size
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(encoder_dim, vocab_size)

    def forward(self, enc: Tensor) -> Tensor:
        """Args: enc `(B, T, D)`. Returns: log-probs `(B, T, V)` in float32."""
        return F.log_softmax(self.proj(self.dropout(enc)).float(), dim=-1)

    def loss(
        self, log_probs: Tensor, enc_lens: Tensor, targets: Tensor, target_lens: Tensor
    ) -> Tensor:
        """Summed CTC loss per target token, the attention loss's scale."""
        loss = F.ctc_loss(
            log_probs.transpose(0, 1),  # (T, B, V)
            targets,
            enc_lens,
            target_lens,
            blank=BLANK_ID,
            reduction="sum",
            zero_infinity=True,
        )
        return loss / target_lens.sum().clamp(min=1)

    def greedy(self, log_probs: Tensor, enc_lens: Tensor) -> list[list[int]]:
        """Best path: argmax per frame, merge repeats, drop blanks."""
        best = log_probs.argmax(-1)  # (B, T)
        out = []
        for row, n in zip(best, enc_lens.tolist()):
            ids = torch.unique_consecutive(row[:n]).tolist()
            out.append([i for i in ids if i != BLANK_ID])
        return out


@dataclass(frozen=True)
class InterCTC:
    """Intermediate CTC (Lee & Watanabe 2021): the CTC head also reads chosen encoder blocks."""

    layers: tuple[int, ...]  # 1-based indices into `encoder.layers`, before the last block
    weight: float  # share of the intermediate losses in the CTC loss, in (0, 1)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(
                "inter_ctc_layers names no block: name some, or set inter_ctc_weight 0 to train "
                "without intermediate CTC"
            )
        if min(self.layers) < 1:
            raise ValueError(f"inter_ctc_layers must be 1-based block indices, got {self.layers}")
        if not 0.0 < self.weight < 1.0:
            raise ValueError(f"inter_ctc_weight must lie in (0, 1), got {self.weight}")

    def blocks(self, encoder: nn.Module) -> list[nn.Module]:
        """The tapped blocks; a ValueError names what the encoder lacks."""
        layers = getattr(encoder, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(
                f"intermediate CTC needs an encoder with a `layers` ModuleList of blocks; "
                f"{type(encoder).__name__} has none"
            )
        if max(self.layers) >= len(layers):
            which = (
                f"an intermediate one is 1..{len(layers) - 1}"
                if len(layers) > 1
                else "none is intermediate: give inter_ctc_weight 0"
            )
            raise ValueError(
                f"inter_ctc_layers {list(self.layers)}: {type(encoder).__name__} has "
                f"{len(layers)} block{'s' * (len(layers) != 1)}, so {which}"
            )
        return [layers[i - 1] for i in sorted(set(self.layers))]

    @contextmanager
    def tap(self, encoder: nn.Module) -> Iterator[list[Tensor]]:
        """Collect the tapped blocks' normalised outputs `(B, T, D)` while the body runs."""
        norm = getattr(encoder, "norm", None)
        norm = norm if isinstance(norm, nn.Module) else nn.Identity()
        outputs: list[Tensor] = []
        handles = [
            block.register_forward_hook(lambda _m, _args, out: outputs.append(norm(out)))
            for block in self.blocks(encoder)
        ]
        try:
            yield outputs
        finally:
            for handle in handles:
                handle.remove()
