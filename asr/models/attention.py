"""Per-step attention for the RNN decoder (Chorowski et al. 2015; Bahdanau et al. 2015)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from asr.models.blocks import check_sizes

# A plain dict of batch-first tensors, so `reorder_batch` reorders it for beam search.
AttentionMemory = dict[str, Tensor]

_INIT_ALIGNMENTS = ("uniform", "first")


def normalise_scores(
    scores: Tensor, mask: Tensor, sharpening: float = 1.0, smoothing: bool = False
) -> Tensor:
    """Softmax (or normalised sigmoid) of `sharpening * scores`, in float32, zero off `mask`.

    >>> w = normalise_scores(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([[True, True, False]]))
    >>> w.tolist()
    [[0.5, 0.5, 0.0]]
    """
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    if sharpening != 1.0:
        scores = scores * sharpening
    if smoothing:  # sigmoid / its sum, as a softmax of log-sigmoids: low scores never all underflow
        # logsigmoid, written so: torch's own exports to ONNX as Log(Sigmoid), which underflows
        scores = -torch.nn.functional.softplus(-scores)
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def _check_init_alignment(init_alignment: str) -> None:
    if init_alignment not in _INIT_ALIGNMENTS:
        raise ValueError(
            f"attention: init_alignment must be one of {_INIT_ALIGNMENTS}, got {init_alignment!r}"
        )


def _initial_alignment(mask: Tensor, init_alignment: str) -> Tensor:
    """`(B, T)` float32: uniform over the valid frames, or all weight on the first frame."""
    if init_alignment == "first":
        weights = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        weights[:, 0] = 1.0
        return weights
    valid = mask.float()
    return valid / valid.sum(-1, keepdim=True)


def _check_prepare(module: nn.Module, keys: Tensor, mask: Tensor, key_dim: int) -> None:
    name = type(module).__name__
    if keys.dim() != 3 or keys.size(-1) != key_dim:
        raise ValueError(f"{name}.prepare: keys must be (B, T, {key_dim}), got {tuple(keys.shape)}")
    if mask.shape != keys.shape[:2] or mask.dtype != torch.bool:
        raise ValueError(
            f"{name}.prepare: mask must be bool (B, T) = {tuple(keys.shape[:2])}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )


class DotProductAttention(nn.Module):
    """Scaled dot-product attention, `e_j = (W_q s) . (W_k h_j) / sqrt(attention_dim)`.

    Args: as `LocationAwareAttention`; `attention_dim` is the size both are projected to.
    """

    num_heads = 1
    kind = "dot-product attention"  # how the explorer names its maps

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int = 320) -> None:
        super().__init__()
        check_sizes("DotProductAttention", attention_dim=attention_dim)
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attention_dim, bias=False)
        self.scale = 1.0 / math.sqrt(attention_dim)
        self.key_dim = key_dim
        self.output_dim = key_dim

    def prepare(self, keys: Tensor, mask: Tensor) -> AttentionMemory:
        """Project the keys once per utterance: keys `(B, T, Dk)`, mask `(B, T)` bool."""
        _check_prepare(self, keys, mask, self.key_dim)
        return {"values": keys, "keys": self.key_proj(keys) * self.scale, "mask": mask}

    def initial_weights(self, memory: AttentionMemory) -> Tensor:
        """Uniform `(B, T)` alignment over the valid frames."""
        return _initial_alignment(memory["mask"], "uniform")

    def forward(
        self, query: Tensor, memory: AttentionMemory, prev_weights: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Args: query `(B, Dq)`, memory from `prepare`, prev_weights ignored.
        Returns: context `(B, Dk)` and weights `(B, T)`."""
        query = self.query_proj(query).unsqueeze(-1)  # (B, A, 1)
        scores = torch.bmm(memory["keys"], query).squeeze(-1)  # (B, T)
        weights = normalise_scores(scores, memory["mask"])
        return _weighted_sum(weights, memory["values"]), weights


