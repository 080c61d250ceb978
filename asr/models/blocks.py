"""Layers shared by the Transformer and Conformer encoders, the decoder and the Transformer LM."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from asr.models.interfaces import lengths_to_mask

# (kernel, stride) of the time and frequency convolutions of each subsampling factor.
SUBSAMPLING_LAYERS: dict[int, tuple[tuple[int, int], ...]] = {
    4: ((3, 2), (3, 2)),
    6: ((3, 2), (5, 3)),
    8: ((3, 2), (3, 2), (3, 2)),
}


def _subsampling_layers(factor: int) -> tuple[tuple[int, int], ...]:
    if factor not in SUBSAMPLING_LAYERS:
        raise ValueError(
            f"subsampling factor {factor} is not supported; choose one of "
            f"{sorted(SUBSAMPLING_LAYERS)}"
        )
    return SUBSAMPLING_LAYERS[factor]


def min_input_length(factor: int) -> int:
    """Fewest frames (or feature bins) that give one output of `Conv2dSubsampling(factor)`.

    >>> [min_input_length(f) for f in (4, 6, 8)]
    [7, 11, 15]
    """
    need = 1
    for kernel, stride in reversed(_subsampling_layers(factor)):
        need = (need - 1) * stride + kernel
    return need


class InputTooShort(ValueError):
    """An input with fewer frames than the encoder's subsampling needs."""


def subsampled_length(lengths: Tensor | int, factor: int) -> Tensor | int:
    """Lengths after `Conv2dSubsampling(factor)`; ValueError below `min_input_length(factor)`.

    >>> subsampled_length(torch.tensor([7, 8, 100]), 4).tolist()
    [1, 1, 24]
    >>> subsampled_length(100, 6), subsampled_length(100, 8)
    (15, 11)
    """
    if isinstance(lengths, Tensor):
        shortest = int(lengths.min()) if lengths.numel() else min_input_length(factor)
    else:
        shortest = lengths
    if shortest < min_input_length(factor):
        raise InputTooShort(
            f"an input of {shortest} frames is too short for subsampling by {factor}: "
            f"it needs at least {min_input_length(factor)} frames"
        )
    for kernel, stride in _subsampling_layers(factor):
        lengths = (lengths - kernel) // stride + 1
    return lengths


