"""Contracts of the composed recognizer, for every encoder x decoder x attention combination:
shapes and lengths, backward, padding invariance, stepwise decoding == teacher forcing."""

from __future__ import annotations

import re
from functools import partial

import pytest
import torch

from asr.frontends import Frontend, LogMelFilterbank, UtteranceCMVN
from asr.models import attention as att
from asr.models.conformer import ConformerEncoder
from asr.models.ctc import CTCHead
from asr.models.lm import TransformerLM
from asr.models.rnn import RNNAttentionDecoder, RNNEncoder
from asr.models.seq2seq import SOS_EOS_ID, Seq2Seq, add_sos_eos
from asr.models.transformer import TransformerDecoder, TransformerEncoder

VOCAB = 12
DIM = 16

ENCODERS = {
    "transformer": partial(TransformerEncoder, d_model=DIM, num_heads=2, ffn_dim=32, num_layers=2),
    "conformer": partial(
        ConformerEncoder, d_model=DIM, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5
    ),
    "conformer_pre_ln": partial(
        ConformerEncoder, d_model=DIM, num_heads=2, ffn_dim=32, num_layers=2, kernel_size=5,
        block_norm=False,
    ),
    "blstmp": partial(RNNEncoder, hidden_size=DIM, num_layers=3, subsample="1_2_2"),
    "vgg_bgru": partial(RNNEncoder, hidden_size=DIM, num_layers=2, rnn_type="gru", subsample="1_1",
                        conv_front=True, conv_channels=4),
}  # fmt: skip

ATTENTIONS = {
    "dot": partial(att.DotProductAttention, attention_dim=DIM),
    "additive": partial(att.AdditiveAttention, attention_dim=DIM),
    "location": partial(att.LocationAwareAttention, attention_dim=DIM, conv_kernel=5),
    "location_sharp_smooth": partial(
        att.LocationAwareAttention, attention_dim=DIM, conv_kernel=5, sharpening=2.0,
        smoothing=True,
    ),
    "multihead": partial(att.MultiHeadAttention, num_heads=2, attention_dim=DIM, conv_kernel=5),
}  # fmt: skip

DECODERS = {
    "transformer": partial(TransformerDecoder, d_model=DIM, num_heads=2, ffn_dim=32, num_layers=2),
    **{
        f"rnn_{name}": partial(RNNAttentionDecoder, attention=factory, embed_dim=8, hidden_size=DIM)
        for name, factory in ATTENTIONS.items()
    },
}

COMBINATIONS = [(e, d) for e in ENCODERS for d in DECODERS]


def build(encoder: str, decoder: str) -> Seq2Seq:
    torch.manual_seed(0)
    frontend = Frontend(LogMelFilterbank(n_mels=20), UtteranceCMVN(norm_vars=True))
    enc = ENCODERS[encoder](frontend.output_dim)
    dec = DECODERS[decoder](VOCAB, enc.output_dim)
    return Seq2Seq(frontend, enc, dec, CTCHead(VOCAB, enc.output_dim)).eval()


def batch(lengths=(8000, 5600, 6400), token_lengths=(5, 3, 4)):
    g = torch.Generator().manual_seed(1)
    waves = torch.randn(len(lengths), max(lengths), generator=g) * 0.1
    wave_lens = torch.tensor(lengths)
    for i, n in enumerate(lengths):
        waves[i, n:] = 0.0
    tokens = torch.randint(4, VOCAB, (len(lengths), max(token_lengths)), generator=g)
    token_lens = torch.tensor(token_lengths)
    for i, n in enumerate(token_lengths):
        tokens[i, n:] = 1  # pad
    return waves, wave_lens, tokens, token_lens


