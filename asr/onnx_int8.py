"""Calibrated int8 graphs: each activation's int8 range measured once on calibration audio.

`export_onnx` quantises dynamically: every run takes each activation's range over its whole
batch, padding included, so an utterance's hypothesis depends on what is decoded beside it.
`calibrate_int8` decodes calibration recordings with the fp32 graphs (offline, and live where
the encoder streams), takes the range each quantised activation reaches, and writes those
ranges into the int8 graphs as constants: each row then runs on its own numbers, at any batch.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from asr.onnx_runtime import (
    FP32_OPS,
    STATE_FILE,
    _numpy,
    _quantized,
    _Session,
    _untied,
    onnx_model,
)
from asr.package import ONNX_DIR
from asr.recognizer import Recognizer
from asr.streaming import StreamOptions, encoder_frames

CALIBRATION_BATCH = 8
CALIBRATION_SIZE = 32  # recordings `asr export --calibration` takes by default
DYNAMIC_OP = "DynamicQuantizeLinear"
CALIBRATION_KEY = "int8_calibration"  # in state.json: how many recordings set the ranges
# Quantised, these take their input's range per run inside the operator (DynamicQuantizeLSTM):
# they stay fp32 in calibrated graphs.
SELF_QUANTISING_OPS = ("LSTM", "Attention")


class _Probe(_Session):
    """An fp32 graph's session that also returns the activations its int8 copy quantises at run
    time, and widens each one's range (always holding 0, as the dynamic quantiser's does)."""

    def __init__(self, path: Path, threads: int | None, int8_path: Path) -> None:
        import onnx

        int8 = onnx.load(str(int8_path))
        self.targets = [node.input[0] for node in int8.graph.node if node.op_type == DYNAMIC_OP]
        self.ranges = {name: [0.0, 0.0] for name in self.targets}
        self.reached: set[str] = set()
        model = _untied(onnx.load(str(path)))  # the copy the quantiser read: the same names
        graph = model.graph
        self.outputs = [value.name for value in graph.output]
        known = {value.name for value in graph.input} | set(self.outputs)
        extra = [name for name in dict.fromkeys(self.targets) if name not in known]
        graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
        self.returned = [*self.outputs, *extra]
        with tempfile.TemporaryDirectory() as tmp:  # not beside the package's graphs
            onnx.save(model, str(Path(tmp) / path.name))
            super().__init__(Path(tmp) / path.name, threads)

    def __call__(self, **feeds: Tensor) -> list[Tensor]:
        given = {k: _numpy(v) for k, v in feeds.items() if k in self.inputs}
        results = self.session.run(self.returned, given)
        seen = dict(zip(self.returned, results)) | given
        for name in self.targets:
            values = seen[name]
            if values.size:
                self.reached.add(name)
                bounds = self.ranges[name]
                bounds[0] = min(bounds[0], float(values.min()))
                bounds[1] = max(bounds[1], float(values.max()))
        return [torch.from_numpy(out) for out in results[: len(self.outputs)]]


def calibrate_int8(
    recognizer: Recognizer,
    folder: str | os.PathLike,
    waves: Sequence[Tensor],
    progress: bool = False,
) -> list[str]:
    """Rewrite the int8 graphs that `export_onnx` wrote of `recognizer`'s model into `folder`
    with activation ranges measured on `waves` (mono, at its rate); return those rewritten.

    The new graphs are made beside the package's and put in their place together once all are
    made: where calibration fails, the int8 graphs stay as they were.

    Raises:
        ValueError: no waves, one too short to encode, graphs calibrated already, or an
            activation the calibration never reached (named).
        FileNotFoundError: `folder` has no int8 graphs (`asr export --format onnx`).
    """
    if not waves:
        raise ValueError("calibration needs at least one recording")
    short = [i for i, wave in enumerate(waves) if len(wave) < recognizer.shortest_input]
    if short:
        raise ValueError(
            f"calibration recording {short[0]} has {len(waves[short[0]])} samples: the model "
            f"encodes no fewer than {recognizer.shortest_input}"
        )
    graphs = Path(folder) / ONNX_DIR
    names = sorted(p.name.removesuffix(".int8.onnx") for p in graphs.glob("*.int8.onnx"))
    if not names:
        raise FileNotFoundError(f"{graphs}: no int8 graphs to calibrate (asr export --format onnx)")
    meta = json.loads((graphs / STATE_FILE).read_text())
    if CALIBRATION_KEY in meta:
        raise ValueError(f"{graphs}: int8 graphs calibrated already; export them again first")
    with tempfile.TemporaryDirectory(dir=graphs, prefix=".calibrating-") as tmp:
        staged = {name: Path(tmp) / f"{name}.int8.onnx" for name in names}
        for name in names:  # afresh, without the operators that quantise their input themselves
            _quantized(graphs / f"{name}.onnx", (*FP32_OPS, *SELF_QUANTISING_OPS), staged[name])
        probes: dict[str, _Probe] = {}

        def probe(path: Path, threads: int | None, spin_wait: bool) -> _Probe:
            name = path.name.removesuffix(".onnx")
            probes[name] = _Probe(path, threads, staged[name])
            return probes[name]

        model = onnx_model(
            recognizer.model, folder, threads=torch.get_num_threads(), session_type=probe
        )
        _decode(replace(recognizer, model=model), waves, progress)
        for name in names:
            unreached = sorted(set(probes[name].targets) - probes[name].reached)
            if unreached:
                raise ValueError(
                    f"{graphs / name}.onnx: calibration never reached {len(unreached)} of its "
                    f"quantised activations ({', '.join(unreached[:3])})"
                )
        for name in names:
            _write_static(staged[name], probes[name])
        for name in names:
            os.replace(staged[name], graphs / staged[name].name)
    meta[CALIBRATION_KEY] = {"recordings": len(waves)}
    (graphs / STATE_FILE).write_text(json.dumps(meta) + "\n")
    return [f"{ONNX_DIR}/{name}.int8.onnx" for name in names]


@torch.inference_mode()
def _decode(recognizer: Recognizer, waves: Sequence[Tensor], progress: bool) -> None:
    """Run every graph on `waves`: the offline search (encoder, decoder, its teacher-forced
    pass), the CTC head, and the chunk step where the encoder streams."""
    model = recognizer.model
    chunk = encoder_frames(StreamOptions().chunk_ms, recognizer.frame_seconds)
    with tqdm(total=len(waves), desc="calibrate", unit="rec", disable=not progress) as bar:
        for start in range(0, len(waves), CALIBRATION_BATCH):
            batch = waves[start : start + CALIBRATION_BATCH]
            recognizer.search(batch)
            feats, feat_lens = model.frontend(*recognizer.pad(batch))
            enc, enc_lens = model.encoder(feats, feat_lens)
            if model.ctc is not None:
                model.ctc(enc)
            if hasattr(model.encoder, "forward_chunk"):
                for row in range(len(batch)):
                    _chunked(model.encoder, feats[row, : feat_lens[row]], int(enc_lens[row]), chunk)
            bar.update(len(batch))


def _chunked(encoder: Any, x: Tensor, frames: int, chunk: int) -> None:
    """`x (T, D)` through the encoder's chunk step, `chunk` output frames at a time, as one
    live stream runs it."""
    sub = encoder.subsampling
    cache, start = encoder.empty_cache(1, x), 0
    while start < frames:
        window = x[start * sub.factor : start * sub.factor + sub.chunk_window(chunk)][None]
        _, _, cache = encoder.forward_chunk(window, torch.tensor([window.size(1)]), cache)
        start += chunk


def _write_static(path: Path, probe: _Probe) -> None:
    """`path`'s dynamic quantisers replaced by ones of the ranges `probe` measured."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    nodes = []
    for node in model.graph.node:
        if node.op_type != DYNAMIC_OP:
            nodes.append(node)
            continue
        low, high = probe.ranges[node.input[0]]
        scale = np.float32((high - low) / 255.0) if high > low else np.float32(1.0)
        zero = np.uint8(np.clip(np.round(-low / scale), 0, 255))
        _, scale_name, zero_name = node.output
        model.graph.initializer.extend(
            [numpy_helper.from_array(np.array(scale), scale_name),
             numpy_helper.from_array(np.array(zero), zero_name)]
        )  # fmt: skip
        nodes.append(
            helper.make_node("QuantizeLinear", [node.input[0], scale_name, zero_name],
                             [node.output[0]], name=f"{node.name}_calibrated")
        )  # fmt: skip
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    dynamic = sorted({n.op_type for n in nodes if n.op_type.startswith("DynamicQuantize")})
    if dynamic:  # an operator a newer quantiser makes
        raise ValueError(f"{path}: {', '.join(dynamic)} still quantises per run")
    onnx.save(model, str(path))
