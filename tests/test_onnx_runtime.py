"""ONNX export and the ONNX Runtime backend: the same hypotheses as PyTorch."""

from __future__ import annotations

import copy
import json
import logging
import re
import shutil
from dataclasses import replace

import onnx as onnx_lib
import pytest
import torch
from conftest import TINY_MODEL_CONFIG, TINY_RNN
from onnx import numpy_helper
from test_package import save_overfit_checkpoint
from test_transcribe import GREEDY, JOINT, UTTERANCES, WAV, _overfit_recognizer

from asr.checkpoint import CheckpointError, instantiate
from asr.cli import main
from asr.decoding import teacher_forced
from asr.models.interfaces import attention_kind
from asr.models.seq2seq import build_seq2seq
from asr.onnx_runtime import SPIN_WAIT_ENTRY, _untied, export_onnx, onnx_model
from asr.plotting import save_alignment_plots
from asr.recognizer import Recognizer, load_model
from asr.search import SearchOptions
from asr.text import CharTokenizer


@pytest.fixture(scope="module")
def overfit():
    return _overfit_recognizer(str(WAV))


@pytest.fixture(scope="module")
def overfit_checkpoint(tmp_path_factory):
    return save_overfit_checkpoint(tmp_path_factory.mktemp("overfit"))


def _tokens(recognizer: Recognizer, waves, options: SearchOptions) -> list[list[int]]:
    return [d.hypothesis.tokens for d in recognizer.search(waves, options)]


def test_a_trained_transformer_decodes_the_same_on_onnx_runtime(overfit, tmp_path):
    recognizer, waves = overfit
    written = export_onnx(recognizer.model, tmp_path, recognizer.sample_rate)
    assert {"onnx/encoder.onnx", "onnx/ctc.onnx", "onnx/decoder_step.int8.onnx"} <= set(written)
    assert not [n for n, m in recognizer.model.named_modules() if m.training], "left training"
    onnx = replace(recognizer, model=onnx_model(recognizer.model, tmp_path))
    assert onnx.weights_digest == recognizer.weights_digest, "an evaluate's WER names them"
    for options in (GREEDY, JOINT, SearchOptions(beam_size=3, ctc_weight=0.5, nbest=2)):
        assert _tokens(onnx, waves, options) == _tokens(recognizer, waves, options)
    # The networks' outputs, not only the argmaxes, agree.
    lens = torch.tensor([len(w) for w in waves])
    batch = torch.nn.utils.rnn.pad_sequence(waves, batch_first=True)
    with torch.no_grad():
        enc, enc_lens = recognizer.model.encode(batch, lens)
        state = recognizer.model.decoder.init_state(enc, enc_lens)
        logp, _, attention = recognizer.model.decoder.step(torch.full((4,), 3), state)
    got_enc, got_lens = onnx.model.encode(batch, lens)
    assert torch.equal(got_lens, enc_lens)
    torch.testing.assert_close(got_enc, enc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(onnx.model.ctc(got_enc), recognizer.model.ctc(enc), atol=1e-4,
                               rtol=1e-4)  # fmt: skip
    got_logp, _, got_attention = onnx.model.decoder.step(
        torch.full((4,), 3), onnx.model.decoder.init_state(got_enc, got_lens)
    )
    torch.testing.assert_close(got_logp, logp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_attention, attention, atol=1e-5, rtol=1e-4)
    for layout in ("num_attention_maps", "attention_layers"):  # how the maps split by layer
        assert getattr(onnx.model.decoder, layout) == getattr(recognizer.model.decoder, layout)
    text = recognizer.transcribe(waves[0], options=GREEDY).text
    for model, name in ((recognizer, "torch.png"), (onnx, "onnx.png")):  # with a map per head
        written = save_alignment_plots(model, model.align(waves[0], text), tmp_path / name)
        assert [p.name for p in written] == [name, name.replace(".png", "_heads.png")]
    # Beams: 3 rows per utterance (the graph was traced with 2) read one shared memory entry.
    beams = torch.arange(len(waves)).repeat_interleave(3)
    state = onnx.model.decoder.reorder_state(onnx.model.decoder.init_state(got_enc, got_lens),
                                             beams)  # fmt: skip
    assert state["memory_keys"][0].size(0) == len(waves), "the memory is not copied per beam"
    got_logp, _, _ = onnx.model.decoder.step(torch.full((beams.numel(),), 3), state)
    torch.testing.assert_close(got_logp, logp.index_select(0, beams), atol=1e-4, rtol=1e-4)


def test_the_forced_graph_teacher_forces_as_pytorch_at_any_length(overfit, tmp_path):
    """decoder_forced.onnx scores whole hypotheses in one run (rescoring, alignment) as the
    PyTorch decoder does, at lengths other than the one it was traced at; packages without it
    step token by token to the same scores."""
    recognizer, waves = overfit
    written = export_onnx(recognizer.model, tmp_path, recognizer.sample_rate, int8=False)
    assert "onnx/decoder_forced.onnx" in written
    onnx = onnx_model(recognizer.model, tmp_path)
    assert onnx.decoder.forced is not None
    lens = torch.tensor([len(w) for w in waves])
    batch = torch.nn.utils.rnn.pad_sequence(waves, batch_first=True)
    with torch.no_grad():
        enc, enc_lens = recognizer.model.encode(batch, lens)
    hypotheses = [[3, 4], [5], [3, 4, 5, 6, 7, 8, 9], []]
    expected = teacher_forced(recognizer.model.decoder, enc, enc_lens, hypotheses)
    stepped = onnx_model(recognizer.model, tmp_path).decoder
    stepped.forced = None
    for decoder in (onnx.decoder, stepped):
        got = teacher_forced(decoder, enc, enc_lens, hypotheses)
        for g, e in zip(got[0], expected[0], strict=True):
            torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], expected[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[2], expected[2], atol=1e-5, rtol=1e-4)


