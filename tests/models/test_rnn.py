"""Contracts of the RNN encoder and the RNN attention decoder: lengths, padding invariance,
stepwise == teacher forcing, reordering, scheduled sampling, configs."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from asr.models import rnn
from asr.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    LocationAwareAttention,
    MultiHeadAttention,
)
from asr.models.interfaces import lengths_to_mask
from asr.models.rnn import ConvFront, RNNAttentionDecoder, RNNEncoder, rnn_output_lengths

FEAT_DIM, VOCAB, ENC_DIM = 12, 9, 10
LENS = torch.tensor([50, 31, 7])


def features(lens: torch.Tensor = LENS, dim: int = FEAT_DIM, seed: int = 0) -> torch.Tensor:
    """`(B, T, dim)` random features with garbage in the padding."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lens), int(lens.max()), dim, generator=generator)
    return torch.where(lengths_to_mask(lens)[..., None], x, 1e3)


# ---------------------------------------------------------------- encoder

ENCODER_OPTIONS = [  # every combination with projections, and both modes without
    *itertools.product(["lstm", "gru"], [True, False], ["stride", "concat"], [False, True], [6]),
    ("lstm", True, "stride", False, 0),
    ("gru", True, "concat", False, 0),
]


def make_encoder(rnn_type="lstm", bidirectional=True, mode="stride", conv_front=False, proj=6):
    torch.manual_seed(0)
    encoder = RNNEncoder(
        FEAT_DIM,
        hidden_size=5,
        num_layers=3,
        rnn_type=rnn_type,
        bidirectional=bidirectional,
        projection_dim=proj,
        subsample="2_1_3",
        subsample_mode=mode,
        conv_front=conv_front,
        conv_channels=2,
    )
    return encoder.eval()


@pytest.mark.parametrize("rnn_type,bidirectional,mode,conv_front,proj", ENCODER_OPTIONS)
def test_encoder_contract(rnn_type, bidirectional, mode, conv_front, proj) -> None:
    """Shapes, lengths, zero padding, padding invariance and backward for every option."""
    encoder = make_encoder(rnn_type, bidirectional, mode, conv_front, proj)
    x = features()
    y, y_lens = encoder(x, LENS)
    expected_dim = proj or (2 if bidirectional else 1) * 5 * (3 if mode == "concat" else 1)
    assert encoder.output_dim == expected_dim
    assert y.shape == (3, encoder.output_lengths(50), expected_dim)
    assert y_lens.tolist() == encoder.output_lengths(LENS).tolist()
    assert y_lens.dtype == torch.int64
    assert (y[~lengths_to_mask(y_lens, y.size(1))] == 0).all()
    for row, length in enumerate(LENS.tolist()):
        alone, alone_lens = encoder(x[row : row + 1, :length], LENS[row : row + 1])
        assert alone_lens.item() == y_lens[row].item() == alone.size(1)
        torch.testing.assert_close(alone[0], y[row, : alone.size(1)], atol=1e-5, rtol=0)
    encoder.train()
    y, _ = encoder(x, LENS)
    y.pow(2).sum().backward()
    for name, param in encoder.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


