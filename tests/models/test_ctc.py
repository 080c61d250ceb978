"""Intermediate CTC: what the tapped blocks give, how the loss weighs them, when it refuses."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from asr.models.ctc import InterCTC
from tests.models.test_seq2seq import batch, build


def _truncated(encoder: nn.Module, blocks: int) -> nn.Module:
    """A copy of `encoder` that stops after its first `blocks` blocks (its final norm kept)."""
    short = copy.deepcopy(encoder)
    short.layers = short.layers[:blocks]
    return short


@pytest.mark.parametrize("encoder", ["transformer", "conformer_pre_ln"])
def test_inter_loss_is_the_ctc_loss_of_the_encoder_cut_at_the_tapped_block(encoder):
    model = build(encoder, "transformer")
    model.encoder.layers.append(copy.deepcopy(model.encoder.layers[-1]))  # 3 blocks: tap 1 and 2
    waves, wave_lens, tokens, token_lens = batch()
    inter = InterCTC(layers=(2, 1), weight=0.4)
    with torch.no_grad():
        out = model.loss(waves, wave_lens, tokens, token_lens, ctc_weight=0.3, inter_ctc=inter)
        feats, feat_lens = model.frontend(waves, wave_lens)
        expected = []
        for blocks in (1, 2):
            enc, enc_lens = _truncated(model.encoder, blocks)(feats, feat_lens)
            expected.append(model.ctc.loss(model.ctc(enc), enc_lens, tokens, token_lens))
        plain = model.loss(waves, wave_lens, tokens, token_lens, ctc_weight=0.3)
    torch.testing.assert_close(out.inter_ctc_loss, torch.stack(expected).mean())
    torch.testing.assert_close(out.ctc_loss, plain.ctc_loss)
    ctc_term = 0.6 * out.ctc_loss + 0.4 * out.inter_ctc_loss
    torch.testing.assert_close(out.loss, 0.3 * ctc_term + 0.7 * out.attention_loss)
    assert plain.inter_ctc_loss is None


def test_the_inter_loss_alone_trains_the_tapped_blocks_and_not_the_ones_above():
    model = build("transformer", "transformer").train()
    waves, wave_lens, tokens, token_lens = batch()
    with InterCTC(layers=(1,), weight=0.5).tap(model.encoder) as outputs:
        enc, enc_lens = model.encode(waves, wave_lens)
    assert len(outputs) == 1 and outputs[0].shape == enc.shape
    model.ctc.loss(model.ctc(outputs[0]), enc_lens, tokens, token_lens).backward()
    assert model.encoder.layers[0].ffn_norm.weight.grad.abs().sum() > 0
    assert model.encoder.layers[1].ffn_norm.weight.grad is None


def test_tap_leaves_no_hook_behind_even_when_the_body_raises():
    model = build("conformer", "transformer")
    with pytest.raises(RuntimeError, match="stop"):
        with InterCTC(layers=(1,), weight=0.5).tap(model.encoder):
            raise RuntimeError("stop")
    assert all(not block._forward_hooks for block in model.encoder.layers)


@pytest.mark.parametrize(
    "layers,weight,message",
    [
        ((), 0.3, "names no block: name some, or set inter_ctc_weight 0"),
        ((0,), 0.3, "1-based"),
        ((1,), 0.0, r"\(0, 1\)"),
        ((1,), 1.0, r"\(0, 1\)"),
    ],
)
def test_bad_settings_are_refused(layers, weight, message):
    with pytest.raises(ValueError, match=message):
        InterCTC(layers, weight)


def test_a_block_beyond_the_encoder_or_an_encoder_without_blocks_is_refused():
    model = build("transformer", "transformer")  # 2 blocks: only block 1 is intermediate
    with pytest.raises(ValueError, match="has 2 blocks, so an intermediate one is 1..1"):
        InterCTC((2,), 0.3).blocks(model.encoder)
    del model.encoder.layers[1]  # one block: "1..0" was said
    with pytest.raises(ValueError, match="has 1 block, so none is intermediate: give inter_ctc"):
        InterCTC((1,), 0.3).blocks(model.encoder)
    with pytest.raises(ValueError, match="RNNEncoder has none"):
        InterCTC((1,), 0.3).blocks(build("blstmp", "transformer").encoder)