def test_int8_graphs_quantise_matmuls_and_keep_convolutions_fp32(overfit, tmp_path):
    import onnx

    recognizer, _ = overfit
    export_onnx(recognizer.model, tmp_path, recognizer.sample_rate)
    graph = onnx.load(str(tmp_path / "onnx" / "encoder.int8.onnx")).graph
    ops = {node.op_type for node in graph.node}
    assert "Conv" in ops and "ConvInteger" not in ops
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}, ops
    # each int8 graph is stamped as its fp32 graph is: which graph, of which weights
    for fp32 in (tmp_path / "onnx").glob("*[!8].onnx"):
        props = [{p.key: p.value for p in onnx.load(str(path)).metadata_props}
                 for path in (fp32, fp32.with_suffix(".int8.onnx"))]  # fmt: skip
        assert props[0] == props[1] and props[0]["asr_graph"] == fp32.stem


def test_sessions_do_not_spin_wait_unless_asked(overfit, tmp_path):
    """ONNX Runtime's polling threads would take the cores PyTorch searches on between runs."""
    recognizer, _ = overfit
    export_onnx(recognizer.model, tmp_path, recognizer.sample_rate, int8=False)
    for spin_wait, entry in ((False, "0"), (True, "1")):
        model = onnx_model(recognizer.model, tmp_path, spin_wait=spin_wait)
        for session in (model.encoder.session, model.decoder.step_session):
            options = session.session.get_session_options()
            assert options.get_session_config_entry(SPIN_WAIT_ENTRY) == entry


def test_absolute_positions_past_the_table_run_on_onnx_runtime_as_on_pytorch(tmp_path):
    """PyTorch grows its table of sinusoids; the graphs compute them, offline and in chunks.
    Trained at full context only, the model is said to lose accuracy in chunks on both."""
    tokenizer = CharTokenizer.train(["YES NO GO"])
    config = copy.deepcopy(TINY_MODEL_CONFIG) | {"vocab_size": tokenizer.vocab_size}
    config["encoder"]["init_args"]["max_len"] = 8  # 1.2 s of audio: 29 encoder frames
    torch.manual_seed(0)
    model = instantiate(build_seq2seq, config).eval()
    export_onnx(model, tmp_path, 16000, int8=False)
    onnx = onnx_model(model, tmp_path)
    feats, feat_lens = model.frontend(torch.randn(1, 19200) * 0.1, torch.tensor([19200]))
    ours, theirs = onnx.encoder(feats, feat_lens)[0], model.encoder(feats, feat_lens)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    recognizers = [Recognizer(m, tokenizer, 16000, "abs") for m in (model, onnx)]
    wave = torch.randn(24000) * 0.1
    finals = []
    for recognizer in recognizers:
        with pytest.warns(UserWarning, match="trained at full context only"):
            stream = recognizer.stream(chunk_ms=160, endpoint=None)
        stream.accept(wave)
        finals.append(stream.final())
    assert finals[0].text == finals[1].text