@pytest.mark.parametrize(
    "rnn_type,bidirectional", list(itertools.product(["lstm", "gru"], [True, False]))
)
def test_cpu_padded_rnn_equals_a_packed_pass(rnn_type: str, bidirectional: bool) -> None:
    """The unpacked CPU path (`_padded_rnn`) against PyTorch's packed pass: outputs and every
    gradient, with garbage in the padding."""
    torch.manual_seed(0)
    layer = rnn._RNN_TYPES[rnn_type](FEAT_DIM, 5, batch_first=True, bidirectional=bidirectional)
    x = features().requires_grad_()
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        x, LENS, batch_first=True, enforce_sorted=False
    )
    expected, _ = torch.nn.utils.rnn.pad_packed_sequence(layer(packed)[0], batch_first=True)
    actual = rnn._padded_rnn(layer, x, LENS)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)
    inputs = [x, *layer.parameters()]
    weights = torch.randn_like(expected)  # a loss that reaches every output
    grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for got, want in zip(torch.autograd.grad((actual * weights).sum(), inputs), grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "mode,conv_front", [("stride", False), ("concat", False), ("stride", True)]
)
def test_length_formula_matches_actual_outputs(mode: str, conv_front: bool) -> None:
    encoder = make_encoder(mode=mode, conv_front=conv_front)
    factors = ([2, 2] if conv_front else []) + [2, 1, 3]
    assert encoder.subsampling_factors == factors
    with torch.no_grad():
        for length in range(1, 40):
            y, y_lens = encoder(features(torch.tensor([length])), torch.tensor([length]))
            expected = length
            for factor in factors:  # step by step: every stage keeps ceil(T / f) frames
                expected = (expected + factor - 1) // factor
            assert y.size(1) == y_lens.item() == expected == rnn_output_lengths(length, factors)


def test_conv_front_length_and_padding() -> None:
    torch.manual_seed(0)
    front = ConvFront(FEAT_DIM, channels=(2, 3))
    x = features()
    y, y_lens = front(x, LENS)
    assert y.shape == (3, 13, 3 * 3) and front.output_dim == 9
    assert y_lens.tolist() == [13, 8, 2]
    for row, length in enumerate(LENS.tolist()):
        alone, _ = front(x[row : row + 1, :length], LENS[row : row + 1])
        torch.testing.assert_close(alone[0], y[row, : alone.size(1)], atol=1e-5, rtol=0)


def test_unpacked_cpu_encoder_equals_the_packed_one() -> None:
    torch.manual_seed(0)
    packed = make_encoder(mode="concat", proj=0).train()
    unpacked = make_encoder(mode="concat", proj=0).train()
    unpacked.load_state_dict(packed.state_dict())
    unpacked.unpacked_on_cpu = True
    x = features()
    out, lens = packed(x, LENS)
    out_unpacked, lens_unpacked = unpacked(x, LENS)
    assert torch.equal(lens, lens_unpacked)
    torch.testing.assert_close(out_unpacked, out, atol=1e-5, rtol=1e-5)


def test_concat_mode_concatenates_adjacent_frames() -> None:
    encoder = make_encoder(mode="concat", proj=0)
    x = features()
    with torch.no_grad():
        first = encoder._run_rnn(encoder.rnns[0], x, LENS)  # (B, T, 10)
        grouped, grouped_lens = encoder._subsample(first, LENS, 2)
    assert grouped_lens.tolist() == [25, 16, 4]
    torch.testing.assert_close(grouped[:, 3], torch.cat([first[:, 6], first[:, 7]], -1))
    # the odd last frame of the 31-frame utterance is paired with zeros
    torch.testing.assert_close(grouped[1, 15], torch.cat([first[1, 30], torch.zeros(10)]))


def test_encoder_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    encoder = RNNEncoder(FEAT_DIM, hidden_size=5, num_layers=2, projection_dim=6, subsample="1_1")
    encoder.dropout.p = 0.5
    x = features()
    assert not torch.equal(encoder(x, LENS)[0], encoder(x, LENS)[0])
    encoder.eval()
    assert torch.equal(encoder(x, LENS)[0], encoder(x, LENS)[0])


