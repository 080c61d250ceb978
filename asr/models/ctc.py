"""CTC head on the encoder output (Graves et al. 2006), for joint CTC/attention training."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.text import BLANK_ID


class CTCHead(nn.Module):
    """Linear projection of encoder frames to token log-probabilities, blank at id 0.

    Args:
        vocab_size: output vocabulary, blank included.
        encoder_dim: size of the encoder frames.
        dropout: dropout on the encoder output before the projection.
    """

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
        """Summed CTC loss divided by the number of target tokens (the attention loss's scale).

        Args:
            log_probs: `(B, T, V)` from `forward`.
            enc_lens: `(B,)` valid frames.
            targets: `(B, L)` token ids without blank/sos/eos (padding ignored past target_lens).
            target_lens: `(B,)`.
        """
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
