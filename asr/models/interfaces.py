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


def attention_kind(decoder: Any) -> str:
    """How a decoder's maps are named (the explorer's label): its RNN attention's kind, else
    cross-attention; an ONNX decoder carries the kind its export recorded."""
    kind = getattr(getattr(decoder, "attention", None), "kind", None)
    return kind or getattr(decoder, "attention_kind", None) or "cross-attention"


def check_lengths(name: str, x: Tensor, x_lens: Tensor, input_dim: int, arg: str = "x") -> Tensor:
    """Validate `(B, T, input_dim)` and its lengths; returns the lengths on the CPU."""
    if x.dim() != 3 or x.size(-1) != input_dim:
        raise ValueError(f"{name}: {arg} must be (B, T, {input_dim}), got {tuple(x.shape)}")
    if x_lens.shape != (x.size(0),):
        raise ValueError(f"{name}: {arg}_lens must be ({x.size(0)},), got {tuple(x_lens.shape)}")
    cpu_lens = x_lens.cpu()
    if cpu_lens.numel() and cpu_lens.min() < 1:
        shortest = int(cpu_lens.min())
        raise ValueError(f"{name}: an input of {shortest} frames is too short: it needs at least 1")
    if cpu_lens.numel() and cpu_lens.max() > x.size(1):
        raise ValueError(f"{name}: lengths {cpu_lens.tolist()} exceed the {x.size(1)} frames")
    return cpu_lens


def check_tokens(name: str, tokens: Tensor, batch: int) -> None:
    """Validate teacher-forcing tokens `(batch, L)`."""
    if tokens.dim() != 2 or tokens.size(0) != batch:
        raise ValueError(f"{name}: tokens must be (B={batch}, L), got {tuple(tokens.shape)}")


def lengths_to_mask(lens: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean mask `(B, T)`, True on valid positions.

    >>> lengths_to_mask(torch.tensor([1, 3])).tolist()
    [[True, False, False], [True, True, True]]
    """
    max_len = int(lens.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lens.device)[None, :] < lens[:, None]