def test_encoder_bf16_autocast() -> None:
    encoder = make_encoder(conv_front=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_lens = encoder(features(), LENS)
    assert torch.isfinite(y).all() and y_lens.tolist() == encoder.output_lengths(LENS).tolist()


@pytest.mark.parametrize("conv_front", [False, True])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_initial_encoder_output_follows_its_input(conv_front: bool, layer_norm: bool) -> None:
    """At initialisation a deep encoder's output must still vary over time; with torch's
    default init it did not (std over time ~0.002 after 3 layers on AN4 features), which held
    CTC on its blank plateau."""
    torch.manual_seed(0)
    encoder = RNNEncoder(
        80, hidden_size=256, num_layers=3, projection_dim=256, subsample="1_1_1",
        conv_front=conv_front, conv_channels=16, layer_norm=layer_norm,
    )  # fmt: skip
    lens = torch.tensor([120, 120])
    with torch.no_grad():
        y, y_lens = encoder(torch.randn(2, 120, 80), lens)
    spread_over_time = y[0, : y_lens[0]].std(0).mean()
    assert spread_over_time > (0.2 if layer_norm else 0.04)


def test_encoder_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="rnn_type"):
        RNNEncoder(FEAT_DIM, rnn_type="transformer")
    with pytest.raises(ValueError, match="one factor >= 1 per layer"):
        RNNEncoder(FEAT_DIM, num_layers=3, subsample="1_2")
    with pytest.raises(ValueError, match="cannot parse"):
        RNNEncoder(FEAT_DIM, subsample="1x2")
    with pytest.raises(ValueError, match="subsample_mode"):
        RNNEncoder(FEAT_DIM, subsample_mode="pool")
    encoder = make_encoder()
    with pytest.raises(ValueError, match="x must be"):
        encoder(features(dim=FEAT_DIM + 1), LENS)
    with pytest.raises(ValueError, match=r"exceed the \d+ frames"):
        encoder(features(), torch.tensor([51, 3, 2]))
    with pytest.raises(ValueError, match="an input of 0 frames is too short: it needs at least 1"):
        encoder(features(), torch.tensor([5, 0, 2]))
    assert RNNEncoder(FEAT_DIM, num_layers=2, subsample=[1, 2]).layer_factors == [1, 2]


# ---------------------------------------------------------------- decoder

ATTENTIONS = {
    "dot": functools.partial(DotProductAttention, attention_dim=8),
    "additive": functools.partial(AdditiveAttention, attention_dim=8),
    "location": functools.partial(LocationAwareAttention, attention_dim=8, conv_kernel=3),
    "location-first-smooth": functools.partial(
        LocationAwareAttention,
        attention_dim=8,
        conv_kernel=3,
        init_alignment="first",
        smoothing=True,
    ),
    "multihead": functools.partial(MultiHeadAttention, attention_dim=8, num_heads=2, conv_kernel=3),
}
DECODER_OPTIONS = [
    (att, rnn_type, feeding, layers)
    for att in ATTENTIONS
    for rnn_type in ("lstm", "gru")
    for feeding, layers in ((True, 1), (False, 2))
]
TOKEN_LEN = 6


def make_decoder(attention="location", rnn_type="lstm", input_feeding=True, num_layers=1, **kw):
    torch.manual_seed(0)
    decoder = RNNAttentionDecoder(
        VOCAB,
        ENC_DIM,
        attention=ATTENTIONS[attention],
        embed_dim=4,
        hidden_size=7,
        num_layers=num_layers,
        rnn_type=rnn_type,
        input_feeding=input_feeding,
        **kw,
    )
    return decoder.eval()


def decoder_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder output `(B, T, ENC_DIM)` with garbage padding, and sos-prefixed tokens `(B, L)`."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (len(LENS), TOKEN_LEN), generator=generator)
    tokens[:, 0] = 3
    return features(dim=ENC_DIM, seed=seed), tokens


