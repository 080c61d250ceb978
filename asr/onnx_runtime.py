"""ONNX export of a recognizer's encoder, CTC head and decoder, and a `Seq2Seq` that runs them
in ONNX Runtime behind the `asr.models` interfaces. The frontend and the search stay PyTorch:
STFT framing depends on the batch's lengths, which tracing would freeze. A chunk-streaming
encoder also gets its chunk step (`forward_chunk` over flat cache tensors), so live streams
run on ONNX Runtime too."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from asr.checkpoint import CheckpointError, refuse_non_finite, weights_digest
from asr.models.chunking import EncoderCache, streaming_problem
from asr.models.interfaces import State, attention_kind
from asr.models.seq2seq import Seq2Seq
from asr.models.transformer import TransformerDecoder
from asr.package import ONNX_DIR, refuse_lfs_pointer

OPSET = 17
CACHE = ["keys", "values", "valid", "conv", "offset"]  # EncoderCache's fields, in order
STATE_FILE = "state.json"
EXPORT_AGAIN = "export it again: asr export --format onnx"
SPIN_WAIT_ENTRY = "session.intra_op.allow_spinning"
GRAPH_KEY, WEIGHTS_KEY = "asr_graph", "asr_weights"  # each graph's metadata: `_stamp`
FP32_OPS = ("Conv",)  # left fp32 in the int8 graphs: quantised convolutions run slower here


class _Step(nn.Module):
    """The decoder's `step` over flat tensors: the state's leaves in, the changed ones out."""

    def __init__(self, decoder: nn.Module, spec: pytree.TreeSpec, changed: list[int]) -> None:
        super().__init__()
        self.decoder, self.spec, self.changed = decoder, spec, changed

    def forward(self, tokens: Tensor, *leaves: Tensor) -> tuple[Tensor, ...]:
        state = pytree.tree_unflatten(list(leaves), self.spec)
        log_probs, new_state, attention = self.decoder.step(tokens, state)
        new_leaves = pytree.tree_leaves(new_state)
        return (log_probs, attention, *(new_leaves[i] for i in self.changed))


class _Forced(nn.Module):
    """The decoder over whole token sequences (teacher forcing): log-probabilities out."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        logits, attention = self.decoder(enc, enc_lens, tokens)
        return logits.float().log_softmax(-1), attention


class _Chunk(nn.Module):
    """The encoder's `forward_chunk` over flat tensors: input and cache in, output and the
    whole new cache out (trimming to a context limit is left to the caller)."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.names = _cache_names(encoder.empty_cache(1, torch.zeros(1)))

    def forward(self, x: Tensor, x_lens: Tensor, *cache: Tensor) -> tuple[Tensor, ...]:
        enc, enc_lens, after = self.encoder.forward_chunk(x, x_lens, _cache(self.names, cache))
        return (enc, enc_lens, *(getattr(after, name) for name in self.names))


def _cache_names(cache: EncoderCache) -> list[str]:
    """The fields a cache carries: no convolution states without convolutions."""
    return [name for name in CACHE if getattr(cache, name) is not None]


def _cache(names: list[str], tensors: Any) -> EncoderCache:
    fields = dict(zip(names, tensors))
    return EncoderCache(**{name: fields.get(name) for name in CACHE})


class _Init(nn.Module):
    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, enc: Tensor, enc_lens: Tensor) -> tuple[Tensor, ...]:
        return tuple(pytree.tree_leaves(self.decoder.init_state(enc, enc_lens)))


def _dynamic(names: list[str], tensors: list[Tensor]) -> dict[str, dict[int, str]]:
    """Every axis of every named tensor dynamic."""
    return {n: {d: f"{n}_{d}" for d in range(t.dim())} for n, t in zip(names, tensors)}


def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            results: list[Tensor]) -> None:  # fmt: skip
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python values made constant
        # A wrapper made here is in training mode, which the exporter restores afterwards,
        # recursively: the model inside would be left training (dropout, batch statistics).
        torch.onnx.export(
            module.eval(), args, str(path), input_names=inputs, output_names=outputs,
            dynamic_axes=_dynamic(inputs, list(args)) | _dynamic(outputs, results),
            opset_version=OPSET, dynamo=False,
        )  # fmt: skip


@torch.no_grad()
def export_onnx(
    model: Seq2Seq, out_dir: str | os.PathLike, sample_rate: int, int8: bool = True
) -> list[str]:
    """Export `model`'s graphs into `out_dir/onnx/`; return the files written."""
    model = model.eval()
    folder = Path(out_dir) / ONNX_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("*.onnx"), folder / STATE_FILE]:  # of other weights
        stale.unlink(missing_ok=True)
    waves = torch.randn(2, 3 * sample_rate) * 0.1
    wave_lens = torch.tensor([3 * sample_rate, 2 * sample_rate])
    feats, feat_lens = model.frontend(waves, wave_lens)
    enc, enc_lens = model.encoder(feats, feat_lens)
    _export(model.encoder, (feats, feat_lens), folder / "encoder.onnx", ["feats", "feat_lens"],
            ["enc", "enc_lens"], [enc, enc_lens])  # fmt: skip
    written = ["encoder.onnx"]
    if streaming_problem(model.encoder) is None:
        written.append(_export_chunk(model.encoder, feats, folder))
    if model.ctc is not None:
        _export(model.ctc, (enc,), folder / "ctc.onnx", ["enc"], ["log_probs"], [model.ctc(enc)])
        written.append("ctc.onnx")
    digest = weights_digest(model.state_dict())
    written += _export_decoder(model.decoder, enc, enc_lens, folder, digest)
    for name in written:
        if name.endswith(".onnx"):
            _stamp(folder / name, {GRAPH_KEY: name.removesuffix(".onnx"), WEIGHTS_KEY: digest})
    if int8:
        written += [_quantized(folder / name) for name in written if name.endswith(".onnx")]
    return [f"{ONNX_DIR}/{name}" for name in written]


