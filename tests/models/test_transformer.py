"""Contracts of the Transformer encoder and decoder: lengths, padding, caching, masking."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from asr.models.blocks import (
    Conv2dSubsampling,
    MultiHeadAttention,
    PositionalEncoding,
    key_padding_mask,
    min_input_length,
    subsampled_length,
)
from asr.models.interfaces import lengths_to_mask
from asr.models.transformer import TransformerDecoder, TransformerEncoder

FACTORS = (4, 6, 8)
SMALL = dict(d_model=16, num_heads=4, ffn_dim=32, num_layers=2)
VOCAB = 11


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def padded_batch(lens: list[int], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random `(B, max(lens), dim)` features whose padding is junk (large values), not zeros."""
    x = torch.randn(len(lens), max(lens), dim)
    lens_t = torch.tensor(lens)
    x[~lengths_to_mask(lens_t)] = 1e3
    return x, lens_t


def encoder_output(lens: list[int], dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder output with junk padding: the decoder must mask it, not rely on zeros."""
    return padded_batch(lens, dim)


def random_tokens(batch: int, length: int) -> torch.Tensor:
    tokens = torch.randint(0, VOCAB, (batch, length))
    tokens[:, 0] = 3  # sos
    return tokens


# ---------------------------------------------------------------- subsampling lengths


@pytest.mark.parametrize("factor", FACTORS)
def test_subsampled_length_matches_each_conv_step_by_step(factor: int) -> None:
    sub = Conv2dSubsampling(min_input_length(factor), 4, factor)
    convs = [m for m in sub.conv if isinstance(m, nn.Conv2d)]
    for frames in range(min_input_length(factor), min_input_length(factor) + 40):
        h = torch.randn(1, 1, frames, min_input_length(factor))
        expected = frames
        for conv in convs:
            h = conv(h)
            expected = (expected - conv.kernel_size[0]) // conv.stride[0] + 1
            assert h.size(2) == expected
        y, y_lens = sub(torch.randn(1, frames, min_input_length(factor)), torch.tensor([frames]))
        assert y.size(1) == expected == subsampled_length(frames, factor) == int(y_lens[0])


@pytest.mark.parametrize("factor", FACTORS)
def test_fewer_subsampling_channels_keep_lengths_and_padding_invariance(factor: int) -> None:
    wide, narrow = Conv2dSubsampling(20, 16, factor), Conv2dSubsampling(20, 16, factor, channels=4)
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in wide.parameters())
    x, x_lens = padded_batch([40, 23], 20)
    y, y_lens = narrow(x, x_lens)
    assert y.shape == (2, subsampled_length(40, factor), 16)
    assert y_lens.tolist() == [subsampled_length(n, factor) for n in (40, 23)]
    alone, _ = narrow(x[1:, :23], x_lens[1:])
    torch.testing.assert_close(y[1:, : y_lens[1]], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("factor", FACTORS)
def test_subsampled_length_closed_form(factor: int) -> None:
    """All three stacks reduce to `(T - T_min) // factor + 1`."""
    frames = torch.arange(min_input_length(factor), 600)
    expected = (frames - min_input_length(factor)) // factor + 1
    assert torch.equal(subsampled_length(frames, factor), expected)
    assert subsampled_length(min_input_length(factor), factor) == 1


@pytest.mark.parametrize(("factor", "minimum"), [(4, 7), (6, 11), (8, 15)])
def test_too_short_input_names_the_minimum(factor: int, minimum: int) -> None:
    assert min_input_length(factor) == minimum
    with pytest.raises(ValueError, match=f"at least {minimum} frames"):
        subsampled_length(torch.tensor([40, minimum - 1]), factor)
    encoder = TransformerEncoder(20, subsampling=factor, **SMALL)
    x, x_lens = padded_batch([40, minimum - 1], 20)
    with pytest.raises(ValueError, match=f"at least {minimum} frames"):
        encoder(x, x_lens)
    with pytest.raises(ValueError, match=f"at least {minimum} feature bins"):
        Conv2dSubsampling(minimum - 1, 8, factor)


def test_bad_configs_and_inputs_raise() -> None:
    with pytest.raises(ValueError, match="factor 5"):
        Conv2dSubsampling(80, 8, 5)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4)
    sub = Conv2dSubsampling(20, 8)
    with pytest.raises(ValueError, match=r"\(B, T, 20\)"):
        sub(torch.randn(2, 30, 21), torch.tensor([30, 30]))
    with pytest.raises(ValueError, match="exceeds"):
        sub(torch.randn(2, 30, 20), torch.tensor([31, 30]))
    with pytest.raises(ValueError, match=r"x_lens must be \(2,\)"):
        sub(torch.randn(2, 30, 20), torch.tensor([30]))


# ---------------------------------------------------------------- positional encoding


def test_positional_encoding_formula_offset_and_growth() -> None:
    d_model = 6
    pe = PositionalEncoding(d_model, max_len=4, dropout=0.0)
    x = torch.randn(2, 9, d_model)
    y = pe(x)  # longer than max_len: the table grows
    assert pe.pe.size(0) >= 9
    for pos in (0, 3, 8):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            want = x[:, pos] * math.sqrt(d_model)
            torch.testing.assert_close(y[:, pos, 2 * i], want[:, 2 * i] + math.sin(angle))
            torch.testing.assert_close(y[:, pos, 2 * i + 1], want[:, 2 * i + 1] + math.cos(angle))
    torch.testing.assert_close(pe(x[:, 5:7], offset=5), y[:, 5:7])
    assert "pe" not in pe.state_dict()


# ---------------------------------------------------------------- multi-head attention


def test_attention_matches_torch_multihead_attention() -> None:
    mha = MultiHeadAttention(16, 4).eval()
    ref = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ref.in_proj_weight.data.copy_(mha.in_proj.weight)
    ref.in_proj_bias.data.copy_(mha.in_proj.bias)
    ref.out_proj.load_state_dict(mha.out_proj.state_dict())
    query, (memory, lens) = torch.randn(3, 5, 16), padded_batch([9, 4, 7], 16)
    mask = lengths_to_mask(lens)
    want, want_w = ref(query, memory, memory, key_padding_mask=~mask, average_attn_weights=False)
    fused, no_weights = mha(query, memory, memory, mask[:, None, None])
    explicit, weights = mha(query, memory, memory, mask[:, None, None], need_weights=True)
    assert no_weights is None
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-5)


def test_attention_weights_rows_sum_to_one_over_valid_keys() -> None:
    mha = MultiHeadAttention(16, 2, dropout=0.5).train()  # returned weights are pre-dropout
    x, lens = torch.randn(3, 9, 16), torch.tensor([9, 4, 7])
    valid = lengths_to_mask(lens)[:, None, None, :]  # (B, 1, 1, T)
    _, weights = mha(x, x, x, valid, need_weights=True)
    assert weights.shape == (3, 2, 9, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 9))
    assert torch.all(weights.masked_select(~valid.expand_as(weights)) == 0)
    assert torch.all(weights.masked_select(valid.expand_as(weights)) > 0)


def test_causal_attention_fused_equals_explicit() -> None:
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 8, 16)
    fused, none = mha(x, x, x, is_causal=True)
    explicit, weights = mha(x, x, x, need_weights=True, is_causal=True)
    assert none is None
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)
    assert torch.all(weights.triu(diagonal=1) == 0)


@pytest.mark.parametrize("keys", [9, 300])  # CPU bf16: math kernel, then torch's choice
def test_bf16_fused_attention_equals_explicit_on_either_kernel(keys: int) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval().to(torch.bfloat16)
    q, kv = torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(2, keys, 16).bfloat16()
    valid = lengths_to_mask(torch.tensor([keys, keys // 2]))[:, None, None, :]
    fused, _ = mha(q, kv, kv, valid)
    explicit, _ = mha(q, kv, kv, valid, need_weights=True)
    torch.testing.assert_close(fused, explicit, atol=2e-2, rtol=2e-2)


def test_float_mask_equals_boolean_mask() -> None:
    mha = MultiHeadAttention(16, 4).eval()
    x, lens = torch.randn(3, 9, 16), torch.tensor([9, 4, 7])
    valid = lengths_to_mask(lens)[:, None, None, :]  # (B, 1, 1, T)
    additive = torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))
    for need_weights in (False, True):
        for is_causal in (False, True):
            want = mha(x, x, x, valid, need_weights, is_causal)
            got = mha(x, x, x, additive, need_weights, is_causal)
            torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
            if need_weights:
                torch.testing.assert_close(got[1], want[1])


# ---------------------------------------------------------------- encoder


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("num_heads", [1, 4])
@pytest.mark.parametrize("relative", [False, True])
def test_encoder_shapes_lengths_backward(factor: int, num_heads: int, relative: bool) -> None:
    encoder = TransformerEncoder(
        20, subsampling=factor, relative_positions=relative, **{**SMALL, "num_heads": num_heads}
    )
    x, x_lens = padded_batch([50, 37, 23], 20)
    y, y_lens = encoder(x, x_lens)
    assert encoder.output_dim == 16
    assert y.shape == (3, subsampled_length(50, factor), 16)
    assert torch.equal(y_lens, subsampled_length(x_lens, factor))
    assert torch.all(y[~lengths_to_mask(y_lens, y.size(1))] == 0)
    y.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("relative", [False, True])
def test_encoder_padding_invariance(factor: int, relative: bool) -> None:
    encoder = TransformerEncoder(20, subsampling=factor, relative_positions=relative, **SMALL)
    encoder.eval()
    lens = [50, 37, 23]
    x, x_lens = padded_batch(lens, 20)
    with torch.no_grad():
        y, y_lens = encoder(x, x_lens)
        for b, length in enumerate(lens):
            alone, alone_lens = encoder(x[b : b + 1, :length], x_lens[b : b + 1])
            assert alone.size(1) == int(y_lens[b]) == int(alone_lens[0])
            torch.testing.assert_close(alone[0], y[b, : alone.size(1)], atol=1e-5, rtol=1e-5)


def test_encoder_runs_under_bf16_autocast() -> None:
    encoder = TransformerEncoder(20, **SMALL).eval()
    x, x_lens = padded_batch([50, 37, 23], 20)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y, y_lens = encoder(x, x_lens)
    assert y.shape == (3, 11, 16) and torch.isfinite(y).all()
    assert torch.equal(y_lens, torch.tensor([11, 8, 5]))


# ---------------------------------------------------------------- decoder


def make_decoder(encoder_dim: int = 16, tie: bool = True, **kwargs) -> TransformerDecoder:
    return TransformerDecoder(VOCAB, encoder_dim, tie_embeddings=tie, **{**SMALL, **kwargs})


@pytest.mark.parametrize(
    ("lens", "tokens", "match"),
    [
        ([12, 0], (2, 3), "an input of 0 frames is too short"),  # all-NaN logits for the row
        ([13, 9], (2, 3), r"lengths \[13, 9\] exceed the 12 frames"),  # read as 12
        ([12], (2, 3), r"enc_lens must be \(2,\)"),  # broadcast over the batch
        ([12, 9], (1, 3), r"tokens must be \(B=2, L\)"),  # broadcast over the batch
    ],
)
def test_decoder_refuses_lengths_and_tokens_that_do_not_fit(lens, tokens, match) -> None:
    decoder, enc = make_decoder(16, True), torch.randn(2, 12, 16)
    with pytest.raises(ValueError, match=match):
        decoder(enc, torch.tensor(lens), random_tokens(*tokens))
    if tokens[0] == 2:
        with pytest.raises(ValueError, match=match):
            decoder.init_state(enc, torch.tensor(lens))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("encoder_dim", [16, 24])
def test_decoder_shapes_and_backward(tie: bool, encoder_dim: int) -> None:
    decoder = make_decoder(encoder_dim, tie)
    enc, enc_lens = encoder_output([12, 9, 5], encoder_dim)
    logits, attn = decoder(enc, enc_lens, random_tokens(3, 7))
    assert decoder.num_attention_maps == 2 * 4 and decoder.attention_layers == 2
    assert logits.shape == (3, 7, VOCAB)
    assert attn.shape == (3, decoder.num_attention_maps, 7, 12)
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in decoder.parameters())


def test_tied_weights_share_storage() -> None:
    tied, untied = make_decoder(tie=True), make_decoder(tie=False)
    assert tied.output.weight is tied.embedding.weight
    assert tied.output.weight.data_ptr() == tied.embedding.weight.data_ptr()
    assert untied.output.weight.data_ptr() != untied.embedding.weight.data_ptr()
    count = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters())
    assert count == VOCAB * 16


@pytest.mark.parametrize("encoder_dim", [16, 24])
def test_decoder_padding_invariance(encoder_dim: int) -> None:
    decoder = make_decoder(encoder_dim).eval()
    enc_lens_list, token_lens = [12, 9, 5], [7, 4, 6]
    enc, enc_lens = encoder_output(enc_lens_list, encoder_dim)
    tokens = random_tokens(3, 7)  # positions past each length hold arbitrary ids
    with torch.no_grad():
        logits, attn = decoder(enc, enc_lens, tokens)
        for b, (t_enc, length) in enumerate(zip(enc_lens_list, token_lens, strict=True)):
            one, one_attn = decoder(
                enc[b : b + 1, :t_enc], enc_lens[b : b + 1], tokens[b : b + 1, :length]
            )
            torch.testing.assert_close(one[0], logits[b, :length], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(
                one_attn[0], attn[b, :, :length, :t_enc], atol=1e-5, rtol=1e-5
            )


def test_cross_attention_rows_sum_to_one_and_ignore_padding() -> None:
    decoder = make_decoder().eval()
    enc, enc_lens = encoder_output([12, 9, 5])
    with torch.no_grad():
        _, attn = decoder(enc, enc_lens, random_tokens(3, 6))
    valid = lengths_to_mask(enc_lens)[:, None, None, :].expand_as(attn)
    torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
    assert torch.all(attn.masked_select(~valid) == 0)


def test_causal_mask_later_tokens_do_not_change_earlier_logits() -> None:
    decoder = make_decoder().eval()
    enc, enc_lens = encoder_output([12, 9, 5])
    tokens = random_tokens(3, 8)
    changed = tokens.clone()
    changed[:, 5] = (tokens[:, 5] + 1) % VOCAB
    with torch.no_grad():
        before, _ = decoder(enc, enc_lens, tokens)
        after, _ = decoder(enc, enc_lens, changed)
    torch.testing.assert_close(after[:, :5], before[:, :5], atol=0, rtol=0)
    assert (after[:, 5:] - before[:, 5:]).abs().amax(-1).min() > 1e-4


def step_through(decoder: TransformerDecoder, enc, enc_lens, tokens):
    """Run `step` over every position; stack log-probs `(B, L, V)` and attention `(B,K,L,T)`."""
    state = decoder.init_state(enc, enc_lens)
    log_probs, attns = [], []
    for t in range(tokens.size(1)):
        logp, state, attn = decoder.step(tokens[:, t], state)
        log_probs.append(logp)
        attns.append(attn)
    return torch.stack(log_probs, 1), torch.stack(attns, 2), state


@pytest.mark.parametrize("encoder_dim", [16, 24])
def test_stepwise_equals_teacher_forcing(encoder_dim: int) -> None:
    decoder = make_decoder(encoder_dim).eval()
    enc, enc_lens = encoder_output([12, 9, 5], encoder_dim)
    tokens = random_tokens(3, 9)
    with torch.no_grad():
        logits, attn = decoder(enc, enc_lens, tokens)
        step_logp, step_attn, state = step_through(decoder, enc, enc_lens, tokens)
    torch.testing.assert_close(step_logp, logits.log_softmax(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step_attn, attn, atol=1e-5, rtol=1e-5)
    assert state["self_keys"][0].shape == (3, 4, 9, 4)  # cached (B, H, t, d)


def test_step_does_not_modify_state_and_reorder_follows_the_batch() -> None:
    decoder = make_decoder().eval()
    enc, enc_lens = encoder_output([12, 9, 5])
    tokens = random_tokens(3, 8)
    index = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        state = decoder.init_state(enc, enc_lens)
        for t in range(4):
            _, new_state, _ = decoder.step(tokens[:, t], state)
            assert state["self_keys"][0].size(2) == t  # the old state is untouched
            state = new_state
        state = decoder.reorder_state(state, index)
        logps, _, _ = decoder.step(tokens[index, 4], state)
        want, _ = decoder(enc[index], enc_lens[index], tokens[index])
    torch.testing.assert_close(logps, want[:, 4].log_softmax(-1), atol=1e-5, rtol=1e-5)


def test_decoder_positions_grow_past_max_len() -> None:
    long_table = make_decoder().eval()
    short_table = make_decoder(max_len=3).eval()
    short_table.load_state_dict(long_table.state_dict())
    enc, enc_lens = encoder_output([12, 9, 5])
    tokens = random_tokens(3, 10)
    with torch.no_grad():
        torch.testing.assert_close(
            short_table(enc, enc_lens, tokens)[0], long_table(enc, enc_lens, tokens)[0]
        )
        step_logp, _, _ = step_through(make_decoder(max_len=2).eval(), enc, enc_lens, tokens[:, :4])
    assert step_logp.shape == (3, 4, VOCAB)


def test_decoder_runs_under_bf16_autocast() -> None:
    decoder = make_decoder().eval()
    enc, enc_lens = encoder_output([12, 9, 5])
    tokens = random_tokens(3, 6)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, attn = decoder(enc, enc_lens, tokens)
        step_logp, step_attn, _ = step_through(decoder, enc, enc_lens, tokens)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert step_logp.dtype == torch.float32
    torch.testing.assert_close(step_logp, logits.float().log_softmax(-1), atol=0.1, rtol=0.05)
    torch.testing.assert_close(attn.float().sum(-1), torch.ones(attn.shape[:-1]), atol=2e-2, rtol=0)


def test_encoder_decoder_end_to_end_gradients() -> None:
    encoder, decoder = TransformerEncoder(20, **SMALL), make_decoder()
    x, x_lens = padded_batch([50, 37, 23], 20)
    enc, enc_lens = encoder(x, x_lens)
    tokens = random_tokens(3, 5)
    logits, _ = decoder(enc, enc_lens, tokens)
    loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert encoder.subsampling.conv[0].weight.grad.abs().sum() > 0


@pytest.mark.gpu
def test_cuda_step_equals_teacher_forcing_and_bf16_autocast_runs() -> None:
    encoder = TransformerEncoder(20, **SMALL).cuda().eval()
    decoder = make_decoder().cuda().eval()
    x, x_lens = (t.cuda() for t in padded_batch([50, 37, 23], 20))
    tokens = random_tokens(3, 6).cuda()
    with torch.no_grad():
        enc, enc_lens = encoder(x, x_lens)
        logits, attn = decoder(enc, enc_lens, tokens)
        step_logp, step_attn, _ = step_through(decoder, enc, enc_lens, tokens)
        torch.testing.assert_close(step_logp, logits.log_softmax(-1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(step_attn, attn, atol=1e-4, rtol=1e-4)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            enc, enc_lens = encoder(x, x_lens)
            logits, _ = decoder(enc, enc_lens, tokens)
    assert torch.isfinite(logits).all() and torch.equal(enc_lens.cpu(), torch.tensor([11, 8, 5]))


@pytest.mark.gpu
def test_cuda_bf16_attention_never_runs_cudnn_attention() -> None:
    """cuDNN attention builds a plan per new shape (seconds per training step on an H200)."""
    from torch.profiler import ProfilerActivity, profile

    attention = MultiHeadAttention(256, 4).cuda()  # head dim 64: cuDNN's on Hopper by default
    x = torch.randn(8, 123, 256, device="cuda", requires_grad=True)
    mask = key_padding_mask(torch.tensor([123, 100, 90, 80, 70, 60, 50, 40]).cuda(), 123)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, _ = attention(x, x, x, mask)
        out.float().sum().backward()
    ops = [event.key for event in prof.key_averages()]
    assert any("attention" in op for op in ops)
    assert not any("cudnn_attention" in op for op in ops), ops


@pytest.mark.slow
def test_tiny_overfit_then_greedy_steps_reproduce_the_targets() -> None:
    encoder = TransformerEncoder(20, dropout=0.0, **SMALL)
    decoder = make_decoder(dropout=0.0)
    x, x_lens = padded_batch([50, 37, 23], 20)
    targets = torch.randint(4, VOCAB, (3, 5))  # ids >= 4: no blank/pad/unk/sos
    inputs = torch.cat([torch.full((3, 1), 3), targets], 1)  # sos-prefixed
    outputs = torch.cat([targets, torch.full((3, 1), 3)], 1)  # eos-terminated
    params = [*encoder.parameters(), *decoder.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    for _ in range(80):
        logits, _ = decoder(*encoder(x, x_lens), inputs)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), outputs.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1
    encoder.eval(), decoder.eval()
    with torch.no_grad():
        state, prev, hyp = decoder.init_state(*encoder(x, x_lens)), torch.full((3,), 3), []
        for _ in range(6):
            logp, state, _ = decoder.step(prev, state)
            prev = logp.argmax(-1)
            hyp.append(prev)
    assert torch.equal(torch.stack(hyp, 1), outputs)


@pytest.mark.parametrize(
    "index, memory_entries",
    [([0, 0, 1, 1, 2, 2], 3), ([0, 0, 0, 1, 1, 1], 2), ([2, 2, 0, 0], 2), ([1, 0, 1, 0], 4)],
)
def test_reordered_rows_share_memory_and_equal_copied_encoder(
    index: list[int], memory_entries: int
) -> None:
    """Rows reordered from a per-utterance memory step exactly like a batch built from copied
    encoder rows. The memory is shared while each utterance keeps its rows in order (beams),
    gathered once per utterance when whole utterances leave or move, else once per row."""
    decoder = make_decoder().eval()
    enc, enc_lens = encoder_output([9, 6, 4])
    idx = torch.tensor(index)
    tokens = random_tokens(len(index), 3)
    with torch.no_grad():
        shared = decoder.reorder_state(decoder.init_state(enc, enc_lens), idx)
        copied = decoder.init_state(enc[idx], enc_lens[idx])
        assert shared["memory_keys"][0].size(0) == memory_entries
        for t in range(tokens.size(1)):
            logp_s, shared, attn_s = decoder.step(tokens[:, t], shared)
            logp_c, copied, attn_c = decoder.step(tokens[:, t], copied)
            torch.testing.assert_close(logp_s, logp_c, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(attn_s, attn_c, atol=1e-5, rtol=1e-5)
