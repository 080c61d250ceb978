"""Pyramidal RNN encoder and RNN attention decoder (Chorowski et al. 2015)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from asr.models.attention import LocationAwareAttention
from asr.models.blocks import check_probabilities, check_sizes
from asr.models.interfaces import State, check_lengths, check_tokens, lengths_to_mask, reorder_batch

_RNN_TYPES = {"lstm": nn.LSTM, "gru": nn.GRU}
_CELL_TYPES = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}
_SUBSAMPLE_MODES = ("stride", "concat")
_CONV_FRONT_FACTORS = (2, 2)


def rnn_output_lengths(lengths: Tensor | int, factors: Sequence[int]) -> Tensor | int:
    """Lengths after subsampling by each factor in turn, `ceil(T / f)` each.

    >>> rnn_output_lengths(torch.tensor([1, 7, 8, 9]), [1, 2, 2, 1]).tolist()
    [1, 2, 2, 3]
    >>> rnn_output_lengths(100, [2, 2, 2])
    13
    """
    for factor in factors:
        # ceil division that also holds in ONNX, whose integer division truncates
        lengths = (lengths + factor - 1) // factor
    return lengths


def parse_subsample(subsample: str | Sequence[int], num_layers: int) -> list[int]:
    """Per-layer factors from `"1_2_2_1"` or a list; one factor per RNN layer.

    >>> parse_subsample("1_2_2_1", 4)
    [1, 2, 2, 1]
    """
    try:
        if isinstance(subsample, str):
            factors = [int(part) for part in subsample.split("_")]
        else:
            factors = [int(part) for part in subsample]
    except ValueError as error:
        raise ValueError(f"RNNEncoder: cannot parse subsample={subsample!r}: {error}") from None
    if len(factors) != num_layers or min(factors) < 1:
        raise ValueError(
            f"RNNEncoder: subsample={subsample!r} needs one factor >= 1 per layer "
            f"(num_layers={num_layers})"
        )
    return factors


def _time_mask(x: Tensor, lens: Tensor) -> Tensor:
    valid = lengths_to_mask(lens, x.size(2))
    return x * valid[:, None, :, None].to(x.dtype)


class ConvFront(nn.Module):
    """VGG-like front: two 3x3 conv + ReLU + 2x2 max-pool blocks; padding zeroed before each."""

    def __init__(self, input_dim: int, channels: tuple[int, int] = (64, 128)) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(c_in, c_out, 3, padding=1)
            for c_in, c_out in zip((1, channels[0]), channels, strict=True)
        )
        self.pool = nn.MaxPool2d(2, ceil_mode=True)
        self.output_dim = channels[-1] * rnn_output_lengths(input_dim, _CONV_FRONT_FACTORS)
        for conv in self.convs:  # He init keeps the ReLU activations' scale layer to layer
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
            nn.init.zeros_(conv.bias)

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, D)`, x_lens `(B,)`.
        Returns: y `(B, ceil(ceil(T/2)/2), output_dim)` and its lengths `(B,)`."""
        x = _time_mask(x.unsqueeze(1), x_lens)  # (B, 1, T, D)
        for conv in self.convs:
            # ReLU output is >= 0, so the zeroed padding never wins a max-pool.
            x = _time_mask(torch.relu(conv(x)), x_lens)
            x = self.pool(x)
            x_lens = rnn_output_lengths(x_lens, (2,))
        batch, channels, time, freq = x.shape
        return x.transpose(1, 2).reshape(batch, time, channels * freq), x_lens  # (B, T', C*F')


def _lecun_normal_(weight: Tensor) -> None:
    """LeCun normal: std `1 / sqrt(in)` keeps unit variance from inputs to outputs."""
    nn.init.normal_(weight, std=1.0 / math.sqrt(weight.size(1)))


def _init_rnn(rnn: nn.RNNBase) -> None:
    """Variance-preserving init; LSTM forget-gate bias 1 (Jozefowicz et al. 2015)."""
    hidden = rnn.hidden_size
    for name, param in rnn.named_parameters():
        if name.startswith("weight_ih"):
            _lecun_normal_(param)
        elif name.startswith("weight_hh"):
            for gate in param.data.split(hidden, 0):
                nn.init.orthogonal_(gate)
        else:
            nn.init.zeros_(param)
            if isinstance(rnn, nn.LSTM) and name.startswith("bias_ih"):
                param.data[hidden : 2 * hidden] = 1.0  # gate order: input, forget, cell, output


def _lecun_linear(in_features: int, out_features: int) -> nn.Linear:
    linear = nn.Linear(in_features, out_features)
    _lecun_normal_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


