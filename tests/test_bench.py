"""The benchmark harness's bookkeeping: model-FLOP counting (bench/common.py) with the formulas
it adds for kernels torch's counter lacks, how bench/peak.py picks the fp32 peak, the pure
functions behind the report's figures, and the report itself. No timing is asserted."""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import bench.common as common
import bench.peak as peak
import bench.report as report
import bench.scaling as scaling
import bench.train as train

B, T, F, H = 4, 12, 10, 16


def per_frame_matmuls(rnn: nn.RNNBase) -> int:
    """FLOPs of one frame through every layer and direction: each weight matrix once."""
    return 2 * sum(w.numel() for w in rnn.parameters() if w.dim() == 2)


@pytest.mark.parametrize("layers, bidirectional", [(1, True), (2, True), (3, False)])
def test_cpu_lstm_counts_every_weight_matrix_once_per_frame(layers, bidirectional) -> None:
    lstm = nn.LSTM(F, H, layers, batch_first=True, bidirectional=bidirectional)
    x = torch.randn(B, T, F, requires_grad=True)
    forward = common.count_flops(lambda: lstm(x))
    assert forward == B * T * per_frame_matmuls(lstm)
    both = common.count_flops(lambda: lstm(x)[0].sum().backward())
    assert both == 3 * forward  # the backward: gradients of the inputs and of the weights


@pytest.mark.parametrize("layers, bidirectional", [(1, True), (2, True), (3, False)])
def test_cudnn_rnn_formula_counts_what_the_cpu_counts(layers, bidirectional) -> None:
    """cuDNN's LSTM (one call for every layer and direction) counted on meta tensors, which
    need no GPU, against the CPU's count of the same `nn.LSTM`."""
    lstm = nn.LSTM(F, H, layers, batch_first=True, bidirectional=bidirectional)
    cpu = common.count_flops(lambda: lstm(torch.randn(B, T, F)))
    meta = lstm.to("meta")
    states = torch.empty(layers * (2 if bidirectional else 1), B, H, device="meta")
    x = torch.empty(B, T, F, device="meta")
    mode_lstm, stride0 = 2, 4  # cuDNN's LSTM mode; w_ih, w_hh, b_ih, b_hh per layer

    def cudnn() -> None:
        torch.ops.aten._cudnn_rnn.default(
            x, meta._flat_weights, stride0, None, states, states, mode_lstm, H, 0, layers,
            True, 0.0, True, bidirectional, [], None,
        )  # fmt: skip

    assert common.count_flops(cudnn) == cpu
    shapes = [list(w.shape) for w in meta._flat_weights]
    assert common._cudnn_rnn_backward_flops(list(x.shape), shapes) == 2 * cpu


def test_cudnn_rnn_formula_counts_packed_frames() -> None:
    """A packed input `(frames, F)` counts its frames, not a padded batch."""
    shapes = [[4 * H, F], [4 * H, H], [4 * H], [4 * H]]
    assert common._cudnn_rnn_flops([30, F], shapes) == 2 * 30 * 4 * H * (F + H)


def test_onednn_fp32_matmul_restores_the_setting() -> None:
    backend = torch.backends.mkldnn.matmul
    before = backend.fp32_precision
    with pytest.raises(RuntimeError), peak.onednn_fp32_matmul():
        assert backend.fp32_precision == "bf16"
        raise RuntimeError
    assert backend.fp32_precision == before


@pytest.mark.parametrize("error, fp32_peak", [(1e-6, 500.0), (1e-3, 250.0)])
def test_fp32_peak_counts_onednn_only_where_its_products_are_fp32(
    monkeypatch, error: float, fp32_peak: float
) -> None:
    def rate(n, dtype, device, min_seconds):  # oneDNN's fp32 at 2x MKL's, as on the CI CPU
        routed = torch.backends.mkldnn.matmul.fp32_precision == "bf16"
        return {torch.float32: 500.0 if routed else 250.0, torch.bfloat16: 900.0}[dtype]

    monkeypatch.setattr(peak, "matmul_gflops", rate)
    monkeypatch.setattr(peak, "onednn_fp32_error", lambda n: error)
    settings = common.Settings(None, True, torch.device("cpu"), 1, None, None)
    result = peak.run(settings)
    assert result["peak_gflops"] == {"fp32": fp32_peak, "bf16": 900.0}
    assert set(result["gflops"][peak.ONEDNN_FP32].values()) == {500.0}
    assert result["onednn_fp32_error"] == error


