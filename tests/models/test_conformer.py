"""Contracts of the Conformer encoder: relative attention formula, lengths, padding."""

from __future__ import annotations

import math

import pytest
import torch

from asr.models.blocks import (
    RelPositionMultiHeadAttention,
    relative_positions,
    relative_shift,
    sinusoid_embedding,
    subsampled_length,
)
from asr.models.conformer import ConformerEncoder, ConvolutionModule
from asr.models.interfaces import lengths_to_mask

SMALL = dict(d_model=16, num_heads=4, ffn_dim=32, num_layers=2, kernel_size=5)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def padded_batch(lens: list[int], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random `(B, max(lens), dim)` features whose padding is junk (large values), not zeros."""
    x = torch.randn(len(lens), max(lens), dim)
    lens_t = torch.tensor(lens)
    x[~lengths_to_mask(lens_t)] = 1e3
    return x, lens_t


@pytest.mark.parametrize("length", [1, 2, 3, 8, 17])
def test_relative_shift_picks_relative_position_i_minus_j(length: int) -> None:
    scores = torch.randn(2, 3, length, 2 * length - 1)
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    index = (length - 1 - i + j).expand(2, 3, length, length)  # column of relative pos i - j
    assert torch.equal(relative_shift(scores), scores.gather(-1, index))


@pytest.mark.parametrize(("queries", "keys"), [(1, 1), (1, 5), (3, 7), (4, 4)])
def test_relative_shift_of_a_query_block(queries: int, keys: int) -> None:
    scores = torch.randn(2, queries, keys + queries - 1)
    i = torch.arange(queries)[:, None]
    j = torch.arange(keys)[None, :]
    index = (queries - 1 - i + j).expand(2, queries, keys)
    assert torch.equal(relative_shift(scores), scores.gather(-1, index))


@pytest.mark.parametrize("need_weights", [False, True])
def test_relative_attention_in_query_blocks_equals_all_at_once(need_weights: bool) -> None:
    whole = RelPositionMultiHeadAttention(8, 2).eval()
    blocked = RelPositionMultiHeadAttention(8, 2, query_block=3).eval()
    blocked.load_state_dict(whole.state_dict())
    x, lens = padded_batch([11, 7], 8)
    pos = relative_positions(11, 8, x.device)
    mask = lengths_to_mask(lens)[:, None, None]
    out, weights = whole(x, pos, mask, need_weights)
    out_blocked, weights_blocked = blocked(x, pos, mask, need_weights)
    torch.testing.assert_close(out_blocked, out, atol=1e-6, rtol=1e-6)
    if need_weights:
        torch.testing.assert_close(weights_blocked, weights, atol=1e-6, rtol=1e-6)
    else:
        assert weights is None and weights_blocked is None


def test_relative_attention_matches_explicit_formula() -> None:
    attn = RelPositionMultiHeadAttention(8, 2).eval()
    x, lens = torch.randn(2, 5, 8), torch.tensor([5, 3])
    valid = lengths_to_mask(lens)
    pos = relative_positions(5, 8, x.device)
    out, weights = attn(x, pos, valid[:, None, None], need_weights=True)
    fused, none = attn(x, pos, valid[:, None, None])
    assert none is None
    torch.testing.assert_close(fused, out, atol=1e-5, rtol=1e-5)

    q, k, v = attn.project_self(x)  # (B, H, T, d)
    want = torch.zeros(2, 2, 5, 5)
    for qi in range(5):
        for kj in range(5):
            sinusoid = sinusoid_embedding(torch.tensor([qi - kj]), 8)  # (1, D)
            rel = attn.pos_proj(sinusoid).view(2, 4)  # (H, d)
            content = ((q[:, :, qi] + attn.pos_bias_u) * k[:, :, kj]).sum(-1)
            position = ((q[:, :, qi] + attn.pos_bias_v) * rel).sum(-1)
            want[:, :, qi, kj] = (content + position) / math.sqrt(4)
    want = want.masked_fill(~valid[:, None, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, want, atol=1e-5, rtol=1e-5)
    assert torch.all(weights[1, :, :, 3:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5))
    context = (want @ v).transpose(1, 2).flatten(2)  # (B, T, H * d)
    torch.testing.assert_close(out, attn.out_proj(context), atol=1e-5, rtol=1e-5)


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError, match="odd"):
        ConvolutionModule(8, 4, 0.0, "batch")
    with pytest.raises(ValueError, match="'group'"):
        ConvolutionModule(8, 5, 0.0, "group")


@pytest.mark.parametrize("factor", [4, 6, 8])
@pytest.mark.parametrize("conv_norm", ["batch", "layer"])
@pytest.mark.parametrize("block_norm", [True, False])
def test_encoder_shapes_lengths_backward(factor: int, conv_norm: str, block_norm: bool) -> None:
    encoder = ConformerEncoder(
        20, subsampling=factor, conv_norm=conv_norm, block_norm=block_norm, **SMALL
    )
    x, x_lens = padded_batch([50, 37, 23], 20)
    y, y_lens = encoder(x, x_lens)
    assert encoder.output_dim == 16
    assert y.shape == (3, subsampled_length(50, factor), 16)
    assert torch.equal(y_lens, subsampled_length(x_lens, factor))
    assert torch.all(y[~lengths_to_mask(y_lens, y.size(1))] == 0)
    y.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())


@pytest.mark.parametrize(
    ("conv_norm", "block_norm"), [("batch", True), ("layer", True), ("batch", False)]
)
def test_encoder_padding_invariance(conv_norm: str, block_norm: bool) -> None:
    encoder = ConformerEncoder(20, conv_norm=conv_norm, block_norm=block_norm, **SMALL).eval()
    lens = [50, 37, 23]
    x, x_lens = padded_batch(lens, 20)
    with torch.no_grad():
        y, y_lens = encoder(x, x_lens)
        for b, length in enumerate(lens):
            alone, _ = encoder(x[b : b + 1, :length], x_lens[b : b + 1])
            assert alone.size(1) == int(y_lens[b])
            torch.testing.assert_close(alone[0], y[b, : alone.size(1)], atol=1e-5, rtol=1e-5)


def test_a_lone_one_frame_utterance_trains_on_the_running_batch_statistics() -> None:
    """BatchNorm has no statistics of one value per channel: such a batch (0.1 s alone in a
    bucket) used to stop training; it is normalised as in evaluation."""
    torch.manual_seed(0)
    encoder = ConformerEncoder(80, d_model=32, num_heads=2, ffn_dim=64, num_layers=1,
                               kernel_size=7).train()  # fmt: skip
    stats = {k: v.clone() for k, v in encoder.state_dict().items() if "running" in k}
    y, lens = encoder(torch.randn(1, 9, 80), torch.tensor([9]))
    assert lens.tolist() == [1] and torch.isfinite(y).all()
    y.sum().backward()
    assert all(torch.equal(v, encoder.state_dict()[k]) for k, v in stats.items())
    encoder(torch.randn(2, 9, 80), torch.tensor([9, 9]))  # two frames: batch statistics again
    assert not torch.equal(stats["layers.0.conv.norm.running_mean"],
                           encoder.state_dict()["layers.0.conv.norm.running_mean"])  # fmt: skip


def test_block_norm_places_the_layer_norms() -> None:
    """The paper's blocks each end in a LayerNorm (the keys older checkpoints hold); pre-LN
    blocks have none and the stack ends in one, so the output is normalised either way."""
    paper = ConformerEncoder(20, **SMALL).state_dict()
    pre_ln = ConformerEncoder(20, block_norm=False, **SMALL).state_dict()
    assert "layers.0.norm.weight" in paper and "norm.weight" not in paper
    assert "layers.0.norm.weight" not in pre_ln and "norm.weight" in pre_ln
    encoder = ConformerEncoder(20, block_norm=False, **SMALL).eval()
    x, x_lens = padded_batch([50], 20)
    with torch.no_grad():
        y, _ = encoder(x, x_lens)
    torch.testing.assert_close(y.mean(-1), torch.zeros(1, y.size(1)), atol=1e-5, rtol=0)


def test_encoder_runs_under_bf16_autocast() -> None:
    encoder = ConformerEncoder(20, **SMALL).eval()
    x, x_lens = padded_batch([50, 37, 23], 20)
    with torch.no_grad():
        want, _ = encoder(x, x_lens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, y_lens = encoder(x, x_lens)
    assert y.shape == (3, 11, 16) and torch.isfinite(y).all()
    assert torch.equal(y_lens, torch.tensor([11, 8, 5]))
    torch.testing.assert_close(y.float(), want, atol=0.15, rtol=0.1)


@pytest.mark.gpu
def test_cuda_matches_cpu_and_bf16_autocast_runs() -> None:
    encoder = ConformerEncoder(20, **SMALL).eval()
    x, x_lens = padded_batch([50, 37, 23], 20)
    with torch.no_grad():
        want, _ = encoder(x, x_lens)
        encoder.cuda()
        y, _ = encoder(x.cuda(), x_lens.cuda())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y_bf16, _ = encoder(x.cuda(), x_lens.cuda())
    torch.testing.assert_close(y.cpu(), want, atol=1e-2, rtol=1e-2)  # cuDNN convs may use TF32
    assert torch.isfinite(y_bf16).all()
