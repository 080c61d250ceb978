"""The benchmark suite's model-FLOP counting (bench/common.py): the formulas it adds for kernels
torch's counter lacks, and its kernels-only bound; and how bench/peak.py picks the fp32 peak.
Counting and bookkeeping only; no timing is asserted."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import bench.common as common
import bench.peak as peak

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


def test_kernel_ceiling_bounds_the_counted_kernels() -> None:
    a = torch.randn(32, 48)
    ceiling = common.kernel_ceiling(lambda: a @ a.T, torch.device("cpu"), repeats=1)
    assert ceiling["ops"] == 1
    assert ceiling["flops"] == 2 * 32 * 48 * 32
    assert math.isfinite(ceiling["gflops"]) and ceiling["gflops"] > 0


def test_kernel_ceiling_reports_a_kernel_that_refuses_random_inputs(monkeypatch) -> None:
    """The bound is left out with the error, not raised: the part's other figures survive."""
    recorded = common._counted_calls

    def mismatched(fn):
        func, (left, _), kwargs = recorded(fn)[0]
        return [(func, (left, torch.randn(3, 7)), kwargs)]

    monkeypatch.setattr(common, "_counted_calls", mismatched)
    a = torch.randn(8, 8)
    with pytest.warns(UserWarning, match="replay failed"):
        ceiling = common.kernel_ceiling(lambda: a @ a, torch.device("cpu"), repeats=1)
    assert ceiling["ops"] == 1 and "gflops" not in ceiling
    assert ceiling["error"].startswith("RuntimeError")


def test_kernel_ceiling_groups_the_kernels_by_op_and_dtype() -> None:
    a, b = torch.randn(32, 48), torch.randn(16, 48, dtype=torch.bfloat16)

    def step() -> None:
        a @ a.T
        a @ a.T
        b @ b.T

    ceiling = common.kernel_ceiling(step, torch.device("cpu"), repeats=1)
    groups = {(g["op"], g["dtype"]): g for g in ceiling["by_kernel"]}
    assert set(groups) == {("mm", "float32"), ("mm", "bfloat16")}
    assert groups["mm", "float32"]["calls"] == 2
    assert groups["mm", "float32"]["flops"] == 2 * (2 * 32 * 48 * 32)
    assert groups["mm", "bfloat16"]["flops"] == 2 * 16 * 48 * 16
    assert sum(g["flops"] for g in groups.values()) == ceiling["flops"]
    seconds = [g["seconds"] for g in ceiling["by_kernel"]]
    assert seconds == sorted(seconds, reverse=True) and all(s > 0 for s in seconds)


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
