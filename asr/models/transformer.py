"""Transformer encoder and decoder for speech (Vaswani et al. 2017, as used in ESPnet)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asr.models.blocks import (
    Conv2dSubsampling,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    RelativePositionalEncoding,
    RelPositionMultiHeadAttention,
    check_probabilities,
    check_sizes,
    key_padding_mask,
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
from asr.models.interfaces import State, check_lengths, check_tokens, lengths_to_mask, reorder_batch


class EncoderLayer(nn.Module):
    """Pre-LN block: `x + SelfAttn(LN(x))`, then `x + FFN(LN(x))`; optionally relative."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float,
        attention_dropout: float,
        relative: bool = False,
    ) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        attention = RelPositionMultiHeadAttention if relative else MultiHeadAttention
        self.attn = attention(d_model, num_heads, attention_dropout)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, pos: Tensor | None = None) -> Tensor:
        """Args: x `(B, T, D)`, mask `(B, 1, 1 or T, T)`, pos `(2T - 1, D)` for a relative
        layer. Returns: `(B, T, D)`."""
        h = self.attn_norm(x)
        if pos is None:
            context = self.attn(h, h, h, mask)[0]
        else:
            context = self.attn(h, pos, mask)[0]
        x = x + self.dropout(context)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))

    def forward_chunk(
        self, x: Tensor, mask: Tensor, pos: Tensor | None, cache: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One chunk `(B, Q, D)` after cached keys and values `(B, H, L, d)`; mask
        `(B, 1, Q, L + Q)`. Returns the output and the keys and values to cache."""
        h = self.attn_norm(x)
        if pos is None:
            q, k, v = self.attn.project_self(h)
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            context, cache = self.attn.attend(q, k, v, mask)[0], (k, v)
        else:
            context, cache = self.attn.forward_cached(h, pos, mask, cache)
        x = x + self.dropout(context)
        return x + self.dropout(self.ffn(self.ffn_norm(x))), cache


class TransformerEncoder(nn.Module):
    """Conv2d subsampling, sinusoidal positions, pre-LN self-attention blocks, final LayerNorm.

    Args:
        input_dim: feature dimension D_in.
        d_model: model (and output) dimension.
        num_heads: attention heads per layer.
        ffn_dim: hidden size of the feed-forward networks.
        num_layers: number of blocks.
        dropout: dropout on positions, residual branches and the FFN hidden layer.
        subsampling: time subsampling factor of the convolutional front, 4, 6 or 8.
        attention_dropout: dropout on the attention weights.
        max_len: positions precomputed by the positional encoding (it grows when needed).
        subsampling_channels: channels of the convolutional front (default `d_model`).
        relative_positions: score relative positions in attention (ESPnet `rel_pos`).
        dynamic_chunk: the largest attention chunk (encoder frames) a training batch draws, for
            a model that streams at any chunk size (`ChunkTraining`); 0: full context only.
        full_context_prob: with `dynamic_chunk`, the share of batches trained at full context.
    """

    def __init__(
        self,
        input_dim: int,
        d_model: int = 256,
        num_heads: int = 4,
        ffn_dim: int = 2048,
        num_layers: int = 12,
        dropout: float = 0.1,
        subsampling: int = 4,
        attention_dropout: float = 0.0,
        max_len: int = 5000,
        subsampling_channels: int | None = None,
        relative_positions: bool = False,
        dynamic_chunk: int = 0,
        full_context_prob: float = 0.5,
    ) -> None:
        super().__init__()
        check_sizes("TransformerEncoder", d_model=d_model, num_layers=num_layers, ffn_dim=ffn_dim)
        check_sizes("TransformerEncoder", least=0, dynamic_chunk=dynamic_chunk)  # 0: none
        check_probabilities(
            "TransformerEncoder", dropout=dropout, attention_dropout=attention_dropout
        )
        self.chunk_training = (
            ChunkTraining(dynamic_chunk, full_context_prob) if dynamic_chunk else None
        )
        self.chunk: int | None = None  # attention chunk (frames) at inference; None: full context
        self.first_chunk: int | None = None  # at inference, the first chunk's frames if not `chunk`
        self.subsampling = Conv2dSubsampling(input_dim, d_model, subsampling, subsampling_channels)
        self.relative = relative_positions
        self.positions = (
            RelativePositionalEncoding(d_model, dropout)
            if relative_positions
            else PositionalEncoding(d_model, max_len, dropout)
        )
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout, self.relative)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.output_dim = d_model

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D_in)`, x_lens `(B,)`. Returns: `(B, T', d_model)`, lengths `(B,)`."""
        x, y_lens = self.subsampling(x, x_lens)
        if self.relative:
            x, pos = self.positions(x)  # pos: (2T' - 1, D)
        else:
            x, pos = self.positions(x), None
        valid = lengths_to_mask(y_lens, x.size(1))
        # mask: (B, 1, 1 or T', T')
        first = None if self.training else self.first_chunk  # inference only
        mask = encoder_mask(valid, self.attention_chunk(), first=first)
        for layer in self.layers:
            x = layer(x, mask, pos)
        return self.norm(x).masked_fill(~valid[..., None], 0.0), y_lens

    def attention_chunk(self) -> int | None:
        """The attention chunk of the next forward pass (None: full context)."""
        return next_attention_chunk(self.training, self.chunk_training, self.chunk)

    def empty_cache(self, batch: int, like: Tensor) -> EncoderCache:
        """The cache of `batch` streams before their first chunk."""
        attn = self.layers[0].attn
        return empty_cache(len(self.layers), batch, attn.num_heads, attn.head_dim, None, like)

    def forward_chunk(
        self, x: Tensor, x_lens: Tensor, cache: EncoderCache, max_cache: int | None = None
    ) -> tuple[Tensor, Tensor, EncoderCache]:
        """One chunk of B streams; arguments and results as `ConformerEncoder.forward_chunk`."""
        x, y_lens = self.subsampling(x, x_lens)
        if self.relative:
            x, pos = self.positions(x, cached=cache.valid.size(1))
        else:
            x, pos = self.positions(x, cache.offset), None
        valid = lengths_to_mask(y_lens, x.size(1))
        mask = chunk_keys_mask(cache, valid)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer.forward_chunk(x, mask, pos, cache.layer(i))
            keys.append(k)
            values.append(v)
        x = self.norm(x).masked_fill(~valid[..., None], 0.0)
        return x, y_lens, append_cache(cache, keys, values, None, valid, max_cache)


class DecoderLayer(nn.Module):
    """Pre-LN block: causal self-attention, cross-attention over the encoder, FFN."""

    def __init__(
        self, d_model: int, num_heads: int, ffn_dim: int, dropout: float, attention_dropout: float
    ) -> None:
        super().__init__()
        self.self_norm = nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.cross_norm = nn.LayerNorm(d_model)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, attention_dropout)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mem_k: Tensor, mem_v: Tensor, mem_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Args: x `(B, L, D)`, mem_k/mem_v `(B, H, T, d)`, mem_mask `(B, 1, 1, T)`.
        Returns: `(B, L, D)` and cross-attention `(B, H, L, T)`."""
        q, k, v = self.self_attn.project_self(self.self_norm(x))
        x = x + self.dropout(self.self_attn.attend(q, k, v, is_causal=True)[0])
        return self._cross_and_ffn(x, mem_k, mem_v, mem_mask)

    def step(
        self, x: Tensor, past_k: Tensor, past_v: Tensor, mem_k: Tensor, mem_v: Tensor,
        mem_mask: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        """One position of N = U * G rows; each utterance's G rows share its memory, uncopied."""
        q, k, v = self.self_attn.project_self(self.self_norm(x))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (N, H, t+1, d)
        # need_weights: in ONNX the explicit product does not transpose the key cache each step
        x = x + self.dropout(self.self_attn.attend(q, k, v, need_weights=True)[0])
        rows, _, dim = x.shape
        q = self.cross_attn.project_query(self.cross_norm(x))  # (N, H, 1, d)
        heads, d = q.size(1), q.size(3)
        q = q.reshape(mem_k.size(0), -1, heads, d).transpose(1, 2)  # (U, H, G, d)
        out, attn = self.cross_attn.attend(q, mem_k, mem_v, mem_mask, need_weights=True)
        x = x + self.dropout(out.reshape(rows, 1, dim))  # (U, G, D) -> (N, 1, D)
        attn = attn.transpose(1, 2).reshape(rows, heads, 1, -1)  # (N, H, 1, T)
        return x + self.dropout(self.ffn(self.ffn_norm(x))), attn, k, v

    def _cross_and_ffn(
        self, x: Tensor, mem_k: Tensor, mem_v: Tensor, mem_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        q = self.cross_attn.project_query(self.cross_norm(x))
        out, attn = self.cross_attn.attend(q, mem_k, mem_v, mem_mask, need_weights=True)
        x = x + self.dropout(out)
        return x + self.dropout(self.ffn(self.ffn_norm(x))), attn


class TransformerDecoder(nn.Module):
    """Pre-LN Transformer decoder; its attention maps are all cross-attention heads, layer-major.

    Args:
        vocab_size: output vocabulary size V.
        encoder_dim: encoder output dimension (projected to `d_model` if different).
        d_model: model dimension.
        num_heads: attention heads per layer.
        ffn_dim: hidden size of the feed-forward networks.
        num_layers: number of blocks.
        dropout: dropout on positions, residual branches and the FFN hidden layer.
        tie_embeddings: share the output layer's weight with the token embedding.
        attention_dropout: dropout on the attention weights.
        max_len: positions precomputed by the positional encoding (it grows when needed).
    """

    def __init__(
        self,
        vocab_size: int,
        encoder_dim: int,
        d_model: int = 256,
        num_heads: int = 4,
        ffn_dim: int = 2048,
        num_layers: int = 6,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
        attention_dropout: float = 0.0,
        max_len: int = 5000,
    ) -> None:
        super().__init__()
        check_sizes("TransformerDecoder", d_model=d_model, num_layers=num_layers, ffn_dim=ffn_dim)
        check_probabilities(
            "TransformerDecoder", dropout=dropout, attention_dropout=attention_dropout
        )
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)  # unit scale after sqrt(d)
        self.positions = PositionalEncoding(d_model, max_len, dropout)
        self.memory_proj = (
            nn.Linear(encoder_dim, d_model) if encoder_dim != d_model else nn.Identity()
        )
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, ffn_dim, dropout, attention_dropout)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embedding.weight
        self.vocab_size = vocab_size
        self.encoder_dim = encoder_dim
        self.num_attention_maps = num_layers * num_heads
        self.attention_layers = num_layers

    def _memory(self, enc: Tensor, enc_lens: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Per-layer cross-attention keys and values `(B, H, T, d)` and the mask `(B,1,1,T)`."""
        check_lengths(type(self).__name__, enc, enc_lens, self.encoder_dim, "enc")
        memory = self.memory_proj(enc)
        pairs = [layer.cross_attn.project_key_value(memory) for layer in self.layers]
        # contiguous once here, or each search step's matmul copies the head views
        keys, values = [k.contiguous() for k, _ in pairs], [v.contiguous() for _, v in pairs]
        return keys, values, key_padding_mask(enc_lens, enc.size(1))

    def forward(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: enc `(B, T, encoder_dim)`, enc_lens `(B,)`, tokens `(B, L)` sos-prefixed.
        Returns: logits `(B, L, V)` and cross-attention `(B, layers * heads, L, T)`."""
        check_tokens(type(self).__name__, tokens, enc.size(0))
        keys, values, mask = self._memory(enc, enc_lens)
        x = self.positions(self.embedding(tokens))
        attns = []
        for layer, mem_k, mem_v in zip(self.layers, keys, values, strict=True):
            x, attn = layer(x, mem_k, mem_v, mask)
            attns.append(attn)
        return self.output(self.norm(x)), torch.cat(attns, dim=1)

    def init_state(self, enc: Tensor, enc_lens: Tensor) -> State:
        """The search state for enc `(B, T, encoder_dim)`, enc_lens `(B,)`, with empty caches."""
        keys, values, mask = self._memory(enc, enc_lens)
        empty = keys[0][:, :, :0]  # (B, H, 0, d)
        return {
            # one memory entry per utterance; `memory_rows` maps search rows to it
            "memory_keys": keys,
            "memory_values": values,
            "memory_mask": mask,
            "memory_rows": torch.arange(enc.size(0), device=enc.device),
            "self_keys": [empty] * len(self.layers),
            "self_values": [empty] * len(self.layers),
        }

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State, Tensor]:
        """Tokens `(B,)` -> log-probs `(B, V)`, new state, cross-attention `(B, K, T)`."""
        t = state["self_keys"][0].size(2)
        x = self.positions(self.embedding(tokens[:, None]), offset=t)  # (B, 1, D)
        if not _rows_grouped(state["memory_rows"], state["memory_mask"].size(0)):
            raise ValueError(
                "TransformerDecoder.step: build the state with init_state/reorder_state"
            )
        self_keys, self_values, attns = [], [], []
        for i, layer in enumerate(self.layers):
            x, attn, k, v = layer.step(
                x,
                state["self_keys"][i],
                state["self_values"][i],
                state["memory_keys"][i],
                state["memory_values"][i],
                state["memory_mask"],
            )
            self_keys.append(k)
            self_values.append(v)
            attns.append(attn)
        logits = self.output(self.norm(x[:, 0]))
        new_state = {**state, "self_keys": self_keys, "self_values": self_values}
        log_probs = logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        return log_probs, new_state, torch.cat(attns, dim=1)[:, :, 0]

    def reorder_state(self, state: State, index: Tensor) -> State:
        """Keep rows `index`; the memory is gathered only when rows leave utterance order."""
        rows = {key: state[key] for key in ("memory_rows", "self_keys", "self_values")}
        shared = {key: value for key, value in state.items() if key not in rows}
        reordered = {**shared, **reorder_batch(rows, index)}
        if not _rows_grouped(reordered["memory_rows"], state["memory_mask"].size(0)):
            return _memory_regrouped(reordered)
        return reordered


def _rows_grouped(rows: Tensor, utterances: int) -> bool:
    """Whether row r reads utterance r // G for one G, the layout `DecoderLayer.step` reads."""
    n = rows.numel()
    if n % utterances:
        return False
    return torch.equal(rows, _grouped_rows(utterances, n // utterances, rows.device))


def _grouped_rows(utterances: int, group: int, device: torch.device) -> Tensor:
    return torch.arange(utterances, device=device).repeat_interleave(group)


def _memory_regrouped(state: State) -> State:
    """The memory gathered to one entry per run of rows if all runs are as long, else per row."""
    rows = state["memory_rows"]
    entries, runs = torch.unique_consecutive(rows, return_counts=True)
    group = int(runs[0]) if runs.numel() and bool((runs == runs[0]).all()) else 1
    entries = entries if group > 1 else rows
    return {
        **state,
        "memory_keys": [k.index_select(0, entries) for k in state["memory_keys"]],
        "memory_values": [v.index_select(0, entries) for v in state["memory_values"]],
        "memory_mask": state["memory_mask"].index_select(0, entries),
        "memory_rows": _grouped_rows(entries.numel(), group, rows.device),
    }
