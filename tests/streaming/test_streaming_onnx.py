"""Live streams on ONNX Runtime: the exported chunk step carries the same cache as PyTorch's
`forward_chunk`, and a stream gives the same partials and finals on either backend."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch
from streaming_fixtures import UTTERANCES, streaming_recognizer

from asr.models.chunking import EncoderCache
from asr.models.transformer import TransformerEncoder
from asr.onnx_runtime import (
    OnnxStreamingEncoder,
    _export_chunk,
    _Session,
    export_onnx,
    onnx_model,
)
from asr.streaming import StreamingEngine, StreamOptions, mask_chunks

pytestmark = pytest.mark.needs_corpus


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The tiny streaming Conformer on PyTorch and on its exported graphs, and its waves."""
    recognizer, waves = streaming_recognizer()
    folder = tmp_path_factory.mktemp("package")
    written = export_onnx(recognizer.model, folder, recognizer.sample_rate)
    assert {"onnx/encoder_chunk.onnx", "onnx/encoder_chunk.int8.onnx"} <= set(written)
    onnx = replace(recognizer, model=onnx_model(recognizer.model, folder))
    return recognizer, onnx, waves, folder


def _chunks(encoder, windows: list[torch.Tensor], starts: list[int], max_cache: int | None):
    """Step two streams through `encoder`, the second joining at chunk `starts[1]` (so the
    batch's caches differ in length: left padding), and collect every output and cache."""
    outputs, caches = [], [None, None]
    for step in range(len(windows)):
        rows = [b for b in (0, 1) if step >= starts[b]]
        x = torch.stack([windows[step - starts[b]][b] for b in rows])
        lens = torch.full((len(rows),), x.size(1))
        cache = EncoderCache.merge(
            [caches[b] if caches[b] is not None else encoder.empty_cache(1, x) for b in rows]
        )
        with torch.inference_mode():
            enc, enc_lens, cache = encoder.forward_chunk(x, lens, cache, max_cache)
        for b, kept in zip(rows, cache.split()):
            caches[b] = kept
        outputs.append((enc, enc_lens, cache))
    return outputs


def _assert_same_steps(torch_steps, onnx_steps) -> None:
    for (enc, lens, cache), (got, got_lens, got_cache) in zip(torch_steps, onnx_steps, strict=True):
        assert torch.equal(got_lens, lens)
        torch.testing.assert_close(got, enc, atol=1e-4, rtol=1e-4)
        assert torch.equal(got_cache.valid, cache.valid)
        assert torch.equal(got_cache.offset, cache.offset)
        torch.testing.assert_close(got_cache.keys, cache.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_cache.values, cache.values, atol=1e-4, rtol=1e-4)
        if cache.conv is None:
            assert got_cache.conv is None
        else:
            torch.testing.assert_close(got_cache.conv, cache.conv, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("max_cache", [None, 6])
def test_the_conformer_chunk_graph_carries_the_cache_as_pytorch_does(both, max_cache) -> None:
    """Chunks of 4 frames, a stream joining later, and a context limit that trims the cache:
    outputs and every cache field agree with `ConformerEncoder.forward_chunk`."""
    recognizer, onnx, _, _ = both
    encoder = recognizer.model.encoder
    torch.manual_seed(1)
    window = encoder.subsampling.chunk_window(4)
    windows = [torch.randn(2, window, encoder.subsampling.input_dim) for _ in range(4)]
    expected = _chunks(encoder, windows, [0, 2], max_cache)
    _assert_same_steps(expected, _chunks(onnx.model.encoder, windows, [0, 2], max_cache))
    assert expected[-1][2].valid.size(1) == (6 if max_cache else 16)


def test_a_transformer_encoder_chunk_graph_has_no_convolution_state(tmp_path) -> None:
    torch.manual_seed(0)
    encoder = TransformerEncoder(40, d_model=32, num_heads=2, ffn_dim=64, num_layers=2).eval()
    window = encoder.subsampling.chunk_window(3)
    with torch.no_grad():
        name = _export_chunk(encoder, torch.randn(2, 100, 40), tmp_path)
    session = _Session(tmp_path / name, threads=1)
    assert "conv" not in session.inputs
    onnx = OnnxStreamingEncoder(None, 0, session, encoder)
    windows = [torch.randn(2, window, 40) for _ in range(3)]
    expected = _chunks(encoder, windows, [0, 1], None)
    _assert_same_steps(expected, _chunks(onnx, windows, [0, 1], None))


@pytest.mark.parametrize("chunk_ms", [160, 640])
def test_streams_give_pytorchs_partials_and_finals_on_onnx_runtime(both, chunk_ms) -> None:
    """The four recordings streamed together, 100 ms at a time: each partial after each piece
    and each final (tokens, word times) as on PyTorch."""
    recognizer, onnx, waves, _ = both
    options = StreamOptions(chunk_ms=chunk_ms, endpoint=None)

    def run(rec):
        engine = StreamingEngine(rec, options)
        streams = {uid: engine.stream() for uid in waves}
        partials = []
        longest = max(w.numel() for w in waves.values())
        for start in range(0, longest, 1600):
            for uid, stream in streams.items():
                stream.feed(waves[uid][start : start + 1600])
            engine.run(list(streams.values()))
            partials.append([s.partial for s in streams.values()])
        finals = [s.final() for s in streams.values()]
        return partials, finals

    (partials, finals), (got_partials, got_finals) = run(recognizer), run(onnx)
    assert got_partials == partials
    assert [f.text for f in finals] == [UTTERANCES[uid] for uid in waves]
    for final, got in zip(finals, got_finals):
        assert got.text == final.text
        assert [(w.text, w.start, w.end) for w in got.words] == [
            (w.text, w.start, w.end) for w in final.words
        ]


def test_the_int8_chunk_graph_streams_the_learnt_transcripts(both) -> None:
    recognizer, _, waves, folder = both
    int8 = replace(recognizer, model=onnx_model(recognizer.model, folder, int8=True))
    assert isinstance(int8.model.encoder, OnnxStreamingEncoder)
    engine = StreamingEngine(int8, StreamOptions(chunk_ms=640, endpoint=None))
    streams = [engine.stream() for _ in waves]
    for stream, wave in zip(streams, waves.values()):
        stream.feed(wave)
    engine.run(streams)
    assert [s.final().text for s in streams] == [UTTERANCES[uid] for uid in waves]


def test_masked_chunks_need_the_pytorch_encoder(both) -> None:
    """The offline graph was traced at full context: masking its chunks is refused, not
    silently ignored."""
    _, onnx, _, _ = both
    with pytest.raises(ValueError, match="cannot mask chunks: decode with the PyTorch backend"):
        mask_chunks(onnx, 640)


def test_a_missing_chunk_graph_is_named_where_the_model_streams(both, tmp_path) -> None:
    """The PyTorch encoder streams, so the package lost a file: that file is named, not a
    claim that the model cannot stream."""
    recognizer, _, _, folder = both
    copy = tmp_path / "package"
    shutil.copytree(folder, copy)
    (copy / "onnx" / "encoder_chunk.onnx").unlink()
    offline = replace(recognizer, model=onnx_model(recognizer.model, copy))
    with pytest.raises(ValueError, match=r"encoder_chunk\.onnx: no such ONNX graph \(export"):
        StreamingEngine(offline, StreamOptions(chunk_ms=640, endpoint=None))
