"""Contracts of the per-step attention modules: normalisation and masking, padding invariance,
Chorowski's formulas, sharpening, location dependence, reordering."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from asr.models.attention import (
    AdditiveAttention,
    DotProductAttention,
    LocationAwareAttention,
    MultiHeadAttention,
    normalise_scores,
)
from asr.models.interfaces import lengths_to_mask, reorder_batch

QUERY_DIM, KEY_DIM, ATT_DIM = 6, 10, 8
LENS = torch.tensor([50, 31, 7])

KINDS = {
    "dot": functools.partial(DotProductAttention, attention_dim=ATT_DIM),
    "additive": functools.partial(AdditiveAttention, attention_dim=ATT_DIM),
    "location": functools.partial(LocationAwareAttention, attention_dim=ATT_DIM, conv_kernel=3),
    "location-wide": functools.partial(LocationAwareAttention, attention_dim=ATT_DIM),
    "location-sharp": functools.partial(
        LocationAwareAttention, attention_dim=ATT_DIM, conv_kernel=3, sharpening=2.0
    ),
    "location-smooth": functools.partial(
        LocationAwareAttention, attention_dim=ATT_DIM, conv_kernel=3, smoothing=True
    ),
    "location-first": functools.partial(
        LocationAwareAttention, attention_dim=ATT_DIM, conv_kernel=3, init_alignment="first"
    ),
    "multihead": functools.partial(MultiHeadAttention, attention_dim=ATT_DIM, conv_kernel=3),
    "multihead-content": functools.partial(
        MultiHeadAttention, attention_dim=ATT_DIM, num_heads=2, location=False
    ),
    "multihead-smooth": functools.partial(
        MultiHeadAttention, attention_dim=ATT_DIM, conv_kernel=3, smoothing=True
    ),
}
LOCATION_KINDS = [name for name in KINDS if name.startswith("location") or name == "multihead"]
CONTENT_KINDS = ["dot", "additive", "multihead-content"]


def make(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return KINDS[name](QUERY_DIM, KEY_DIM).eval()


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query `(B, Dq)`, keys `(B, T, Dk)` with garbage in the padding, mask `(B, T)`."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(len(LENS), QUERY_DIM, generator=generator)
    keys = torch.randn(len(LENS), int(LENS.max()), KEY_DIM, generator=generator)
    mask = lengths_to_mask(LENS)
    keys = torch.where(mask[..., None], keys, 1e3)  # padding must never matter
    return query, keys, mask


def random_alignment(module: torch.nn.Module, mask: torch.Tensor, seed: int = 2) -> torch.Tensor:
    """A random previous alignment, zero on padding: `(B, T)` or `(B, H, T)`."""
    generator = torch.Generator().manual_seed(seed)
    shape = (mask.size(0), module.num_heads, mask.size(1))
    weights = torch.rand(shape, generator=generator) * mask[:, None]
    weights = weights / weights.sum(-1, keepdim=True)
    return weights.squeeze(1) if module.num_heads == 1 else weights


@pytest.mark.parametrize("name", KINDS)
def test_weights_normalised_and_zero_on_padding(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    memory = module.prepare(keys, mask)
    for prev in (None, random_alignment(module, mask)):
        context, weights = module(query, memory, prev)
        heads = module.num_heads
        expected = (3, 50) if heads == 1 else (3, heads, 50)
        assert weights.shape == expected
        assert context.shape == (3, KEY_DIM) and module.output_dim == KEY_DIM
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)
        padding = ~mask if heads == 1 else ~mask[:, None].expand_as(weights)
        assert (weights[padding] == 0).all()
        assert torch.isfinite(context).all()


@pytest.mark.parametrize("name", KINDS)
def test_padding_invariance(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    prev = random_alignment(module, mask)
    context, weights = module(query, module.prepare(keys, mask), prev)
    for row, length in enumerate(LENS.tolist()):
        alone_keys = keys[row : row + 1, :length]
        alone_memory = module.prepare(alone_keys, mask[row : row + 1, :length])
        alone_context, alone_weights = module(
            query[row : row + 1], alone_memory, prev[row : row + 1, ..., :length]
        )
        torch.testing.assert_close(alone_context[0], context[row], atol=1e-5, rtol=0)
        torch.testing.assert_close(alone_weights[0], weights[row, ..., :length], atol=1e-5, rtol=0)


def location_features(prev: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """Reference `f_j = sum_k F_k alpha_{j + k - K}` (zero outside), `(B, T, C)` from an
    alignment `(B, T)` and filters `(C, 2K + 1)`, written as an explicit sum over offsets."""
    half = (filters.size(1) - 1) // 2
    padded = F.pad(prev, (half, half))
    time = prev.size(1)
    shifted = torch.stack([padded[:, k : k + time] for k in range(filters.size(1))], -1)
    return shifted @ filters.T  # (B, T, C)


@pytest.mark.parametrize("name", ["location", "location-sharp", "location-smooth"])
def test_location_aware_matches_chorowski_equations(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    prev = random_alignment(module, mask)
    _, weights = module(query, module.prepare(keys, mask), prev)
    features = location_features(prev, module.location_conv.weight[:, 0])
    hidden = (
        (query @ module.query_proj.weight.T)[:, None]  # W s
        + module.key_proj(keys)  # V h + b
        + features @ module.location_proj.weight.T  # U f
    )
    energy = module.sharpening * (torch.tanh(hidden) @ module.score.weight[0])  # (B, T)
    if module.smoothing:
        expected = torch.sigmoid(energy) * mask
        expected = expected / expected.sum(-1, keepdim=True)
    else:
        expected = energy.masked_fill(~mask, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("sharpening", [1.0, 2.0])
def test_smoothing_of_scores_far_below_zero_is_still_the_sigmoids_ratio(sharpening) -> None:
    """Sigmoids of scores below about -100 are all 0 in float32: their ratio is not 0 / 0."""
    scores = torch.tensor([[-60.0, -61.0, -70.0, 0.0], [-110.0, -112.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    weights = normalise_scores(scores, mask, sharpening, smoothing=True)
    expected = torch.sigmoid(sharpening * scores.double()) * mask
    expected = (expected / expected.sum(-1, keepdim=True)).float()
    torch.testing.assert_close(weights, expected, atol=1e-7, rtol=1e-5)


def test_smoothing_of_scores_far_below_zero_runs_on_onnx_runtime_as_on_pytorch() -> None:
    """The exporter writes logsigmoid as Log(Sigmoid), which underflows again."""
    import io

    onnxruntime = pytest.importorskip("onnxruntime")
    from asr.onnx_runtime import OPSET

    class Smoothed(torch.nn.Module):
        def forward(self, scores, mask):
            return normalise_scores(scores, mask, 2.0, smoothing=True)

    scores = torch.tensor([[-60.0, -61.0, -70.0, 0.0], [-110.0, -112.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    graph = io.BytesIO()
    torch.onnx.export(Smoothed(), (scores, mask), graph, opset_version=OPSET, dynamo=False,
                      input_names=["scores", "mask"])  # fmt: skip
    session = onnxruntime.InferenceSession(graph.getvalue())
    [weights] = session.run(None, {"scores": scores.numpy(), "mask": mask.numpy()})
    torch.testing.assert_close(torch.from_numpy(weights), Smoothed()(scores, mask))


def test_dot_product_matches_formula() -> None:
    module = make("dot")
    query, keys, mask = inputs()
    context, weights = module(query, module.prepare(keys, mask))
    energy = (keys @ module.key_proj.weight.T) @ (module.query_proj.weight @ query.T)
    energy = energy.diagonal(dim1=0, dim2=2).T / ATT_DIM**0.5  # (B, T)
    expected = energy.masked_fill(~mask, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(context, torch.einsum("bt,btd->bd", weights, keys * mask[..., None]))


def test_multihead_context_is_projection_of_head_contexts() -> None:
    module = make("multihead")
    query, keys, mask = inputs()
    context, weights = module(query, module.prepare(keys, mask), random_alignment(module, mask))
    values = keys @ module.value_proj.weight.T  # (B, T, A)
    values = values.view(3, 50, module.num_heads, module.head_dim)  # (B, T, H, d)
    per_head = torch.einsum("bht,bthd->bhd", weights, values)
    expected = module.out_proj(per_head.reshape(3, -1))  # heads concatenated
    torch.testing.assert_close(context, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("base", ["location", "multihead", "additive"])
def test_sharpening_lowers_entropy(base: str) -> None:
    plain = make(base)
    sharp = make(base)
    sharp.sharpening = 3.0
    query, keys, mask = inputs()
    prev = random_alignment(plain, mask)

    def entropy(module: torch.nn.Module) -> torch.Tensor:
        _, weights = module(query, module.prepare(keys, mask), prev)
        return -(weights * weights.clamp_min(1e-30).log()).sum(-1)

    assert (entropy(sharp) < entropy(plain) - 1e-4).all()


@pytest.mark.parametrize("name", LOCATION_KINDS)
def test_location_result_depends_on_previous_weights(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    memory = module.prepare(keys, mask)
    _, first = module(query, memory, random_alignment(module, mask, seed=3))
    _, second = module(query, memory, random_alignment(module, mask, seed=4))
    assert (first - second).abs().amax(-1).min() > 1e-6  # every row (and head) moved


@pytest.mark.parametrize("name", CONTENT_KINDS)
def test_content_result_ignores_previous_weights(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    memory = module.prepare(keys, mask)
    context, weights = module(query, memory, None)
    context_prev, weights_prev = module(query, memory, random_alignment(module, mask))
    assert torch.equal(weights, weights_prev) and torch.equal(context, context_prev)


@pytest.mark.parametrize("name", KINDS)
def test_none_means_initial_alignment(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    memory = module.prepare(keys, mask)
    initial = module.initial_weights(memory)
    one_hot = torch.zeros(mask.shape)
    one_hot[:, 0] = 1
    uniform = mask / mask.sum(-1, keepdim=True)
    expected = one_hot if getattr(module, "init_alignment", "uniform") == "first" else uniform
    if module.num_heads > 1:
        expected = expected[:, None].expand(-1, module.num_heads, -1)
    torch.testing.assert_close(initial, expected)
    context, weights = module(query, memory, None)
    context_init, weights_init = module(query, memory, initial)
    assert torch.equal(weights, weights_init) and torch.equal(context, context_init)


@pytest.mark.parametrize("name", KINDS)
def test_reordered_memory_gives_reordered_results(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    prev = random_alignment(module, mask)
    context, weights = module(query, module.prepare(keys, mask), prev)
    index = torch.tensor([2, 0, 0, 1])
    memory = reorder_batch(module.prepare(keys, mask), index)
    context_r, weights_r = module(query[index], memory, prev[index])
    torch.testing.assert_close(context_r, context[index])
    torch.testing.assert_close(weights_r, weights[index])


@pytest.mark.parametrize("name", KINDS)
def test_backward(name: str) -> None:
    module = make(name).train()
    query, keys, mask = inputs()
    query.requires_grad_(True)
    keys.requires_grad_(True)
    context, weights = module(query, module.prepare(keys, mask), random_alignment(module, mask))
    (context.pow(2).sum() + (weights * torch.arange(50.0)).sum()).backward()
    for param_name, param in module.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), param_name
    assert query.grad.abs().sum() > 0
    assert (keys.grad[~mask] == 0).all() and keys.grad[mask].abs().sum() > 0


@pytest.mark.parametrize("name", ["dot", "additive", "location", "multihead"])
def test_bf16_autocast(name: str) -> None:
    module = make(name)
    query, keys, mask = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        memory = module.prepare(keys, mask)
        context, weights = module(query, memory, None)
        context, weights = module(query, memory, weights)
    assert weights.dtype == torch.float32 and torch.isfinite(context).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    padding = ~mask if weights.dim() == 2 else ~mask[:, None].expand_as(weights)
    assert (weights[padding] == 0).all()


def test_bad_arguments_raise() -> None:
    module = make("location")
    _, keys, mask = inputs()
    with pytest.raises(ValueError, match="keys must be"):
        module.prepare(keys[..., :3], mask)
    with pytest.raises(ValueError, match="mask must be"):
        module.prepare(keys, mask.float())
    with pytest.raises(ValueError, match="divide"):
        MultiHeadAttention(QUERY_DIM, KEY_DIM, num_heads=3, attention_dim=8)
    with pytest.raises(ValueError, match="init_alignment"):
        LocationAwareAttention(QUERY_DIM, KEY_DIM, init_alignment="middle")


def test_every_attention_names_its_kind_for_the_explorer():
    kinds = {name: make(QUERY_DIM, KEY_DIM).kind for name, make in KINDS.items()}
    assert kinds["multihead"] == "multi-head location-aware attention"
    assert kinds["multihead-content"] == "multi-head additive attention"
    assert all(kind.endswith("attention") for kind in kinds.values())
