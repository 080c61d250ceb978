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
import itertools
import logging
import math
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
from asr.confidence import PlattScaling
from asr.guard import REPAIR_CTC_WEIGHT, ctc_greedy_length, cut_loop, failure
from asr.models.lm import build_lm
from asr.models.seq2seq import Seq2Seq, build_seq2seq
from asr.package import read_recognizer
from asr.precision import autocast, check_precision
from asr.results import Alignment, Alternative, BatchResult, Decoded, Segment, Transcript
from asr.search import (
    DEFAULT_CTC_WEIGHT,
    Hypothesis,
    LanguageModel,
    SearchOptions,
    beam_search,
    greedy_search,
    length_bound,
    max_output_length,
)
from asr.segment import SegmenterOptions
from asr.text import BLANK_ID, PAD_ID, SOS_EOS_ID, Tokenizer
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
# The `SearchOptions` fields `transcribe` takes as keywords. A recognizer keeps `nbest`
# hypotheses per segment, the best and `nbest - 1` alternatives; None: the best alone.
SEARCH_KEYWORDS = tuple(f.name for f in fields(SearchOptions))
MEASURE_SECONDS = 12  # extra audio `frame_seconds` measures over (divisible by common hops)

BACKENDS = ("torch", "onnx", "onnx-int8")  # what runs the networks (`load_model`)

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
    # Tokens per second (eos included) of the fastest training utterance, speed perturbation
    # included (`asr.search.fastest_speech`, stored by `asr fit`): searches may emit
    # `RATE_MARGIN` times this whatever `max_len_ratio` says. None: `max_len_ratio` alone.
    tokens_per_second: float | None = None
    # The cross-attention maps whose DTW word times agree best with CTC forced alignment on dev
    # (`asr choose-heads`, stored in the checkpoint); None: all maps, averaged.
    alignment_heads: list[int] | None = None
    # Maps word probabilities to confidences that match the share of words right on dev
    # (`asr calibrate`, stored in the checkpoint); None: confidence = probability.
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
        """Seconds per encoder frame, measured (`frame_timing`)."""
        return self._encoder_timing[0]

    @cached_property
    def _encoder_timing(self) -> tuple[float, float]:
        return frame_timing(self.model.encode, self.sample_rate, self.device, self.checkpoint)

    @cached_property
    def feature_seconds(self) -> float:
        """Seconds per feature frame (the frontend's hop), measured like `frame_seconds`."""
        return frame_timing(self.model.frontend, self.sample_rate, self.device, self.checkpoint)[0]

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
        options = self.bounded(options)
        with torch.inference_mode(), autocast(self.device, self.precision):
            enc, enc_lens = self.model.encode(*self._pad(waves))
            ctc = self.model.ctc(enc).float() if self.model.ctc is not None else None  # (B, T, V)
        nbests, token_logp, eos_first = self._decode(enc, enc_lens, ctc, options, lm)
        repaired: list[str | None] = [None] * len(waves)
        if options.repair and options.ctc_weight == 0:  # joint decoding is CTC-bound already
            self._repair(nbests, token_logp, repaired, (enc, enc_lens, ctc), options, lm)
        no_speech = eos_first if ctc is None else _empty_ctc_log_prob(ctc, enc_lens)
        return [
            Decoded(
                nbest[0],
                None if ctc is None else ctc[b, : int(enc_lens[b])].cpu(),
                len(waves[b]),
                token_logp[b],
                float(no_speech[b].exp()),
                nbest[1:],
                repaired[b],
            )
            for b, nbest in enumerate(nbests)
        ]

    def _decode(
        self,
        enc: Tensor,
        enc_lens: Tensor,
        ctc: Tensor | None,
        options: SearchOptions,
        lm: LanguageModel | None,
    ) -> tuple[list[list[Hypothesis]], list[Tensor], Tensor]:
        """The n-best lists of a batch, the best's token log-probabilities and the log-
        probability of eos first (`_token_log_probs`)."""
        greedy = options.beam_size == 1 and options.ctc_weight == 0 and options.lm_weight == 0
        rows = len(enc) * (1 if greedy else options.beam_size)
        bf16_steps = self.precision == "bf16" and rows >= BF16_STEP_ROWS
        # In bf16, autocast reuses its bf16 copies of the weights from step to step only
        # outside inference mode.
        with autocast(self.device, "bf16") if bf16_steps else torch.inference_mode():
            enc = enc if bf16_steps else enc.float()
            if greedy:
                bound = options.max_len_ratio, options.max_len_extra
                nbests = [[h] for h in greedy_search(self.model.decoder, enc, enc_lens, *bound)]
            else:
                kept = replace(options, nbest=options.nbest or 1)  # backtrack only those kept
                nbests = beam_search(self.model.decoder, enc, enc_lens, kept, ctc, lm)
                empty = partial(_empty_hypothesis, self.model.decoder)
                nbests = [n or [empty(int(t))] for n, t in zip(nbests, enc_lens)]
            best = [n[0] for n in nbests]
            token_logp, eos_first = self._token_log_probs(enc, enc_lens, best)  # as the steps
        return nbests, token_logp, eos_first

    def _repair(
        self,
        nbests: list[list[Hypothesis]],
        token_logp: list[Tensor],
        repaired: list[str | None],
        encoded: tuple[Tensor, Tensor, Tensor | None],
        options: SearchOptions,
        lm: LanguageModel | None,
    ) -> None:
        """Decode again the utterances whose best hypothesis shows an attention failure
        (`asr.guard.failure`), with the CTC head weighted `REPAIR_CTC_WEIGHT`; without one,
        cut loops after their first copy. Where that changes the hypothesis, it replaces the
        n-best list and the failure is named in `repaired` (all three lists in place)."""
        enc, enc_lens, ctc = encoded
        limits = max_output_length(enc_lens, options.max_len_ratio, options.max_len_extra)
        failed = {}
        for b, nbest in enumerate(nbests):
            ctc_length = None if ctc is None else ctc_greedy_length(ctc[b, : int(enc_lens[b])])
            why = failure(nbest[0].tokens, int(limits[b]), ctc_length)
            if why is not None:
                failed[b] = why
        if not failed:
            return
        rows = torch.tensor(sorted(failed), device=enc_lens.device)
        if ctc is not None:
            # Every token is CTC-scored: a pre-beam by attention would keep the loop's.
            weight = max(options.ctc_weight, REPAIR_CTC_WEIGHT)
            again = replace(options, ctc_weight=weight, pre_beam_ratio=None)
            fixed, fixed_logp, _ = self._decode(enc[rows], enc_lens[rows], ctc[rows], again, lm)
        else:
            cut = [_cut_loop(nbests[b][0]) for b in rows.tolist()]
            fixed = [[h] for h in cut]
            fixed_logp, _ = self._token_log_probs(enc[rows].float(), enc_lens[rows], cut)
        for k, b in enumerate(rows.tolist()):
            ended = math.isfinite(fixed[k][0].score)  # not the empty stand-in of no hypothesis
            if ended and fixed[k][0].tokens != nbests[b][0].tokens:
                nbests[b], token_logp[b], repaired[b] = fixed[k], fixed_logp[k], failed[b]

    @torch.inference_mode()
    def _token_log_probs(
        self, enc: Tensor, enc_lens: Tensor, hyps: Sequence[Hypothesis]
    ) -> tuple[list[Tensor], Tensor]:
        """The decoder's log-probability of each hypothesis's tokens and eos, by teacher
        forcing, `(L_b + 1,)` each on the CPU, and of eos as the first token `(B,)`."""
        token_logp, eos_first, _ = self._teacher_forced(enc, enc_lens, [h.tokens for h in hyps])
        return token_logp, eos_first

    def _teacher_forced(
        self, enc: Tensor, enc_lens: Tensor, token_lists: Sequence[Sequence[int]]
    ) -> tuple[list[Tensor], Tensor, Tensor]:
        """The decoder run on each token list after sos: the log-probability of its tokens
        and eos `(L_b + 1,)` each on the CPU, that of eos as the first token `(B,)`, and the
        cross-attention `(B, K, L + 1, T)`."""
        lens = [len(tokens) for tokens in token_lists]
        ys = torch.full((len(token_lists), max(lens) + 1), PAD_ID, device=enc.device)
        ys[:, 0] = SOS_EOS_ID
        targets = torch.full_like(ys, PAD_ID)
        for b, tokens in enumerate(token_lists):
            ids = torch.tensor(list(tokens), dtype=torch.long, device=enc.device)
            ys[b, 1 : lens[b] + 1] = ids
            targets[b, : lens[b]] = ids
            targets[b, lens[b]] = SOS_EOS_ID
        logits, attention = self.model.decoder(enc, enc_lens, ys)
        logp = logits.float().log_softmax(-1)
        picked = logp.gather(2, targets[..., None]).squeeze(2).cpu()
        token_logp = [picked[b, : n + 1] for b, n in enumerate(lens)]
        return token_logp, logp[:, 0, SOS_EOS_ID].cpu(), attention

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
        probs = decoded.token_probs
        alternatives = [
            Alternative(self.tokenizer.decode(h.tokens), list(h.tokens), h.score)
            for h in decoded.alternatives
        ]
        segment = Segment(
            0.0,
            duration,
            text,
            hyp.score,
            decoded.avg_logprob,
            decoded.no_speech_prob,
            alternatives,
            decoded.repaired,
        )
        return Transcript(
            text=text,
            tokens=list(hyp.tokens),
            pieces=pieces,
            token_starts=np.minimum(times.start, duration).tolist(),
            token_ends=np.minimum(times.end, duration).tolist(),
            words=self.timed_words(
                pieces, times, duration, probs or None, decoded.token_ctc_probs
            ),  # fmt: skip
            score=hyp.score,
            duration=duration,
            segments=[segment],
            token_probs=probs,
            avg_logprob=decoded.avg_logprob,
        )

    def words(
        self, decoded: Decoded, timestamps: str = "attention", fallback: bool = True
    ) -> list[Word]:
        """Word times of a decoded hypothesis (arguments as `token_times`)."""
        pieces = self.tokenizer.pieces(decoded.hypothesis.tokens)
        times = self.token_times(decoded, timestamps, fallback)
        duration = decoded.num_samples / self.sample_rate
        probs = decoded.token_probs or None
        return self.timed_words(pieces, times, duration, probs, decoded.token_ctc_probs)

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
                return decoded.ctc_path().times(self.frame_seconds)
            except ValueError as err:
                if not fallback:
                    raise
                log.warning("CTC timestamps failed, using attention instead: %s", err)
        times = attention_timestamps(hyp.attention, self.frame_seconds, self.alignment_heads)
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
        with autocast(self.device, self.precision):
            feats, feat_lens = self.model.frontend(waves, lens)
            enc, enc_lens = self.model.encoder(feats, feat_lens)
            token_logp, _, attention = self._teacher_forced(enc, enc_lens, [tokens])
            ctc = self.model.ctc(enc)[0].float().cpu() if self.model.ctc is not None else None
        logp = token_logp[0].sum()
        attention = attention[0].float().cpu()  # (K, L + 1, T)
        pieces = self.tokenizer.pieces(tokens)
        duration = len(wave) / self.sample_rate
        times = attention_timestamps(attention, self.frame_seconds, self.alignment_heads)
        times = times[: len(tokens)]
        ctc_words = None
        if ctc is not None:  # (T, V)
            try:
                ctc_times = ctc_forced_alignment(ctc, tokens, self.frame_seconds)
                ctc_words = self.timed_words(pieces, ctc_times, duration)
            except ValueError as err:  # more tokens than the frames can hold
                log.warning("no CTC alignment: %s", err)
        return Alignment(
            tokens=list(tokens),
            pieces=pieces,
            attention=attention,
            features=feats[0, : int(feat_lens[0])].float().cpu(),
            words=self.timed_words(pieces, times, duration),
            ctc_words=ctc_words,
            score=float(logp),
            duration=duration,
            frame_seconds=self.frame_seconds,
            feature_seconds=self.feature_seconds,
        )

    def timed_words(
        self,
        pieces: list[str],
        times: TokenTimes,
        duration: float,
        probs: Sequence[float] | None = None,
        ctc_probs: Sequence[float] | None = None,
    ) -> list[Word]:
        """Words of token `pieces` timed by `times` (with the tokens' decoder and CTC
        probabilities, where given), cut to `duration` seconds; special tokens (`<unk>`)
        belong to no word."""
        words = word_timestamps(pieces, times, probs, ctc_probs)
        return [self._confident(_clamped(w, duration)) for w in words]

    def _confident(self, word: Word) -> Word:
        if self.confidence_scaling is None or word.probability is None:
            return word
        confidence = self.confidence_scaling(word.probability, word.ctc_probability)
        return replace(word, confidence=confidence)

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


