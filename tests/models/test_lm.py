"""Contracts of the token language models: shapes and backward, causality (right padding is
harmless), stepwise scoring == teacher forcing, beam reordering, and the search interface."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from asr.models.lm import LSTMLM, TransformerLM
from asr.text import SOS_EOS_ID

VOCAB = 11
LMS = {
    "lstm": partial(LSTMLM, embed_dim=8, hidden_size=16, num_layers=2, dropout=0.1),
    "lstm_tied": partial(LSTMLM, embed_dim=16, hidden_size=16, num_layers=1, tie_embeddings=True),
    "transformer": partial(TransformerLM, d_model=16, num_heads=2, ffn_dim=32, num_layers=2),
    "transformer_tied": partial(
        TransformerLM, d_model=16, num_heads=4, ffn_dim=32, num_layers=1, tie_embeddings=True
    ),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return LMS[name](VOCAB).eval()


def sos_prefixed(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    """Random `(B, L)` inputs starting with sos, other ids from the regular tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, VOCAB, (batch, length), generator=g)
    tokens[:, 0] = SOS_EOS_ID
    return tokens


def step_through(lm: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """`(B, L, V)` log-probs from feeding `tokens` one position at a time."""
    state = lm.init_state(tokens.size(0), tokens.device)
    out = []
    for t in range(tokens.size(1)):
        log_probs, state = lm.step(tokens[:, t], state)
        out.append(log_probs)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("name", LMS)
def test_shapes_and_backward(name: str) -> None:
    lm = build(name).train()
    tokens = sos_prefixed(3, 7)
    logits = lm(tokens)
    assert logits.shape == (3, 7, VOCAB)
    logits.logsumexp(-1).sum().backward()
    missing = [n for n, p in lm.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("name", LMS)
def test_step_equals_teacher_forcing(name: str) -> None:
    lm = build(name)
    tokens = sos_prefixed(3, 9)
    with torch.no_grad():
        expected = lm(tokens).log_softmax(-1)
        stepped = step_through(lm, tokens)
    torch.testing.assert_close(stepped, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LMS)
def test_future_tokens_and_padding_do_not_change_the_past(name: str) -> None:
    lm = build(name)
    tokens = sos_prefixed(2, 8)
    changed = tokens.clone()
    changed[:, 5:] = torch.tensor([1, 1, 3])  # pad, pad, eos
    with torch.no_grad():
        torch.testing.assert_close(lm(changed)[:, :5], lm(tokens)[:, :5], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(lm(changed)[:, 6:], lm(tokens)[:, 6:])


@pytest.mark.parametrize("name", LMS)
def test_batched_equals_one_sentence_at_a_time(name: str) -> None:
    lm = build(name)
    tokens = sos_prefixed(4, 6)
    with torch.no_grad():
        batched = lm(tokens)
        for row in range(4):
            torch.testing.assert_close(
                lm(tokens[row : row + 1])[0], batched[row], atol=1e-5, rtol=1e-5
            )


@pytest.mark.parametrize("name", LMS)
def test_reorder_state_follows_the_beams(name: str) -> None:
    """Stepping, keeping rows [2, 0, 0] mid-way and stepping on equals scoring the reordered
    histories from scratch."""
    lm = build(name)
    tokens = sos_prefixed(3, 6)
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        state = lm.init_state(3, tokens.device)
        for t in range(3):
            _, state = lm.step(tokens[:, t], state)
        state = lm.reorder_state(state, index)
        histories = torch.cat([tokens[index, :3], tokens[:, 3:]], dim=1)
        for t in range(3, 6):
            log_probs, state = lm.step(histories[:, t], state)
        expected = lm(histories)[:, -1].log_softmax(-1)
    torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LMS)
def test_step_leaves_its_input_state_alone(name: str) -> None:
    """One state may be stepped twice: the second step does not disturb the first's state."""
    lm = build(name)
    tokens = sos_prefixed(2, 4)
    with torch.no_grad():
        state = lm.init_state(2, tokens.device)
        _, state = lm.step(tokens[:, 0], state)
        first, first_state = lm.step(tokens[:, 1], state)
        lm.step((tokens[:, 1] + 1) % VOCAB, state)
        again, _ = lm.step(tokens[:, 1], state)
        last, _ = lm.step(tokens[:, 2], first_state)
        expected = lm(tokens[:, :3])[:, -1].log_softmax(-1)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    torch.testing.assert_close(last, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LMS)
def test_step_gives_normalised_float32_log_probs(name: str) -> None:
    lm = build(name)
    log_probs, _ = lm.step(torch.full((2,), SOS_EOS_ID), lm.init_state(2, "cpu"))
    assert log_probs.shape == (2, VOCAB) and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2))


def test_transformer_cache_grows_one_position_per_step() -> None:
    lm = build("transformer")
    state = lm.init_state(2, "cpu")
    for t in range(3):
        assert [k.shape for k in state["keys"]] == [(2, 2, t, 8)] * 2
        _, state = lm.step(torch.full((2,), SOS_EOS_ID), state)


def test_tied_embeddings_share_one_matrix() -> None:
    for name in ("lstm_tied", "transformer_tied"):
        lm = build(name)
        assert lm.output.weight is lm.embedding.weight


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="embed_dim == hidden_size"):
        LSTMLM(VOCAB, embed_dim=8, hidden_size=16, tie_embeddings=True)
    with pytest.raises(ValueError, match="num_layers"):
        TransformerLM(VOCAB, num_layers=0)
    lm = build("transformer")
    with pytest.raises(ValueError, match=r"int64 token ids \(B, L\)"):
        lm(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"\(B,\)"):
        lm.step(torch.zeros(2, 1, dtype=torch.long), lm.init_state(2, "cpu"))
