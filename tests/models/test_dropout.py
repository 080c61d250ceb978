"""Contract of asr.models.dropout: nn.Dropout's behaviour with a cheaper CPU mask."""

import pytest
import torch

from asr.models.dropout import FastDropout, fast_dropout, use_fast_dropout
from asr.models.transformer import TransformerDecoder, TransformerEncoder


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(1_000_003)  # not a multiple of 4
    y = fast_dropout(x, p)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 0.003
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))


def test_elements_independent_across_positions() -> None:
    torch.manual_seed(0)
    kept = fast_dropout(torch.ones(400_000, 4), 0.5) != 0  # four 16-bit lanes of each draw
    rates = kept.float().mean(0)
    assert torch.all((rates - 0.5).abs() < 0.005)
    both = (kept[:, 0] & kept[:, 1]).float().mean().item()
    assert abs(both - 0.25) < 0.005


def test_gradient_is_mask_times_scale() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 33, requires_grad=True)
    y = fast_dropout(x, 0.2)
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float() / 0.8)


def test_seeded_and_identity_cases() -> None:
    x = torch.randn(5, 9, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = fast_dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, fast_dropout(x, 0.1))
    assert a.dtype == torch.bfloat16 and a.shape == x.shape
    assert fast_dropout(x, 0.1, training=False) is x
    assert fast_dropout(x, 0.0) is x
    assert torch.all(fast_dropout(x, 1.0) == 0)


def test_module_matches_nn_dropout_api() -> None:
    layer = FastDropout(0.25)
    x = torch.randn(4, 8)
    assert "p=0.25" in repr(layer)
    assert torch.equal(layer.eval()(x), x)
    assert (layer.train()(torch.ones(10_000)) == 0).any()
    with pytest.raises(ValueError, match="dropout probability"):
        FastDropout(1.5)


def test_use_fast_dropout_swaps_every_dropout_and_leaves_the_model_unchanged() -> None:
    torch.manual_seed(0)
    encoder = TransformerEncoder(80, d_model=16, num_heads=2, ffn_dim=32, num_layers=2)
    decoder = TransformerDecoder(10, 16, d_model=16, num_heads=2, ffn_dim=32, num_layers=1)
    model = torch.nn.ModuleList([encoder, decoder])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dropouts = [m for m in model.modules() if type(m) is torch.nn.Dropout]
    probabilities = sorted(m.p for m in dropouts)
    assert len(dropouts) > 0 and use_fast_dropout(model) == len(dropouts)
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())
    fast = [m for m in model.modules() if isinstance(m, FastDropout)]
    assert sorted(m.p for m in fast) == probabilities, "each keeps its probability"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert use_fast_dropout(model) == 0