class Conv2dSubsampling(nn.Module):
    """Unpadded strided conv2d + ReLU over (time, feature), then linear; padding cannot leak in."""

    def __init__(
        self, input_dim: int, d_model: int, factor: int = 4, channels: int | None = None
    ) -> None:
        super().__init__()
        layers = _subsampling_layers(factor)
        if input_dim < min_input_length(factor):
            raise ValueError(
                f"Conv2dSubsampling: input_dim={input_dim} is too small for factor {factor}; "
                f"it needs at least {min_input_length(factor)} feature bins"
            )
        channels = channels or d_model
        convs: list[nn.Module] = []
        for i, (kernel, stride) in enumerate(layers):
            convs += [nn.Conv2d(1 if i == 0 else channels, channels, kernel, stride), nn.ReLU()]
        self.conv = nn.Sequential(*convs)
        self.out = nn.Linear(channels * subsampled_length(input_dim, factor), d_model)
        self.input_dim = input_dim
        self.factor = factor
        self.output_dim = d_model

    def chunk_window(self, chunk: int) -> int:
        """Input frames that give `chunk` outputs; consecutive windows start `chunk * factor`
        frames apart, so each overlaps the next by `min_input_length - factor` frames.

        >>> Conv2dSubsampling(20, 8, 4).chunk_window(16)
        67
        """
        return min_input_length(self.factor) + (chunk - 1) * self.factor

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D_in)`, x_lens `(B,)`. Returns: `(B, T', d_model)`, lengths `(B,)`."""
        if x.dim() != 3 or x.size(2) != self.input_dim:
            raise ValueError(
                f"Conv2dSubsampling: expected input (B, T, {self.input_dim}), got {tuple(x.shape)}"
            )
        if x_lens.shape != (x.size(0),):
            raise ValueError(
                f"Conv2dSubsampling: x_lens must be ({x.size(0)},), got {tuple(x_lens.shape)}"
            )
        if x_lens.numel() and int(x_lens.max()) > x.size(1):
            raise ValueError(
                f"Conv2dSubsampling: a length {int(x_lens.max())} exceeds the {x.size(1)} frames"
            )
        y_lens = subsampled_length(x_lens, self.factor)
        y = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        y = y.transpose(1, 2).flatten(2)  # (B, T', C * F')
        return self.out(y), y_lens


def sinusoid_embedding(positions: Tensor, d_model: int) -> Tensor:
    """Sinusoids `(N, d_model)` of (possibly negative) positions `(N,)`: sin on even channels.

    >>> [round(v, 4) for v in sinusoid_embedding(torch.tensor([0.0, 1.0, -1.0]), 4)[:, 0].tolist()]
    [0.0, 0.8415, -0.8415]
    """
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)
        * (-math.log(1e4) / d_model)
    )
    angles = positions.float()[:, None] * inv_freq  # (N, ceil(d_model / 2))
    table = torch.zeros(positions.numel(), d_model, device=positions.device)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)[:, : d_model // 2]
    return table


def sinusoid_table(length: int, d_model: int) -> Tensor:
    """Sinusoidal positions `0 .. length - 1` as a `(length, d_model)` table.

    >>> [round(v, 4) for v in sinusoid_table(3, 4)[:, 0].tolist()]  # sin(position)
    [0.0, 0.8415, 0.9093]
    """
    return sinusoid_embedding(torch.arange(length), d_model)


class PositionalEncoding(nn.Module):
    """`dropout(x * sqrt(d_model) + pe)`, sinusoidal `pe` (Vaswani et al. 2017); grows as needed."""

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.1) -> None:
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(max_len, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Args: x `(B, T, d_model)`, offset of the first position (or one per row `(B,)`).
        Returns: `(B, T, d_model)`."""
        rows = isinstance(offset, Tensor) and offset.dim() == 1
        if torch.onnx.is_in_onnx_export():  # a table would be frozen at its traced size
            steps = torch.arange(x.size(1), device=x.device)
            positions = offset[:, None] + steps if rows else offset + steps  # (B, T) or (T,)
            pe = sinusoid_embedding(positions.reshape(-1), self.d_model).to(x.dtype)
            return self.dropout(x * self.scale + pe.reshape(*positions.shape, -1))
        if rows:
            positions = offset[:, None] + torch.arange(x.size(1), device=x.device)  # (B, T)
            self._grow(int(positions.max()) + 1 if positions.numel() else 0)
            return self.dropout(x * self.scale + self.pe[positions])
        end = offset + x.size(1)
        self._grow(end)
        return self.dropout(x * self.scale + self.pe[offset:end])

    def _grow(self, end: int) -> None:
        if end > self.pe.size(0):
            self.pe = sinusoid_table(max(end, 2 * self.pe.size(0)), self.d_model).to(self.pe)


def check_sizes(owner: str, least: int = 1, **sizes: int) -> None:
    """ValueError naming the first of `sizes` below `least`: a layer count or width of 0 or
    less built a network without it, or failed at its first batch with torch's words."""
    for name, size in sizes.items():
        if size < least:
            raise ValueError(f"{owner}: {name} must be >= {least}, got {size}")


def check_probabilities(owner: str, **probabilities: float) -> None:
    """ValueError naming the first of `probabilities` (dropout rates, chances) outside [0, 1]:
    torch's own says it without the argument's name, deep in a traceback."""
    for name, p in probabilities.items():
        if not 0.0 <= p <= 1.0:  # nan too
            raise ValueError(f"{owner}: {name} must be in [0, 1], got {p}")


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention; weights are returned before dropout."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        check_sizes("MultiHeadAttention", d_model=d_model, num_heads=num_heads)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # rows: query, key, value
        self.out_proj = nn.Linear(d_model, d_model)
        self.weight_dropout = nn.Dropout(dropout)

    def _heads(self, x: Tensor) -> Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, d)

    def project_query(self, x: Tensor) -> Tensor:
        """`(B, L, D)` -> queries `(B, H, L, d)`."""
        d = self.in_proj.out_features // 3
        return self._heads(F.linear(x, self.in_proj.weight[:d], self.in_proj.bias[:d]))

    def project_key_value(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """`(B, L, D)` -> keys and values, each `(B, H, L, d)`."""
        d = self.in_proj.out_features // 3
        kv = F.linear(x, self.in_proj.weight[d:], self.in_proj.bias[d:])
        key, value = kv.chunk(2, dim=-1)
        return self._heads(key), self._heads(value)

    def project_self(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections in one matmul: `(B, L, D)` -> q, k, v `(B, H, L, d)`."""
        query, key, value = self.in_proj(x).chunk(3, dim=-1)
        return self._heads(query), self._heads(key), self._heads(value)

    def attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Heads `(B, H, L, d)` -> `(B, L_q, D)` and weights `(B, H, L_q, L_k)` or None."""
        context, weights = self.head_contexts(query, key, value, mask, need_weights, is_causal)
        return self.output(context), weights

    def head_contexts(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """`attend` without the output projection: contexts `(B, H, L_q, d)` and weights or None."""
        if is_causal and (mask is not None or need_weights):
            mask = _with_causal(mask, query.size(2), key.size(2), query.device)
            is_causal = False
        p = self.weight_dropout.p if self.training else 0.0
        if not need_weights:
            with _sdpa_backend(query, key):
                context = F.scaled_dot_product_attention(
                    query, key, value, attn_mask=mask, dropout_p=p, is_causal=is_causal
                )
            return context, None
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Lq, Lk)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:
            scores = scores + mask
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(value.dtype)
        return self.weight_dropout(weights) @ value, weights

    def output(self, context: Tensor) -> Tensor:
        """Per-head contexts `(B, H, L, d)` -> `(B, L, D)` through the output projection."""
        return self.out_proj(context.transpose(1, 2).flatten(2))

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Args: query `(B, L_q, D)`, key/value `(B, L_k, D)`, mask `(B, H, L_q, L_k)` bool.
        Returns: `(B, L_q, D)` and weights `(B, H, L_q, L_k)` or None."""
        if query is key and key is value:
            q, k, v = self.project_self(query)
        elif key is value:
            q, (k, v) = self.project_query(query), self.project_key_value(key)
        else:
            q = self.project_query(query)
            k, _ = self.project_key_value(key)
            _, v = self.project_key_value(value)
        return self.attend(q, k, v, mask, need_weights, is_causal)


def relative_shift(scores: Tensor) -> Tensor:
    """Scores `(..., Q, K + Q - 1)` at relative positions `Q-1 .. -(K-1)` -> a view `(..., Q, K)`.

    >>> scores = torch.tensor([[1, 0, -1], [11, 10, 9]])  # row i, column c: 10 i + (Q - 1 - c)
    >>> relative_shift(scores).tolist()  # 10 i + (i - j)
    [[0, -1], [11, 10]]
    """
    queries, width = scores.shape[-2:]
    if torch.onnx.is_in_onnx_export():  # strides are not in ONNX: the same values gathered
        return _relative_shift_gathered(scores)
    if scores.stride(-1) != 1 or scores.stride(-2) != width:
        scores = scores.contiguous()
    size = (*scores.shape[:-1], width - queries + 1)
    stride = (*scores.stride()[:-2], width - 1, 1)
    return scores.as_strided(size, stride, scores.storage_offset() + queries - 1)


def _relative_shift_gathered(scores: Tensor) -> Tensor:
    """`relative_shift` as a gather, which ONNX export traces with dynamic shapes.

    >>> scores = torch.randn(2, 3, 4, 9)
    >>> torch.equal(_relative_shift_gathered(scores), relative_shift(scores))
    True
    """
    queries, width = scores.shape[-2], scores.shape[-1]
    keys = width - queries + 1
    rows = torch.arange(queries, device=scores.device)[:, None]
    index = torch.arange(keys, device=scores.device)[None, :] - rows + (queries - 1)  # (Q, K)
    return scores.gather(-1, index.expand(*scores.shape[:-1], keys))


def relative_positions(
    keys: int, d_model: int, device: torch.device, queries: int | None = None
) -> Tensor:
    """Sinusoids of relative positions `keys - 1, ..., -(queries - 1)`: `(keys + queries - 1,
    d_model)`; `queries` defaults to `keys` (self-attention over the whole sequence)."""
    queries = keys if queries is None else queries
    return sinusoid_embedding(torch.arange(keys - 1, -queries, -1, device=device), d_model)


class RelativePositionalEncoding(nn.Module):
    """`dropout(x * sqrt(d_model))` and the relative-position sinusoids the attention scores."""

    def __init__(self, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.d_model = d_model
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, cached: int = 0) -> tuple[Tensor, Tensor]:
        """`(B, T, d_model)` -> the scaled input and the relative positions of its T queries
        over `cached + T` keys: `(cached + 2T - 1, d_model)`."""
        length = x.size(1)
        pos = relative_positions(cached + length, self.d_model, x.device, length)
        return self.dropout(x * self.scale), pos


class RelPositionMultiHeadAttention(MultiHeadAttention):
    """Self-attention scoring `((q + u) . k + (q + v) . W p) / sqrt(d)` (Dai et al. 2019)."""

    def __init__(
        self, d_model: int, num_heads: int, dropout: float = 0.0, query_block: int = 256
    ) -> None:
        super().__init__(d_model, num_heads, dropout)
        if query_block < 1:
            raise ValueError(f"query_block must be >= 1, got {query_block}")
        self.query_block = query_block
        self.pos_proj = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def forward(  # type: ignore[override]
        self, x: Tensor, pos: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Args: x `(B, T, D)`, pos `(2T - 1, D)`, mask `(B, 1, 1 or T, T)` True on allowed keys.
        Returns: `(B, T, D)` and weights `(B, H, T, T)` or None."""
        q, k, v = self.project_self(x)
        return self.attend_relative(q, k, v, pos, mask, need_weights)

    def forward_cached(
        self, x: Tensor, pos: Tensor, mask: Tensor, cache: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """A chunk's queries over cached and own keys (the chunk follows the cache).

        Args: x `(B, Q, D)`, pos `(L + 2Q - 1, D)` (`relative_positions(L + Q, ..., Q)`),
            mask `(B, 1, Q, L + Q)`, cache keys and values `(B, H, L, d)`.
        Returns: `(B, Q, D)` and the keys and values `(B, H, L + Q, d)` to cache."""
        q, k, v = self.project_self(x)
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        return self.attend_relative(q, k, v, pos, mask)[0], (k, v)

    def attend_relative(
        self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, mask: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Queries `(B, H, Q, d)` at the last Q of K key positions; pos `(K + Q - 1, D)`."""
        p = self._heads(self.pos_proj(pos.to(q.dtype))[None])  # (1, H, K+Q-1, d)
        q_u = (q + self.pos_bias_u[:, None]).to(q.dtype)
        q_v = (q + self.pos_bias_v[:, None]).to(q.dtype)
        queries, keys = q.size(2), k.size(2)
        contexts, weights = [], []
        for start in range(0, queries, self.query_block):
            stop = min(start + self.query_block, queries)
            p_block = p[:, :, queries - stop : keys + queries - 1 - start]
            scores = relative_shift(q_v[:, :, start:stop] @ p_block.transpose(-2, -1))
            block_mask = mask if mask.size(-2) == 1 else mask[..., start:stop, :]
            bias = (scores / math.sqrt(self.head_dim)).masked_fill_(~block_mask, float("-inf"))
            context, weight = self.head_contexts(
                q_u[:, :, start:stop],
                k,
                v,
                bias.to(q.dtype),
                need_weights,  # bias (B, H, Q, K)
            )
            contexts.append(context)
            weights.append(weight)
        if len(contexts) == 1:
            return self.output(contexts[0]), weights[0]
        return self.output(torch.cat(contexts, 2)), torch.cat(weights, 2) if need_weights else None


def _with_causal(mask: Tensor | None, len_q: int, len_k: int, device: torch.device) -> Tensor:
    """Combine `mask` (boolean, float or None) with the causal mask `key <= query`."""
    causal = torch.ones(len_q, len_k, dtype=torch.bool, device=device).tril()
    if mask is None or mask.dtype == torch.bool:
        return causal if mask is None else mask & causal
    return mask.masked_fill(~causal, float("-inf"))


_MATH_MAX_KEYS = 192  # keys up to which CPU bf16 attention uses the math kernel
# Not cuDNN: it builds a plan for every new batch shape, and lengths vary from batch to batch.
_CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _sdpa_backend(query: Tensor, key: Tensor) -> contextlib.AbstractContextManager[None]:
    """The math kernel for short bf16 attention on CPU (fp32 scores), `_CUDA_BACKENDS` on CUDA."""
    if query.device.type == "cuda":
        return sdpa_kernel(_CUDA_BACKENDS)
    short = key.size(-2) <= _MATH_MAX_KEYS
    if short and query.device.type == "cpu" and query.dtype == torch.bfloat16:
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def key_padding_mask(lens: Tensor, max_len: int) -> Tensor:
    """Boolean `(B, 1, 1, T)`, True on valid keys, for `MultiHeadAttention` masks."""
    return lengths_to_mask(lens, max_len)[:, None, None, :]


class FeedForward(nn.Sequential):
    """Position-wise `Linear(d_model, ffn_dim) -> ReLU -> Dropout -> Linear(ffn_dim, d_model)`."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(
            nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model)
        )