class AdditiveAttention(nn.Module):
    """Content-based additive attention (Bahdanau): `e_j = w^T tanh(W s + V h_j + b)`.

    Args: as `LocationAwareAttention`, less the location ones.
    """

    num_heads = 1
    kind = "additive attention"

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        attention_dim: int = 320,
        sharpening: float = 1.0,
        smoothing: bool = False,
    ) -> None:
        super().__init__()
        check_sizes(type(self).__name__, attention_dim=attention_dim)  # 0: attention ignores all
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)  # W
        self.key_proj = nn.Linear(key_dim, attention_dim)  # V and b
        self.score = nn.Linear(attention_dim, 1, bias=False)  # w
        self.sharpening = sharpening
        self.smoothing = smoothing
        self.key_dim = key_dim
        self.output_dim = key_dim

    def prepare(self, keys: Tensor, mask: Tensor) -> AttentionMemory:
        """Project the keys once per utterance: keys `(B, T, Dk)`, mask `(B, T)` bool."""
        _check_prepare(self, keys, mask, self.key_dim)
        return {"values": keys, "keys": self.key_proj(keys), "mask": mask}

    def initial_weights(self, memory: AttentionMemory) -> Tensor:
        """Uniform `(B, T)` alignment over the valid frames."""
        return _initial_alignment(memory["mask"], "uniform")

    def forward(
        self, query: Tensor, memory: AttentionMemory, prev_weights: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Args: query `(B, Dq)`, memory from `prepare`, prev_weights ignored.
        Returns: context `(B, Dk)` and weights `(B, T)`."""
        hidden = memory["keys"] + self.query_proj(query).unsqueeze(1)  # (B, T, A)
        return self._attend(hidden, memory)

    def _attend(self, hidden: Tensor, memory: AttentionMemory) -> tuple[Tensor, Tensor]:
        scores = self.score(torch.tanh(hidden)).squeeze(-1)  # (B, T)
        weights = normalise_scores(scores, memory["mask"], self.sharpening, self.smoothing)
        return _weighted_sum(weights, memory["values"]), weights


class LocationAwareAttention(AdditiveAttention):
    """Hybrid attention (Chorowski et al. 2015): `e_j = w^T tanh(W s + V h_j + U f_j + b)`.

    Args:
        query_dim: size of the decoder state `s`.
        key_dim: size of the encoder output `h` (and of the context).
        attention_dim: size of the hidden layer inside the tanh.
        conv_channels: number of location filters.
        conv_kernel: half-width K of the location filters (width 2K+1).
        sharpening: inverse temperature beta on the scores.
        smoothing: normalise `sigmoid(e)` instead of `exp(e)`.
        init_alignment: alignment before the first step, "uniform" or "first" (frame 0).
    """

    kind = "location-aware attention"

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        attention_dim: int = 320,
        conv_channels: int = 10,
        conv_kernel: int = 100,
        sharpening: float = 1.0,
        smoothing: bool = False,
        init_alignment: str = "uniform",
    ) -> None:
        super().__init__(query_dim, key_dim, attention_dim, sharpening, smoothing)
        _check_init_alignment(init_alignment)
        check_sizes("LocationAwareAttention", conv_channels=conv_channels)
        check_sizes("LocationAwareAttention", least=0, conv_kernel=conv_kernel)
        width = 2 * conv_kernel + 1
        self.location_conv = nn.Conv1d(1, conv_channels, width, padding=conv_kernel, bias=False)
        self.location_proj = nn.Linear(conv_channels, attention_dim, bias=False)  # U
        self.init_alignment = init_alignment

    def initial_weights(self, memory: AttentionMemory) -> Tensor:
        """The `(B, T)` alignment assumed before the first step (see `init_alignment`)."""
        return _initial_alignment(memory["mask"], self.init_alignment)

    def forward(
        self, query: Tensor, memory: AttentionMemory, prev_weights: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Args: query `(B, Dq)`, memory from `prepare`, prev_weights `(B, T)` or None.
        Returns: context `(B, Dk)` and weights `(B, T)`."""
        if prev_weights is None:
            prev_weights = self.initial_weights(memory)
        prev = prev_weights.to(memory["keys"].dtype).unsqueeze(1)  # (B, 1, T)
        location = self.location_conv(prev).transpose(1, 2)  # (B, T, C)
        hidden = (
            memory["keys"]
            + self.query_proj(query).unsqueeze(1)
            + self.location_proj(location)  # (B, T, A)
        )
        return self._attend(hidden, memory)


class MultiHeadAttention(nn.Module):
    """Multi-head additive attention, optionally location-aware per head (ESPnet AttMultiHeadLoc).

    Args:
        num_heads: number of heads H; must divide `attention_dim`.
        attention_dim: total size of the per-head hidden layers and value projections.
        location: add the location term (otherwise content-based heads).
        others: as `LocationAwareAttention`, per head.
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        num_heads: int = 4,
        attention_dim: int = 320,
        location: bool = True,
        conv_channels: int = 10,
        conv_kernel: int = 100,
        sharpening: float = 1.0,
        smoothing: bool = False,
        init_alignment: str = "uniform",
    ) -> None:
        super().__init__()
        check_sizes("MultiHeadAttention", attention_dim=attention_dim)
        if location:
            check_sizes("MultiHeadAttention", conv_channels=conv_channels)
            check_sizes("MultiHeadAttention", least=0, conv_kernel=conv_kernel)
        if num_heads < 1 or attention_dim % num_heads:
            raise ValueError(
                f"MultiHeadAttention: num_heads={num_heads} must be >= 1 and divide "
                f"attention_dim={attention_dim}"
            )
        _check_init_alignment(init_alignment)
        self.num_heads = num_heads
        self.head_dim = attention_dim // num_heads
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attention_dim)
        self.value_proj = nn.Linear(key_dim, attention_dim, bias=False)
        self.score = nn.Parameter(torch.empty(num_heads, self.head_dim, 1))  # w_h
        nn.init.normal_(self.score, std=self.head_dim**-0.5)
        self.out_proj = nn.Linear(attention_dim, key_dim)
        self.location = location
        self.kind = f"multi-head {'location-aware' if location else 'additive'} attention"
        if location:
            width = 2 * conv_kernel + 1
            channels = num_heads * conv_channels
            self.location_conv = nn.Conv1d(
                num_heads, channels, width, padding=conv_kernel, groups=num_heads, bias=False
            )
            self.location_proj = nn.Parameter(  # U_h
                torch.empty(num_heads, conv_channels, self.head_dim)
            )
            nn.init.normal_(self.location_proj, std=conv_channels**-0.5)
        self.sharpening = sharpening
        self.smoothing = smoothing
        self.init_alignment = init_alignment
        self.key_dim = key_dim
        self.output_dim = key_dim

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, time, _ = x.shape
        return x.view(batch, time, self.num_heads, -1).transpose(1, 2)  # (B, H, T, d)

    def prepare(self, keys: Tensor, mask: Tensor) -> AttentionMemory:
        """Project keys and values once per utterance: keys `(B, T, Dk)`, mask `(B, T)` bool."""
        _check_prepare(self, keys, mask, self.key_dim)
        return {
            "values": self._split_heads(self.value_proj(keys)).contiguous(),  # (B, H, T, d)
            "keys": self._split_heads(self.key_proj(keys)).contiguous(),  # (B, H, T, d)
            "mask": mask,
        }

    def initial_weights(self, memory: AttentionMemory) -> Tensor:
        """The `(B, H, T)` alignment assumed before the first step (see `init_alignment`)."""
        weights = _initial_alignment(memory["mask"], self.init_alignment)
        return weights.unsqueeze(1).expand(-1, self.num_heads, -1)

    def forward(
        self, query: Tensor, memory: AttentionMemory, prev_weights: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Args: query `(B, Dq)`, memory from `prepare`, prev_weights `(B, H, T)` or None.
        Returns: context `(B, Dk)` and weights `(B, H, T)`."""
        keys = memory["keys"]
        batch, heads, time, head_dim = keys.shape
        query = self.query_proj(query).view(batch, heads, 1, head_dim)  # (B, H, 1, d)
        hidden = keys + query  # (B, H, T, d)
        if self.location:
            if prev_weights is None:
                prev_weights = self.initial_weights(memory)
            location = self.location_conv(prev_weights.to(keys.dtype))  # (B, H * C, T)
            location = location.view(batch, heads, -1, time).transpose(2, 3)  # (B, H, T, C)
            hidden = hidden + torch.matmul(location, self.location_proj)  # (B, H, T, d)
        scores = torch.matmul(torch.tanh(hidden), self.score).squeeze(-1)  # (B, H, T)
        mask = memory["mask"].unsqueeze(1)  # (B, 1, T)
        weights = normalise_scores(scores, mask, self.sharpening, self.smoothing)
        values = memory["values"]
        heads_context = torch.matmul(weights.to(values.dtype).unsqueeze(2), values)  # (B,H,1,d)
        context = self.out_proj(heads_context.reshape(batch, -1))  # (B, Dk)
        return context, weights


def _weighted_sum(weights: Tensor, values: Tensor) -> Tensor:
    return torch.bmm(weights.to(values.dtype).unsqueeze(1), values).squeeze(1)
