"""`load_model` -> `Recognizer`: the facade for inference with a trained model.

    recognizer = asr.load_model("exp/an4/conformer/avg.ckpt")
    transcript = recognizer.transcribe("utt.wav", beam_size=10, ctc_weight=0.5)
    transcript.text, transcript.words  # words with start/end seconds

`transcribe` and `transcribe_batch` take their settings as keywords (`SearchOptions` fields
among them, merged by `search_options`) and run `asr.transcribe`; `search` decodes a batch of
waveforms (`asr.decoding`); times, words and alignment are `asr.alignment`'s. Nothing here
imports Lightning.
"""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from difflib import get_close_matches
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from asr import alignment
from asr.audio import AudioInput, as_waveform, load_audio
from asr.confidence import PlattScaling
from asr.decoding import decode_batch
from asr.loading import load_seq2seq
from asr.models.seq2seq import Seq2Seq
from asr.precision import check_precision
from asr.results import Alignment, BatchResult, Decoded, Transcript
from asr.search import (
    DEFAULT_CTC_WEIGHT,
    LanguageModel,
    SearchOptions,
    length_bound,
)
from asr.segment import SegmenterOptions
from asr.text import Tokenizer
from asr.transcribe import TRANSCRIBE_BATCH_SIZE, transcribe_sources

# The `SearchOptions` fields `transcribe` takes as keywords. A recognizer keeps `nbest`
# hypotheses per segment, the best and `nbest - 1` alternatives; None: the best alone.
SEARCH_KEYWORDS = tuple(f.name for f in fields(SearchOptions))


