"""`load_model` and `Recognizer`: the inference facade over a trained model."""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from difflib import get_close_matches
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import Tensor

from asr import alignment
from asr.audio import AudioInput, as_waveform, check_sample_rate, from_home, load_audio
from asr.checkpoint import CheckpointError, weights_digest
from asr.confidence import PlattScaling
from asr.ctc_beam import EndpointOptions
from asr.decoding import decode_batch
from asr.loading import load_lm, load_seq2seq
from asr.models.seq2seq import Seq2Seq
from asr.package import HF_PREFIX, read_recognizer
from asr.precision import check_precision, input_dtype
from asr.results import Alignment, BatchResult, Decoded, Transcript
from asr.search import (
    DEFAULT_CTC_WEIGHT,
    LanguageModel,
    SearchOptions,
    check_language_model,
    length_bound,
)
from asr.segment import SHORTEST_MAX_SEGMENT, SegmenterOptions
from asr.streaming import Stream, StreamingEngine, StreamOptions
from asr.text import Tokenizer
from asr.transcribe import TRANSCRIBE_BATCH_SIZE, transcribe_sources

SEARCH_KEYWORDS = tuple(f.name for f in fields(SearchOptions))
MAX_CHANNELS = 8  # an (S, C) array with no more columns, and more rows, is one recording


