"""Calibrated int8 graphs: each row's results its own, whatever is decoded beside it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import TINY_MODEL_CONFIG, TINY_RNN
from test_evaluate import _manifest
from test_package import save_overfit_checkpoint
from test_transcribe import GREEDY, UTTERANCES, WAV, _overfit_recognizer

from asr.checkpoint import instantiate
from asr.cli import main
from asr.models.seq2seq import build_seq2seq
from asr.onnx_int8 import DYNAMIC_OP, calibrate_int8
from asr.onnx_runtime import export_onnx, onnx_model
from asr.recognizer import load_model


@pytest.fixture(scope="module")
def overfit_checkpoint(tmp_path_factory):
    return save_overfit_checkpoint(tmp_path_factory.mktemp("overfit"))


@pytest.fixture(scope="module")
def packages(overfit_checkpoint, tmp_path_factory):
    """The overfit model exported twice: int8 graphs quantised per run, and calibrated."""
    folder = tmp_path_factory.mktemp("int8")
    manifest = _manifest(folder / "train.jsonl", UTTERANCES)
    for name, extra in (("dynamic", []), ("calibrated", ["--calibration", str(manifest)])):
        args = ["export", "--checkpoint", str(overfit_checkpoint), "--out", str(folder / name),
                "--format", "onnx", "--quiet", *extra]  # fmt: skip
        assert main(args) == 0
    return folder / "dynamic", folder / "calibrated"


def _graph_ops(path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path)).graph.node}


def _encoder_rows(recognizer, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's output for `feats` alone, and for the same row beside a louder one."""
    lens = torch.tensor([feats.size(1)])
    alone, _ = recognizer.model.encoder(feats, lens)
    batch = torch.cat([feats, 5 * feats.flip(1)])
    beside, _ = recognizer.model.encoder(batch, lens.repeat(2))
    return alone[0], beside[0]


def test_calibrated_graphs_keep_no_quantiser_that_reads_the_batch(packages, capsys):
    dynamic, calibrated = packages
    for graph in sorted((calibrated / "onnx").glob("*.int8.onnx")):
        ops = _graph_ops(graph)
        assert DYNAMIC_OP not in ops and "QuantizeLinear" in ops, graph.name
        assert DYNAMIC_OP in _graph_ops(dynamic / "onnx" / graph.name), graph.name
    names = {p.name for p in (calibrated / "onnx").glob("*.int8.onnx")}
    assert {"encoder.int8.onnx", "encoder_chunk.int8.onnx", "decoder_step.int8.onnx"} <= names
    state = json.loads((calibrated / "onnx" / "state.json").read_text())
    assert state["int8_calibration"] == {"recordings": len(UTTERANCES)}


@torch.inference_mode()
def test_an_utterance_encodes_and_decodes_the_same_alone_and_in_a_batch(packages):
    """Dynamic quantisation takes each range over the batch: a louder row beside an utterance
    changes its int8 encoding. Calibrated ranges are constants, so nothing beside it does."""
    dynamic, calibrated = packages
    waves = [load_model(calibrated).load(str(WAV / f"{p}.wav")) for p in UTTERANCES]
    results = {}
    for folder in packages:
        recognizer = load_model(folder, backend="onnx-int8")
        feats, _ = recognizer.model.frontend(*recognizer.pad(waves[3:]))
        results[folder] = _encoder_rows(recognizer, feats)
        if folder == calibrated:
            alone = [recognizer.search([w], GREEDY)[0].hypothesis for w in waves]
            together = [d.hypothesis for d in recognizer.search(waves, GREEDY)]
            assert [h.tokens for h in together] == [h.tokens for h in alone]
            for a, b in zip(alone, together):
                assert a.score == pytest.approx(b.score, abs=1e-5)
    alone, beside = results[dynamic]
    assert not torch.equal(alone, beside), "the louder row does not move the dynamic ranges"
    alone, beside = results[calibrated]
    torch.testing.assert_close(alone, beside, atol=1e-6, rtol=0)


@torch.inference_mode()
def test_the_calibrated_chunk_step_is_each_streams_own(packages):
    _, calibrated = packages
    recognizer = load_model(calibrated, backend="onnx-int8")
    assert recognizer.backend == "onnx-int8", "what asr evaluate records, beside its WER"
    encoder = recognizer.model.encoder
    wave = recognizer.load(str(WAV / "an4_clstk/fash/an255-fash-b.wav"))
    feats, _ = recognizer.model.frontend(*recognizer.pad([wave]))
    window = encoder.subsampling.chunk_window(4)
    x = feats[:, :window]
    lens = torch.tensor([window])
    alone, _, _ = encoder.forward_chunk(x, lens, encoder.empty_cache(1, x))
    both = torch.cat([x, 5 * feats[:, window : 2 * window]])
    beside, _, _ = encoder.forward_chunk(both, lens.repeat(2), encoder.empty_cache(2, x))
    torch.testing.assert_close(alone[0], beside[0], atol=1e-6, rtol=0)


