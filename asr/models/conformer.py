"""Conformer encoder (Gulati et al. 2020): convolution-augmented Transformer blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.blocks import (
    Conv2dSubsampling,
    RelativePositionalEncoding,
    RelPositionMultiHeadAttention,
    check_probabilities,
    check_sizes,
)
from asr.models.chunking import (
    ChunkTraining,
    EncoderCache,
    append_cache,
    chunk_keys_mask,
    empty_cache,
    encoder_mask,
    next_attention_chunk,
)
from asr.models.interfaces import lengths_to_mask


class ConvolutionModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv over zeroed padding, norm, SiLU, pointwise conv.

    `causal`: the depthwise convolution sees only the current and past frames (streaming).
    """

    def __init__(
        self, d_model: int, kernel_size: int, dropout: float, norm: str, causal: bool = False
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0 or kernel_size < 1:
            raise ValueError(f"ConvolutionModule: kernel_size={kernel_size} must be odd and >= 1")
        if norm not in ("batch", "layer"):
            raise ValueError(f"ConvolutionModule: norm={norm!r} must be 'batch' or 'layer'")
        self.causal = causal
        self.left_context = kernel_size - 1 if causal else 0
        self.layer_norm = nn.LayerNorm(d_model)
        self.pointwise_in = nn.Conv1d(d_model, 2 * d_model, 1)
        self.depthwise = nn.Conv1d(
            d_model, d_model, kernel_size, padding=0 if causal else kernel_size // 2,
            groups=d_model,
        )  # fmt: skip
        self.norm = nn.BatchNorm1d(d_model) if norm == "batch" else nn.LayerNorm(d_model)
        self.pointwise_out = nn.Conv1d(d_model, d_model, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """Args: x `(B, T, D)`, valid `(B, T)` True on real frames. Returns: `(B, T, D)`."""
        h = self._gated(x, valid)
        if self.causal:
            h = F.pad(h, (self.left_context, 0))
        return self._rest(h)

    def forward_cached(self, x: Tensor, valid: Tensor, cache: Tensor) -> tuple[Tensor, Tensor]:
        """A chunk of a causal module: x `(B, Q, D)`, valid `(B, Q)`, cache `(B, D, K - 1)` of
        the inputs before. Returns: `(B, Q, D)` and the cache for the next chunk."""
        h = torch.cat([cache, self._gated(x, valid)], 2)  # (B, D, K - 1 + Q)
        return self._rest(h), h[:, :, h.size(2) - self.left_context :]

    def _gated(self, x: Tensor, valid: Tensor) -> Tensor:
        h = self.pointwise_in(self.layer_norm(x).transpose(1, 2))  # (B, 2D, T)
        return F.glu(h, dim=1).masked_fill(~valid[:, None, :], 0.0)  # (B, D, T)

    def _rest(self, h: Tensor) -> Tensor:
        h = self.depthwise(h)
        n = self.norm
        if isinstance(n, nn.LayerNorm):
            h = n(h.transpose(1, 2)).transpose(1, 2)
        elif self.training and h.size(0) * h.size(2) == 1:
            # One value per channel has no batch statistics (a lone utterance of one frame).
            h = F.batch_norm(h, n.running_mean, n.running_var, n.weight, n.bias, False, 0.0, n.eps)
        else:
            h = n(h)
        h = self.pointwise_out(F.silu(h))
        return self.dropout(h.transpose(1, 2))  # (B, T, D)


class MacaronFeedForward(nn.Sequential):
    """`LayerNorm -> Linear -> SiLU -> Dropout -> Linear -> Dropout`, half-weighted by the block."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(
            nn.LayerNorm(d_model),
            nn.Linear(d_model, ffn_dim),
            nn.SiLU(),
            nn.Dropout(dropout),
            nn.Linear(ffn_dim, d_model),
            nn.Dropout(dropout),
        )


class ConformerLayer(nn.Module):
    """`x + FFN/2`, `+ RelMHSA`, `+ Conv`, `+ FFN/2`, then LayerNorm if `block_norm`."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        kernel_size: int,
        dropout: float,
        attention_dropout: float,
        conv_norm: str,
        block_norm: bool = True,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.ffn1 = MacaronFeedForward(d_model, ffn_dim, dropout)
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = RelPositionMultiHeadAttention(d_model, num_heads, attention_dropout)
        self.conv = ConvolutionModule(d_model, kernel_size, dropout, conv_norm, causal)
        self.ffn2 = MacaronFeedForward(d_model, ffn_dim, dropout)
        self.norm = nn.LayerNorm(d_model) if block_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, pos: Tensor, valid: Tensor, mask: Tensor | None = None) -> Tensor:
        """Args: x `(B, T, D)`, pos `(2T - 1, D)`, valid `(B, T)`, mask `(B, 1, 1 or T, T)`
        (default: the valid keys). Returns: `(B, T, D)`."""
        mask = valid[:, None, None, :] if mask is None else mask
        x = x + 0.5 * self.ffn1(x)
        x = x + self.dropout(self.attn(self.attn_norm(x), pos, mask)[0])
        x = x + self.conv(x, valid)
        return self.norm(x + 0.5 * self.ffn2(x))

    def forward_chunk(
        self, x: Tensor, pos: Tensor, valid: Tensor, mask: Tensor,
        cache: tuple[Tensor, Tensor], conv_cache: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor]:  # fmt: skip
        """One chunk `(B, Q, D)` after `cache`; see `RelPositionMultiHeadAttention.forward_cached`
        and `ConvolutionModule.forward_cached`. Returns the output and both new caches."""
        x = x + 0.5 * self.ffn1(x)
        context, cache = self.attn.forward_cached(self.attn_norm(x), pos, mask, cache)
        x = x + self.dropout(context)
        conv, conv_cache = self.conv.forward_cached(x, valid, conv_cache)
        x = x + conv
        return self.norm(x + 0.5 * self.ffn2(x)), cache, conv_cache


class ConformerEncoder(nn.Module):
    """Conv2d subsampling, then Conformer blocks with relative-position self-attention.

    Args:
        input_dim: feature dimension D_in.
        d_model: model (and output) dimension.
        num_heads: attention heads per block.
        ffn_dim: hidden size of each macaron feed-forward module.
        num_layers: number of blocks.
        kernel_size: odd depthwise convolution width, in subsampled frames.
        dropout: dropout on the input, residual branches and FFN hidden layers.
        subsampling: time subsampling factor of the convolutional front, 4, 6 or 8.
        attention_dropout: dropout on the attention weights.
        conv_norm: "batch" or "layer" normalisation in the convolution modules.
        subsampling_channels: channels of the convolutional front (default `d_model`).
        block_norm: LayerNorm ending each block (the paper's); False: one after the stack.
        causal: causal depthwise convolutions, which chunk streaming needs.
        dynamic_chunk: the largest attention chunk (encoder frames) a training batch draws, for
            a model that streams at any chunk size (`ChunkTraining`); 0: full context only.
        full_context_prob: with `dynamic_chunk`, the share of batches trained at full context.
    """

    def __init__(
        self,
        input_dim: int,
        d_model: int = 256,
        num_heads: int = 4,
        ffn_dim: int = 1024,
        num_layers: int = 12,
        kernel_size: int = 31,
        dropout: float = 0.1,
        subsampling: int = 4,
        attention_dropout: float = 0.0,
        conv_norm: str = "batch",
        subsampling_channels: int | None = None,
        block_norm: bool = True,
        causal: bool = False,
        dynamic_chunk: int = 0,
        full_context_prob: float = 0.5,
    ) -> None:
        super().__init__()
        check_sizes("ConformerEncoder", d_model=d_model, num_layers=num_layers, ffn_dim=ffn_dim)
        check_sizes("ConformerEncoder", least=0, dynamic_chunk=dynamic_chunk)  # 0: none
        check_probabilities(
            "ConformerEncoder", dropout=dropout, attention_dropout=attention_dropout
        )
        if conv_norm not in ("batch", "layer"):  # the convolution module's own says `norm`
            raise ValueError(
                f"ConformerEncoder: conv_norm must be 'batch' or 'layer', got {conv_norm!r}"
            )
        if dynamic_chunk and not causal:
            raise ValueError(
                "ConformerEncoder: dynamic_chunk needs causal=True, or each chunk's convolutions "
                "would see the next chunk"
            )
        self.chunk_training = (
            ChunkTraining(dynamic_chunk, full_context_prob) if dynamic_chunk else None
        )
        self.causal = causal
        self.chunk: int | None = None  # attention chunk (frames) at inference; None: full context
        self.first_chunk: int | None = None  # at inference, the first chunk's frames if not `chunk`
        self.subsampling = Conv2dSubsampling(input_dim, d_model, subsampling, subsampling_channels)
        self.positions = RelativePositionalEncoding(d_model, dropout)
        self.layers = nn.ModuleList(
            ConformerLayer(
                d_model,
                num_heads,
                ffn_dim,
                kernel_size,
                dropout,
                attention_dropout,
                conv_norm,
                block_norm,
                causal,
            )
            for _ in range(num_layers)
        )
        self.norm = nn.Identity() if block_norm else nn.LayerNorm(d_model)
        self.output_dim = d_model

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D_in)`, x_lens `(B,)`. Returns: `(B, T', d_model)`, lengths `(B,)`.

        Attention is chunked by `attention_chunk()`: a drawn chunk in training with
        `dynamic_chunk`, `self.chunk` otherwise."""
        x, y_lens = self.subsampling(x, x_lens)
        x, pos = self.positions(x)  # pos: (2T' - 1, D)
        valid = lengths_to_mask(y_lens, x.size(1))
        first = None if self.training else self.first_chunk  # inference only
        mask = encoder_mask(valid, self.attention_chunk(), first=first)
        for layer in self.layers:
            x = layer(x, pos, valid, mask)
        return self.norm(x).masked_fill(~valid[..., None], 0.0), y_lens

    def attention_chunk(self) -> int | None:
        """The attention chunk of the next forward pass (None: full context)."""
        return next_attention_chunk(self.training, self.chunk_training, self.chunk)

    def empty_cache(self, batch: int, like: Tensor) -> EncoderCache:
        """The cache of `batch` streams before their first chunk."""
        if not self.causal:
            raise ValueError("this Conformer cannot stream: its convolutions are not causal")
        attn = self.layers[0].attn
        conv = (self.output_dim, self.layers[0].conv.left_context)
        return empty_cache(len(self.layers), batch, attn.num_heads, attn.head_dim, conv, like)

    def forward_chunk(
        self, x: Tensor, x_lens: Tensor, cache: EncoderCache, max_cache: int | None = None
    ) -> tuple[Tensor, Tensor, EncoderCache]:
        """One chunk of B streams: the same frames `forward` gives under the chunk mask.

        Args:
            x: `(B, W, D_in)` input windows (`subsampling.chunk_window(chunk)` frames; fewer at
                a stream's end), x_lens `(B,)`.
            cache: what the streams carry from their chunks before.
            max_cache: keep the newest this many frames of attention context (None: all).

        Returns:
            `(B, Q, d_model)`, lengths `(B,)`, and the cache for the next chunk.
        """
        x, y_lens = self.subsampling(x, x_lens)
        x, pos = self.positions(x, cached=cache.valid.size(1))
        valid = lengths_to_mask(y_lens, x.size(1))
        mask = chunk_keys_mask(cache, valid)
        keys, values, convs = [], [], []
        for i, layer in enumerate(self.layers):
            x, (k, v), conv = layer.forward_chunk(
                x, pos, valid, mask, cache.layer(i), cache.conv[i]
            )
            keys.append(k)
            values.append(v)
            convs.append(conv)
        x = self.norm(x).masked_fill(~valid[..., None], 0.0)
        return x, y_lens, append_cache(cache, keys, values, convs, valid, max_cache)
