"""Chunk streaming contracts: an encoder run chunk by chunk over its cache gives the frames of
the full sequence under the chunk mask, for every chunk size, alone or batched."""

from __future__ import annotations

import pytest
import torch

from asr.models.chunking import (
    ChunkTraining,
    EncoderCache,
    chunk_attention_mask,
    streaming_problem,
)
from asr.models.conformer import ConformerEncoder
from asr.models.transformer import TransformerEncoder

SMALL = dict(d_model=16, num_heads=4, num_layers=2, dropout=0.0, subsampling_channels=8)
ENCODERS = {
    "conformer": lambda: ConformerEncoder(20, ffn_dim=32, kernel_size=5, causal=True, **SMALL),
    "transformer": lambda: TransformerEncoder(20, ffn_dim=32, **SMALL),
    "transformer-relative": lambda: TransformerEncoder(
        20, ffn_dim=32, relative_positions=True, **SMALL
    ),
}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def chunked(
    encoder, x: torch.Tensor, chunk: int, max_cache: int | None = None, first: int | None = None
) -> torch.Tensor:
    """`x (T, D_in)` through `forward_chunk`, `chunk` output frames at a time (`first` the
    first time): `(T', D)`."""
    sub = encoder.subsampling
    total = int(encoder.subsampling(x[None], torch.tensor([x.size(0)]))[1])
    cache, outs, start = encoder.empty_cache(1, x), [], 0
    while start < total:
        q = min(first if first and not start else chunk, total - start)
        window = x[start * sub.factor : start * sub.factor + sub.chunk_window(q)][None]
        y, _, cache = encoder.forward_chunk(
            window, torch.tensor([window.size(1)]), cache, max_cache
        )
        outs.append(y[0])
        start += q
    return torch.cat(outs)


def masked(
    encoder, x: torch.Tensor, lens: torch.Tensor, chunk: int | None, first: int | None = None
) -> torch.Tensor:
    encoder.chunk, encoder.first_chunk = chunk, first
    try:
        return encoder(x, lens)[0]
    finally:
        encoder.chunk = encoder.first_chunk = None


@pytest.mark.parametrize("name", sorted(ENCODERS))
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7, 16, 40])
def test_chunk_by_chunk_equals_the_chunk_masked_sequence(name: str, chunk: int) -> None:
    encoder = ENCODERS[name]().eval()
    lens = torch.tensor([101, 67])
    x = torch.randn(2, 101, 20)
    full = masked(encoder, x, lens, chunk)
    for b, n in enumerate(lens.tolist()):
        out = chunked(encoder, x[b, :n], chunk)
        torch.testing.assert_close(out, full[b, : out.size(0)], atol=1e-5, rtol=1e-5)
        assert out.size(0) == int(encoder.subsampling(x[b : b + 1, :n], lens[b : b + 1])[1])


@pytest.mark.parametrize("name", sorted(ENCODERS))
@pytest.mark.parametrize(("first", "chunk"), [(3, 2), (12, 4), (30, 7)])
def test_a_longer_first_chunk_equals_the_mask_whose_first_chunk_is_as_long(
    name: str, first: int, chunk: int
) -> None:
    encoder = ENCODERS[name]().eval()
    lens = torch.tensor([101, 67])
    x = torch.randn(2, 101, 20)
    full = masked(encoder, x, lens, chunk, first)
    for b, n in enumerate(lens.tolist()):
        out = chunked(encoder, x[b, :n], chunk, first=first)
        torch.testing.assert_close(out, full[b, : out.size(0)], atol=1e-5, rtol=1e-5)
    plain = masked(encoder, x, lens, chunk)
    assert not torch.allclose(plain[:, :first], full[:, :first], atol=1e-3)  # it sees more


def test_training_draws_its_chunks_whatever_the_first_chunk_at_inference() -> None:
    encoder = ConformerEncoder(20, ffn_dim=32, kernel_size=5, causal=True, dynamic_chunk=4, **SMALL)
    x, lens = torch.randn(2, 101, 20), torch.tensor([101, 67])
    outs = []
    for first in (None, 12):
        encoder.first_chunk = first
        torch.manual_seed(1)  # the same drawn chunks
        outs.append(encoder.train()(x, lens)[0])
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_chunk_as_long_as_the_utterance_is_full_context(name: str) -> None:
    encoder = ENCODERS[name]().eval()
    x, lens = torch.randn(1, 61, 20), torch.tensor([61])
    torch.testing.assert_close(chunked(encoder, x[0], 1000), masked(encoder, x, lens, None)[0])


