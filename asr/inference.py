"""Self-contained checkpoints, `load_model`, and the `Recognizer` inference API.

A checkpoint written by `asr fit` carries, besides the weights, everything needed to rebuild
the recognizer without the training files: the model's resolved config (class paths and
arguments), the tokenizer files, and the files the config points at (CMVN statistics). All
are plain strings, so loading stays `weights_only=True`.

    recognizer = asr.load_model("exp/an4/checkpoints/last.ckpt")
    transcript = recognizer.transcribe("utt.wav", options=SearchOptions(beam_size=10))
    transcript.text, transcript.words  # words with start/end seconds

`Recognizer.search` decodes a batch of waveforms; `transcript` turns a result into text and
token/word times (cross-attention DTW, or CTC forced alignment); `transcribe` and
`transcribe_batch` add file reading and long-audio segmentation (`asr.transcribe`);
`align` aligns a known transcript by teacher forcing.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torchaudio.functional
from torch import Tensor, nn

from asr.alignment import (
    TokenTimes,
    Word,
    attention_timestamps,
    ctc_forced_alignment,
    word_timestamps,
)
from asr.audio import load_audio
from asr.checkpoint import CheckpointError, load_checkpoint
from asr.models.seq2seq import SOS_EOS_ID, Seq2Seq
from asr.precision import autocast, check_precision
from asr.search import Hypothesis, LanguageModel, SearchOptions, beam_search, greedy_search
from asr.text import SPECIAL_PIECES, Tokenizer

if TYPE_CHECKING:
    from asr.transcribe import SegmenterOptions

log = logging.getLogger(__name__)

AudioInput = str | os.PathLike | np.ndarray | Tensor  # a file, or a mono waveform (S,)
TIMESTAMP_METHODS = ("attention", "ctc")
MEASURE_SECONDS = 12  # extra audio `frame_seconds` measures over (divisible by common hops)

# Search steps run in bf16 from this many rows (batch x beam) on. One decoder step on the 2-core
# CPU, fp32 / bf16 ms at 1, 32, 128 and 320 rows: AN4 Transformer 0.37 / 0.88, 1.15 / 1.55,
# 3.30 / 3.28, 7.9 / 7.4; AN4 RNN (additive attention over the frames) 0.19 / 0.35,
# 1.48 / 0.98, 6.8 / 3.6, 16.0 / 8.3. Below, small bf16 matmuls cost more than they save.
BF16_STEP_ROWS = 128

ASSET_KEYS = ("stats_path",)  # config arguments naming files that are embedded in checkpoints


def _read_files(folder: Path) -> dict[str, str]:
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in folder.iterdir()}


def write_embedded_files(files: dict[str, str], folder: Path) -> None:
    """Write the base64 files `checkpoint_payload` embedded into `folder`."""
    for name, data in files.items():
        (folder / Path(name).name).write_bytes(base64.b64decode(data))


def _find_assets(config: Any, found: dict[str, str]) -> dict[str, str]:
    """Collect files named by ASSET_KEYS anywhere in a nested config."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key in ASSET_KEYS and isinstance(value, str) and value:
                found[value] = base64.b64encode(Path(value).read_bytes()).decode()
            else:
                _find_assets(value, found)
    elif isinstance(config, list):
        for value in config:
            _find_assets(value, found)
    return found