def test_an_rnn_attention_model_decodes_the_same_on_onnx_runtime(tmp_path):
    """Pyramidal BiLSTM, location-aware attention, CTC head (random weights: the hypotheses
    mean nothing, but both backends must find the same ones)."""
    tokenizer = CharTokenizer.train(["YES NO GO"])
    torch.manual_seed(0)
    model = instantiate(
        build_seq2seq, TINY_MODEL_CONFIG | TINY_RNN | {"vocab_size": tokenizer.vocab_size}
    )
    recognizer = Recognizer(model.eval(), tokenizer, 16000, "rnn")
    waves = [torch.randn(n) * 0.1 for n in (16000, 9000, 12000)]
    written = export_onnx(model, tmp_path, 16000, int8=False)
    assert "onnx/decoder_forced.onnx" not in written, "its loop over tokens would be frozen"
    onnx = replace(recognizer, model=onnx_model(model, tmp_path))
    # the explorer names the maps alike on both backends
    assert attention_kind(onnx.model.decoder) == attention_kind(model.decoder) == (
        "location-aware attention"
    )  # fmt: skip
    options = [replace(GREEDY, repair=False), SearchOptions(beam_size=3, ctc_weight=0.3)]
    for option in options:
        assert _tokens(onnx, waves, option) == _tokens(recognizer, waves, option)
    with pytest.raises(FileNotFoundError, match="encoder.int8.onnx: no such ONNX graph"):
        onnx_model(model, tmp_path, int8=True)
    other = copy.deepcopy(model)  # graphs beside other weights (an upload that kept them)
    with torch.no_grad():
        next(other.parameters())[0] += 1e-3
    with pytest.raises(CheckpointError, match=r"onnx: its graphs hold other weights than the"):
        onnx_model(other, tmp_path)
    # one graph of another export copied in, or over another graph: named, not run
    export_onnx(other, tmp_path / "other", 16000, int8=False)
    graphs = tmp_path / "onnx"
    kept = (graphs / "encoder.onnx").read_bytes()
    (graphs / "encoder.onnx").write_bytes((tmp_path / "other/onnx/encoder.onnx").read_bytes())
    with pytest.raises(CheckpointError, match=r"encoder\.onnx: exported from other weights than "):
        onnx_model(model, tmp_path)
    (graphs / "encoder.onnx").write_bytes((graphs / "ctc.onnx").read_bytes())
    with pytest.raises(CheckpointError, match=r"encoder\.onnx: holds the ctc graph, not encoder"):
        onnx_model(model, tmp_path)
    (graphs / "encoder.onnx").write_bytes(kept)
    state = json.loads((tmp_path / "onnx" / "state.json").read_text())
    (tmp_path / "onnx" / "state.json").write_text(json.dumps(state | {"spec": "[1"}))
    with pytest.raises(CheckpointError, match=r"state\.json: unreadable \(.+\); export it"):
        onnx_model(model, tmp_path)
    (tmp_path / "onnx" / "state.json").write_text("{")  # damaged files: named, not a traceback
    with pytest.raises(CheckpointError, match=r"state\.json: unreadable \(.+\); export it"):
        onnx_model(model, tmp_path)
    (tmp_path / "onnx" / "state.json").write_text(json.dumps(state))
    kept = (graphs / "ctc.onnx").read_bytes()  # a weight damaged: refused, as a package's
    graph = onnx_lib.load(str(graphs / "ctc.onnx"))
    weight = next(i for i in graph.graph.initializer if i.data_type == onnx_lib.TensorProto.FLOAT)
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] = float("nan")
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx_lib.save(graph, str(graphs / "ctc.onnx"))
    with pytest.raises(CheckpointError, match=rf"ctc\.onnx: {re.escape(weight.name)}: non-finite"):
        onnx_model(model, tmp_path)
    (graphs / "ctc.onnx").write_bytes(kept)
    (tmp_path / "onnx" / "ctc.onnx").write_bytes(b"\x08torn")
    with pytest.raises(CheckpointError, match=r"ctc\.onnx: not a readable ONNX graph \(.+\); "):
        onnx_model(model, tmp_path)


