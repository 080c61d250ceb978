"""The benchmark harness's bookkeeping: model-FLOP counting (bench/common.py) with the formulas
it adds for kernels torch's counter lacks, how bench/peak.py picks the fp32 peak, the pure
functions behind the report's figures, and the report itself. No timing is asserted."""

from __future__ import annotations

import doctest
import json

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
