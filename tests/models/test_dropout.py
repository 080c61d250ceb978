"""Contract of asr.models.dropout: nn.Dropout's behaviour with a cheaper CPU mask."""

import pytest
import torch

from asr.models.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1_000_003)  # not a multiple of 4
    y = dropout(x, p)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 0.003
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))


def test_elements_independent_across_positions() -> None:
    torch.manual_seed(0)
    kept = dropout(torch.ones(400_000, 4), 0.5) != 0  # four 16-bit lanes of each draw
    rates = kept.float().mean(0)
    assert torch.all((rates - 0.5).abs() < 0.005)
    both = (kept[:, 0] & kept[:, 1]).float().mean().item()
    assert abs(both - 0.25) < 0.005


def test_gradient_is_mask_times_scale() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 33, requires_grad=True)
    y = dropout(x, 0.2)
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float() / 0.8)


def test_seeded_and_identity_cases() -> None:
    x = torch.randn(5, 9, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.1))
    assert a.dtype == torch.bfloat16 and a.shape == x.shape
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.all(dropout(x, 1.0) == 0)


def test_module_matches_nn_dropout_api() -> None:
    layer = Dropout(0.25)
    x = torch.randn(4, 8)
    assert "p=0.25" in repr(layer)
    assert torch.equal(layer.eval()(x), x)
    assert (layer.train()(torch.ones(10_000)) == 0).any()
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(1.5)