@pytest.mark.parametrize("encoder,decoder", COMBINATIONS)
def test_shapes_lengths_and_backward(encoder, decoder):
    model = build(encoder, decoder).train()
    waves, wave_lens, tokens, token_lens = batch()
    logits, attn = model(waves, wave_lens, tokens, token_lens)
    enc, enc_lens = model.encode(waves, wave_lens)
    assert logits.shape == (3, tokens.size(1) + 1, VOCAB)
    k = model.decoder.num_attention_maps
    assert attn.shape == (3, k, tokens.size(1) + 1, enc.size(1))
    assert enc_lens.max() == enc.size(1) and (enc_lens > 0).all()
    out = model.loss(waves, wave_lens, tokens, token_lens, ctc_weight=0.3, label_smoothing=0.1)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("encoder,decoder", COMBINATIONS)
def test_padding_invariance(encoder, decoder):
    """An utterance alone equals its slice of a padded batch (encoder and decoder outputs)."""
    model = build(encoder, decoder)
    waves, wave_lens, tokens, token_lens = batch()
    with torch.no_grad():
        logits, attn = model(waves, wave_lens, tokens, token_lens)
        for i in range(3):
            n, m = int(wave_lens[i]), int(token_lens[i])
            alone, alone_attn = model(waves[i : i + 1, :n], wave_lens[i : i + 1],
                                      tokens[i : i + 1, :m], token_lens[i : i + 1])  # fmt: skip
            t = alone_attn.size(-1)
            torch.testing.assert_close(logits[i, : m + 1], alone[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn[i, :, : m + 1, :t], alone_attn[0], atol=1e-5, rtol=1e-5)
            assert attn[i, :, : m + 1, t:].abs().max() == 0 if attn.size(-1) > t else True


@pytest.mark.parametrize("encoder,decoder", COMBINATIONS)
def test_stepwise_equals_teacher_forcing(encoder, decoder):
    model = build(encoder, decoder)
    waves, wave_lens, tokens, token_lens = batch()
    with torch.no_grad():
        enc, enc_lens = model.encode(waves, wave_lens)
        ys_in, _ = add_sos_eos(tokens, token_lens)
        logits, attn = model.decoder(enc, enc_lens, ys_in)
        state = model.decoder.init_state(enc, enc_lens)
        for t in range(ys_in.size(1)):
            logp, state, step_attn = model.decoder.step(ys_in[:, t], state)
            expected = torch.log_softmax(logits[:, t].float(), -1)
            torch.testing.assert_close(logp, expected, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step_attn, attn[:, :, t], atol=1e-5, rtol=1e-5)


def test_sos_eos_framing():
    ys_in, ys_out = add_sos_eos(torch.tensor([[5, 6, 1]]), torch.tensor([2]))
    assert ys_in[0, 0] == SOS_EOS_ID and ys_out[0].tolist() == [5, 6, SOS_EOS_ID, 1]


def test_ctc_weight_without_head_is_an_error():
    model = build("transformer", "transformer")
    model.ctc = None
    with pytest.raises(ValueError, match="no CTC head"):
        model.loss(*batch(), ctc_weight=0.5)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: TransformerEncoder(20, d_model=16, num_heads=2, num_layers=-2),
         "TransformerEncoder: num_layers must be >= 1, got -2"),  # built with no layers
        (lambda: ConformerEncoder(20, d_model=16, num_heads=2, num_layers=0),
         "ConformerEncoder: num_layers must be >= 1, got 0"),
        (lambda: ConformerEncoder(20, d_model=16, num_heads=2, kernel_size=-1),
         "kernel_size=-1 must be odd and >= 1"),
        (lambda: TransformerEncoder(20, d_model=16, num_heads=0),
         "MultiHeadAttention: num_heads must be >= 1, got 0"),  # ZeroDivisionError
        (lambda: TransformerEncoder(20, d_model=16, num_heads=-2),
         "MultiHeadAttention: num_heads must be >= 1, got -2"),
        (lambda: TransformerDecoder(VOCAB, 16, d_model=16, num_heads=2, num_layers=0),
         "TransformerDecoder: num_layers must be >= 1, got 0"),  # at its first batch
        (lambda: RNNEncoder(20, num_layers=0, subsample=[]),
         "RNNEncoder: num_layers must be >= 1, got 0"),
        (lambda: RNNEncoder(20, projection_dim=-5), "RNNEncoder: projection_dim must be >= 0"),
        (lambda: RNNAttentionDecoder(VOCAB, 16, hidden_size=0),
         "RNNAttentionDecoder: hidden_size must be >= 1, got 0"),  # an empty attention query
        (lambda: TransformerEncoder(20, d_model=0, num_heads=2),
         "TransformerEncoder: d_model must be >= 1, got 0"),  # ZeroDivisionError
        (lambda: TransformerLM(VOCAB, d_model=16, num_heads=2, ffn_dim=0),
         "TransformerLM: ffn_dim must be >= 1, got 0"),  # trained without complaint
        (lambda: att.LocationAwareAttention(16, 16, attention_dim=0),
         "LocationAwareAttention: attention_dim must be >= 1, got 0"),  # uniform attention
        (lambda: att.LocationAwareAttention(16, 16, conv_channels=0),
         "LocationAwareAttention: conv_channels must be >= 1, got 0"),
        (lambda: att.DotProductAttention(16, 16, attention_dim=0),
         "DotProductAttention: attention_dim must be >= 1, got 0"),
        (lambda: att.MultiHeadAttention(16, 16, num_heads=2, attention_dim=0),
         "MultiHeadAttention: attention_dim must be >= 1, got 0"),
        # torch's own words name no argument, deep in a traceback
        (lambda: TransformerEncoder(20, d_model=16, num_heads=2, dropout=1.5),
         "TransformerEncoder: dropout must be in [0, 1], got 1.5"),
        (lambda: TransformerDecoder(VOCAB, 16, d_model=16, num_heads=2, attention_dropout=-1),
         "TransformerDecoder: attention_dropout must be in [0, 1], got -1"),
        (lambda: ConformerEncoder(20, d_model=16, num_heads=2, dropout=float("nan")),
         "ConformerEncoder: dropout must be in [0, 1], got nan"),
        (lambda: RNNEncoder(20, dropout=2.0), "RNNEncoder: dropout must be in [0, 1], got 2.0"),
        (lambda: RNNAttentionDecoder(VOCAB, 16, dropout=-0.5),
         "RNNAttentionDecoder: dropout must be in [0, 1], got -0.5"),
        (lambda: TransformerLM(VOCAB, d_model=16, num_heads=2, dropout=1.1),
         "TransformerLM: dropout must be in [0, 1], got 1.1"),
        (lambda: RNNEncoder(20, conv_front=True, conv_channels=0),
         "RNNEncoder: conv_channels must be >= 1, got 0"),  # the LSTM's input_size
        # said of the encoder's own arguments, which a config sets, not its parts'
        (lambda: ConformerEncoder(20, d_model=16, num_heads=2, conv_norm="group"),
         "ConformerEncoder: conv_norm must be 'batch' or 'layer', got 'group'"),
        (lambda: ConformerEncoder(20, d_model=16, num_heads=2, causal=True, dynamic_chunk=-4),
         "ConformerEncoder: dynamic_chunk must be >= 0, got -4"),
        (lambda: TransformerEncoder(20, d_model=16, num_heads=2, dynamic_chunk=-1),
         "TransformerEncoder: dynamic_chunk must be >= 0, got -1"),
    ],
)  # fmt: skip
def test_sizes_that_build_no_network_are_refused_by_name(make, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        make()


def test_a_float64_model_takes_input_shorter_than_a_window():
    """Its spectrogram of no frames was float32, which the float64 mel matrix refused."""
    model = build("blstmp", "rnn_location").double().eval()
    short = model.frontend(torch.zeros(1, 300, dtype=torch.float64), torch.tensor([300]))
    assert short[0].dtype == torch.float64 and short[0].size(1) == 0
    assert model.shortest_input() == build("blstmp", "rnn_location").eval().shortest_input()


def test_measuring_lengths_leaves_a_training_model_as_it_was():
    """The zeros `encoder_timing` and `shortest_input` run on would move the Conformer's batch
    statistics; each submodule keeps its mode (a frozen part stays in eval)."""
    model = build("conformer", "transformer").train()
    model.frontend.eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    model.encoder_timing(), model.feature_seconds(), model.shortest_input()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [m.training for m in model.modules()] == modes