@torch.inference_mode()
def test_rnn_encoders_keep_their_lstms_fp32_where_calibrated(tmp_path):
    """A quantised LSTM (DynamicQuantizeLSTM) takes its input's range per run inside the
    operator: calibrated graphs leave it fp32, so RNN-attention models are batch-free too."""
    recognizer, waves = _overfit_recognizer(str(WAV))
    torch.manual_seed(0)
    config = TINY_MODEL_CONFIG | TINY_RNN | {"vocab_size": recognizer.tokenizer.vocab_size}
    recognizer = replace(recognizer, model=instantiate(build_seq2seq, config).eval())
    export_onnx(recognizer.model, tmp_path, recognizer.sample_rate)
    assert "DynamicQuantizeLSTM" in _graph_ops(tmp_path / "onnx" / "encoder.int8.onnx")
    calibrate_int8(recognizer, tmp_path, waves)
    ops = _graph_ops(tmp_path / "onnx" / "encoder.int8.onnx")
    assert (
        "LSTM" in ops and "MatMulInteger" in ops and not {DYNAMIC_OP, "DynamicQuantizeLSTM"} & ops
    )
    int8 = replace(recognizer, model=onnx_model(recognizer.model, tmp_path, int8=True))
    together = [d.hypothesis.tokens for d in int8.search(waves, GREEDY)]
    assert together == [int8.search([w], GREEDY)[0].hypothesis.tokens for w in waves]


def test_calibration_is_refused_without_recordings_or_without_onnx(
    packages,
    overfit_checkpoint,
    tmp_path,
    capsys,  # noqa: F811
):
    dynamic, calibrated = packages
    recognizer = load_model(dynamic)
    with pytest.raises(ValueError, match="at least one recording"):
        calibrate_int8(recognizer, dynamic, [])
    with pytest.raises(ValueError, match="calibration recording 0 has 10 samples"):
        calibrate_int8(recognizer, dynamic, [torch.zeros(10)])
    with pytest.raises(ValueError, match="calibrated already; export them again"):
        calibrate_int8(
            recognizer, calibrated, [recognizer.load(WAV / f"{next(iter(UTTERANCES))}.wav")]
        )
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    args = ["export", "--checkpoint", str(overfit_checkpoint), "--out", str(tmp_path / "p"),
            "--calibration", str(manifest)]  # fmt: skip
    assert main(args) == 2
    assert "--calibration sets the int8 graphs' ranges: it needs --format onnx" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "p").exists(), "refused before anything is written"
    with pytest.raises(SystemExit):
        main([*args, "--format", "onnx", "--calibration-size", "0"])
    assert main([*args[:-2], "--format", "onnx", "--calibration-size", "4"]) == 2
    assert "--calibration-size is the number of --calibration recordings" in (
        capsys.readouterr().err
    )


def test_a_calibration_that_fails_leaves_the_graphs_as_they_were(
    overfit_checkpoint, tmp_path, capsys, monkeypatch
):
    """Every graph is made aside and put in place once all are: no mix of calibrated and
    per-batch graphs, and the error says what the package holds."""
    import asr.onnx_int8

    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    out = tmp_path / "p"
    args = ["export", "--checkpoint", str(overfit_checkpoint), "--out", str(out),
            "--format", "onnx", "--quiet"]  # fmt: skip
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in (out / "onnx").iterdir()}
    written = asr.onnx_int8._write_static
    calls = []

    def fails_third(path, probe):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        written(path, probe)

    monkeypatch.setattr(asr.onnx_int8, "_write_static", fails_third)
    assert main([*args, "--calibration", str(manifest)]) == 2
    said = capsys.readouterr().err
    assert f"the package in {out} was written, its int8 graphs taking their ranges per" in said
    after = {p.name: p.read_bytes() for p in (out / "onnx").iterdir()}
    assert after == before, "the int8 graphs, state.json and nothing else"


def test_the_cli_calibrates_on_each_lines_span_spread_over_the_manifest(
    overfit_checkpoint, tmp_path, capsys, monkeypatch
):
    """Lines' spans, not their whole files; recordings too short to encode left out, and
    said; N lines taken across the manifest, not its first N."""
    import asr.onnx_int8
    import asr.onnx_runtime

    taken = []
    monkeypatch.setattr(asr.onnx_runtime, "export_onnx", lambda *args: [])
    monkeypatch.setattr(
        asr.onnx_int8, "calibrate_int8", lambda r, out, waves, progress: taken.append(waves)
    )
    wav = str(WAV / f"{next(iter(UTTERANCES))}.wav")
    spans = [{"offset": 0.1 * k, "duration": 0.5} for k in range(6)] + [{"duration": 0.01}]
    manifest = tmp_path / "m.jsonl"
    lines = [
        {"audio_filepath": wav, "text": "", "id": f"u{k}", **span} for k, span in enumerate(spans)
    ]
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["export", "--checkpoint", str(overfit_checkpoint), "--out", str(tmp_path / "p"),
            "--format", "onnx", "--calibration", str(manifest), "--quiet"]  # fmt: skip
    assert main([*args, "--calibration-size", "3"]) == 0
    assert [len(w) for w in taken[0]] == [8000] * 3  # lines 0, 2 and 4 of 7
    assert main(args) == 0  # all 7: the 10 ms line is too short
    assert [len(w) for w in taken[1]] == [8000] * 6
    assert "1 of 7 --calibration recordings are too short to encode" in capsys.readouterr().err
