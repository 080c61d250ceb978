"""The contracts every frontend, encoder and decoder follows: batch first, absolute lengths."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

# Search state: tensors with batch (or batch x beam) first, so `reorder_state` can index it.
State = dict[str, Any]


class SequenceModule(Protocol):
    """Frontends and encoders: `forward(x, x_lens) -> (y, y_lens)`."""

    output_dim: int

    def __call__(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]: ...


class Decoder(Protocol):
    """Attention decoders over the token ids of `asr.text`."""

    vocab_size: int
    num_attention_maps: int  # K in the attention shapes
    attention_layers: int  # the layers K splits over evenly: map k is head k % (K / layers)

    def __call__(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing: tokens `(B, L)` -> logits `(B, L, V)`, attention `(B, K, L, T_enc)`."""
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