class RNNEncoder(nn.Module):
    """Pyramidal (bi)LSTM/GRU encoder with projections (Listen-Attend-Spell, ESPnet BLSTMP).

    Args:
        input_dim: feature size D.
        hidden_size: RNN units per direction.
        num_layers: number of RNN layers.
        rnn_type: "lstm" or "gru".
        bidirectional: run each layer in both directions.
        projection_dim: size of the projection after each layer (0: no projections).
        subsample: per-layer factors after each RNN, `"1_2_2_1"` or a list.
        subsample_mode: "stride" keeps every f-th frame; "concat" joins f adjacent frames.
        dropout: dropout after every projection but the last.
        conv_front: put a VGG-like conv2d front (x4 subsampling) before the RNN.
        conv_channels: channels of the front's first block (the second has twice as many).
        layer_norm: layer-normalise each projection's output (needs `projection_dim > 0`).
        unpacked_on_cpu: on CPU, run oneDNN's LSTM over the padded batch, not packed sequences.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_size: int = 320,
        num_layers: int = 4,
        rnn_type: str = "lstm",
        bidirectional: bool = True,
        projection_dim: int = 320,
        subsample: str | list[int] = "1_2_2_1",
        subsample_mode: str = "stride",
        dropout: float = 0.0,
        conv_front: bool = False,
        conv_channels: int = 64,
        layer_norm: bool = True,
        unpacked_on_cpu: bool = False,
    ) -> None:
        super().__init__()
        if rnn_type not in _RNN_TYPES:
            raise ValueError(
                f"RNNEncoder: rnn_type must be one of {list(_RNN_TYPES)}: {rnn_type!r}"
            )
        if subsample_mode not in _SUBSAMPLE_MODES:
            raise ValueError(
                f"RNNEncoder: subsample_mode must be one of {_SUBSAMPLE_MODES}: {subsample_mode!r}"
            )
        check_sizes("RNNEncoder", num_layers=num_layers, hidden_size=hidden_size)
        check_sizes("RNNEncoder", least=0, projection_dim=projection_dim)  # 0: none
        if conv_front:
            check_sizes("RNNEncoder", conv_channels=conv_channels)
        check_probabilities("RNNEncoder", dropout=dropout)
        self.input_dim = input_dim
        self.layer_factors = parse_subsample(subsample, num_layers)
        self.subsample_mode = subsample_mode
        self.unpacked_on_cpu = unpacked_on_cpu
        channels = (conv_channels, 2 * conv_channels)
        self.front = ConvFront(input_dim, channels) if conv_front else None
        directions = 2 if bidirectional else 1
        self.rnns = nn.ModuleList()
        self.projections = nn.ModuleList()
        self.norms = nn.ModuleList()
        size = self.front.output_dim if self.front is not None else input_dim
        for factor in self.layer_factors:
            rnn = _RNN_TYPES[rnn_type](
                size, hidden_size, batch_first=True, bidirectional=bidirectional
            )
            _init_rnn(rnn)
            self.rnns.append(rnn)
            size = directions * hidden_size * (factor if subsample_mode == "concat" else 1)
            if projection_dim > 0:
                self.projections.append(_lecun_linear(size, projection_dim))
                size = projection_dim
                if layer_norm:
                    self.norms.append(nn.LayerNorm(size))
        self.dropout = nn.Dropout(dropout)
        self.output_dim = size

    @property
    def subsampling_factors(self) -> list[int]:
        """All factors from input to output frames, conv front first."""
        front = list(_CONV_FRONT_FACTORS) if self.front is not None else []
        return front + self.layer_factors

    def output_lengths(self, x_lens: Tensor | int) -> Tensor | int:
        """Output lengths for input lengths (see `rnn_output_lengths`)."""
        return rnn_output_lengths(x_lens, self.subsampling_factors)

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: x `(B, T, input_dim)`, x_lens `(B,)` each in `[1, T]`.
        Returns: y `(B, T', output_dim)`, zero past each length, and y_lens `(B,)`."""
        check_lengths(type(self).__name__, x, x_lens, self.input_dim)
        if self.front is not None:
            x, x_lens = self.front(x, x_lens)
        last = len(self.rnns) - 1
        for index, (rnn, factor) in enumerate(zip(self.rnns, self.layer_factors, strict=True)):
            x = self._run_rnn(rnn, x, x_lens)
            x, x_lens = self._subsample(x, x_lens, factor)
            if self.projections:
                x = self.projections[index](x)
            if self.norms:
                x = self.norms[index](x)
            if index < last:
                x = self.dropout(torch.tanh(x) if self.projections else x)
        valid = lengths_to_mask(x_lens, x.size(1)).unsqueeze(-1)  # (B, T', 1)
        return x.masked_fill(~valid, 0.0), x_lens

    def _run_rnn(self, rnn: nn.RNNBase, x: Tensor, x_lens: Tensor) -> Tensor:
        unpacked = self.unpacked_on_cpu and x.device.type == "cpu"
        if unpacked or torch.onnx.is_in_onnx_export():  # ONNX has no packed sequences
            return _padded_rnn(rnn, x, x_lens)
        packed = pack_padded_sequence(x, x_lens.cpu(), batch_first=True, enforce_sorted=False)
        output, _ = rnn(packed)
        output, _ = pad_packed_sequence(output, batch_first=True, total_length=x.size(1))
        return output

    def _subsample(self, x: Tensor, x_lens: Tensor, factor: int) -> tuple[Tensor, Tensor]:
        if factor == 1:
            return x, x_lens
        if self.subsample_mode == "stride":
            return x[:, ::factor], rnn_output_lengths(x_lens, (factor,))
        batch, time, dim = x.shape
        groups = rnn_output_lengths(time, (factor,))
        x = nn.functional.pad(x, (0, 0, 0, groups * factor - time))
        return x.reshape(batch, groups, factor * dim), rnn_output_lengths(x_lens, (factor,))