def step_through(decoder, enc, enc_lens, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    state = decoder.init_state(enc, enc_lens)
    log_probs, maps = [], []
    for index in range(tokens.size(1)):
        step_log_probs, state, weights = decoder.step(tokens[:, index], state)
        log_probs.append(step_log_probs)
        maps.append(weights)
    return torch.stack(log_probs, 1), torch.stack(maps, 2)


@pytest.mark.parametrize("attention,rnn_type,input_feeding,num_layers", DECODER_OPTIONS)
def test_decoder_contract(attention, rnn_type, input_feeding, num_layers) -> None:
    """Shapes, normalised attention, padding invariance, stepwise == teacher forcing, backward."""
    decoder = make_decoder(attention, rnn_type, input_feeding, num_layers)
    enc, tokens = decoder_inputs()
    logits, attn = decoder(enc, LENS, tokens)
    maps = decoder.num_attention_maps
    assert maps == (2 if attention == "multihead" else 1)
    assert logits.shape == (3, TOKEN_LEN, VOCAB) and attn.shape == (3, maps, TOKEN_LEN, 50)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, maps, TOKEN_LEN))
    assert (attn.masked_select(~lengths_to_mask(LENS)[:, None, None]) == 0).all()

    for row, length in enumerate(LENS.tolist()):  # padding invariance
        alone_logits, alone_attn = decoder(
            enc[row : row + 1, :length], LENS[row : row + 1], tokens[row : row + 1]
        )
        torch.testing.assert_close(alone_logits[0], logits[row], atol=1e-5, rtol=0)
        torch.testing.assert_close(alone_attn[0], attn[row, ..., :length], atol=1e-5, rtol=0)

    log_probs, step_attn = step_through(decoder, enc, LENS, tokens)
    torch.testing.assert_close(log_probs, logits.log_softmax(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(step_attn, attn, atol=1e-5, rtol=0)

    decoder.train()
    logits, attn = decoder(enc, LENS, tokens)
    (logits.logsumexp(-1).sum() + attn.pow(2).sum()).backward()
    for name, param in decoder.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


def test_later_tokens_do_not_affect_earlier_positions() -> None:
    decoder = make_decoder("multihead")
    enc, tokens = decoder_inputs()
    logits, attn = decoder(enc, LENS, tokens)
    changed = tokens.clone()
    changed[:, 3:] = (changed[:, 3:] + 1) % VOCAB
    changed_logits, changed_attn = decoder(enc, LENS, changed)
    # position i reads token i: positions 0..2 are untouched, 3.. change
    torch.testing.assert_close(changed_logits[:, :3], logits[:, :3], atol=1e-6, rtol=0)
    torch.testing.assert_close(changed_attn[:, :, :3], attn[:, :, :3], atol=1e-6, rtol=0)
    assert (changed_logits[:, 3:] - logits[:, 3:]).abs().amax(-1).min() > 1e-4


@pytest.mark.parametrize("attention,rnn_type", [("location", "lstm"), ("multihead", "gru")])
def test_reorder_state_follows_index(attention: str, rnn_type: str) -> None:
    decoder = make_decoder(attention, rnn_type, num_layers=2)
    enc, tokens = decoder_inputs()
    state = decoder.init_state(enc, LENS)
    _, state, _ = decoder.step(tokens[:, 0], state)
    _, state, _ = decoder.step(tokens[:, 1], state)
    index = torch.tensor([2, 2, 0, 1])
    log_probs, _, attn = decoder.step(tokens[:, 2], state)
    reordered = decoder.reorder_state(state, index)
    log_probs_r, _, attn_r = decoder.step(tokens[index, 2], reordered)
    torch.testing.assert_close(log_probs_r, log_probs[index])
    torch.testing.assert_close(attn_r, attn[index])
    assert reordered["enc_lens"].tolist() == LENS[index].tolist()


def test_scheduled_sampling_feeds_back_argmax_in_training_only() -> None:
    enc, tokens = decoder_inputs()
    reference = make_decoder()
    sampled = make_decoder(scheduled_sampling=1.0)  # same weights (same seed)
    eval_logits, _ = reference(enc, LENS, tokens)
    torch.testing.assert_close(sampled(enc, LENS, tokens)[0], eval_logits, atol=0, rtol=0)

    sampled.train()
    reference.train()
    train_logits, _ = sampled(enc, LENS, tokens)
    torch.testing.assert_close(reference(enc, LENS, tokens)[0], eval_logits)  # no dropout
    assert not torch.allclose(train_logits, eval_logits)
    # with probability 1 every input after sos is the previous step's argmax
    state = sampled.init_state(enc, LENS)
    token, greedy = tokens[:, 0], []
    for _ in range(TOKEN_LEN):
        log_probs, state, _ = sampled.step(token, state)
        greedy.append(log_probs)
        token = log_probs.argmax(-1)
    torch.testing.assert_close(
        train_logits.log_softmax(-1), torch.stack(greedy, 1), atol=1e-5, rtol=0
    )


def test_scheduled_sampling_mixes_reference_and_predictions() -> None:
    enc, tokens = decoder_inputs()
    decoder = make_decoder(scheduled_sampling=0.5).train()
    torch.manual_seed(1)
    outputs = {tuple(decoder(enc, LENS, tokens)[0].flatten().tolist()) for _ in range(6)}
    assert len(outputs) > 1  # the coin flips change the outputs from run to run


def test_decoder_bf16_autocast_forward_backward() -> None:
    encoder = make_encoder(proj=ENC_DIM)
    decoder = make_decoder("multihead", dropout=0.1, scheduled_sampling=0.2).train()
    _, tokens = decoder_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        enc, enc_lens = encoder(features(), LENS)
        logits, attn = decoder(enc, enc_lens, tokens)
    assert torch.isfinite(logits).all() and torch.isfinite(attn).all()
    logits.float().logsumexp(-1).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)


def test_encoder_decoder_overfit_tiny_batch() -> None:
    """Loss must fall on two utterances: the parts learn together end to end."""
    torch.manual_seed(0)
    encoder = RNNEncoder(FEAT_DIM, 8, num_layers=2, projection_dim=ENC_DIM, subsample="1_2")
    decoder = RNNAttentionDecoder(VOCAB, ENC_DIM, embed_dim=8, hidden_size=12)
    params = list(encoder.parameters()) + list(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=0.03)
    x, lens = features(torch.tensor([16, 10])), torch.tensor([16, 10])
    targets = torch.tensor([[5, 6, 7, 8, 3], [8, 7, 3, 1, 1]])
    inputs = torch.cat([torch.full((2, 1), 3), targets[:, :-1]], 1)
    losses = []
    for _ in range(25):
        logits, _ = decoder(*encoder(x, lens), inputs)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


def test_decoder_built_from_config() -> None:
    """YAML/CLI configs pick the attention by class_path; the decoder supplies the sizes."""
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(RNNAttentionDecoder, "decoder")
    attention = {
        "class_path": "asr.models.attention.MultiHeadAttention",
        "init_args": {"num_heads": 2},
    }
    config = parser.parse_object(
        {"decoder": {"vocab_size": VOCAB, "encoder_dim": ENC_DIM, "attention": attention}}
    )
    decoder = parser.instantiate(config).decoder
    assert isinstance(decoder.attention, MultiHeadAttention) and decoder.num_attention_maps == 2
    default = parser.instantiate(
        parser.parse_object({"decoder": {"vocab_size": 5, "encoder_dim": 4}})
    )
    assert isinstance(default.decoder.attention, LocationAwareAttention)


def test_decoder_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="rnn_type"):
        RNNAttentionDecoder(VOCAB, ENC_DIM, rnn_type="rnn")
    with pytest.raises(ValueError, match="scheduled_sampling"):
        RNNAttentionDecoder(VOCAB, ENC_DIM, scheduled_sampling=1.5)
    decoder = make_decoder()
    enc, tokens = decoder_inputs()
    with pytest.raises(ValueError, match="tokens must be"):
        decoder(enc, LENS, tokens[0])
    with pytest.raises(ValueError, match="enc must be"):
        decoder(enc[..., :4], LENS, tokens)
