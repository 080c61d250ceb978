"""Live recognition: audio in as it comes, partial transcripts chunk by chunk, finals at endpoints.

`Recognizer.stream()` gives a `Stream`: `accept(samples)` feeds audio and returns the utterances
an endpoint closed, `partial` is the live text, `final()` ends the audio. A chunk-streaming
encoder (`ConformerEncoder(causal=True)` or `TransformerEncoder`, best trained with
`dynamic_chunk`) runs chunk by chunk over a cache of its left context, and a CTC prefix beam
search reads each chunk; at an endpoint the attention decoder rescores the n-best (or, with
`final_search="beam"`, a joint CTC/attention beam search runs over the utterance's frames, as
`transcribe` searches) and the final gets word times and confidences as `transcribe`'s do.
Several streams step through the model together (`StreamingEngine.run`), as a server batches
its clients.

Chunking is fixed by the model's frames, never by how the audio arrives, so a stream's results
do not depend on how its audio is split. Each utterance starts afresh (no left context), and
`first_chunk_ms` can make its first chunk longer than the rest: the opening word, which has no
context before it, then sees more of itself, for a later first partial.
"""

from __future__ import annotations

import math
import os
import warnings
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from asr import alignment
from asr.audio import mono_samples
from asr.ctc_beam import CTCPrefixBeam, EndpointOptions
from asr.decoding import (
    at_least_float32,
    empty_ctc_log_prob,
    search_encoded,
    teacher_forced,
)
from asr.frontends import GlobalCMVN, features_of
from asr.frontends.features import num_frames
from asr.levels import SILENT_DB, frame_energy_db, loud_level
from asr.models.blocks import min_input_length
from asr.models.chunking import EncoderCache, streaming_problem
from asr.precision import autocast, input_dtype
from asr.results import Decoded, Transcript
from asr.search import (
    MAX_LM_WEIGHT,
    STREAM_BEAM,
    STREAM_CTC_WEIGHT,
    Hypothesis,
    LanguageModel,
    check_language_model,
    option_number,
)
from asr.segment import Span
from asr.text import PAD_ID, SOS_EOS_ID
from asr.transcribe import join_segments
from asr.vad import LEVEL_FRAME_SECONDS, StreamingVAD

if TYPE_CHECKING:
    from asr.recognizer import Recognizer


FINAL_SEARCHES = ("rescore", "beam")