@pytest.mark.parametrize("module", [train, report, scaling], ids=lambda m: m.__name__)
def test_doctests_of_the_report_figures(module) -> None:
    """The epoch summary, MFU and growth exponent examples (the default doctest run covers
    only asr/)."""
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_growth_exponent_of_a_quadratic_is_two() -> None:
    assert scaling.growth_exponent([10, 20, 40], [1.0, 4.0, 16.0]) == pytest.approx(2.0)


def _part(name: str, result: dict, **machine) -> dict:
    meta = {
        "command": f"python -m bench {name} --out X", "date": "2030-01-01T00:00:00",
        "git": "abc1234", "torch": "9.9", "lightning": "8.8", "python": "3.12", "cpu": "TestCPU",
        "cpu_count": 2, "threads": 2, "device": "cpu", "quick": False, **machine,
    }  # fmt: skip
    return {"machine": meta, "result": result}


def test_report_prints_the_environment_and_measured_figures_only(tmp_path) -> None:
    steps = {"steps": 10, "seconds": 2.0, "audio_seconds_per_second": 400.0, "memory": {}}
    train_result = {
        "transformer": {
            "config": "conf/an4/transformer.yaml", "flops_per_audio_second": 0.4e9,
            "fp32": {**steps, "audio_seconds_per_second": 300.0}, "bf16": steps,
        },
    }  # fmt: skip
    parts = {
        "peak": _part("peak", {"sizes": [256], "gflops": {"fp32": {"256": 500.0},
                      "bf16": {"256": 1000.0}}, "peak_gflops": {"fp32": 500.0, "bf16": 1000.0}}),
        "train": _part("train", train_result),
        "decode": _part("decode", {"error": "RuntimeError: boom"}),
    }  # fmt: skip
    for name, data in parts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    text = report.write(tmp_path)
    assert "- git: abc1234" in text and "- lightning: 8.8" in text and "- CPU: TestCPU" in text
    assert "`python -m bench PART --out X` for each part (peak, train, decode)" in text
    # 400 audio s/s x 0.4 GFLOP per audio s = 160 GFLOP/s = 16 % of the bf16 peak; fp32: 24 %
    assert "| conf/an4/transformer.yaml | bf16 | 10 | 400.00 | 0.200 |" in text
    assert "| 160.0 | 16.0% |" in text and "| 120.0 | 24.0% |" in text
    assert "part `decode` failed: RuntimeError: boom" in text
    assert "Smoke run" not in text and "different settings" not in text
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["derived"]["mfu"]["transformer_bf16"]["mfu"] == pytest.approx(0.16)
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_report_says_when_parts_differ(tmp_path) -> None:
    for name, quick in (("peak", True), ("train", False)):
        part = _part(name, {"error": "skipped"}, quick=quick)
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
    text = report.write(tmp_path)
    assert "Smoke run" in text and "different settings" in text


def test_streaming_load_times_chunks_from_their_last_sample_and_finds_gaps() -> None:
    import bench.streaming as streaming

    ok = streaming.Connection("a", b"", sent_at=[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7])
    # 640 ms chunks read to 0.685 s and 1.325 s: packets 7 (0.6-0.7 s) and 14 -> clamped
    ok.partials = [(0.685, 1.75), (1.325, 1.9)]
    ok.end_sent, ok.done_at, ok.done_text, ok.done_duration = 1.8, 2.0, "x", 0.0
    gap = streaming.Connection("b", bytes(3200), sent_at=[0.0] * 30)
    gap.partials = [(0.685, 1.0), (1.965, 1.1)]  # a chunk missing between them
    gap.done_duration = 0.05  # the server heard half of the 0.1 s sent
    row = streaming.summarise([ok, gap], chunk_s=0.64)
    assert row["streams whose audio arrived short"] == 1
    assert ok.sent_time(0.685) == 1.6 and ok.sent_time(0.6) == 1.5
    assert row["streams with a chunk lost or out of order"] == 1
    assert row["final p50 ms"] == pytest.approx(200.0)
    assert row["chunks"] == 4
    assert streaming.error_row("x", ["a b c"], ["a x c d"])["Err"] == pytest.approx(66.7)


