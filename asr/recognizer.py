"""`load_model` -> `Recognizer`: decoding, timestamps and alignment with a trained model.

    recognizer = asr.load_model("exp/an4/transformer/avg.ckpt")
    transcript = recognizer.transcribe("utt.wav", beam_size=10, ctc_weight=0.5)
    transcript.text, transcript.words  # words with start/end seconds

`Recognizer.search` decodes a batch of waveforms; `transcript` turns a result into text and
token/word times (cross-attention DTW, or CTC forced alignment); `transcribe` and
`transcribe_batch` add file reading and long-audio segmentation (`asr.transcribe`), and take
their settings as keywords (`SearchOptions` fields among them, merged by `search_options`);
`align` aligns a known transcript by teacher forcing. `load_lm` reads a language model for
shallow fusion. Models are built directly from the checkpoint (`asr.checkpoint`): nothing
here imports Lightning.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from difflib import get_close_matches
from functools import cached_property, partial
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from asr.audio import AudioInput, as_waveform, load_audio
from asr.checkpoint import (
    LM_KEY,
    build_from_payload,
    payload_tokenizer,
    read_payload,
    submodule_weights,
)
from asr.models.lm import build_lm
from asr.models.seq2seq import Seq2Seq, build_seq2seq
from asr.package import read_recognizer
from asr.precision import autocast, check_precision
from asr.results import Alignment, BatchResult, Decoded, Segment, Transcript
from asr.search import (
    DEFAULT_CTC_WEIGHT,
    Hypothesis,
    LanguageModel,
    SearchOptions,
    beam_search,
    greedy_search,
)
from asr.segment import SegmenterOptions
from asr.text import SOS_EOS_ID, SPECIAL_PIECES, Tokenizer
from asr.timing import (
    TokenTimes,
    Word,
    attention_timestamps,
    ctc_forced_alignment,
    word_timestamps,
)
from asr.transcribe import TRANSCRIBE_BATCH_SIZE, transcribe_sources

log = logging.getLogger(__name__)

TIMESTAMP_METHODS = ("attention", "ctc")
# The `SearchOptions` fields `transcribe` takes as keywords: all but nbest, since search keeps
# only the best hypothesis.
SEARCH_KEYWORDS = tuple(f.name for f in fields(SearchOptions) if f.name != "nbest")
MEASURE_SECONDS = 12  # extra audio `frame_seconds` measures over (divisible by common hops)

# Search steps run in bf16 from this many rows (batch x beam) on: below it, small bf16 matmuls
# cost more than they save on CPUs.
BF16_STEP_ROWS = 128


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
    # in the checkpoint (`asr set-decoding`); None: `SearchOptions()`, with CTC weight
    # `DEFAULT_CTC_WEIGHT` where the model has a CTC head.
    decoding: SearchOptions | None = None

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
        return next(self.model.parameters()).device

    @cached_property
    def frame_seconds(self) -> float:
        """Seconds per encoder frame, measured: the frames `encode` adds for 12 s more audio.

        Exact for every frontend hop and encoder subsampling that divide 12 s of frames,
        and needs no knowledge of either.
        """
        return self._measure_seconds_per_frame(self.model.encode)

    @cached_property
    def feature_seconds(self) -> float:
        """Seconds per feature frame (the frontend's hop), measured like `frame_seconds`."""
        return self._measure_seconds_per_frame(self.model.frontend)

    @torch.inference_mode()
    def _measure_seconds_per_frame(self, module: Callable[[Tensor, Tensor], Any]) -> float:
        short, extra = self.sample_rate, MEASURE_SECONDS * self.sample_rate
        lens = torch.tensor([short, short + extra], device=self.device)
        _, out_lens = module(torch.zeros(2, short + extra, device=self.device), lens)
        frames = int(out_lens[1] - out_lens[0])
        if frames <= 0:
            raise ValueError(
                f"{self.checkpoint}: the model's output length does not grow with audio"
            )
        return round(MEASURE_SECONDS / frames, 9)

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
        if word_timestamps not in TIMESTAMP_METHODS:
            raise ValueError(
                f"word_timestamps must be one of {TIMESTAMP_METHODS}, got {word_timestamps!r}"
            )
        return transcribe_sources(
            self,
            audios,
            sample_rate=sample_rate,
            options=self.search_options(options, **search),
            lm=lm,
            timestamps=word_timestamps,
            batch_size=batch_size,
            segmenter=segmenter,
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
        """Decode one batch of waveforms, each as one utterance.

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
        with torch.inference_mode(), autocast(self.device, self.precision):
            enc, enc_lens = self.model.encode(*self._pad(waves))
            ctc = self.model.ctc(enc).float() if self.model.ctc is not None else None  # (B, T, V)
        greedy = options.beam_size == 1 and options.ctc_weight == 0 and options.lm_weight == 0
        rows = len(waves) * (1 if greedy else options.beam_size)
        bf16_steps = self.precision == "bf16" and rows >= BF16_STEP_ROWS
        # In bf16, autocast reuses its bf16 copies of the weights from step to step only
        # outside inference mode.
        with autocast(self.device, "bf16") if bf16_steps else torch.inference_mode():
            enc = enc if bf16_steps else enc.float()
            if greedy:
                hyps = greedy_search(self.model.decoder, enc, enc_lens, options.max_len_ratio)
            else:
                best = replace(options, nbest=1)  # only the best is kept: backtrack only it
                nbest = beam_search(self.model.decoder, enc, enc_lens, best, ctc, lm)
                empty = partial(_empty_hypothesis, self.model.decoder)
                hyps = [n[0] if n else empty(int(t)) for n, t in zip(nbest, enc_lens)]
        return [
            Decoded(hyp, None if ctc is None else ctc[b, : int(enc_lens[b])].cpu(), len(waves[b]))
            for b, hyp in enumerate(hyps)
        ]

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
        if timestamps not in TIMESTAMP_METHODS:
            raise ValueError(f"timestamps must be one of {TIMESTAMP_METHODS}, got {timestamps!r}")
        if timestamps == "ctc" and self.model.ctc is None:
            raise ValueError(f"{self.checkpoint}: timestamps='ctc' needs a CTC head")

    def _pad(self, waves: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        lens = torch.tensor([len(w) for w in waves], dtype=torch.long)
        batch = torch.zeros(len(waves), int(lens.max()))
        for row, wave in enumerate(waves):
            batch[row, : len(wave)] = wave
        return batch.to(self.device), lens.to(self.device)

    def transcript(self, decoded: Decoded, timestamps: str = "attention") -> Transcript:
        """The `Transcript` of one decoded utterance, times from its start.

        Args:
            decoded: from `search`.
            timestamps: "attention" or "ctc" (see `transcribe`).
        """
        hyp = decoded.hypothesis
        duration = decoded.num_samples / self.sample_rate
        times = self.token_times(decoded, timestamps)
        pieces = self.tokenizer.pieces(hyp.tokens)
        text = self.tokenizer.decode(hyp.tokens)
        return Transcript(
            text=text,
            tokens=list(hyp.tokens),
            pieces=pieces,
            token_starts=np.minimum(times.start, duration).tolist(),
            token_ends=np.minimum(times.end, duration).tolist(),
            words=self._words(pieces, times, duration),
            score=hyp.score,
            duration=duration,
            segments=[Segment(0.0, duration, text, hyp.score)],
        )

    def words(
        self, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
    ) -> list[Word]:
        """Word times of a decoded hypothesis (arguments as `token_times`)."""
        pieces = self.tokenizer.pieces(decoded.hypothesis.tokens)
        times = self.token_times(decoded, timestamps, fallback)
        return self._words(pieces, times, decoded.num_samples / self.sample_rate)

    def token_times(
        self, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
    ) -> TokenTimes:
        """Frame spans of a decoded hypothesis's tokens (eos excluded).

        Args:
            decoded: from `search`.
            timestamps: "attention" (DTW over cross-attention) or "ctc" (forced alignment).
            fallback: where CTC cannot align the hypothesis (more tokens than its frames
                allow), use the attention with a warning instead of raising ValueError.
        """
        if timestamps not in TIMESTAMP_METHODS:
            raise ValueError(f"timestamps must be one of {TIMESTAMP_METHODS}, got {timestamps!r}")
        hyp = decoded.hypothesis
        if timestamps == "ctc":
            if decoded.ctc_log_probs is None:
                raise ValueError(f"{self.checkpoint}: timestamps='ctc' needs a CTC head")
            try:
                return ctc_forced_alignment(decoded.ctc_log_probs, hyp.tokens, self.frame_seconds)
            except ValueError as err:
                if not fallback:
                    raise
                log.warning("CTC timestamps failed, using attention instead: %s", err)
        times = attention_timestamps(hyp.attention, self.frame_seconds)
        return times[: len(hyp.tokens)]

    # ------------------------------------------------------------------ alignment

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

    @torch.inference_mode()
    def align_tokens(self, wave: Tensor, tokens: Sequence[int]) -> Alignment:
        """Teacher-forced alignment of token ids to a waveform `(S,)` at `sample_rate`."""
        waves, lens = self._pad([wave])
        ys = torch.tensor([[SOS_EOS_ID, *tokens]], device=self.device)
        with autocast(self.device, self.precision):
            feats, feat_lens = self.model.frontend(waves, lens)
            enc, enc_lens = self.model.encoder(feats, feat_lens)
            logits, attention = self.model.decoder(enc, enc_lens, ys)  # (1, L+1, V), (1, K, L+1, T)
            ctc = self.model.ctc(enc)[0].float().cpu() if self.model.ctc is not None else None
        targets = torch.tensor([*tokens, SOS_EOS_ID], device=self.device)
        logp = logits[0].float().log_softmax(-1).gather(1, targets[:, None]).sum()
        attention = attention[0].float().cpu()
        pieces = self.tokenizer.pieces(tokens)
        duration = len(wave) / self.sample_rate
        times = attention_timestamps(attention, self.frame_seconds)[: len(tokens)]
        ctc_words = None
        if ctc is not None:  # (T, V)
            try:
                ctc_times = ctc_forced_alignment(ctc, tokens, self.frame_seconds)
                ctc_words = self._words(pieces, ctc_times, duration)
            except ValueError as err:  # more tokens than the frames can hold
                log.warning("no CTC alignment: %s", err)
        return Alignment(
            tokens=list(tokens),
            pieces=pieces,
            attention=attention,
            features=feats[0, : int(feat_lens[0])].float().cpu(),
            words=self._words(pieces, times, duration),
            ctc_words=ctc_words,
            score=float(logp),
            duration=duration,
            frame_seconds=self.frame_seconds,
            feature_seconds=self.feature_seconds,
        )

    def _words(self, pieces: list[str], times: TokenTimes, duration: float) -> list[Word]:
        return [_clamped(w, duration) for w in word_timestamps(_word_pieces(pieces), times)]

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


def _empty_hypothesis(decoder: nn.Module, num_frames: int) -> Hypothesis:
    """What an utterance gets when no hypothesis ended (eos step only, flat attention)."""
    attention = torch.full((decoder.num_attention_maps, 1, num_frames), 1.0 / num_frames)
    return Hypothesis([], float("-inf"), attention)


def _word_pieces(pieces: Sequence[str]) -> list[str]:
    """Pieces for `word_timestamps`: special tokens (`<unk>`) belong to no word."""
    return ["" if p in SPECIAL_PIECES else p for p in pieces]


def _clamped(word: Word, duration: float) -> Word:
    """The word with its times cut to `[0, duration]` (the last encoder frame may overhang)."""
    return Word(word.text, min(word.start, duration), min(word.end, duration))


def load_model(
    path: str | os.PathLike, device: str | torch.device = "cpu", precision: str = "fp32"
) -> Recognizer:
    """Rebuild a recognizer, to run in `precision` ("fp32" or "bf16": see
    `Recognizer.precision`), from `path`: an `asr fit` checkpoint (or an `asr average`
    output), a model package folder (`asr export`), or `hf://owner/name[@revision]`, a package
    on the Hugging Face Hub (fetched once into its cache; found there with `HF_HUB_OFFLINE=1`).

    Raises:
        CheckpointError: the file is not a recognizer checkpoint written by `asr fit`, or not
            a model package, or refuses to load safely (a pickle); the message names it.
    """
    check_precision(precision)
    weights, payload = read_recognizer(path)
    model = build_from_payload(build_seq2seq, payload)
    model.load_state_dict(weights)
    model = model.to(device).eval()
    return Recognizer(
        model,
        payload_tokenizer(payload),
        _sample_rate(model),
        str(path),
        precision,
        payload.get("segment_seconds"),
        SearchOptions(**payload["decoding"]) if "decoding" in payload else None,
    )


def load_lm(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer]:
    """Rebuild the language model of an `asr fit` LM checkpoint (or an `asr average` output).

    Returns:
        The LM (the plain module, in eval mode, on `device`), which follows the search
        interface `asr.search.LanguageModel`, and its tokenizer.

    Raises:
        CheckpointError: the file holds no LM written by `asr fit`, or refuses to load
            safely; the message names it.
    """
    state, payload = read_payload(path, LM_KEY)
    lm = build_from_payload(build_lm, payload)
    lm.load_state_dict(submodule_weights(state, "lm."))
    return lm.to(device).eval(), payload_tokenizer(payload)


def _sample_rate(model: Seq2Seq) -> int:
    features = getattr(model.frontend, "features", model.frontend)
    return int(getattr(features, "sample_rate", 16000))