def _with_vad(segmenter: SegmenterOptions, vad: str | None) -> SegmenterOptions:
    return segmenter if vad is None else replace(segmenter, vad=vad)


def _cut_loop(hyp: Hypothesis) -> Hypothesis:
    """`hyp` with its loop cut after the first copy (`asr.guard.cut_loop`); its attention
    keeps the steps of the tokens kept and the last step's, as eos."""
    tokens = cut_loop(hyp.tokens)
    if len(tokens) == len(hyp.tokens):
        return hyp
    attention = torch.cat([hyp.attention[:, : len(tokens)], hyp.attention[:, -1:]], dim=1)
    return Hypothesis(tokens, hyp.score, attention)


def _empty_ctc_log_prob(ctc_log_probs: Tensor, enc_lens: Tensor) -> Tensor:
    """`(B,)` the CTC log-probability of the empty transcript: blank at every valid frame."""
    blank = ctc_log_probs[..., BLANK_ID]  # (B, T)
    valid = torch.arange(blank.size(1), device=blank.device)[None, :] < enc_lens[:, None]
    return (blank * valid).sum(1).cpu()


def _clamped(word: Word, duration: float) -> Word:
    """The word with its times cut to `[0, duration]` (the last encoder frame may overhang)."""
    return replace(word, start=min(word.start, duration), end=min(word.end, duration))


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
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    weights, payload = read_recognizer(path)
    model = build_from_payload(build_seq2seq, payload)
    model.load_state_dict(weights)
    model = model.to(device).eval()
    if backend != "torch":
        model = _onnx_model(model, path, backend, device, precision)
    return Recognizer(
        model,
        payload_tokenizer(payload),
        model_sample_rate(model),
        str(path),
        precision,
        payload.get("segment_seconds"),
        SearchOptions(**payload["decoding"]) if "decoding" in payload else None,
        payload.get("tokens_per_second"),
        payload.get("alignment_heads"),
        _scaling(payload.get("confidence_scaling")),
    )