def test_streaming_ratio_interval_is_paired_and_holds_the_ratio() -> None:
    from bench.streaming import ratio_interval

    full = np.array([0, 1, 2, 0, 3, 1, 0, 2])
    assert ratio_interval(full, full) == (1.0, 1.0)  # each draw's sums are equal
    assert ratio_interval(full, 2 * full) == (2.0, 2.0)
    chunked = full + np.array([1, 0, 0, 0, 1, 0, 0, 0])
    low, high = ratio_interval(full, chunked)
    assert 1.0 <= low < chunked.sum() / full.sum() < high  # never below: no utterance got better
    assert ratio_interval(full, chunked) == (low, high)  # seeded: the same interval again


def test_streaming_ratio_against_a_full_context_without_errors_is_not_the_error_count() -> None:
    """A full context that got all right made the ratio the chunked decode's error count."""
    from bench.streaming import _percentile, error_ratio, ratio_interval

    assert error_ratio(18, 0) == math.inf and error_ratio(0, 0) == 1.0 and error_ratio(3, 2) == 1.5
    assert ratio_interval(np.zeros(5, int), np.array([0, 0, 2, 0, 1])) == (1.0, math.inf)
    assert _percentile([1, 2, 3, math.inf], 100 * 2 / 3) == 3.0, "numpy: inf * 0, nan"


def test_a_server_that_ends_before_listening_says_why(tmp_path):
    import argparse

    from bench.streaming import start_server

    args = argparse.Namespace(model=str(tmp_path / "none.ckpt"), chunk=640, final_search="beam",
                              backend="torch", first_chunk_ms=None, server_args="")  # fmt: skip
    with pytest.raises(RuntimeError, match="(?s)ended before listening:.*no such checkpoint"):
        start_server(args, 0, 1)


@pytest.mark.parametrize(
    "option, said",
    [(["--threads", "0"], "must be at least 1"), (["--device", "bogus"], "not a torch device")],
)
def test_bench_options_are_checked_before_any_folder_is_made(option, said, tmp_path, capsys):
    from bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["report", "--out", str(tmp_path / "out"), *option])
    assert said in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_missing_checkpoint_is_named_before_any_folder_is_made(tmp_path):
    from bench.__main__ import main

    with pytest.raises(SystemExit, match=r"--checkpoint \S*none.ckpt does not exist"):
        main(
            ["decode", "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "none.ckpt")]
        )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "source, kinds",
    [
        ("x = 1  # c\ny = 2\n", (0, 2)),  # a comment after code leaves the line code
        ("# a note\nx = 1\n", (1, 1)),
        ('"""Module."""\nimport os\n', (1, 1)),
        ('def f():\n    """Doc,\n    two lines."""\n    return 1\n', (2, 2)),
        ('class A:\n    "Doc."\n\n    async def f(self):\n        "Doc."\n', (2, 2)),
        ('if x:\n    "no docstring"\nfor i in x:\n    "nor"\nwith y:\n    "nor"\n', (0, 6)),
    ],
)
def test_doc_ratio_counts_docstrings_and_comment_only_lines_as_documentation(source, kinds):
    from bench.doc_ratio import line_kinds

    assert line_kinds(source) == kinds


