"""Token-level LSTM and causal Transformer language models for shallow fusion."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from asr.models.blocks import (
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    check_probabilities,
    check_sizes,
)
from asr.models.interfaces import State, reorder_batch


def _check_tokens(name: str, tokens: Tensor, dim: int) -> None:
    if tokens.dim() != dim or tokens.dtype != torch.long:
        shape = "(B, L)" if dim == 2 else "(B,)"
        raise ValueError(
            f"{name}: expected int64 token ids {shape}, got {tuple(tokens.shape)} {tokens.dtype}"
        )


def _log_softmax(logits: Tensor) -> Tensor:
    """Log-probabilities in at least float32 (bf16 log-probs are too coarse for search)."""
    return logits.log_softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))


class LSTMLM(nn.Module):
    """Embedding -> multi-layer LSTM -> linear output over the vocabulary.

    Args:
        vocab_size: vocabulary size V.
        embed_dim: token embedding size.
        hidden_size: LSTM hidden size.
        num_layers: stacked LSTM layers.
        dropout: dropout on the embeddings, between LSTM layers and before the output layer.
        tie_embeddings: share the output weight with the embedding (needs equal sizes).
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 256,
        hidden_size: int = 512,
        num_layers: int = 2,
        dropout: float = 0.1,
        tie_embeddings: bool = False,
    ) -> None:
        super().__init__()
        check_probabilities("LSTMLM", dropout=dropout)
        if tie_embeddings and embed_dim != hidden_size:
            raise ValueError(
                f"LSTMLM: tie_embeddings needs embed_dim == hidden_size, got {embed_dim} and "
                f"{hidden_size}"
            )
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        between_layers = dropout if num_layers > 1 else 0.0  # nn.LSTM warns otherwise
        self.rnn = nn.LSTM(
            embed_dim, hidden_size, num_layers, batch_first=True, dropout=between_layers
        )
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden_size, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embedding.weight
        self.vocab_size = vocab_size

    def forward(self, tokens: Tensor) -> Tensor:
        """Args: tokens `(B, L)` sos-prefixed. Returns: next-token logits `(B, L, V)`."""
        _check_tokens("LSTMLM", tokens, 2)
        out, _ = self.rnn(self.dropout(self.embedding(tokens)))
        return self.output(self.dropout(out))

    def init_state(self, batch_size: int, device: torch.device | str) -> State:
        """Zero LSTM states, batch first: "hidden" and "cell" `(B, layers, H)`."""
        shape = (batch_size, self.rnn.num_layers, self.rnn.hidden_size)
        zeros = torch.zeros(shape, device=device, dtype=self.output.weight.dtype)
        return {"hidden": zeros, "cell": zeros}

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Tokens `(B,)` -> next-token log-probs `(B, V)` and the new state."""
        _check_tokens("LSTMLM.step", tokens, 1)
        h0 = state["hidden"].transpose(0, 1).contiguous()  # (layers, B, H), as nn.LSTM wants
        c0 = state["cell"].transpose(0, 1).contiguous()
        out, (h, c) = self.rnn(self.dropout(self.embedding(tokens[:, None])), (h0, c0))
        logits = self.output(self.dropout(out[:, 0]))
        return _log_softmax(logits), {"hidden": h.transpose(0, 1), "cell": c.transpose(0, 1)}

    def reorder_state(self, state: State, index: Tensor) -> State:
        """Keep batch rows `index`."""
        return reorder_batch(state, index)


class CausalBlock(nn.Module):
    """Pre-LN Transformer block with causal self-attention; `step` extends the cache by one."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Args: x `(B, L, D)`; position i sees 0..i. Returns: `(B, L, D)`."""
        q, k, v = self.attn.project_self(self.attn_norm(x))
        return self._ffn(x + self.dropout(self.attn.attend(q, k, v, is_causal=True)[0]))

    def step(self, x: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x `(B, 1, D)`, cache `(B, H, t, d)` -> `(B, 1, D)` and the cache `(B, H, t + 1, d)`."""
        q, k, v = self.attn.project_self(self.attn_norm(x))
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, H, t+1, d)
        return self._ffn(x + self.dropout(self.attn.attend(q, k, v)[0])), k, v

    def _ffn(self, x: Tensor) -> Tensor:
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class TransformerLM(nn.Module):
    """Causal pre-LN Transformer LM with sinusoidal positions.

    Args:
        vocab_size: vocabulary size V.
        d_model: model dimension.
        num_heads: attention heads per layer.
        ffn_dim: hidden size of the feed-forward networks.
        num_layers: number of blocks (at least 1).
        dropout: dropout on positions, residual branches and the FFN hidden layer.
        tie_embeddings: share the output weight with the embedding.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        num_heads: int = 4,
        ffn_dim: int = 1024,
        num_layers: int = 4,
        dropout: float = 0.1,
        tie_embeddings: bool = False,
    ) -> None:
        super().__init__()
        check_sizes("TransformerLM", d_model=d_model, ffn_dim=ffn_dim, num_layers=num_layers)
        check_probabilities("TransformerLM", dropout=dropout)
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)  # unit scale after sqrt(d)
        self.positions = PositionalEncoding(d_model, dropout=dropout)
        self.layers = nn.ModuleList(
            CausalBlock(d_model, num_heads, ffn_dim, dropout) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, vocab_size)
        if tie_embeddings:
            self.output.weight = self.embedding.weight
        self.vocab_size = vocab_size
        self.num_heads = num_heads

    def forward(self, tokens: Tensor) -> Tensor:
        """Args: tokens `(B, L)` sos-prefixed. Returns: next-token logits `(B, L, V)`."""
        _check_tokens("TransformerLM", tokens, 2)
        x = self.positions(self.embedding(tokens))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))

    def init_state(self, batch_size: int, device: torch.device | str) -> State:
        """Empty caches: "keys" and "values", one `(B, H, 0, d)` per layer."""
        d_model = self.embedding.embedding_dim
        shape = (batch_size, self.num_heads, 0, d_model // self.num_heads)
        empty = torch.zeros(shape, device=device, dtype=self.embedding.weight.dtype)
        return {"keys": [empty] * len(self.layers), "values": [empty] * len(self.layers)}

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """Tokens `(B,)` -> next-token log-probs `(B, V)` and the new state."""
        _check_tokens("TransformerLM.step", tokens, 1)
        t = state["keys"][0].size(2)
        x = self.positions(self.embedding(tokens[:, None]), offset=t)  # (B, 1, D)
        keys, values = [], []
        for layer, past_k, past_v in zip(self.layers, state["keys"], state["values"]):
            x, k, v = layer.step(x, past_k, past_v)
            keys.append(k)
            values.append(v)
        logits = self.output(self.norm(x[:, 0]))
        return _log_softmax(logits), {"keys": keys, "values": values}

    def reorder_state(self, state: State, index: Tensor) -> State:
        """Keep batch rows `index`."""
        return reorder_batch(state, index)


def build_lm(lm: Callable[[int], nn.Module], vocab_size: int) -> nn.Module:
    """The LM that `lm` builds for `vocab_size` tokens (how checkpoints rebuild it)."""
    if vocab_size <= 0:
        raise ValueError("vocab_size must be positive (link it from data.vocab_size)")
    return lm(vocab_size)