@pytest.mark.parametrize("name", sorted(ENCODERS))
@pytest.mark.parametrize("left_chunks", [2, 0])  # 0: max_cache 0 kept the whole cache (-0:)
def test_limited_context_equals_the_mask_of_as_many_left_chunks(name: str, left_chunks) -> None:
    encoder = ENCODERS[name]().eval()
    x = torch.randn(1, 101, 20)
    valid = torch.ones(1, 24, dtype=torch.bool)
    out = chunked(encoder, x[0], 4, max_cache=4 * left_chunks)  # chunks of 4 frames before it
    mask = valid[:, None, None, :] & chunk_attention_mask(24, 4, left_chunks=left_chunks)
    # the reference: the same layers under a mask that sees two chunks back
    h, y_lens = encoder.subsampling(x, torch.tensor([101]))
    if isinstance(encoder, ConformerEncoder):
        h, pos = encoder.positions(h)
        for layer in encoder.layers:
            h = layer(h, pos, valid, mask)
    else:
        h, pos = encoder.positions(h) if encoder.relative else (encoder.positions(h), None)
        for layer in encoder.layers:
            h = layer(h, mask, pos)
    torch.testing.assert_close(out, encoder.norm(h)[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="max_frames must be >= 0 or None, got -2"):
        chunked(encoder, x[0], 4, max_cache=-2)


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_streams_at_different_points_batched_equal_each_alone(name: str) -> None:
    """Caches of different lengths are left-padded into one batch and split back."""
    encoder = ENCODERS[name]().eval()
    sub, chunk = encoder.subsampling, 3
    window = sub.chunk_window(chunk)
    xs = [torch.randn(200, 20) for _ in range(3)]
    caches = [encoder.empty_cache(1, xs[0]) for _ in xs]
    for b, warmup in enumerate([0, 1, 4]):  # stream b is `warmup` chunks ahead
        for k in range(warmup):
            w = xs[b][k * chunk * sub.factor :][:window][None]
            caches[b] = encoder.forward_chunk(w, torch.tensor([window]), caches[b])[2]
    step = [xs[b][w * chunk * sub.factor :][:window] for b, w in enumerate([0, 1, 4])]
    alone = [
        encoder.forward_chunk(s[None], torch.tensor([window]), c) for s, c in zip(step, caches)
    ]
    y, _, merged = encoder.forward_chunk(
        torch.stack(step), torch.full((3,), window), EncoderCache.merge(caches)
    )
    for b, (y_b, _, cache_b) in enumerate(alone):
        torch.testing.assert_close(y[b], y_b[0], atol=1e-5, rtol=1e-5)
        split = merged.split()[b]
        torch.testing.assert_close(split.keys, cache_b.keys, atol=1e-5, rtol=1e-5)
        assert torch.equal(split.offset, cache_b.offset)


def test_chunk_mask_sees_its_own_chunk_and_those_before() -> None:
    mask = chunk_attention_mask(10, 3)
    for i in range(10):
        for j in range(10):
            assert bool(mask[i, j]) == (j // 3 <= i // 3)
    mask = chunk_attention_mask(10, 3, first=4)  # chunks 0-3, 4-6, 7-9
    for i in range(10):
        for j in range(10):
            assert bool(mask[i, j]) == (max(j - 1, 0) // 3 <= max(i - 1, 0) // 3)


def test_dynamic_chunk_training_draws_chunks_and_full_context() -> None:
    training = ChunkTraining(max_chunk=8, full_context_prob=0.25)
    draws = [training.draw() for _ in range(2000)]
    full = sum(d is None for d in draws) / len(draws)
    assert 0.2 < full < 0.3
    assert {d for d in draws if d is not None} == set(range(1, 9))
    torch.manual_seed(3)
    first = [training.draw() for _ in range(20)]
    torch.manual_seed(3)
    assert [training.draw() for _ in range(20)] == first  # seeded runs repeat


def test_a_dynamic_chunk_encoder_masks_only_in_training() -> None:
    encoder = ConformerEncoder(20, ffn_dim=32, kernel_size=5, causal=True, dynamic_chunk=2,
                               full_context_prob=0.0, **SMALL)  # fmt: skip
    x, lens = torch.randn(1, 101, 20), torch.tensor([101])
    encoder.eval()
    eval_out = encoder(x, lens)[0]
    torch.testing.assert_close(eval_out, masked(encoder, x, lens, None))
    encoder.train()
    chunks = []
    encoder.attention_chunk = lambda: chunks.append(1) or 1  # type: ignore[method-assign]
    encoder(x, lens)
    assert chunks == [1]


def test_streaming_needs_causal_convolutions() -> None:
    with pytest.raises(ValueError, match="causal"):
        ConformerEncoder(20, ffn_dim=32, kernel_size=5, dynamic_chunk=8, **SMALL)
    with pytest.raises(ValueError, match="cannot stream"):
        ConformerEncoder(20, ffn_dim=32, kernel_size=5, **SMALL).empty_cache(1, torch.zeros(1))
    with pytest.raises(ValueError, match="max_chunk"):
        ChunkTraining(max_chunk=0)


def test_streaming_problem_says_why_an_encoder_cannot_stream() -> None:
    assert all(streaming_problem(make()) is None for make in ENCODERS.values())
    lookahead = ConformerEncoder(20, ffn_dim=32, kernel_size=5, **SMALL)
    assert "convolutions are not causal" in streaming_problem(lookahead)
    assert streaming_problem(torch.nn.LSTM(4, 4)) == "LSTM cannot run chunk by chunk"