def test_graphs_cloned_without_git_lfs_are_named_as_a_pointer(tmp_path):
    """The Hub keeps *.onnx in LFS: a clone without git-lfs was told to export the graphs
    again, which needs the checkpoint its user does not have."""
    tokenizer = CharTokenizer.train(["YES NO GO"])
    model = instantiate(build_seq2seq, TINY_MODEL_CONFIG | {"vocab_size": tokenizer.vocab_size})
    (tmp_path / "onnx").mkdir()
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 123456\n"
    (tmp_path / "onnx" / "encoder.onnx").write_text(pointer)
    with pytest.raises(CheckpointError) as refused:
        onnx_model(model, tmp_path)
    assert str(refused.value).startswith(
        f"{tmp_path / 'onnx' / 'encoder.onnx'}: a Git LFS pointer, not the file: fetch it"
    )


def test_cli_exports_and_decodes_with_onnx_backends(
    overfit_checkpoint, tmp_path, capsys, caplog, monkeypatch
):
    """A trained model gives the learnt transcript on every backend, int8 included. The export
    says what it wrote, without the quantiser's notes on each tensor it leaves alone."""
    checkpoint, pkg = overfit_checkpoint, tmp_path / "pkg"
    with caplog.at_level(logging.INFO):
        assert main(["export", "--checkpoint", str(checkpoint), "--out", str(pkg),
                     "--format", "onnx"]) == 0  # fmt: skip
    assert "onnx/decoder_step.onnx" in capsys.readouterr().out
    assert [r.getMessage() for r in caplog.records if r.name == "root"] == []
    audio = str(WAV / "an4_clstk/fash/an251-fash-b.wav")
    texts = {}
    for backend in ("torch", "onnx", "onnx-int8"):
        args = ["transcribe", audio, "--model", str(pkg), "--backend", backend,
                "--output-dir", str(tmp_path / backend), "--format", "json", "--quiet"]  # fmt: skip
        assert main(args) == 0
        texts[backend] = json.loads((tmp_path / backend / "an251-fash-b.json").read_text())["text"]
    assert texts == dict.fromkeys(texts, UTTERANCES["an4_clstk/fash/an251-fash-b"])
    with pytest.raises(ValueError, match=r"needs a package \(asr export --format onnx\)"):
        load_model(checkpoint, backend="onnx")
    from huggingface_hub import constants
    from test_package import _hf_cache

    _hf_cache(pkg, tmp_path / "hub", "me/onnx")  # the package on the Hub, cached
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub = load_model("hf://me/onnx", backend="onnx")
    assert hub.transcribe(audio).text == texts["onnx"]
    shutil.rmtree(pkg / "onnx")  # a plain package: a Hub user cannot export its checkpoint
    said = "a package without ONNX graphs (onnx/): decode it with --backend torch, or "
    with pytest.raises(ValueError, match=re.escape(f"{pkg}: {said}export its checkpoint")):
        load_model(pkg, backend="onnx")
    _hf_cache(pkg, tmp_path / "hub", "me/plain")
    with pytest.raises(ValueError, match=re.escape(f"hf://me/plain: {said}ask its author")):
        load_model("hf://me/plain", backend="onnx")
    with pytest.raises(ValueError, match="backend must be one of"):
        load_model(pkg, backend="tensorrt")


def test_tied_weights_are_copied_per_reader_before_quantising(tmp_path):
    """The decoder's tied embedding/output weight is one initializer read by a Gather and a
    Gemm; the quantiser gets one copy per reader, so the int8 embedding keeps its shape."""
    import onnx
    import onnxruntime as ort

    torch.manual_seed(0)
    model = instantiate(build_seq2seq, TINY_MODEL_CONFIG | {"vocab_size": 11})
    export_onnx(model, tmp_path, 16000)
    graph = onnx.load(str(tmp_path / "onnx/decoder_step.onnx")).graph
    readers = [n.op_type for n in graph.node if "decoder.embedding.weight" in n.input]
    assert sorted(readers) == ["Gather", "Gemm"], "the exported graph ties the weight"
    untied = _untied(onnx.load(str(tmp_path / "onnx/decoder_step.onnx"))).graph
    names = {i.name for i in untied.initializer}
    read = [name for node in untied.node for name in node.input if name in names]
    assert len(read) == len(set(read)), "an initializer still has two readers"
    int8 = onnx.load(str(tmp_path / "onnx/decoder_step.int8.onnx")).graph
    shapes = {i.name: list(i.dims) for i in int8.initializer}
    (gather,) = [n for n in int8.node if n.op_type == "Gather" and "embedding" in n.input[0]]
    assert shapes[gather.input[0]] == [11, 16], "the embedding reads a (vocab, d_model) table"
    ort.InferenceSession(str(tmp_path / "onnx/decoder_step.int8.onnx"))  # loads