@dataclass
class Recognizer:
    """A trained recognizer ready for inference.

    Build one with `load_model`, or wrap an in-memory model (in eval mode) directly.
    """

    model: Seq2Seq  # the plain module, in eval mode
    tokenizer: Tokenizer
    sample_rate: int  # audio rate the frontend expects
    checkpoint: str  # where it was loaded from
    # "bf16": `search` runs the frontend, encoder and CTC head, and `align` the whole model,
    # under bf16 autocast (asr.precision); the decoder steps of a search too when they hold at
    # least `BF16_STEP_ROWS` hypotheses (batch x beam). What they return stays float32.
    precision: str = "fp32"
    # The longest segment `transcribe` cuts long audio into by default: about the length of
    # the training utterances (`asr.segment.segment_seconds_for`, stored by `asr fit`).
    # None: `SegmenterOptions`' 20 s.
    segment_seconds: float | None = None
    # The search settings used where none are given: those the recipe chose on dev and stored
    # in the checkpoint (`asr finalize`); None: `SearchOptions()`, with CTC weight
    # `DEFAULT_CTC_WEIGHT` where the model has a CTC head.
    decoding: SearchOptions | None = None
    # Tokens per second (eos included) of the fastest training utterance, speed perturbation
    # included (`asr.search.fastest_speech`, stored by `asr fit`): searches may emit
    # `RATE_MARGIN` times this whatever `max_len_ratio` says. None: `max_len_ratio` alone.
    tokens_per_second: float | None = None
    # The cross-attention maps whose DTW word times agree best with CTC forced alignment on dev
    # (`asr finalize`); None: all maps, averaged.
    alignment_heads: list[int] | None = None
    # Maps word probabilities to confidences that match the share of words right on dev
    # (`asr finalize`); None: confidence = probability.
    confidence_scaling: PlattScaling | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)

    def segmenter(self) -> SegmenterOptions:
        """How `transcribe` splits long audio when not told: segments of at most
        `segment_seconds`."""
        if self.segment_seconds is None:
            return SegmenterOptions()
        return SegmenterOptions(max_segment_seconds=self.segment_seconds)

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
    def frame_seconds(self) -> float:
        """Seconds per encoder frame, measured (`Seq2Seq.encoder_timing`)."""
        return self._encoder_timing[0]

    @cached_property
    def _encoder_timing(self) -> tuple[float, float]:
        return self.model.encoder_timing()

    @cached_property
    def shortest_input(self) -> int:
        """The fewest samples the model gives a transcript of; `transcribe` gives shorter
        audio an empty one (`Seq2Seq.shortest_input`)."""
        return self.model.shortest_input()

    @cached_property
    def feature_seconds(self) -> float:
        """Seconds per feature frame (the frontend's hop), measured like `frame_seconds`."""
        return self.model.feature_seconds()

    def bounded(self, options: SearchOptions) -> SearchOptions:
        """`options` with the output bound raised to what the fastest training speech needs
        (`asr.search.length_bound`)."""
        if self.tokens_per_second is None:
            return options
        asked = (options.max_len_ratio, options.max_len_extra)
        bound = length_bound(*asked, self.tokens_per_second, *self._encoder_timing)
        if bound == asked:
            return options
        return replace(options, max_len_ratio=bound[0], max_len_extra=bound[1])

    # ------------------------------------------------------------------ decoding

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
        """Transcribe one recording of any length.

        Audio longer than `segmenter.max_segment_seconds` is split on silence and decoded in
        batches of segments (files are read a segment at a time; see `asr.transcribe`).

            recognizer.transcribe("talk.m4a", beam_size=10, ctc_weight=0.5)
            recognizer.transcribe(wave, sample_rate=8000, word_timestamps="ctc")

        Args:
            audio: a file path (any rate, any format libsndfile or FFmpeg reads: WAV, FLAC,
                MP3, m4a, MP4, WebM, ...), or a mono waveform `(S,)` as a numpy array or tensor.
            sample_rate: the rate of an array `audio`; None means the model's rate. Files
                carry their own.
            word_timestamps: how token and word times are found: "attention" (DTW over
                cross-attention) or "ctc" (forced alignment of the hypothesis with the CTC
                head; `TIMESTAMP_METHODS`).
            options: search settings; None uses `default_options`. A beam of 1 without CTC
                or LM weight runs greedy search.
            lm: language model for shallow fusion (with `lm_weight > 0`).
            batch_size: segments of long audio decoded together.
            segmenter: how long audio is split; None uses `self.segmenter()`.
            vad: what finds the speech to cut long audio at: "energy" or "silero" (Silero VAD,
                which also drops inputs without speech); None: `segmenter`'s ("energy").
            **search: `SearchOptions` fields (`SEARCH_KEYWORDS`: beam_size, ctc_weight,
                lm_weight, length_bonus, max_len_ratio, ...) set over `options`.

        Returns:
            The `Transcript`, times in seconds of the input.

        Raises:
            AudioError: the input cannot be read or decoded; the message names it and says
                why (a ValueError).
            ValueError: settings out of range, or that the model cannot decode with.
            TypeError: an unknown keyword (named).
        """
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
        """Transcribe several recordings, decoding up to `batch_size` segments together
        (sorted by length). Arguments as `transcribe`; an input that cannot be read or
        decoded fails alone.

            results = recognizer.transcribe_batch(paths, beam_size=4)
            texts = [r.transcript.text for r in results if r.error is None]
            transcripts = [r.transcript_or_raise() for r in results]  # raise at the first failure

        Returns:
            One `BatchResult` per input, in input order: its `name` (the path, or
            `<waveform i>`) and its `transcript`, or where it failed, its `error` (an
            `AudioError` naming it, with the `reason`).

        Raises:
            ValueError: settings out of range, or that the model cannot decode with (before
                any input is read).
            TypeError: an unknown keyword (named).
        """
        alignment.check_timestamps(word_timestamps, "word_timestamps")
        return transcribe_sources(
            self,
            audios,
            sample_rate=sample_rate,
            options=self.search_options(options, **search),
            lm=lm,
            timestamps=word_timestamps,
            batch_size=batch_size,
            segmenter=_with_vad(segmenter or self.segmenter(), vad),
        )

    def search_options(self, options: SearchOptions | None = None, **changes: Any) -> SearchOptions:
        """`options` (None: `default_options`) with the fields named in `changes` set.

        Raises:
            TypeError: a keyword that is not among `SEARCH_KEYWORDS` (named).
            ValueError: a value out of range (`SearchOptions` says which).
        """
        unknown = sorted(set(changes) - set(SEARCH_KEYWORDS))
        if unknown:
            raise _unknown_keywords(unknown)
        return replace(options or self.default_options, **changes)

    @torch.no_grad()
    def search(
        self,
        waves: Sequence[Tensor],
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
    ) -> list[Decoded]:
        """Decode one batch of waveforms, each as one utterance (`asr.decoding.decode_batch`).

        Args:
            waves: mono waveforms `(S_i,)` at `sample_rate`.
            options: search settings (see `transcribe`).
            lm: language model for shallow fusion.

        Returns:
            One `Decoded` per wave, in order.
        """
        options = options or self.default_options
        self.check_options(options, lm)
        if not waves:
            return []
        return decode_batch(self.model, *self.pad(waves), self.bounded(options), lm, self.precision)

    def check_options(
        self,
        options: SearchOptions | None,
        lm: LanguageModel | None = None,
        timestamps: str = "attention",
    ) -> None:
        """Raise ValueError where the options need a CTC head or an LM that is missing."""
        options = options or self.default_options
        if options.ctc_weight > 0 and self.model.ctc is None:
            raise ValueError(
                f"{self.checkpoint}: ctc_weight={options.ctc_weight} but the model has no CTC head"
            )
        if options.lm_weight > 0 and lm is None:
            raise ValueError(f"lm_weight={options.lm_weight} but no language model was given")
        alignment.check_timestamps(timestamps)
        if timestamps == "ctc" and self.model.ctc is None:
            raise ValueError(f"{self.checkpoint}: timestamps='ctc' needs a CTC head")

    def pad(self, waves: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """Waves `(S_i,)` as a zero-padded batch `(B, S)` and lengths `(B,)` on the device."""
        lens = torch.tensor([len(w) for w in waves], dtype=torch.long)
        batch = torch.zeros(len(waves), int(lens.max()))
        for row, wave in enumerate(waves):
            batch[row, : len(wave)] = wave
        return batch.to(self.device), lens.to(self.device)

    # Times, words and alignment (`asr.alignment`).
    transcript = alignment.transcript
    words = alignment.words
    token_times = alignment.token_times
    align_tokens = alignment.align_tokens
    timed_words = alignment.timed_words

    def align(self, audio: AudioInput, text: str, sample_rate: int | None = None) -> Alignment:
        """Align a known transcript to audio by teacher forcing the decoder.

        Args:
            audio: a file path or a mono waveform `(S,)` (see `transcribe`).
            text: the transcript; normalised and tokenised by the model's tokenizer.
            sample_rate: the rate of an array `audio`; None means the model's rate.

        Returns:
            The `Alignment`: attention and CTC word times, attention maps, features.

        Raises:
            ValueError: the text is empty or has characters the tokenizer cannot represent.
        """
        oov = self.tokenizer.oov(text)
        if oov:
            raise ValueError(f"text has characters outside the model's vocabulary: {oov}")
        tokens = self.tokenizer.encode(text)
        if not tokens:
            raise ValueError(f"text {text!r} is empty after normalisation")
        return self.align_tokens(self.load(audio, sample_rate), tokens)

    def load(self, audio: AudioInput, sample_rate: int | None = None) -> Tensor:
        """A file path or a waveform as a mono float32 tensor `(S,)` at `sample_rate`."""
        if isinstance(audio, (str, os.PathLike)):
            return load_audio(audio, self.sample_rate)
        return as_waveform(audio, sample_rate or self.sample_rate, self.sample_rate)


def _unknown_keywords(names: Sequence[str]) -> TypeError:
    """The error for keywords `transcribe` does not take: each named, with a close match where
    there is one, then what it does take."""
    own = [
        p.name
        for p in inspect.signature(Recognizer.transcribe_batch).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    named = []
    for name in names:
        close = get_close_matches(name, [*own, *SEARCH_KEYWORDS], n=1)
        named.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return TypeError(
        f"unknown keyword argument {', '.join(named)}; transcribe takes {', '.join(own)} "
        f"and the search settings {', '.join(SEARCH_KEYWORDS)}"
    )


def _with_vad(segmenter: SegmenterOptions, vad: str | None) -> SegmenterOptions:
    return segmenter if vad is None else replace(segmenter, vad=vad)


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    backend: str = "torch",
) -> Recognizer:
    """Rebuild a recognizer, to run in `precision` ("fp32" or "bf16": see
    `Recognizer.precision`), from `path`: an `asr fit` checkpoint (or an `asr average`
    output), a model package folder (`asr export`), or `hf://owner/name[@revision]`, a package
    on the Hugging Face Hub (fetched once into its cache; found there with `HF_HUB_OFFLINE=1`).

    `backend` "onnx" (or "onnx-int8", the quantised graphs) runs the encoder, CTC head and
    decoder in ONNX Runtime on the CPU (`asr.onnx_runtime`), from a package folder exported
    with `asr export --format onnx`; "torch" runs everything in PyTorch.

    Raises:
        CheckpointError: the file is not a recognizer checkpoint written by `asr fit`, or not
            a model package, or refuses to load safely (a pickle); the message names it.
        ValueError: an unknown backend, or ONNX on a device other than the CPU or in bf16.
        FileNotFoundError: the package has no such ONNX graphs (named).
    """
    check_precision(precision)
    model, tokenizer, payload = load_seq2seq(path, device, backend, precision)
    scaling = payload.get("confidence_scaling")
    return Recognizer(
        model,
        tokenizer,
        model.sample_rate,
        str(path),
        precision,
        payload.get("segment_seconds"),
        SearchOptions(**payload["decoding"]) if "decoding" in payload else None,
        payload.get("tokens_per_second"),
        payload.get("alignment_heads"),
        None if scaling is None else PlattScaling.from_dict(scaling),
    )
