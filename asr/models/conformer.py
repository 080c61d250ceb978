"""Conformer encoder (Gulati et al. 2020): convolution-augmented Transformer blocks."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from asr.models.blocks import (
    Conv2dSubsampling,
    RelativePositionalEncoding,
    RelPositionMultiHeadAttention,
)
from asr.models.interfaces import lengths_to_mask


class ConvolutionModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv over zeroed padding, norm, SiLU, pointwise conv."""

    def __init__(self, d_model: int, kernel_size: int, dropout: float, norm: str) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"ConvolutionModule: kernel_size={kernel_size} must be odd")
        if norm not in ("batch", "layer"):
            raise ValueError(f"ConvolutionModule: norm={norm!r} must be 'batch' or 'layer'")
        self.layer_norm = nn.LayerNorm(d_model)
        self.pointwise_in = nn.Conv1d(d_model, 2 * d_model, 1)
        self.depthwise = nn.Conv1d(
            d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model
        )
        self.norm = nn.BatchNorm1d(d_model) if norm == "batch" else nn.LayerNorm(d_model)
        self.pointwise_out = nn.Conv1d(d_model, d_model, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """Args: x `(B, T, D)`, valid `(B, T)` True on real frames. Returns: `(B, T, D)`."""
        h = self.pointwise_in(self.layer_norm(x).transpose(1, 2))  # (B, 2D, T)
        h = F.glu(h, dim=1).masked_fill(~valid[:, None, :], 0.0)  # (B, D, T)
        h = self.depthwise(h)
        if isinstance(self.norm, nn.LayerNorm):
            h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        else:
            h = self.norm(h)
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
    ) -> None:
        super().__init__()
        self.ffn1 = MacaronFeedForward(d_model, ffn_dim, dropout)
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = RelPositionMultiHeadAttention(d_model, num_heads, attention_dropout)
        self.conv = ConvolutionModule(d_model, kernel_size, dropout, conv_norm)
        self.ffn2 = MacaronFeedForward(d_model, ffn_dim, dropout)
        self.norm = nn.LayerNorm(d_model) if block_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, pos: Tensor, valid: Tensor) -> Tensor:
        """Args: x `(B, T, D)`, pos `(2T - 1, D)`, valid `(B, T)`. Returns: `(B, T, D)`."""
        x = x + 0.5 * self.ffn1(x)
        x = x + self.dropout(self.attn(self.attn_norm(x), pos, valid[:, None, None, :])[0])
        x = x + self.conv(x, valid)
        return self.norm(x + 0.5 * self.ffn2(x))


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
    ) -> None:
        super().__init__()
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
            )
            for _ in range(num_layers)
        )
        self.norm = nn.Identity() if block_norm else nn.LayerNorm(d_model)
        self.output_dim = d_model

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D_in)`, x_lens `(B,)`. Returns: `(B, T', d_model)`, lengths `(B,)`."""
        x, y_lens = self.subsampling(x, x_lens)
        x, pos = self.positions(x)  # pos: (2T' - 1, D)
        valid = lengths_to_mask(y_lens, x.size(1))
        for layer in self.layers:
            x = layer(x, pos, valid)
        return self.norm(x).masked_fill(~valid[..., None], 0.0), y_lens