def _stamp(path: Path, props: dict[str, str]) -> None:
    """Record `props` in the graph at `path` (which graph it is, the weights it holds), so a
    graph copied in from another export, or over another graph, is refused by its name."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(path))


def _export_chunk(encoder: nn.Module, feats: Tensor, folder: Path) -> str:
    """The chunk step, traced on 2 streams after a first chunk, one with a shorter context
    (left padding), so no cache length, chunk size or batch size is frozen."""
    chunk = 4
    window = encoder.subsampling.chunk_window(chunk)
    x = feats[:, :window]
    x_lens = torch.full((2,), window)
    _, _, cache = encoder.forward_chunk(x, x_lens, encoder.empty_cache(2, x))
    cache.valid[1, :1] = False
    names = _cache_names(cache)
    tensors = [getattr(cache, name) for name in names]
    results = _Chunk(encoder)(x, x_lens, *tensors)
    outputs = ["enc", "enc_lens", *(f"new_{name}" for name in names)]
    _export(_Chunk(encoder), (x, x_lens, *tensors), folder / "encoder_chunk.onnx",
            ["x", "x_lens", *names], outputs, list(results))  # fmt: skip
    return "encoder_chunk.onnx"


def _export_decoder(
    decoder: nn.Module, enc: Tensor, enc_lens: Tensor, folder: Path, weights: str
) -> list[str]:
    state = decoder.init_state(enc, enc_lens)
    leaves, spec = pytree.tree_flatten(state)
    names = [f"state{i}" for i in range(len(leaves))]
    _export(_Init(decoder), (enc, enc_lens), folder / "decoder_init.onnx", ["enc", "enc_lens"],
            names, leaves)  # fmt: skip
    # Trace 2 rows per utterance so the graph does not freeze one beam size.
    rows = torch.arange(enc.size(0)).repeat_interleave(2)
    state = decoder.reorder_state(state, rows)
    tokens = torch.full((rows.numel(),), 3)
    for _ in range(2):  # a state with history: every cache has a length to vary
        _, state, _ = decoder.step(tokens, state)
    leaves = pytree.tree_leaves(state)
    log_probs, new_state, attention = decoder.step(tokens, state)
    new_leaves, new_spec = pytree.tree_flatten(new_state)
    if new_spec != spec:
        raise ValueError(f"{type(decoder).__name__}.step changes the state's structure")
    changed = [i for i, (a, b) in enumerate(zip(leaves, new_leaves)) if a is not b]
    outputs = ["log_probs", "attention", *(f"new_state{i}" for i in changed)]
    results = [log_probs, attention, *(new_leaves[i] for i in changed)]
    _export(_Step(decoder, spec, changed), (tokens, *leaves), folder / "decoder_step.onnx",
            ["tokens", *names], outputs, results)  # fmt: skip
    meta = {
        "spec": pytree.treespec_dumps(spec),
        "changed": changed,
        "vocab_size": decoder.vocab_size,
        "num_attention_maps": decoder.num_attention_maps,
        "attention_layers": decoder.attention_layers,
        "attention_kind": attention_kind(decoder),
        "weights": weights,
    }
    (folder / STATE_FILE).write_text(json.dumps(meta) + "\n")
    written = ["decoder_init.onnx", "decoder_step.onnx", STATE_FILE]
    # Rescoring and alignment teacher-force whole hypotheses: one run instead of a run per
    # token, where the decoder has no loop over tokens for the tracer to freeze.
    if isinstance(decoder, TransformerDecoder):
        ys = torch.full((enc.size(0), 4), 3)
        results = list(_Forced(decoder)(enc, enc_lens, ys))
        _export(_Forced(decoder), (enc, enc_lens, ys), folder / "decoder_forced.onnx",
                ["enc", "enc_lens", "tokens"], ["log_probs", "attention"], results)  # fmt: skip
        written.append("decoder_forced.onnx")
    return written


def _quantized(path: Path, fp32_ops: tuple[str, ...] = FP32_OPS, out: Path | None = None) -> str:
    """A dynamically quantised copy (int8 weights) of the graph at `path`, beside it (or at
    `out`); the operators `fp32_ops` stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    out = out or path.with_suffix(".int8.onnx")
    # The quantiser logs each tensor it leaves alone, and a hint, to the root logger.
    root = logging.getLogger()

    def quiet(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    root.addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as tmp:  # the quantiser writes a pre-processed copy
            staged = Path(tmp) / path.name
            source = onnx.load(str(path))
            onnx.save(_untied(source), str(staged))
            ops = sorted(set(IntegerOpsRegistry) - set(fp32_ops))
            quantize_dynamic(str(staged), str(out), op_types_to_quantize=ops,
                             weight_type=QuantType.QInt8)  # fmt: skip
    finally:
        root.removeFilter(quiet)
    _stamp(out, {prop.key: prop.value for prop in source.metadata_props})
    return out.name


def _untied(model: Any) -> Any:
    """`model` with one copy of each initializer per reader: quantisers mangle tied weights."""
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    seen: set[str] = set()
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name not in initializers:
                continue
            if name in seen:
                copy = type(initializers[name])()
                copy.CopyFrom(initializers[name])
                copy.name = f"{name}__{node.name or len(graph.initializer)}_{i}"
                graph.initializer.append(copy)
                node.input[i] = copy.name
            seen.add(name)
    return model


def _refuse_non_finite_graph(path: Path) -> None:
    """CheckpointError naming `path` and the first floating weight (initializer) of its graph
    that holds a NaN or an infinity, as a package's weights are checked."""
    import onnx
    from onnx import numpy_helper

    for weight in onnx.load(str(path), load_external_data=False).graph.initializer:
        values = torch.from_numpy(numpy_helper.to_array(weight).copy())  # one at a time
        refuse_non_finite({weight.name: values}, path)


class _Session:
    """An ONNX Runtime session on torch tensors (CPU); spin-wait is off: it starves torch."""

    def __init__(self, path: Path, threads: int | None, spin_wait: bool = False) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.add_session_config_entry(SPIN_WAIT_ENTRY, "1" if spin_wait else "0")
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnxruntime's own types, for a torn or foreign file
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CheckpointError(
                f"{path}: not a readable ONNX graph ({reason}); {EXPORT_AGAIN}"
            ) from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.props = dict(self.session.get_modelmeta().custom_metadata_map)  # `_stamp`'s

    def __call__(self, **feeds: Tensor) -> list[Tensor]:
        given = {k: _numpy(v) for k, v in feeds.items() if k in self.inputs}
        return [torch.from_numpy(out) for out in self.session.run(None, given)]


def _numpy(tensor: Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy()


class OnnxEncoder:
    """The encoder graph; ValueError for inputs shorter than `shortest` frames."""

    cannot_stream: str | None = None  # why not, where the PyTorch encoder streams

    def __init__(self, session: _Session, shortest: int) -> None:
        self.session, self.shortest = session, shortest

    def __call__(self, feats: Tensor, feat_lens: Tensor) -> tuple[Tensor, Tensor]:
        if len(feat_lens) and int(feat_lens.min()) < self.shortest:
            raise ValueError(
                f"an input of {int(feat_lens.min())} frames is too short for the encoder: it "
                f"needs at least {self.shortest} frames"
            )
        enc, enc_lens = self.session(feats=feats.float(), feat_lens=feat_lens)
        return enc, enc_lens


class OnnxStreamingEncoder(OnnxEncoder):
    """`OnnxEncoder` with the chunk step of a streaming encoder (`forward_chunk`, as the
    PyTorch encoder's); the PyTorch encoder's subsampling front gives the chunks' windows."""

    def __init__(
        self, session: _Session, shortest: int, chunk: _Session, encoder: nn.Module
    ) -> None:
        super().__init__(session, shortest)
        self.chunk_session = chunk
        self.subsampling = encoder.subsampling
        self.chunk_training = getattr(encoder, "chunk_training", None)  # the same warnings
        self._empty = encoder.empty_cache(1, torch.zeros(1))
        self.names = _cache_names(self._empty)

    def empty_cache(self, batch: int, like: Tensor) -> EncoderCache:
        """The cache of `batch` streams before their first chunk."""
        return EncoderCache.merge([self._empty] * batch)

    def forward_chunk(
        self, x: Tensor, x_lens: Tensor, cache: EncoderCache, max_cache: int | None = None
    ) -> tuple[Tensor, Tensor, EncoderCache]:
        """One chunk of B streams: arguments and results as `ConformerEncoder.forward_chunk`."""
        feeds = {name: getattr(cache, name) for name in self.names}
        enc, enc_lens, *after = self.chunk_session(x=x.float(), x_lens=x_lens, **feeds)
        return enc, enc_lens, _cache(self.names, after).trimmed(max_cache)


@torch.inference_mode()
def _shortest_frames(encoder: nn.Module, dim: int) -> int:
    """The fewest feature frames `encoder` takes without ValueError (at most 64)."""
    for frames in range(1, 64):
        try:
            encoder(torch.zeros(1, frames, dim), torch.tensor([frames]))
            return frames
        except ValueError:
            continue
    return 64


class OnnxCTC:
    def __init__(self, session: _Session) -> None:
        self.session = session

    def __call__(self, enc: Tensor) -> Tensor:
        return self.session(enc=enc.float())[0]


class OnnxDecoder:
    """`asr.models.interfaces.Decoder` over the decoder_init and decoder_step graphs."""

    def __init__(
        self, init: _Session, step: _Session, meta: dict[str, Any],
        reorder_state: Callable[[State, Tensor], State], forced: _Session | None = None,
    ) -> None:  # fmt: skip
        self.init, self.step_session, self.forced = init, step, forced
        self.reorder_state = reorder_state  # the PyTorch decoder's: it shares what it can
        self.spec = pytree.treespec_loads(meta["spec"])
        self.changed = meta["changed"]
        self.vocab_size = meta["vocab_size"]
        self.num_attention_maps = meta["num_attention_maps"]
        self.attention_layers = meta.get("attention_layers", 1)  # packages that predate it
        self.attention_kind = meta.get("attention_kind")

    def init_state(self, enc: Tensor, enc_lens: Tensor) -> State:
        leaves = self.init(enc=enc.float(), enc_lens=enc_lens)
        return pytree.tree_unflatten(leaves, self.spec)

    def step(self, tokens: Tensor, state: State) -> tuple[Tensor, State, Tensor]:
        leaves = pytree.tree_leaves(state)
        feeds = {f"state{i}": leaf for i, leaf in enumerate(leaves)}
        log_probs, attention, *changed = self.step_session(tokens=tokens, **feeds)
        for i, leaf in zip(self.changed, changed):
            leaves[i] = leaf
        return log_probs, pytree.tree_unflatten(leaves, self.spec), attention

    def __call__(self, enc: Tensor, enc_lens: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher forcing: log-probabilities `(B, L, V)`, attention `(B, K, L, T)`; step by
        step where the package has no decoder_forced graph."""
        if self.forced is not None:
            log_probs, attention = self.forced(enc=enc.float(), enc_lens=enc_lens, tokens=tokens)
            return log_probs, attention
        state = self.init_state(enc, enc_lens)
        outputs, maps = [], []
        for i in range(tokens.size(1)):
            log_probs, state, attention = self.step(tokens[:, i], state)
            outputs.append(log_probs)
            maps.append(attention)
        return torch.stack(outputs, 1), torch.stack(maps, 2)


def onnx_model(
    model: Seq2Seq,
    folder: str | os.PathLike,
    int8: bool = False,
    threads: int | None = None,
    spin_wait: bool = False,
    session_type: Callable[[Path, int | None, bool], Any] | None = None,
) -> Seq2Seq:
    """`model` with its encoder, CTC head and decoder running `folder/onnx/` in ONNX Runtime;
    `session_type(path, threads, spin_wait)` opens each graph (`_Session`'s interface)."""
    session_type = session_type or _Session
    graphs = Path(folder) / ONNX_DIR
    suffix = ".int8.onnx" if int8 else ".onnx"

    def missing(name: str) -> str:
        hint = EXPORT_AGAIN + (" writes it too" if int8 else "")
        return f"{graphs / f'{name}{suffix}'}: no such ONNX graph ({hint})"

    opened: dict[Path, Any] = {}

    def session(name: str) -> _Session:
        path = graphs / f"{name}{suffix}"
        if not path.is_file():
            raise FileNotFoundError(missing(name))
        refuse_lfs_pointer(path)  # a clone without git-lfs: fetched, not exported again
        opened[path] = session_type(path, threads, spin_wait)
        _refuse_non_finite_graph(path)
        graph = getattr(opened[path], "props", {}).get(GRAPH_KEY, name)  # older graphs: none
        if graph != name:
            raise CheckpointError(f"{path}: holds the {graph} graph, not {name}; {EXPORT_AGAIN}")
        return opened[path]

    def optional(name: str) -> _Session | None:
        """A graph that only some models have (None where the package has none)."""
        return session(name) if (graphs / f"{name}{suffix}").is_file() else None

    shortest = _shortest_frames(model.encoder, model.frontend.output_dim)
    chunk = optional("encoder_chunk")  # where the encoder streams
    if chunk is not None:
        encoder = OnnxStreamingEncoder(session("encoder"), shortest, chunk, model.encoder)
    else:
        encoder = OnnxEncoder(session("encoder"), shortest)
        if streaming_problem(model.encoder) is None:  # it streams in PyTorch: a graph is gone
            encoder.cannot_stream = missing("encoder_chunk")
    ctc = OnnxCTC(session("ctc")) if model.ctc is not None else None
    sessions = session("decoder_init"), session("decoder_step"), optional("decoder_forced")
    try:
        meta = json.loads((graphs / STATE_FILE).read_text())
        decoder = OnnxDecoder(*sessions[:2], meta, model.decoder.reorder_state, sessions[2])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{graphs / STATE_FILE}: unreadable ({type(err).__name__}: {err}); {EXPORT_AGAIN}"
        ) from None
    # the graphs record the weights they hold: left beside others (a Hub upload of a package
    # without them), or among graphs of others, they are refused, not run (older ones: none)
    for path, graph in opened.items():
        held = getattr(graph, "props", {}).get(WEIGHTS_KEY)
        if held is not None and held != meta.get("weights", held):
            raise CheckpointError(
                f"{path}: exported from other weights than {graphs / STATE_FILE}; {EXPORT_AGAIN}"
            )
    digest = weights_digest(model.state_dict())
    if "weights" in meta and meta["weights"] != digest:
        raise CheckpointError(
            f"{graphs}: its graphs hold other weights than the package's; {EXPORT_AGAIN}"
        )
    run = Seq2Seq(model.eval().frontend, encoder, decoder, ctc).eval()  # a new module trains
    run.weights_digest = digest  # of the weights it runs, which it holds no longer
    return run