@dataclass
class Recognizer:
    """A trained recognizer ready for inference: from `load_model`, or wrapping a model."""

    model: Seq2Seq  # the plain module, in eval mode
    tokenizer: Tokenizer  # maps text to token ids and back
    sample_rate: int  # audio rate the frontend expects
    checkpoint: str  # where it was loaded from
    precision: str = "fp32"  # "bf16": search and align under bf16 autocast (asr.precision)
    segment_seconds: float | None = None  # longest segment; None: DEFAULT_SEGMENT_SECONDS
    decoding: SearchOptions | None = None  # default search settings (`asr finalize`)
    tokens_per_second: float | None = None  # fastest training speech; raises the length bound
    alignment_heads: list[int] | None = None  # cross-attention maps for DTW; None: all
    confidence_scaling: PlattScaling | None = None  # word probability -> confidence; None: same
    backend: str = "torch"  # what runs the model: "torch", or ONNX Runtime ("onnx", "onnx-int8")

    def __post_init__(self) -> None:
        check_precision(self.precision)
        training = next((n for n, m in self.model.named_modules() if m.training), None)
        if training is not None:  # a module made anew trains, though the model around it not
            part = f"model's {training} ({type(self.model.get_submodule(training)).__name__})"
            raise ValueError(
                f"Recognizer: the {part if training else 'model'} is in training mode, so "
                "dropout and SpecAugment would change every transcript: call model.eval() first"
            )
        seconds = self.segment_seconds
        if seconds is not None and not (_is_number(seconds) and seconds >= SHORTEST_MAX_SEGMENT):
            raise ValueError(  # shorter leaves no room for the windows' overlap
                f"Recognizer: segment_seconds is {seconds!r}, not a number of at least "
                f"{SHORTEST_MAX_SEGMENT} (the shortest asr fit stores)"
            )

    def segmenter(self, given: SegmenterOptions | None = None) -> SegmenterOptions:
        """How `transcribe` splits long audio: `given` (default `SegmenterOptions()`) with, where
        its `max_segment_seconds` is None, this model's longest segment."""
        given = given or SegmenterOptions()
        if given.max_segment_seconds is not None or self.segment_seconds is None:
            return given
        return replace(given, max_segment_seconds=self.segment_seconds)

    @property
    def default_options(self) -> SearchOptions:
        """The search settings of a call that gives none (see `decoding`)."""
        if self.decoding is not None:
            return self.decoding
        return SearchOptions(ctc_weight=DEFAULT_CTC_WEIGHT if self.model.ctc is not None else 0.0)

    @property
    def device(self) -> torch.device:
        tensor = next(itertools.chain(self.model.parameters(), self.model.buffers()), None)
        return torch.device("cpu") if tensor is None else tensor.device

    @cached_property
    def weights_digest(self) -> str | None:
        """A digest of the model's weights (`asr.checkpoint.weights_digest`), which tells the
        model a WER was measured on; where ONNX Runtime runs it, the weights' its graphs hold."""
        if not isinstance(self.model.encoder, torch.nn.Module):
            return getattr(self.model, "weights_digest", None)
        return weights_digest(self.model.state_dict())

    @cached_property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame, measured (`Seq2Seq.encoder_timing`)."""
        return self._encoder_timing[0]

    @cached_property
    def _encoder_timing(self) -> tuple[float, float]:
        return self.model.encoder_timing()

    @cached_property
    def shortest_input(self) -> int:
        """The fewest samples the model gives a transcript of."""
        return self.model.shortest_input()

    @cached_property
    def feature_seconds(self) -> float:
        """Seconds per feature frame (the frontend's hop)."""
        return self.model.feature_seconds()

    def bounded(self, options: SearchOptions) -> SearchOptions:
        """`options` with the output bound raised to what the fastest training speech needs."""
        if self.tokens_per_second is None:
            return options
        asked = (options.max_len_ratio, options.max_len_extra)
        bound = length_bound(*asked, self.tokens_per_second, *self._encoder_timing)
        if bound == asked:
            return options
        return replace(options, max_len_ratio=bound[0], max_len_extra=bound[1])

    def transcribe(
        self,
        audio: AudioInput,
        *,
        sample_rate: int | None = None,
        word_timestamps: str = "attention",
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
        batch_size: int = TRANSCRIBE_BATCH_SIZE,
        segmenter: SegmenterOptions | None = None,
        vad: str | None = None,
        **search: Any,
    ) -> Transcript:
        """Transcribe one recording of any length, split on silence into segments.

        Args:
            audio: a file path (any format libsndfile or FFmpeg reads), or a mono waveform
                `(S,)` as a numpy array or tensor.
            sample_rate: the rate of an array `audio`; None means the model's rate.
            word_timestamps: "attention" (DTW over cross-attention) or "ctc" (CTC alignment).
            options: search settings; None uses `default_options`.
            lm: language model for shallow fusion (with `lm_weight > 0`).
            batch_size: segments of long audio decoded together.
            segmenter: how long audio is split; its max_segment_seconds None (the default):
                the model's own (`self.segmenter`).
            vad: "energy" or "silero" speech detection for cutting; None: `segmenter`'s.
            **search: `SearchOptions` fields (`SEARCH_KEYWORDS`) set over `options`.

        Returns:
            The `Transcript`, times in seconds of the input.

        Raises:
            AudioError: the input cannot be read or decoded (a ValueError naming it).
            ValueError: settings out of range, or that the model cannot decode with.
            TypeError: an unknown keyword (named), several recordings, options or a segmenter
                of another kind, or an `lm` that is no language model (a path).
        """
        if isinstance(audio, (list, tuple)):  # NeMo's transcribe takes a list of paths
            raise TypeError(
                f"transcribe takes one recording, got a {type(audio).__name__} of "
                f"{len(audio)}: use transcribe_batch for several"
            )
        [result] = self.transcribe_batch(
            [audio],
            sample_rate=sample_rate,
            word_timestamps=word_timestamps,
            options=options,
            lm=lm,
            batch_size=batch_size,
            segmenter=segmenter,
            vad=vad,
            **search,
        )
        return result.transcript_or_raise()

    def transcribe_batch(
        self,
        audios: Sequence[AudioInput],
        *,
        sample_rate: int | None = None,
        word_timestamps: str = "attention",
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
        batch_size: int = TRANSCRIBE_BATCH_SIZE,
        segmenter: SegmenterOptions | None = None,
        vad: str | None = None,
        **search: Any,
    ) -> list[BatchResult]:
        """Transcribe several recordings; one that cannot be read or decoded fails alone.

        Args:
            audios: file paths or mono waveforms `(S,)`, or one array `(B, S)` of B rows (an
                array of no more than `MAX_CHANNELS` columns and more rows is one recording
                of that many channels, and refused).
            sample_rate, word_timestamps, options, lm, batch_size, segmenter, vad, **search:
                as in `transcribe`.

        Returns:
            One `BatchResult` per input, in input order: its `transcript`, or its `error`.

        Raises:
            ValueError: settings out of range, or that the model cannot decode with.
            TypeError: an unknown keyword (named), one input rather than a sequence, options
                or a segmenter of another kind, or an `lm` that is no language model (a path).
        """
        _check_kind("segmenter", segmenter, SegmenterOptions, "max_segment_seconds=10")
        if _inputs_column(audios):  # a data frame's column: a list of them
            audios = audios.reshape(-1).tolist()
        array = isinstance(audios, (np.ndarray, Tensor))
        # (B, S): rows; (S,), and (S, C) as audio APIs give C channels, are one recording
        columns = array and audios.ndim == 2 and audios.shape[1] <= MAX_CHANNELS < audios.shape[0]
        one_wave = array and (audios.ndim < 2 or columns)
        if isinstance(audios, (str, os.PathLike)) or one_wave:  # not a list of its parts
            advice = f"{type(audios).__name__}: give [it], or use transcribe"
            if columns and audios.shape[1] > 1:
                advice = (
                    f"recording of {audios.shape[1]} channels {tuple(audios.shape)}: mix them or "
                    "pick one, then give [it] or use transcribe"
                )
            raise TypeError(f"transcribe_batch takes a sequence of inputs, got one {advice}")
        if not array and not isinstance(audios, Sequence):
            audios = list(audios)  # a generator: read once
        alignment.check_timestamps(word_timestamps, "word_timestamps")
        return transcribe_sources(
            self,
            audios,
            sample_rate=sample_rate,
            options=self.search_options(options, **search),
            lm=lm,
            timestamps=word_timestamps,
            batch_size=batch_size,
            segmenter=_with_vad(self.segmenter(segmenter), vad),
        )

    def search_options(self, options: SearchOptions | None = None, **changes: Any) -> SearchOptions:
        """Merge search settings.

        Args:
            options: the base settings; None uses `default_options`.
            **changes: `SearchOptions` fields to set.

        Returns:
            `options` with `changes` applied.

        Raises:
            TypeError: a keyword that is not among `SEARCH_KEYWORDS` (named), or options of
                another kind.
            ValueError: a value out of range (`SearchOptions` says which).
        """
        unknown = sorted(set(changes) - set(SEARCH_KEYWORDS))
        if unknown:
            raise _unknown_keywords(unknown)
        _check_kind("options", options, SearchOptions, "beam_size=1", keywords=True)
        return replace(self.default_options if options is None else options, **changes)

    @torch.no_grad()
    def search(
        self,
        waves: Sequence[Tensor],
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
    ) -> list[Decoded]:
        """Decode one batch of waveforms, each as one utterance.

        Args:
            waves: mono waveforms `(S_i,)` at `sample_rate`.
            options: search settings (see `transcribe`).
            lm: language model for shallow fusion.

        Returns:
            One `Decoded` per wave, in order.

        Raises:
            ValueError: options the model cannot decode with (`check_options`).
            TypeError: options of another kind, or an `lm` that is no language model.
        """
        options = self.default_options if options is None else options
        self.check_options(options, lm)  # of another kind too
        if not waves:
            return []
        return decode_batch(self.model, *self.pad(waves), self.bounded(options), lm, self.precision)

    def check_options(
        self,
        options: SearchOptions | None,
        lm: LanguageModel | None = None,
        timestamps: str = "attention",
    ) -> None:
        """Raise ValueError where the options need a CTC head or an LM that is missing;
        TypeError where they are of another kind, or `lm` is no language model (a path)."""
        _check_kind("options", options, SearchOptions, "beam_size=1")
        options = self.default_options if options is None else options
        if options.ctc_weight > 0 and self.model.ctc is None:
            raise ValueError(
                f"{self.checkpoint}: ctc_weight={options.ctc_weight} but the model has no CTC head"
            )
        check_language_model(options.lm_weight, lm, self.model.decoder.vocab_size, self.vocabulary)
        alignment.check_timestamps(timestamps)
        if timestamps == "ctc" and self.model.ctc is None:
            raise ValueError(f"{self.checkpoint}: timestamps='ctc' needs a CTC head")

    def load_lm(self, path: str | os.PathLike) -> torch.nn.Module:
        """The language model of an LM checkpoint, for `lm=`, on this model's device; its
        vocabulary must be this model's.

        Raises:
            CheckpointError: the file holds no LM (named).
            ValueError: the LM's vocabulary differs from the model's.
        """
        lm, _ = load_lm(path, self.device)
        try:
            check_language_model(1.0, lm, self.model.decoder.vocab_size, self.vocabulary)
        except ValueError as error:
            raise ValueError(f"{path}: {error} (the recognizer: {self.checkpoint})") from None
        return lm

    @cached_property
    def vocabulary(self) -> tuple[str, ...]:
        """The tokenizer's piece of each token id."""
        return tuple(self.tokenizer.pieces(range(self.tokenizer.vocab_size)))

    def pad(self, waves: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """Waves `(S_i,)` as a zero-padded batch `(B, S)` and lengths `(B,)` on the device."""
        lens = torch.tensor([len(w) for w in waves], dtype=torch.long)
        batch = torch.zeros(len(waves), int(lens.max()))
        for row, wave in enumerate(waves):
            batch[row, : len(wave)] = wave
        return batch.to(self.device, input_dtype(self.model)), lens.to(self.device)

    transcript = alignment.transcript
    words = alignment.words
    token_times = alignment.token_times
    align_tokens = alignment.align_tokens
    timed_words = alignment.timed_words

    def stream(
        self, options: StreamOptions | None = None, lm: LanguageModel | None = None, **changes: Any
    ) -> Stream:
        """A live stream: `accept(samples)` as audio comes, `partial`, then `final()`.

        Args:
            options: how the stream is decoded; None uses `StreamOptions()`.
            lm: language model for rescoring finals (with `lm_weight > 0`).
            **changes: `StreamOptions` fields to set (e.g. `chunk_ms=320`), and its
                `EndpointOptions` fields (e.g. `silence_from="silero"`).

        Returns:
            A `Stream` (`asr.streaming`), its samples mono float at `sample_rate`.

        Raises:
            TypeError: a keyword that is neither (named), options or endpoint rules of another
                kind, or an `lm` that is no language model (a path).
            ValueError: the model cannot stream (no CTC head, a frontend that needs the whole
                recording, an encoder that is not chunk-streaming), options out of range or not
                numbers, or endpoint settings with `endpoint=None` (no endpoints).
        """
        return StreamingEngine(self, _stream_options(options, changes), lm).stream()

    def align(self, audio: AudioInput, text: str, sample_rate: int | None = None) -> Alignment:
        """Align a known transcript to audio by teacher forcing the decoder.

        Args:
            audio: a file path or a mono waveform `(S,)` (see `transcribe`).
            text: the transcript; normalised and tokenised by the model's tokenizer.
            sample_rate: the rate of an array `audio`; None means the model's rate.

        Returns:
            The `Alignment`: attention and CTC word times, attention maps, features.

        Raises:
            ValueError: the text is empty, has characters the tokenizer cannot represent, or
                has more tokens (and repeats, which CTC separates by a blank) than the audio
                has encoder frames: no alignment of it means anything.
        """
        oov = self.tokenizer.oov(text)
        if oov:
            raise ValueError(f"text has characters outside the model's vocabulary: {oov}")
        tokens = self.tokenizer.encode(text)
        if not tokens:
            raise ValueError(f"text {text!r} is empty after normalisation")
        return self.align_tokens(self.load(audio, sample_rate), tokens, strict=True)

    def load(self, audio: AudioInput, sample_rate: int | None = None) -> Tensor:
        """A file path or a waveform as a mono float32 tensor `(S,)` at `sample_rate`."""
        if isinstance(audio, (str, os.PathLike)):
            if sample_rate is not None:  # a file reads its own: a bad one is still said
                check_sample_rate(sample_rate)
            return load_audio(from_home(audio), self.sample_rate)
        return as_waveform(audio, sample_rate, self.sample_rate)


def _unknown_keywords(names: Sequence[str]) -> TypeError:
    """The TypeError for unknown keywords, with close matches."""
    own = [
        p.name
        for p in inspect.signature(Recognizer.transcribe_batch).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return TypeError(
        f"unknown keyword argument {_named(names, [*own, *SEARCH_KEYWORDS])}; transcribe takes "
        f"{', '.join(own)} and the search settings {', '.join(SEARCH_KEYWORDS)}"
    )


def _named(names: Sequence[str], choices: Sequence[str]) -> str:
    """`'name' (did you mean 'close'?), ...` for unknown keywords."""
    named = []
    for name in names:
        close = get_close_matches(name, choices, n=1)
        named.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ", ".join(named)


def _stream_options(options: StreamOptions | None, changes: dict[str, Any]) -> StreamOptions:
    """`options` with `changes` to its fields and its endpoint's fields applied."""
    own = [f.name for f in fields(StreamOptions)]
    endpoint_fields = [f.name for f in fields(EndpointOptions)]
    unknown = sorted(set(changes) - {*own, *endpoint_fields})
    if unknown:
        raise TypeError(
            f"unknown keyword argument {_named(unknown, [*own, *endpoint_fields])}; stream takes "
            f"the StreamOptions fields {', '.join(own)} and the EndpointOptions fields "
            f"{', '.join(endpoint_fields)}"
        )
    _check_kind("options", options, StreamOptions, "chunk_ms=320", keywords=True)
    options = StreamOptions() if options is None else options
    options = replace(options, **{k: changes[k] for k in own if k in changes})
    endpoint = {k: changes[k] for k in endpoint_fields if k in changes}
    if endpoint and options.endpoint is None:
        raise ValueError(f"{', '.join(endpoint)} given with endpoint=None (no endpoints)")
    return replace(options, endpoint=replace(options.endpoint, **endpoint)) if endpoint else options


def _check_kind(name: str, given: Any, kind: type, example: str, keywords: bool = False) -> None:
    """TypeError where `given`, the argument `name`, is neither None nor a `kind`; `keywords`:
    the call takes its fields as keywords too."""
    if given is not None and not isinstance(given, kind):
        alone = f", or {example} alone to change one field" if keywords else ""
        raise TypeError(
            f"{name} must be a {kind.__name__} ({kind.__module__}), got {type(given).__name__}: "
            f"{kind.__name__}({example}){alone}"
        )


def _with_vad(segmenter: SegmenterOptions, vad: str | None) -> SegmenterOptions:
    return segmenter if vad is None else replace(segmenter, vad=vad)


def stored_search(path: str | os.PathLike) -> SearchOptions | None:
    """The search settings a recognizer `path` stores (`asr finalize`), None where it stores
    none, read without building the network (a `--workers` parent checks options by them)."""
    path = _model_path(path)
    _, payload = read_recognizer(path)
    return _stored_search(payload, path)[0]


def _model_path(path: str | os.PathLike) -> str | os.PathLike:
    """A checkpoint or package path with `~` read as a shell would (`~/models/an4`); an
    hf:// name as it is."""
    return path if str(path).startswith(HF_PREFIX) else os.path.expanduser(path)


def _stored_search(
    payload: dict[str, Any], path: str | os.PathLike
) -> tuple[SearchOptions | None, PlattScaling | None]:
    """The payload's stored search settings and word-confidence scaling (None where absent);
    CheckpointError where they do not load."""
    scaling = payload.get("confidence_scaling")
    try:
        search = SearchOptions(**payload["decoding"]) if "decoding" in payload else None
        confidence = None if scaling is None else PlattScaling.from_dict(scaling)
    except (TypeError, KeyError, ValueError) as err:  # a newer asr's option, an edited file
        raise CheckpointError(
            f"{path}: its stored decoding or confidence settings do not load "
            f"({type(err).__name__}: {err}); an edited file, or one a newer asr wrote?"
        ) from None
    return search, confidence


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    backend: str = "torch",
) -> Recognizer:
    """Rebuild a recognizer from a checkpoint, package folder or Hugging Face Hub name.

    Args:
        path: an `asr fit` checkpoint (or `asr average` output), a package folder
            (`asr export`), or `hf://owner/name[@revision]`.
        device: where the model runs.
        precision: "fp32" or "bf16" (see `Recognizer.precision`).
        backend: "torch", or "onnx" / "onnx-int8" (ONNX Runtime on the CPU, from a package).

    Returns:
        The `Recognizer`, with the settings the checkpoint stores.

    Raises:
        CheckpointError: not a recognizer checkpoint or package, or unsafe to load (named).
        ValueError: an unknown backend, ONNX on a device other than the CPU or in bf16, or
            a CUDA device where there is none.
        FileNotFoundError: the package has no such ONNX graphs (named).
    """
    check_precision(precision)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: no CUDA device is available (device='cpu')")
    path = _model_path(path)
    model, tokenizer, payload = load_seq2seq(path, device, backend, precision)
    search, confidence = _stored_search(payload, path)
    maps = getattr(model.decoder, "num_attention_maps", None)
    segment_seconds, tokens_per_second, heads = _stored_settings(payload, path, maps)
    return Recognizer(
        model,
        tokenizer,
        model.sample_rate,
        str(path),
        precision,
        segment_seconds,
        search,
        tokens_per_second,
        heads,
        confidence,
        backend,
    )


def _stored_settings(
    payload: dict[str, Any], path: str | os.PathLike, maps: int | None
) -> tuple[float | None, float | None, list[int] | None]:
    """The payload's segment_seconds, tokens_per_second and alignment_heads (indices into the
    decoder's `maps`); CheckpointError names `path` where one is malformed (an edited package
    config), not a later transcribe."""

    def within(name: str, low: float, high: float) -> float | None:
        value = payload.get(name)
        if value is None or (_is_number(value) and low <= value <= high):
            return value
        raise CheckpointError(f"{path}: {name} is {value!r}, not a number in [{low:g}, {high:g}]")

    heads = payload.get("alignment_heads")
    if heads is not None and not (
        isinstance(heads, list)
        and heads
        and all(_is_index(h) and (maps is None or h < maps) for h in heads)
    ):
        raise CheckpointError(
            f"{path}: alignment_heads is {heads!r}, not a list of indices into the decoder's "
            f"{maps} attention maps"
        )
    # segments no shorter than `asr fit` stores (one of 2 s or less leaves no room for the
    # windows' overlap); speech of at most 1000 tokens/s
    return (
        within("segment_seconds", SHORTEST_MAX_SEGMENT, 1e6),
        within("tokens_per_second", 1e-3, 1e3),
        heads,
    )


def _inputs_column(audios: Any) -> bool:
    """Whether `audios` is an array `(N,)` or `(N, 1)` of inputs, each a file path or (in an
    array of objects) a waveform, as a data frame's column holds them."""
    inputs = (str, os.PathLike, np.ndarray, Tensor)
    return (
        isinstance(audios, np.ndarray)
        and audios.dtype.kind in "UO"
        and (audios.ndim == 1 or (audios.ndim == 2 and audios.shape[1] == 1))
        and audios.size > 0
        and all(isinstance(a, inputs) for a in audios.reshape(-1))
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