def _scaling(stored: dict[str, float] | None) -> PlattScaling | None:
    return None if stored is None else PlattScaling.from_dict(stored)


def _onnx_model(model: Seq2Seq, path, backend: str, device, precision: str) -> Seq2Seq:
    from asr.onnx_runtime import onnx_model

    if torch.device(device).type != "cpu" or precision != "fp32":
        raise ValueError(f"backend {backend!r} runs on the CPU in fp32 (its int8: onnx-int8)")
    if not os.path.isdir(path):
        raise ValueError(f"{path}: backend {backend!r} needs a package folder (asr export "
                         "--format onnx), not a checkpoint")  # fmt: skip
    return onnx_model(model, path, int8=backend == "onnx-int8")


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


@torch.inference_mode()
def frame_timing(
    module: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    sample_rate: int,
    device: torch.device | str = "cpu",
    name: str = "model",
) -> tuple[float, float]:
    """Seconds per output frame of `module` (waves, lens) -> (frames, lens), and the seconds of
    a 1 s input that its frames leave out (window and subsampling edges), measured: the
    frames it adds for `MEASURE_SECONDS` more audio. Exact for every frontend hop and
    encoder subsampling that divide them, and needs no knowledge of either.

    Raises:
        ValueError: the output does not grow with the input; the message names `name`.
    """
    short, extra = sample_rate, MEASURE_SECONDS * sample_rate
    lens = torch.tensor([short, short + extra], device=device)
    _, out_lens = module(torch.zeros(2, short + extra, device=device), lens)
    frames = int(out_lens[1] - out_lens[0])
    if frames <= 0:
        raise ValueError(f"{name}: the model's output length does not grow with audio")
    frame_seconds = round(MEASURE_SECONDS / frames, 9)
    return frame_seconds, round(1.0 - int(out_lens[0]) * frame_seconds, 9)


def model_sample_rate(model: Seq2Seq) -> int:
    """The audio rate `model`'s frontend expects (16 kHz where it does not say)."""
    features = getattr(model.frontend, "features", model.frontend)
    return int(getattr(features, "sample_rate", 16000))