@dataclass(frozen=True)
class StreamOptions:
    """How a live stream is decoded."""

    # audio per encoder chunk; None: full context, each utterance decoded at its end (the
    # endpoint's max_utterance at most: silence is not heard before that)
    chunk_ms: float | None = 640.0
    first_chunk_ms: float | None = None  # each utterance's first chunk; None: chunk_ms
    # None: the model's own search (asr finalize), else STREAM_BEAM and STREAM_CTC_WEIGHT
    # (a beam final: offline's defaults, Recognizer.default_options)
    beam: int | None = None  # CTC prefixes kept, and rescored at an endpoint
    ctc_weight: float | None = None  # rescoring: ctc_weight * CTC + (1 - ctc_weight) * attention
    lm_weight: float = 0.0  # and + lm_weight * the language model's score (given an LM)
    max_context_ms: float | None = None  # left context attention keeps; None: the utterance
    endpoint: EndpointOptions | None = field(default_factory=EndpointOptions)  # None: at the end
    final_search: str = "rescore"  # the CTC n-best rescored, or "beam": a joint beam search

    def __post_init__(self) -> None:
        optional = ("chunk_ms", "first_chunk_ms", "beam", "ctc_weight", "max_context_ms")
        for name in (*optional, "lm_weight"):  # "640" failed deep in the stream
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            value = option_number(f"StreamOptions: {name}", value, whole=name == "beam")
            object.__setattr__(self, name, value)  # numpy's: JSON messages take no such number
        if self.endpoint is not None and not isinstance(self.endpoint, EndpointOptions):
            raise TypeError(
                f"StreamOptions: endpoint must be an EndpointOptions (asr.ctc_beam) or None, got "
                f"{type(self.endpoint).__name__}: stream(trailing_silence=1.0) sets one field"
            )
        if self.final_search not in FINAL_SEARCHES:
            raise ValueError(
                f"final_search must be one of {FINAL_SEARCHES}, got {self.final_search!r}"
            )
        for name in ("chunk_ms", "first_chunk_ms", "max_context_ms"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be positive and finite (or None), got {value}")
        chunked_only = [n for n in ("first_chunk_ms", "max_context_ms") if getattr(self, n)]
        if self.chunk_ms is None and chunked_only:
            raise ValueError(
                f"{', '.join(chunked_only)}: settings of chunks, and chunk_ms None decodes at "
                "full context"
            )
        if self.chunk_ms is None and self.endpoint and self.endpoint.silence_from == "silero":
            raise ValueError(
                "silence_from='silero' hears the silence between chunks, and chunk_ms None "
                "decodes nothing before an utterance ends"
            )
        if None not in (self.chunk_ms, self.first_chunk_ms) and self.first_chunk_ms < self.chunk_ms:
            raise ValueError(
                f"first_chunk_ms ({self.first_chunk_ms:g}) must be at least chunk_ms "
                f"({self.chunk_ms:g})"
            )
        if self.ctc_weight is not None and not 0.0 <= self.ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must be in [0, 1], got {self.ctc_weight}")
        if self.beam is not None and self.beam < 1:
            raise ValueError(f"beam must be at least 1, got {self.beam}")
        if not 0 <= self.lm_weight <= MAX_LM_WEIGHT:
            raise ValueError(f"lm_weight must lie in [0, {MAX_LM_WEIGHT:g}], got {self.lm_weight}")


def _with_model_search(options: StreamOptions, recognizer: Recognizer) -> StreamOptions:
    """`options` with the beam and CTC weight it leaves open taken from the model's stored
    search, as offline decoding takes them. A model without one: the streaming defaults for
    rescoring, the offline ones for a beam final (offline's own search)."""
    stored = recognizer.decoding
    if stored is None and options.final_search == "beam":
        stored = recognizer.default_options
    beam = options.beam or (stored.beam_size if stored is not None else STREAM_BEAM)
    ctc_weight = options.ctc_weight
    if ctc_weight is None:
        ctc_weight = stored.ctc_weight if stored is not None else STREAM_CTC_WEIGHT
    return replace(options, beam=beam, ctc_weight=ctc_weight)


def _framing(features: torch.nn.Module) -> tuple[int, int]:
    """The frame length and shift (samples) of a snip-edges feature module."""
    for part in (
        features,
        getattr(features, "spectrogram", None),
        getattr(features, "log_mel", None),
    ):
        part = getattr(part, "spectrogram", part)
        if hasattr(part, "win_length") and hasattr(part, "hop_length"):
            return int(part.win_length), int(part.hop_length)
    raise ValueError(f"{type(features).__name__}: no win_length/hop_length, so it cannot stream")


def encoder_frames(ms: float | None, frame_seconds: float) -> int | None:
    """Encoder frames in `ms` milliseconds, at least one (None stays None)."""
    if ms is None:
        return None
    return max(1, round(ms / 1000 / frame_seconds))


def streaming_encoder(recognizer: Recognizer, chunked: bool) -> torch.nn.Module:
    """The recognizer's encoder; ValueError where it cannot run chunk by chunk, or (`chunked`)
    cannot stream in chunks (e.g. convolutions that see the next frames)."""
    encoder = recognizer.model.encoder
    if not hasattr(encoder, "forward_chunk"):
        raise ValueError(
            getattr(encoder, "cannot_stream", None)
            or f"{recognizer.checkpoint}: {type(encoder).__name__} cannot run chunk by chunk"
        )
    problem = streaming_problem(encoder) if chunked else None
    if problem is not None:
        raise ValueError(f"{recognizer.checkpoint}: {problem}")
    if chunked and getattr(encoder, "chunk_training", True) is None:
        warnings.warn(
            f"{recognizer.checkpoint}: trained at full context only (no dynamic_chunk), so it "
            "loses accuracy in chunks; a streaming config trains for them (docs/streaming.md)",
            stacklevel=3,
        )
    return encoder


LEVELLED = "the model's frontend normalises each utterance's level, which needs the whole recording"
UNLEVELLED = "a config without `level` (conf/<corpus>/conformer_streaming.yaml)"


def check_streamable_frontend(recognizer: Recognizer) -> None:
    """ValueError naming the checkpoint where the frontend needs the whole recording."""
    try:
        FeatureStream(recognizer.model.frontend)
    except ValueError as error:
        raise ValueError(f"{recognizer.checkpoint}: {error}") from None


def mask_chunks(recognizer: Recognizer, chunk_ms: float | None) -> None:
    """Decode offline as the model streams: its encoder's self-attention under the mask of
    chunks of `chunk_ms`, every chunk before in view (None or 0: full context again). The joint
    beam search over it gives the live `final_search="beam"` finals (one utterance a recording).
    It sets the recognizer's encoder: every whole-sequence pass of it takes the mask, those of
    its full-context streams (`chunk_ms=None`) too."""
    chunk_ms = chunk_ms or None
    if chunk_ms is not None and not 0 < chunk_ms < math.inf:  # nan and inf too
        raise ValueError(f"chunk_ms must be positive (0 or None: full context), got {chunk_ms}")
    if chunk_ms is None:  # any model decodes at full context
        if hasattr(recognizer.model.encoder, "chunk"):
            recognizer.model.encoder.chunk = None
        return
    if getattr(recognizer.model.frontend, "level", None) is not None:  # offline at 0, though
        raise ValueError(
            f"{recognizer.checkpoint}: {LEVELLED}: it cannot stream, so no chunk size measures "
            f"a live decode of it: score it at full context (--chunk-ms 0), or train {UNLEVELLED}"
        )
    check_streamable_frontend(recognizer)  # else no live decode gives what this measures
    encoder = streaming_encoder(recognizer, chunked=True)
    if not hasattr(encoder, "chunk"):  # an ONNX graph, traced at full context
        raise ValueError(
            f"{recognizer.checkpoint}: {type(encoder).__name__} cannot mask chunks: decode "
            "with the PyTorch backend, or stream"
        )
    encoder.chunk = encoder_frames(chunk_ms, recognizer.frame_seconds)


class FeatureStream:
    """The frontend's features and normalisation on audio that arrives in pieces: each frame
    is computed once, as soon as its window is complete, equal to the whole-file frames."""

    def __init__(self, frontend: torch.nn.Module) -> None:
        if getattr(frontend, "level", None) is not None:
            raise ValueError(
                f"{LEVELLED}: it cannot stream, at full context (--chunk-ms 0) neither, as "
                "features are made while audio arrives; `asr transcribe` decodes it, or train "
                f"{UNLEVELLED}"
            )
        normalize = getattr(frontend, "normalize", None)
        if normalize is not None and not isinstance(normalize, GlobalCMVN):
            raise ValueError(f"{type(normalize).__name__} needs the whole utterance: cannot stream")
        self.features, self.normalize = features_of(frontend), normalize
        self.win, self.hop = _framing(self.features)
        tensors = [*frontend.parameters(), *frontend.buffers()]
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self.dtype = input_dtype(frontend)  # a float64 model's too
        self.buffer = torch.zeros(0, dtype=self.dtype)
        self.skip = 0  # samples still to drop: those between frames, where hop > win

    @torch.inference_mode()
    def push(self, samples: Tensor) -> Tensor:
        """Samples `(S,)` in, the feature frames they complete out `(N, D)`."""
        buffer = torch.cat([self.buffer, samples.to(self.buffer)])
        dropped = min(self.skip, buffer.numel())
        buffer, self.skip = buffer[dropped:], self.skip - dropped
        frames = int(num_frames(buffer.numel(), self.win, self.hop))
        if frames <= 0:
            self.buffer = buffer
            return torch.zeros(0, self.features.output_dim, dtype=self.dtype)
        used = (frames - 1) * self.hop + self.win
        wave = buffer[None, :used].to(self.device)
        lens = torch.tensor([used], device=self.device)
        feats, lens = self.features(wave, lens)
        if self.normalize is not None:
            feats, lens = self.normalize(feats, lens)
        self.buffer = buffer[frames * self.hop :]
        self.skip = max(0, frames * self.hop - buffer.numel())
        return feats[0, :frames].to(self.dtype).cpu()


class StreamingEngine:
    """A recognizer set up for live streams; steps the chunks of many streams together."""

    def __init__(
        self,
        recognizer: Recognizer,
        options: StreamOptions | None = None,
        lm: LanguageModel | None = None,
    ) -> None:
        self.recognizer = recognizer
        self.options = _with_model_search(options or StreamOptions(), recognizer)
        check_language_model(
            self.options.lm_weight, lm, recognizer.model.decoder.vocab_size, recognizer.vocabulary
        )
        self.lm = lm
        model = recognizer.model
        if model.ctc is None:
            raise ValueError(f"{recognizer.checkpoint}: streaming needs a CTC head")
        check_streamable_frontend(recognizer)  # here, not per stream, and before any warning
        self.encoder = streaming_encoder(recognizer, chunked=self.options.chunk_ms is not None)
        self.factor = self.encoder.subsampling.factor
        self.frame_seconds = recognizer.frame_seconds
        self.chunk = encoder_frames(self.options.chunk_ms, self.frame_seconds)
        self.first_chunk = self.chunk  # each utterance's first chunk (frames)
        if self.chunk is not None and self.options.first_chunk_ms is not None:
            self.first_chunk = encoder_frames(self.options.first_chunk_ms, self.frame_seconds)
        self.max_cache = encoder_frames(self.options.max_context_ms, self.frame_seconds)
        self.min_window = min_input_length(self.factor)
        # At full context nothing is decoded before an utterance ends, and its memory grows as
        # the square of its length: an utterance is cut at the endpoint's longest (input frames).
        self.longest = None
        endpoint = self.options.endpoint
        if self.chunk is None and endpoint is not None:
            hop = _framing(features_of(model.frontend))[1]
            longest = math.ceil(endpoint.max_utterance * recognizer.sample_rate / hop)
            self.longest = max(self.min_window, longest)
        self.search_options = recognizer.bounded(  # final_search="beam": the model's defaults
            recognizer.search_options(
                beam_size=self.options.beam,
                nbest=min(5, self.options.beam),  # the best and 4 alternatives, as rescoring gives
                ctc_weight=self.options.ctc_weight,
                lm_weight=self.options.lm_weight,
            )
        )

    @property
    def chunk_seconds(self) -> float | None:
        return None if self.chunk is None else self.chunk * self.frame_seconds

    @property
    def first_chunk_seconds(self) -> float | None:
        return None if self.first_chunk is None else self.first_chunk * self.frame_seconds

    def window(self, chunk: int) -> int:
        """Input frames a chunk of `chunk` encoder frames reads."""
        return self.encoder.subsampling.chunk_window(chunk)

    def stream(self) -> Stream:
        """A new stream, sharing this engine's model."""
        return Stream(self)

    @torch.inference_mode()
    def run(self, streams: Sequence[Stream]) -> None:
        """Step every stream through all the chunks its audio completes, ready ones batched."""
        while True:
            ready = [s for s in streams if s.ready]
            if not ready:
                return
            self.step(ready)

    @torch.inference_mode()
    def step(self, streams: Sequence[Stream]) -> None:
        """One chunk of each stream in `streams` (all `ready`), through the encoder at once, or
        in two batches where some start an utterance with a longer first chunk (a batch's rows
        must not be padded: causal convolutions cache their last inputs)."""
        if self.chunk is None:  # full context: each an utterance at its longest
            for stream in streams:
                self._encode_whole(stream, stream.take_all(self.longest))
                stream.close_utterance(stream.trailing_silence())
            return
        sizes: dict[int, list[Stream]] = {}
        for stream in streams:
            sizes.setdefault(stream.next_chunk, []).append(stream)
        for chunk, group in sizes.items():
            self._encode(group, [s.take_window(chunk) for s in group])

    def _encode(self, streams: Sequence[Stream], windows: list[Tensor]) -> None:
        device = self.recognizer.device
        lens = torch.tensor([w.size(0) for w in windows], device=device)
        x = windows[0].new_zeros(len(windows), int(lens.max()), windows[0].size(1)).to(device)
        for row, window in enumerate(windows):
            x[row, : window.size(0)] = window
        cache = EncoderCache.merge([s.cache_or_empty(x) for s in streams])
        enc, log_probs, enc_lens, cache = self._encoded(
            self.encoder.forward_chunk, x, lens, cache, self.max_cache
        )
        for row, (stream, kept) in enumerate(zip(streams, cache.split())):
            n = int(enc_lens[row])
            stream.after_chunk(enc[row, :n], log_probs[row, :n], kept)

    @torch.inference_mode()
    def finish(self, stream: Stream) -> None:
        """The end of a stream's audio: its last frames, then its last utterance's final."""
        self.run([stream])
        rest = stream.take_all()
        if self.chunk is None:
            self._encode_whole(stream, rest)
        elif rest.size(0) >= self.min_window:
            self._encode([stream], [rest])
        stream.close_utterance(stream.trailing_silence())

    def _encode_whole(self, stream: Stream, feats: Tensor) -> None:
        """An utterance's input frames `(T, D)` through the whole-sequence encoder."""
        if feats.size(0) >= self.min_window:
            device = self.recognizer.device
            lens = torch.tensor([feats.size(0)], device=device)
            enc, log_probs, _ = self._encoded(self.encoder, feats[None].to(device), lens)
            stream.after_chunk(enc[0], log_probs[0], None, endpoint=False)

    def _encoded(self, encode: Callable[..., tuple], *inputs: Any) -> tuple:
        """`encode(*inputs)`'s encoder output, its CTC log-probabilities, then the rest of what
        it returns; under the recognizer's precision, the outputs at least float32."""
        with autocast(self.recognizer.device, self.recognizer.precision):
            enc, *rest = encode(*inputs)
            log_probs = self.recognizer.model.ctc(enc)
        return at_least_float32(enc), at_least_float32(log_probs), *rest

    def search(self, enc: Tensor, ctc_log_probs: Tensor, num_samples: int) -> Decoded:
        """A joint CTC/attention beam search over one utterance's encoder frames `enc (T, D)`,
        as `transcribe` searches: its hypotheses are not bound to the CTC n-best."""
        lens = torch.tensor([enc.size(0)], device=enc.device)
        ctc = ctc_log_probs[None].float()
        decoder = self.recognizer.model.decoder
        options = self.search_options
        precision = self.recognizer.precision
        nbests, token_logp, _ = search_encoded(
            decoder, enc[None], lens, ctc, options, self.lm, precision
        )
        best = nbests[0]
        return Decoded(
            best[0],
            ctc_log_probs.float().cpu(),
            num_samples,
            token_log_probs=token_logp[0],
            alternatives=best[1:5],
        )

    def rescore(
        self,
        enc: Tensor,
        ctc_log_probs: Tensor,
        nbest: list[tuple[list[int], float]],
        num_samples: int,
    ) -> Decoded:
        """The attention decoder's choice among the CTC n-best of one utterance `enc (T, D)`."""
        decoder = self.recognizer.model.decoder
        frames = enc.size(0)
        tokens = [t for t, _ in nbest]
        enc_b = enc[None].expand(len(tokens), -1, -1)
        lens = torch.full((len(tokens),), frames, device=enc.device)
        token_logp, _, attention = teacher_forced(decoder, enc_b, lens, tokens)
        w = self.options.ctc_weight
        scores = [w * ctc + (1 - w) * float(lp.sum()) for (_, ctc), lp in zip(nbest, token_logp)]
        if self.lm is not None:
            lm_scores = _lm_scores(self.lm, tokens, enc.device)
            scores = [s + self.options.lm_weight * lm for s, lm in zip(scores, lm_scores)]
        order = sorted(range(len(tokens)), key=lambda i: -scores[i])
        hyps = [
            Hypothesis(tokens[i], scores[i], attention[i, :, : len(tokens[i]) + 1].float().cpu())
            for i in order
        ]
        return Decoded(
            hyps[0],
            ctc_log_probs.float().cpu(),
            num_samples,
            token_log_probs=token_logp[order[0]],
            alternatives=hyps[1:5],
        )


def _no_speech_prob(ctc_log_probs: Tensor) -> float:
    """The CTC head's probability of an empty transcript of one utterance `(T, V)`."""
    frames = torch.tensor([ctc_log_probs.size(0)], device=ctc_log_probs.device)
    return float(empty_ctc_log_prob(ctc_log_probs[None].float(), frames)[0].exp())


# An utterance's span (its last word with it) ends this long after its last CTC spike (or
# Silero's speech): the spike comes before the word's acoustic end
SPEECH_TAIL = 0.25


class Stream:
    """One live audio stream (see the module's docstring); made by `Recognizer.stream()`."""

    def __init__(self, engine: StreamingEngine) -> None:
        self.engine = engine
        self.recognizer = engine.recognizer
        self.features = FeatureStream(self.recognizer.model.frontend)
        self.pending = torch.zeros(  # frames not consumed
            0, self.features.features.output_dim, dtype=self.features.dtype
        )
        self.consumed = 0  # feature frames whose encoder outputs are done
        self.samples = 0
        self.decoded_samples = 0  # audio the decoded chunks have read, to their last sample
        # closed utterances, each timed from its span's start
        self.utterances: list[Transcript] = []
        self.spans: list[tuple[float, float]] = []
        self.closed = False
        self._new: list[Transcript] = []
        # Called with each final's span (seconds from the stream's start), its transcript
        # (times from the span's start) and its search result: the explorer keeps its maps.
        self.on_decoded: Callable[[Span, Transcript, Decoded], None] | None = None
        endpoint = engine.options.endpoint
        self.vad = None
        if endpoint is not None and endpoint.silence_from == "silero":
            self.vad = StreamingVAD(self.sample_rate)
        # 10 ms energies (dBFS) of the audio from `_energy_origin` (a frame index) on, which
        # tell an utterance of silence, as the offline splitter does
        self._energy_frame = max(1, round(LEVEL_FRAME_SECONDS * self.sample_rate))
        self._energies = array("d")
        self._energy_origin = 0
        self._energy_pending = np.zeros(0, dtype=np.float32)
        self._start_utterance()

    def _start_utterance(self) -> None:
        self.search = CTCPrefixBeam(self.engine.options.beam)
        self.cache: EncoderCache | None = None
        self.enc: list[Tensor] = []
        self.ctc: list[Tensor] = []
        self.start_frame = self.consumed

    @property
    def sample_rate(self) -> int:
        return self.recognizer.sample_rate

    def accept(self, samples: Tensor | np.ndarray) -> list[Transcript]:
        """Feed audio (mono samples at `sample_rate`, `(S,)`, `(S, 1)` or `(1, S)`: floats, or
        integers such as 16-bit PCM, which are scaled) and decode the chunks it completes.

        Returns:
            The utterances an endpoint closed meanwhile, times from the stream's start.
        """
        self.feed(samples)
        self.engine.run([self])
        return self.take_finals()

    def feed(self, samples: Tensor | np.ndarray) -> None:
        """Add audio without decoding (a server then steps many streams at once)."""
        if self.closed:
            raise ValueError("the stream has ended: start a new one")
        if isinstance(samples, (str, os.PathLike)):  # a path: said as such, not as a wrong type
            raise ValueError(
                f"a stream takes samples (a numpy array or a tensor), not a file path: {samples} "
                "(asr.audio.load_audio reads one)"
            )
        wave = mono_samples(samples)
        self.samples += wave.numel()
        if self.vad is not None:
            self.vad.push(wave.numpy())
        pending = np.concatenate([self._energy_pending, wave.numpy()])
        whole = len(pending) // self._energy_frame * self._energy_frame
        if whole:
            self._energies.extend(frame_energy_db(pending[:whole], self._energy_frame).tolist())
        self._energy_pending = pending[whole:]
        frames = self.features.push(wave)
        if frames.numel():
            self.pending = torch.cat([self.pending, frames])

    def final(self) -> Transcript:
        """End the audio: decode what is left and return the whole stream's transcript."""
        if not self.closed:
            self.engine.finish(self)
            self.closed = True
        duration = self.samples / self.sample_rate
        parts = list(zip(self.spans, self.utterances))
        return join_segments(self.recognizer.tokenizer, parts, duration)

    def take_finals(self) -> list[Transcript]:
        """The utterances closed since the last call."""
        new, self._new = self._new, []
        return new

    @property
    def partial(self) -> str:
        """The live text of the open utterance (its best CTC prefix)."""
        return self.recognizer.tokenizer.decode(self.search.best)

    @property
    def next_chunk(self) -> int | None:
        """Encoder frames of the next chunk: an utterance's first, or the others' size."""
        return self.engine.chunk if self.enc else self.engine.first_chunk

    @property
    def ready(self) -> bool:
        if self.closed:
            return False
        chunk = self.next_chunk
        if chunk is None:  # full context: an utterance at its longest
            longest = self.engine.longest
            return longest is not None and self.pending.size(0) >= longest
        return self.pending.size(0) >= self.engine.window(chunk)

    @property
    def seconds(self) -> float:
        """Audio received, in seconds."""
        return self.samples / self.sample_rate

    @property
    def utterance_start(self) -> float:
        """Where the open utterance starts, in seconds from the stream's start."""
        return self.start_frame * self.features.hop / self.sample_rate

    @property
    def decoded_seconds(self) -> float:
        """Audio the latest chunk read, to its last sample, in seconds."""
        return self.decoded_samples / self.sample_rate

    def take_window(self, chunk: int) -> Tensor:
        """The input frames of a chunk of `chunk` encoder frames; the overlap with the next
        window stays pending."""
        out = self.pending[: self.engine.window(chunk)]
        self.decoded_samples = (
            self.consumed + out.size(0) - 1
        ) * self.features.hop + self.features.win
        step = chunk * self.engine.factor
        self.pending = self.pending[step:]
        self.consumed += step
        return out

    def take_all(self, frames: int | None = None) -> Tensor:
        """Every pending frame (the stream's end), or the first `frames` (a full-context
        utterance at its longest)."""
        if frames is None:
            out, self.pending = self.pending, self.pending[:0]
        else:
            out, self.pending = self.pending[:frames], self.pending[frames:]
        self.consumed += out.size(0)
        last = (self.consumed - 1) * self.features.hop + self.features.win  # its last sample's
        self.decoded_samples = self.samples if frames is None else last
        return out

    def cache_or_empty(self, like: Tensor) -> EncoderCache:
        return self.cache if self.cache is not None else self.engine.encoder.empty_cache(1, like)

    def after_chunk(
        self, enc: Tensor, log_probs: Tensor, cache: EncoderCache | None, endpoint: bool = True
    ) -> None:
        """Take one chunk's encoder frames `(Q, D)` and CTC log-probabilities `(Q, V)`."""
        self.cache = cache
        self.enc.append(enc)
        self.ctc.append(log_probs)
        self.search.advance(log_probs.float().cpu().numpy())
        rule = self.engine.options.endpoint
        if not endpoint or rule is None:
            return
        silence = self.trailing_silence()
        if rule.reached(self.search, self.engine.frame_seconds, silence):
            self.close_utterance(silence, endpointed=True)

    def _silent(self, start: float, stop: float) -> bool:
        """Whether the audio from `start` to `stop` (seconds) is quieter than SILENT_DB at its
        loudest 0.1 s (digital silence, or a model's input muted): no speech, as offline."""
        rate, frame = self.sample_rate, self._energy_frame
        first = round(start * rate) // frame - self._energy_origin
        last = -(-round(stop * rate) // frame) - self._energy_origin
        energies = np.asarray(self._energies[max(0, first) : max(0, last)])  # a copy's view
        if last > len(self._energies) and len(self._energy_pending):  # a short last frame
            last_frame = frame_energy_db(self._energy_pending, self._energy_frame)
            energies = np.append(energies, last_frame)
        return len(energies) > 0 and loud_level(energies, frame / rate) < SILENT_DB

    def trailing_silence(self) -> float:
        """Seconds of silence the open utterance ends with: CTC blanks, or Silero's."""
        if self.vad is not None:
            return self.vad.silence(self.decoded_seconds, since=self.utterance_start)
        return self.search.trailing_blanks * self.engine.frame_seconds

    def close_utterance(self, silence: float = 0.0, endpointed: bool = False) -> None:
        """Decode the open utterance's final (if it said anything) and start the next. Its
        span ends SPEECH_TAIL into the `silence` (seconds) it ended with, so its last word
        does not run on through the silence. One an endpoint closed with no speech yet (CTC's
        best prefix empty, as a beam of any silence holds some token) is dropped, as is one
        whose audio is silent (`_silent`)."""
        trim = max(0.0, silence - SPEECH_TAIL)
        start = self.utterance_start
        consumed = self.consumed * self.features.hop / self.sample_rate
        # the silence ends where it was measured: Silero's at the window's last sample
        stop = (self.decoded_seconds if self.vad is not None else consumed) - trim
        end = max(start, min(stop, consumed, self.seconds))
        nbest = self.search.nbest(self.engine.options.beam)
        said = any(tokens for tokens, _ in nbest) and not (endpointed and not nbest[0][0])
        said = said and not self._silent(start, self.decoded_seconds)
        if self.enc and said:
            enc, ctc = torch.cat(self.enc), torch.cat(self.ctc)
            num_samples = max(1, round((end - start) * self.sample_rate))
            if self.engine.options.final_search == "beam":
                decoded = self.engine.search(enc, ctc, num_samples)
            else:
                decoded = self.engine.rescore(enc, ctc, nbest, num_samples)
            decoded = replace(decoded, no_speech_prob=_no_speech_prob(ctc))
            transcript = alignment.transcript(self.recognizer, decoded)
            if transcript.words:  # not a word separator alone
                self.spans.append((start, end))
                self.utterances.append(transcript)
                self._new.append(_shifted(transcript, start))
                if self.on_decoded is not None:
                    self.on_decoded((start, end), transcript, decoded)
        self._start_utterance()
        done = self.start_frame * self.features.hop // self._energy_frame - self._energy_origin
        if done > 0:  # the energies of closed utterances: a long stream keeps none of them
            del self._energies[:done]
            self._energy_origin += done


def _lm_scores(
    lm: LanguageModel, token_lists: list[list[int]], device: torch.device
) -> list[float]:
    """Each token list's language-model log-probability, eos included."""
    steps = max(len(t) for t in token_lists) + 1
    inputs = torch.full((len(token_lists), steps), SOS_EOS_ID, device=device)
    targets = torch.full_like(inputs, PAD_ID)
    for row, tokens in enumerate(token_lists):
        inputs[row, 1 : len(tokens) + 1] = torch.tensor(tokens, device=device)
        targets[row, : len(tokens) + 1] = torch.tensor([*tokens, SOS_EOS_ID], device=device)
    state = lm.init_state(len(token_lists), device)
    total = torch.zeros(len(token_lists), device=device)
    for t in range(steps):
        logp, state = lm.step(inputs[:, t], state)
        picked = logp.float().gather(1, targets[:, t : t + 1].clamp(min=0))[:, 0]
        total += picked.masked_fill(targets[:, t] == PAD_ID, 0.0)
    return total.tolist()


def _shifted(transcript: Transcript, offset: float) -> Transcript:
    """`transcript` with its times moved `offset` seconds later, its duration (the audio its
    times lie in, which writers keep them within) with them."""
    return replace(
        transcript,
        duration=offset + transcript.duration,
        token_starts=[offset + t for t in transcript.token_starts],
        token_ends=[offset + t for t in transcript.token_ends],
        words=[replace(w, start=offset + w.start, end=offset + w.end) for w in transcript.words],
        segments=[
            replace(s, start=offset + s.start, end=offset + s.end) for s in transcript.segments
        ],
    )


def stream_transcript(
    recognizer: Recognizer,
    wave: Tensor,
    options: StreamOptions | None = None,
    packet_seconds: float | None = None,
    lm: LanguageModel | None = None,
) -> Transcript:
    """Decode a whole waveform `(S,)` as a live stream would (fed in packets of
    `packet_seconds`, or at once): the streaming decoder's offline result."""
    stream = StreamingEngine(recognizer, options, lm).stream()
    step = wave.numel() if not packet_seconds else max(1, int(packet_seconds * stream.sample_rate))
    for start in range(0, wave.numel(), step):
        stream.accept(wave[start : start + step])
    return stream.final()