def _padded_rnn(rnn: nn.RNNBase, x: Tensor, x_lens: Tensor) -> Tensor:
    """What a packed pass of the one-layer `rnn` computes, from padded fp32 calls."""
    with torch.autocast(x.device.type, enabled=False):  # as the packed kernels ran: fp32
        x = x.to(rnn.weight_ih_l0.dtype)
        outputs = [_one_direction(rnn, x, "")]
        if rnn.bidirectional:
            backward = _one_direction(rnn, _reverse_within(x, x_lens), "_reverse")
            outputs.append(_reverse_within(backward, x_lens))
        output = torch.cat(outputs, -1) if len(outputs) > 1 else outputs[0]
    return output.masked_fill(~lengths_to_mask(x_lens, x.size(1))[..., None], 0.0)


def _one_direction(rnn: nn.RNNBase, x: Tensor, suffix: str) -> Tensor:
    """Output `(B, T, H)` of one direction (`suffix` "" or "_reverse") of `rnn` from zeros."""
    weights = [p for name, p in rnn.named_parameters() if name.endswith(f"_l0{suffix}")]
    h0 = x.new_zeros(1, x.size(0), rnn.hidden_size)
    args = (weights, rnn.bias, 1, 0.0, rnn.training, False, True)  # 1 layer, uni-, batch first
    if isinstance(rnn, nn.LSTM):
        return torch.lstm(x, (h0, h0), *args)[0]
    return torch.gru(x, h0, *args)[0]


def _reverse_within(x: Tensor, x_lens: Tensor) -> Tensor:
    """Each row's first `x_lens[b]` frames in reverse order, the padding left in place."""
    time = torch.arange(x.size(1), device=x.device)
    lens = x_lens[:, None].to(x.device)
    index = torch.where(time < lens, lens - 1 - time, time)  # (B, T), its own inverse
    return x.gather(1, index[..., None].expand(-1, -1, x.size(2)))


