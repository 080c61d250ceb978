"""The contracts every frontend, encoder and decoder follows.

Batch first, absolute lengths. Attention weights are always returned as one tensor
shape, `(B, K, L_dec, L_enc)` from teacher forcing and `(B, K, L_enc)` from a step,
where K is the number of attention maps: 1 for an RNN decoder with single-head
attention, heads for multi-head attention, layers * heads (layer-major) for a
Transformer decoder. Plotting and timing code therefore sees one shape.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

# A decoder's search state: a dict of tensors whose first dimension is the batch
# (or batch x beam) dimension, so `reorder_state` can index it uniformly.
State = dict[str, Any]


class SequenceModule(Protocol):
    """Frontends and encoders: `forward(x, x_lens) -> (y, y_lens)`."""

    output_dim: int

    def __call__(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]: ...


class Decoder(Protocol):
    """Attention decoders. Token ids: 0 blank, 1 pad, 2 unk, 3 sos/eos (see asr.text)."""

    vocab_size: int
    num_attention_maps: int  # K in the attention shapes above

    def __call__(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing: tokens `(B, L)` (sos-prefixed inputs) -> logits `(B, L, V)`,
        attention `(B, K, L, T_enc)`."""
        ...

    def init_state(self, enc: Tensor, enc_lens: Tensor) -> State: ...

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State, Tensor]:
        """One step: tokens `(B,)` -> log-probs `(B, V)`, new state, attention `(B, K, T_enc)`."""
        ...

    def reorder_state(self, state: State, index: Tensor) -> State: ...


def reorder_batch(state: State, index: Tensor) -> State:
    """Select batch rows `index` from every tensor in a (possibly nested) state dict."""
    out: State = {}
    for key, value in state.items():
        if isinstance(value, Tensor):
            out[key] = value.index_select(0, index)
        elif isinstance(value, dict):
            out[key] = reorder_batch(value, index)
        elif isinstance(value, (list, tuple)):
            out[key] = type(value)(
                v.index_select(0, index) if isinstance(v, Tensor) else v for v in value
            )
        else:
            out[key] = value
    return out


def lengths_to_mask(lens: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean mask `(B, T)`, True on valid positions.

    >>> lengths_to_mask(torch.tensor([1, 3])).tolist()
    [[True, False, False], [True, True, True]]
    """
    max_len = int(lens.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]