def _replace_assets(config: Any, paths: dict[str, str]) -> Any:
    if isinstance(config, dict):
        return {
            k: paths.get(v, v) if k in ASSET_KEYS else _replace_assets(v, paths)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [_replace_assets(v, paths) for v in config]
    return config


def checkpoint_payload(
    model_config: dict[str, Any], tokenizer: Tokenizer, segment_seconds: float | None = None
) -> dict[str, Any]:
    """What `ASRModule` adds to every checkpoint under the key `"asr"` (`segment_seconds`:
    see `Recognizer.segment_seconds`)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        files = _read_files(Path(tmp))
    payload = {
        "model_config": model_config,
        "tokenizer": files,
        "assets": _find_assets(model_config, {}),
    }
    if segment_seconds is not None:
        payload["segment_seconds"] = segment_seconds
    return payload


# Segments decoded together by `transcribe`. Measured on 2 CPU cores, beam 10 + CTC over a
# 10-minute recording: 4 took 24 s at 1.7 GB peak RSS, 8 took 29 s at 2.5 GB.
TRANSCRIBE_BATCH_SIZE = 4


@dataclass
class Segment:
    """A stretch of audio decoded as one utterance, in seconds of the input's timeline."""

    start: float
    end: float
    text: str
    score: float  # the search score of its hypothesis


@dataclass
class Transcript:
    """What `Recognizer.transcribe` returns for one input.

    Times are seconds from the start of the input. Long inputs are decoded in segments
    (`asr.transcribe`); `tokens` then lists every segment's tokens in order, with no
    separator between segments, while `text` joins the segment texts with a space.
    """

    text: str
    tokens: list[int]  # output ids, without sos/eos
    pieces: list[str]  # the tokens' pieces, `▁` marking a space
    token_starts: list[float]  # one per token, non-decreasing
    token_ends: list[float]
    words: list[Word]  # word spans, from `token_starts`/`token_ends`
    score: float  # the search score, summed over segments
    duration: float  # seconds of audio in the input
    segments: list[Segment]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, times rounded to milliseconds."""
        spans = zip(self.tokens, self.pieces, self.token_starts, self.token_ends, strict=True)
        return {
            "text": self.text,
            "duration": _ms(self.duration),
            "score": _finite(self.score),
            "segments": [
                {
                    "start": _ms(s.start),
                    "end": _ms(s.end),
                    "text": s.text,
                    "score": _finite(s.score),
                }
                for s in self.segments
            ],
            "words": [
                {"word": w.text, "start": _ms(w.start), "end": _ms(w.end)} for w in self.words
            ],
            "tokens": [
                {"id": i, "piece": p, "start": _ms(start), "end": _ms(end)}
                for i, p, start, end in spans
            ],
        }


def _ms(seconds: float) -> float:
    return round(float(seconds), 3)


def _finite(value: float) -> float | None:
    """JSON has no infinities (a hypothesis that never ended scores -inf)."""
    return value if math.isfinite(value) else None


@dataclass
class Decoded:
    """One utterance out of `Recognizer.search`: the best hypothesis and what timing needs."""

    hypothesis: Hypothesis  # its attention is `(K, L+1, T_enc)`, cut to the valid frames
    ctc_log_probs: Tensor | None  # `(T_enc, V)` on the CPU, when the model has a CTC head
    num_samples: int  # samples of the decoded audio, at the recognizer's rate


@dataclass
class Alignment:
    """A transcript aligned to audio by teacher forcing (`Recognizer.align`)."""

    tokens: list[int]
    pieces: list[str]
    attention: Tensor  # (K, L+1, T_enc) cross-attention, the eos step last
    features: Tensor  # (T_feat, D) the frontend's features, for plots
    words: list[Word]  # from the attention (DTW)
    ctc_words: list[Word] | None  # from CTC forced alignment, when the model has a CTC head
    score: float  # teacher-forced log-probability of `tokens + [eos]`
    duration: float  # seconds of audio
    frame_seconds: float  # seconds per encoder frame
    feature_seconds: float  # seconds per feature frame

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)


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
    # the training utterances (`asr.transcribe.segment_seconds_for`, stored by `asr fit`).
    # None (checkpoints from before): `SegmenterOptions`' 20 s.
    segment_seconds: float | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)

    def segmenter(self) -> SegmenterOptions:
        """How `transcribe` splits long audio when not told: segments of at most
        `segment_seconds`."""
        from asr.transcribe import SegmenterOptions  # it builds on this module

        if self.segment_seconds is None:
            return SegmenterOptions()
        return SegmenterOptions(max_segment_seconds=self.segment_seconds)

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
        sample_rate: int | None = None,
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
        timestamps: str = "attention",
        batch_size: int = TRANSCRIBE_BATCH_SIZE,
        segmenter: SegmenterOptions | None = None,
    ) -> Transcript:
        """Transcribe one recording of any length.

        Audio longer than `segmenter.max_segment_seconds` is split on silence and decoded in
        batches of segments (files are read a segment at a time; see `asr.transcribe`).

        Args:
            audio: a file path (any format and rate soundfile reads), or a mono waveform
                `(S,)` as a numpy array or tensor.
            sample_rate: the rate of an array `audio`; None means the model's rate. Files
                carry their own.
            options: search settings; None uses `SearchOptions()` (beam 10). A beam of 1
                without CTC or LM weight runs greedy search.
            lm: language model for shallow fusion (`options.lm_weight > 0`).
            timestamps: "attention" (DTW over cross-attention) or "ctc" (forced alignment of
                the hypothesis with the CTC head).
            batch_size: segments of long audio decoded together.
            segmenter: how long audio is split; None uses `self.segmenter()`.

        Returns:
            The `Transcript`, times in seconds of the input.

        Raises:
            AudioError: the file cannot be read; the message names it and says why.
        """
        return self.transcribe_batch(
            [audio], sample_rate, options, lm, timestamps, batch_size, segmenter
        )[0]

    def transcribe_batch(
        self,
        audios: Sequence[AudioInput],
        sample_rate: int | None = None,
        options: SearchOptions | None = None,
        lm: LanguageModel | None = None,
        timestamps: str = "attention",
        batch_size: int = TRANSCRIBE_BATCH_SIZE,
        segmenter: SegmenterOptions | None = None,
    ) -> list[Transcript]:
        """Transcribe several recordings, decoding up to `batch_size` segments together
        (sorted by length). Arguments as `transcribe`.

        Returns:
            One `Transcript` per input, in input order.

        Raises:
            AudioError: an input cannot be read; the message names it.
        """
        from asr.transcribe import transcribe_sources  # it builds on this module

        results = transcribe_sources(
            self, audios, sample_rate, options, lm, timestamps, batch_size, segmenter
        )
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

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
        options = options or SearchOptions()
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
        options = options or SearchOptions()
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


def as_waveform(audio: np.ndarray | Tensor, sample_rate: int, target_rate: int) -> Tensor:
    """A mono waveform `(S,)` (numpy or torch) as float32 at `target_rate`; integer samples
    are scaled to [-1, 1) as soundfile does.

    >>> as_waveform(np.array([16384, -32768], dtype=np.int16), 16000, 16000).tolist()
    [0.5, -1.0]
    """
    wave = torch.as_tensor(audio).detach().cpu()
    if wave.dim() != 1 or wave.numel() == 0:
        raise ValueError(f"audio must be a non-empty mono waveform (S,), got {tuple(wave.shape)}")
    if not wave.is_floating_point():
        wave = wave.double() / (torch.iinfo(wave.dtype).max + 1)
    wave = wave.float()
    if not bool(torch.isfinite(wave).all()):
        raise ValueError("audio contains NaN or infinite samples")
    if sample_rate == target_rate:
        return wave
    return torchaudio.functional.resample(wave, sample_rate, target_rate)


def load_model(
    path: str | os.PathLike, device: str | torch.device = "cpu", precision: str = "fp32"
) -> Recognizer:
    """Rebuild the recognizer of an `asr fit` checkpoint (or an `asr average` output), to run
    in `precision` ("fp32" or "bf16": see `Recognizer.precision`).

    Raises:
        CheckpointError: the file is not a checkpoint written by `asr fit`, or refuses to load
            safely; the message names it.
    """
    check_precision(precision)
    state = load_checkpoint(path)
    payload = state.get("asr")
    if not isinstance(payload, dict) or "model_config" not in payload:
        raise CheckpointError(f"{path}: no recognizer config inside (not written by `asr fit`?)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "tokenizer").mkdir()
        write_embedded_files(payload["tokenizer"], tmp / "tokenizer")
        assets = {}
        for i, (original, data) in enumerate(payload["assets"].items()):
            assets[original] = str(tmp / f"asset{i}_{Path(original).name}")
            Path(assets[original]).write_bytes(base64.b64decode(data))
        config = _replace_assets(payload["model_config"], assets)
        config["tokenizer"] = str(tmp / "tokenizer")
        from asr.lightning import ASRModule

        module = instantiate_module(ASRModule, config)
    weights = {k[len("model.") :]: v for k, v in state["state_dict"].items()}
    module.model.load_state_dict(weights)
    model = module.model.to(device).eval()
    return Recognizer(
        model,
        module.tokenizer,
        _sample_rate(model),
        str(path),
        precision,
        payload.get("segment_seconds"),
    )


def instantiate_module(cls: type, config: dict[str, Any]) -> nn.Module:
    """Build `cls` from the plain init args stored in a checkpoint (class paths included)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model", fail_untyped=False)
    parsed = parser.parse_object({"model": config})
    return parser.instantiate_classes(parsed).model


def _sample_rate(model: Seq2Seq) -> int:
    features = getattr(model.frontend, "features", model.frontend)
    return int(getattr(features, "sample_rate", 16000))