class RNNAttentionDecoder(nn.Module):
    """RNN attention decoder (Chorowski et al. 2015) with Luong-style input feeding.

    Args:
        vocab_size: output vocabulary size V.
        encoder_dim: size of the encoder output (keys and context).
        attention: factory `(query_dim, key_dim)` of an `asr.models.attention` module.
        embed_dim: token embedding size.
        hidden_size: RNN units per layer.
        num_layers: stacked RNN cells.
        rnn_type: "lstm" or "gru".
        input_feeding: feed the previous context to the RNN with the embedding.
        dropout: dropout on the embedding, between cells and before the output layer.
        scheduled_sampling: training probability of feeding back the argmax (Bengio et al. 2015).
    """

    def __init__(
        self,
        vocab_size: int,
        encoder_dim: int,
        attention: Callable[[int, int], nn.Module] = LocationAwareAttention,
        embed_dim: int = 256,
        hidden_size: int = 320,
        num_layers: int = 1,
        rnn_type: str = "lstm",
        input_feeding: bool = True,
        dropout: float = 0.0,
        scheduled_sampling: float = 0.0,
    ) -> None:
        super().__init__()
        if rnn_type not in _CELL_TYPES:
            raise ValueError(
                f"RNNAttentionDecoder: rnn_type must be one of {list(_CELL_TYPES)}: {rnn_type!r}"
            )
        check_sizes(
            "RNNAttentionDecoder",
            num_layers=num_layers,
            hidden_size=hidden_size,
            embed_dim=embed_dim,
        )
        check_probabilities(
            "RNNAttentionDecoder", dropout=dropout, scheduled_sampling=scheduled_sampling
        )
        self.vocab_size = vocab_size
        self.encoder_dim = encoder_dim
        self.is_lstm = rnn_type == "lstm"
        self.input_feeding = input_feeding
        self.scheduled_sampling = scheduled_sampling
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.attention = attention(hidden_size, encoder_dim)
        self.num_attention_maps = self.attention.num_heads
        self.attention_layers = 1
        sizes = [embed_dim + (encoder_dim if input_feeding else 0)] + [hidden_size] * num_layers
        cell = _CELL_TYPES[rnn_type]
        self.cells = nn.ModuleList(cell(size, hidden_size) for size in sizes[:-1])
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden_size + encoder_dim, vocab_size)

    def init_state(self, enc: Tensor, enc_lens: Tensor) -> State:
        """The batch-first search state for enc `(B, T, encoder_dim)`, enc_lens `(B,)`."""
        check_lengths(type(self).__name__, enc, enc_lens, self.encoder_dim, "enc")
        memory = self.attention.prepare(enc, lengths_to_mask(enc_lens, enc.size(1)))
        dtype = self.output.weight.dtype
        zeros = enc.new_zeros(enc.size(0), self.cells[0].hidden_size, dtype=dtype)
        state: State = {
            "hidden": [zeros] * len(self.cells),
            "context": enc.new_zeros(enc.size(0), self.encoder_dim, dtype=dtype),
            "weights": self.attention.initial_weights(memory),
            "memory": memory,
            "enc_lens": enc_lens,
        }
        if self.is_lstm:
            state["cell"] = [zeros] * len(self.cells)
        return state

    def _advance(self, embedded: Tensor, state: State) -> tuple[Tensor, State, Tensor]:
        """Embedded inputs `(B, E)` -> output-layer input `(B, H + encoder_dim)`, state, weights."""
        inputs = torch.cat([embedded, state["context"]], -1) if self.input_feeding else embedded
        hidden, cell = [], []
        for index, rnn_cell in enumerate(self.cells):
            if self.is_lstm:
                h, c = rnn_cell(inputs, (state["hidden"][index], state["cell"][index]))
                cell.append(c)
            else:
                h = rnn_cell(inputs, state["hidden"][index])
            hidden.append(h)
            inputs = self.dropout(h)
        context, weights = self.attention(h, state["memory"], state["weights"])
        new_state = {**state, "hidden": hidden, "context": context, "weights": weights}
        if self.is_lstm:
            new_state["cell"] = cell
        return self.dropout(torch.cat([h, context], -1)), new_state, weights

    def _as_maps(self, weights: Tensor) -> Tensor:
        """Weights `(B, T)` or `(B, K, T)` -> `(B, K, T)`."""
        return weights.unsqueeze(1) if weights.dim() == 2 else weights

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State, Tensor]:
        """Tokens `(B,)` -> log-probs `(B, V)`, the new state and attention `(B, K, T_enc)`."""
        features, state, weights = self._advance(self.dropout(self.embed(tokens)), state)
        log_probs = torch.log_softmax(self.output(features).float(), -1)
        return log_probs, state, self._as_maps(weights)

    def reorder_state(self, state: State, index: Tensor) -> State:
        """Keep batch rows `index` of the state."""
        return reorder_batch(state, index)

    def forward(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: enc `(B, T, encoder_dim)`, enc_lens `(B,)`, tokens `(B, L)` sos-prefixed.
        Returns: logits `(B, L, V)` and attention `(B, K, L, T)`."""
        check_tokens(type(self).__name__, tokens, enc.size(0))
        state = self.init_state(enc, enc_lens)
        embedded = self.dropout(self.embed(tokens))
        sampling = self.training and self.scheduled_sampling > 0.0
        outputs, maps = [], []
        for index in range(tokens.size(1)):
            step_input = embedded[:, index]
            if sampling and index > 0:
                step_input = self._sampled_input(tokens[:, index], outputs[-1])
            features, state, weights = self._advance(step_input, state)
            outputs.append(self.output(features) if sampling else features)
            maps.append(self._as_maps(weights))
        outputs = torch.stack(outputs, 1)  # (B, L, V) or (B, L, H + encoder_dim)
        logits = outputs if sampling else self.output(outputs)
        return logits, torch.stack(maps, 2)  # (B, K, L, T)

    def _sampled_input(self, reference: Tensor, prev_logits: Tensor) -> Tensor:
        """Embedded previous argmax with probability `scheduled_sampling`, else the reference."""
        use_model = torch.rand(reference.shape, device=reference.device) < self.scheduled_sampling
        tokens = torch.where(use_model, prev_logits.argmax(-1), reference)
        return self.dropout(self.embed(tokens))
