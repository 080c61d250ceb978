"""Chunk streaming for self-attention encoders: chunk masks, dynamic chunk training and the
cache a chunk carries to the next (WeNet's U2 recipe, Zhang et al. 2021).

A streaming encoder sees, at every layer, its own chunk and the chunks before it. Trained with a
random chunk size per batch (full context some of the time), one model serves full context and
any chunk size at inference. Run chunk by chunk, each layer keeps the attention keys and values
of the frames before (and the convolution's last inputs), so a chunk costs its own frames plus
the cached context; the result equals the full-sequence computation under the chunk mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def chunk_attention_mask(
    length: int,
    chunk: int,
    left_chunks: int = -1,
    device: torch.device | None = None,
    first: int | None = None,
) -> Tensor:
    """`(T, T)` True where query frame `i` may attend key frame `j`: `j` is in `i`'s chunk or
    in one of the `left_chunks` chunks before it (all of them when negative). The first chunk
    holds `first` frames (None: `chunk`), the others `chunk`.

    >>> chunk_attention_mask(4, 2).int().tolist()
    [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    >>> chunk_attention_mask(3, 1, left_chunks=1).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    >>> chunk_attention_mask(4, 1, first=3).int().tolist()
    [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    """
    if chunk < 1 or (first is not None and first < 1):
        raise ValueError(f"chunks must be at least 1 frame, got {chunk} (first: {first})")
    index = torch.arange(length, device=device)
    if first is None:
        index = index // chunk
    else:
        index = torch.where(index < first, 0, (index - first) // chunk + 1)
    query, key = index[:, None], index[None, :]
    allowed = key <= query
    if left_chunks >= 0:
        allowed &= key >= query - left_chunks
    return allowed


def encoder_mask(
    valid: Tensor, chunk: int | None, left_chunks: int = -1, first: int | None = None
) -> Tensor:
    """Self-attention mask `(B, 1, 1 or T, T)` from valid frames `(B, T)`, chunked or not
    (`first`: the first chunk's frames, as `chunk_attention_mask`)."""
    mask = valid[:, None, None, :]
    if chunk is None:
        return mask
    return mask & chunk_attention_mask(valid.size(1), chunk, left_chunks, valid.device, first)


@dataclass(frozen=True)
class ChunkTraining:
    """Which attention chunk each training batch sees (dynamic chunk training).

    Args:
        max_chunk: the largest chunk drawn, in encoder frames (uniform over 1..max_chunk).
        full_context_prob: the share of batches trained with full context (no chunk mask).
    """

    max_chunk: int = 32
    full_context_prob: float = 0.5

    def __post_init__(self) -> None:
        if self.max_chunk < 1:
            raise ValueError(f"max_chunk must be at least 1, got {self.max_chunk}")
        if not 0.0 <= self.full_context_prob <= 1.0:
            raise ValueError(f"full_context_prob must be in [0, 1], got {self.full_context_prob}")

    def draw(self) -> int | None:
        """A chunk size for one batch, or None for full context (from torch's global RNG, so
        seeded runs repeat)."""
        if float(torch.rand(())) < self.full_context_prob:
            return None
        return int(torch.randint(1, self.max_chunk + 1, ()))


def next_attention_chunk(
    training: bool, chunk_training: ChunkTraining | None, chunk: int | None
) -> int | None:
    """An encoder's attention chunk for its next pass: drawn in training (`chunk_training`),
    else the inference `chunk`; None is full context."""
    if training:
        return None if chunk_training is None else chunk_training.draw()
    return chunk


@dataclass
class EncoderCache:
    """What B streams carry from one chunk to the next, at every layer of an encoder.

    Caches are left-padded to one length; `valid` marks the real frames (the newest last).
    """

    keys: Tensor  # (N_layers, B, H, L, d) self-attention keys of the cached frames
    values: Tensor  # (N_layers, B, H, L, d)
    valid: Tensor  # (B, L) True on cached frames, False on left padding
    conv: Tensor | None  # (N_layers, B, D, K - 1) last inputs of causal convolutions, or None
    offset: Tensor  # (B,) encoder frames each stream has produced (absolute positions)

    @property
    def batch_size(self) -> int:
        return int(self.offset.numel())

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        return self.keys[i], self.values[i]

    @staticmethod
    def merge(caches: list[EncoderCache]) -> EncoderCache:
        """One batch of several streams' caches (each `B = 1` or more), left-padded."""
        if len(caches) == 1:
            return caches[0]
        length = max(c.valid.size(1) for c in caches)
        return EncoderCache(
            torch.cat([_left_pad(c.keys, length, 3) for c in caches], 1),
            torch.cat([_left_pad(c.values, length, 3) for c in caches], 1),
            torch.cat([_left_pad(c.valid, length, 1) for c in caches], 0),
            None if caches[0].conv is None else torch.cat([c.conv for c in caches], 1),
            torch.cat([c.offset for c in caches]),
        )

    def trimmed(self, max_frames: int | None) -> EncoderCache:
        """The cache of the newest `max_frames` frames of attention context (None: all)."""
        if max_frames is not None and max_frames < 0:
            raise ValueError(f"max_frames must be >= 0 or None, got {max_frames}")
        if max_frames is None or self.valid.size(1) <= max_frames:
            return self
        first = self.valid.size(1) - max_frames  # not `-max_frames`: 0 would keep them all
        k, v = self.keys[:, :, :, first:], self.values[:, :, :, first:]
        return EncoderCache(k, v, self.valid[:, first:], self.conv, self.offset)

    def split(self) -> list[EncoderCache]:
        """The batch's caches one stream at a time, each without left padding."""
        out = []
        for b in range(self.batch_size):
            start = self.valid.size(1) - int(self.valid[b].sum())
            out.append(
                EncoderCache(
                    self.keys[:, b : b + 1, :, start:],
                    self.values[:, b : b + 1, :, start:],
                    self.valid[b : b + 1, start:],
                    None if self.conv is None else self.conv[:, b : b + 1],
                    self.offset[b : b + 1],
                )
            )
        return out


def _left_pad(x: Tensor, length: int, dim: int) -> Tensor:
    missing = length - x.size(dim)
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim)


def empty_cache(
    num_layers: int, batch: int, heads: int, head_dim: int, conv: tuple[int, int] | None,
    like: Tensor,
) -> EncoderCache:  # fmt: skip
    """The cache of `batch` streams before their first chunk (`conv`: channels, kernel - 1)."""
    kv = like.new_zeros(num_layers, batch, heads, 0, head_dim)
    return EncoderCache(
        kv,
        kv.clone(),
        torch.zeros(batch, 0, dtype=torch.bool, device=like.device),
        None if conv is None else like.new_zeros(num_layers, batch, *conv),
        torch.zeros(batch, dtype=torch.long, device=like.device),
    )


def streaming_problem(encoder: torch.nn.Module) -> str | None:
    """Why `encoder` cannot run chunk by chunk with a cache, or None where it can."""
    if not hasattr(encoder, "forward_chunk"):
        return f"{type(encoder).__name__} cannot run chunk by chunk"
    try:
        encoder.empty_cache(1, torch.zeros(1))
    except ValueError as e:  # e.g. a Conformer whose convolutions see the next frames
        return str(e)
    return None


def chunk_keys_mask(cache: EncoderCache, valid: Tensor) -> Tensor:
    """Mask `(B, 1, Q, L + Q)` of a chunk's queries over cached and chunk keys: every valid key
    of the cache, and the chunk's own valid frames (the whole chunk is one attention chunk)."""
    keys = torch.cat([cache.valid, valid], 1)  # (B, L + Q)
    return keys[:, None, None, :].expand(-1, 1, valid.size(1), -1)


def append_cache(
    cache: EncoderCache,
    keys: list[Tensor],
    values: list[Tensor],
    conv: list[Tensor] | None,
    valid: Tensor,
    max_frames: int | None,
) -> EncoderCache:
    """The cache after a chunk: layer keys/values `(B, H, L + Q, d)` (cache and chunk), the
    chunk's valid frames `(B, Q)`, trimmed to the newest `max_frames` (None: all)."""
    # Padding inside a chunk only happens at a stream's end, after which nothing is cached.
    return EncoderCache(
        torch.stack(keys),
        torch.stack(values),
        torch.cat([cache.valid, valid], 1),
        None if conv is None else torch.stack(conv),
        cache.offset + valid.sum(1),
    ).trimmed(max_frames)