def test_streaming_bench_reads_each_manifest_line_s_span(tmp_path) -> None:
    import soundfile as sf

    from bench.streaming import RATE, load_waves, read_manifest

    wave = np.linspace(-0.5, 0.5, 3 * RATE, dtype=np.float32)
    sf.write(tmp_path / "joined.wav", wave, RATE, subtype="FLOAT")
    spans = [(0.0, 1.0), (1.5, 0.5)]  # two segments of one file, as a segmented corpus has
    lines = [
        {"audio_filepath": "joined.wav", "offset": o, "duration": d, "text": "A"} for o, d in spans
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    first, second = load_waves(read_manifest(tmp_path / "m.jsonl"))
    assert np.array_equal(first.numpy(), wave[:RATE])
    assert np.array_equal(second.numpy(), wave[RATE + RATE // 2 : 2 * RATE])


def test_each_training_step_row_is_measured_in_a_fresh_process(monkeypatch) -> None:
    import os

    assert train.in_own_process(os.getpid) != os.getpid()
    calls = []

    def own_process(fn, name, precision, settings):
        calls.append((fn, precision))
        return {precision: {}}

    monkeypatch.setattr(train, "in_own_process", own_process)
    result = train.measure_config("transformer", None)
    assert calls == [(train.measure_precision, p) for p in common.PRECISIONS]
    assert set(result) == {"config", *common.PRECISIONS}


@pytest.mark.parametrize(
    "memory, device, label",
    [({"label": "peak RSS MiB (own process)"}, "cpu", "peak RSS MiB (own process)"),
     ({}, "cpu", "process peak MiB (earlier rows' memory included)"),
     ({}, "cuda", "peak CUDA MiB allocated (earlier rows' live tensors included)")],
)  # fmt: skip
def test_report_labels_the_training_memory_by_how_it_was_measured(memory, device, label) -> None:
    steps = {"steps": 1, "seconds": 1.0, "audio_seconds_per_second": 1.0, "memory": memory}
    data = {"config": "c", "flops_per_audio_second": 1.0, "fp32": steps, "bf16": steps}
    header = report._train_md({"train": {"transformer": data}}, {"mfu": {}}, device)[2]
    assert f"| s / step | {label} |" in header


def test_explorer_builds_its_first_folder_once_untimed(monkeypatch, tmp_path) -> None:
    import sys

    import bench.explorer as explorer

    built = []

    def build(folder, out, link_audio=False):
        built.append(out.name)
        return {"folder": str(folder)}

    monkeypatch.setattr(explorer, "build", build)
    argv = ["explorer", "a", "b", "--synthetic", "0", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    explorer.main()
    assert built == ["warmup.html", "page0.html", "page1.html"]
    assert len(json.loads((tmp_path / "explorer.json").read_text())) == 2


def test_bench_says_which_data_folder_it_uses_and_why(tmp_path, capsys) -> None:
    prepared = tmp_path / "out" / "data"
    prepared.mkdir(parents=True)
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "cmvn.json"):
        (prepared / name).write_text("")
    (prepared / "tokenizer").mkdir()
    assert common.ensure_data(prepared, tmp_path / "x") == prepared
    assert capsys.readouterr().err == ""
    assert common.ensure_data(tmp_path / "none", tmp_path / "out") == prepared
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and "none does not exist; using" in said[0] and str(prepared) in said[0]


def test_gpu_estimate_refuses_cuda_up_front_where_there_is_none(monkeypatch, capsys) -> None:
    import bench.gpu_estimate as gpu_estimate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_estimate, "estimate", lambda *args: pytest.fail("measured first"))
    with pytest.raises(SystemExit):
        gpu_estimate.main(["--device", "cuda"])
    assert "cuda: no CUDA device is available" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--mfu", "0"], "--mfu: must be more than 0"),  # a division by zero
        (["--mfu", "-0.1"], "--mfu: must be more than 0"),  # negative throughputs
        (["--gpus", "0"], "--gpus: must be at least 1"),
        (["--steps", "0"], "--steps: must be at least 1"),
        (["--vocab-size", "3"], "--vocab-size: must be at least 5"),
        (["--config", "none.yaml"], "--config: no such config: none.yaml"),
    ],
)
def test_gpu_estimate_refuses_what_it_cannot_estimate_by_option(option, said, capsys) -> None:
    import bench.gpu_estimate as gpu_estimate

    with pytest.raises(SystemExit):
        gpu_estimate.main(option)
    assert said in capsys.readouterr().err


def test_bench_defaults_hold_from_any_working_folder(tmp_path, monkeypatch, capsys) -> None:
    import bench.doc_ratio as doc_ratio

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["doc_ratio"])
    doc_ratio.main()
    assert "documentation lines" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["doc_ratio", str(tmp_path)])  # no .py files: said
    with pytest.raises(SystemExit):
        doc_ratio.main()
    assert "no .py files below it" in capsys.readouterr().err


def test_the_streaming_bench_decodes_with_the_models_own_search(monkeypatch) -> None:
    """The live decoder takes the model's stored beam and CTC weight: so does the bench,
    unless told otherwise."""
    import bench.streaming as streaming

    given = []
    monkeypatch.setattr(streaming, "wer", lambda args: given.append(args) or {})
    monkeypatch.setattr(streaming.Path, "write_text", lambda self, text: None)
    streaming.main(["wer", "--manifest", "m.jsonl", "--model", "m.ckpt"])
    assert (given[0].beam, given[0].ctc_weight) == (None, None)
