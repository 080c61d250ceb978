"""Transcription: the Recognizer API, long-audio segmentation, output writers, `asr transcribe`
and `asr align`.

Two real models: a tiny Transformer overfit in memory on four AN4 utterances (it recognises
them, so timing and segmentation can be checked against what was said), and a tiny
checkpoint trained through `asr fit` for the command-line tests. The audio is the AN4 fixture
in tests/fixtures/an4, so these tests need no corpus.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from functools import cache, partial
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from conftest import AN4_FIXTURE, REPO, encode_audio, trained_once
from torch import nn

import asr.decoding
import asr.transcribe
from asr.audio import AudioError, audio_info, load_audio
from asr.cli import main
from asr.cli.inputs import transcribe_files
from asr.cli.numbers import check_nbest
from asr.data.cmvn import compute_cmvn_stats
from asr.data.dataset import collate
from asr.data.manifest import Utterance, write_manifest
from asr.frontends import Frontend, LogMelFilterbank, UtteranceCMVN
from asr.levels import frame_energy_db
from asr.models.ctc import CTCHead
from asr.models.rnn import RNNEncoder
from asr.models.seq2seq import Seq2Seq
from asr.models.transformer import TransformerDecoder, TransformerEncoder
from asr.recognizer import Recognizer, load_model
from asr.results import Alternative, Segment, Transcript
from asr.search import SearchOptions, greedy_search
from asr.segment import (
    ArraySource,
    FileSource,
    SegmenterOptions,
    plan_segments,
    segment_source,
)
from asr.text import CharTokenizer, train_tokenizer
from asr.timing import Word
from asr.transcribe import join_segments, transcribe_sources
from asr.writers import FORMATS

WAV = AN4_FIXTURE / "wav"
UTTERANCES = {  # the fixture's AN4 training utterances (under WAV), which the tiny model learns
    "an4_clstk/fash/an251-fash-b": "YES",
    "an4_clstk/fash/an253-fash-b": "GO",
    "an4_clstk/fash/an254-fash-b": "YES",
    "an4_clstk/fash/an255-fash-b": "U M N Y H SIX",
}
GREEDY = SearchOptions(beam_size=1)
JOINT = SearchOptions(beam_size=3, ctc_weight=0.3)
RATE = 16000
GAP_NOISE = 1e-4  # amplitude of the noise filling inserted silences (about -83 dBFS)


# --------------------------------------------------------------------------- models


@cache
def _overfit_recognizer(wav_root: str) -> tuple[Recognizer, list[torch.Tensor]]:
    """A tiny Transformer + CTC trained until greedy search reproduces all four transcripts,
    once per machine and code (`conftest.trained_once`); each caller gets its own copy."""
    return copy.deepcopy(_trained_overfit_recognizer(wav_root))


@functools.cache
def _trained_overfit_recognizer(wav_root: str) -> tuple[Recognizer, list[torch.Tensor]]:
    return trained_once("overfit-fixture", [Path(__file__)], partial(_train_overfit, wav_root))


def _train_overfit(wav_root: str, weights: dict | None) -> tuple[Recognizer, list[torch.Tensor]]:
    tokenizer = CharTokenizer.train(UTTERANCES.values())
    items = [
        {"id": p, "wave": load_audio(f"{wav_root}/{p}.wav"), "text": text,
         "tokens": torch.tensor(tokenizer.encode(text))}
        for p, text in UTTERANCES.items()
    ]  # fmt: skip
    batch = collate(items, pad_id=tokenizer.pad_id)
    torch.manual_seed(0)
    frontend = Frontend(LogMelFilterbank(n_mels=40), UtteranceCMVN(norm_vars=True))
    encoder = TransformerEncoder(40, d_model=64, num_heads=4, ffn_dim=128, num_layers=2, dropout=0)
    decoder = TransformerDecoder(
        tokenizer.vocab_size, 64, d_model=64, num_heads=4, ffn_dim=128, num_layers=1, dropout=0
    )
    model = Seq2Seq(frontend, encoder, decoder, CTCHead(tokenizer.vocab_size, 64))
    waves = [i["wave"] for i in items]
    if weights is not None:
        model.load_state_dict(weights)
        return Recognizer(model.eval(), tokenizer, RATE, "<in memory>"), waves
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    args = (batch.waves, batch.wave_lens, batch.tokens, batch.token_lens)
    for step in range(1, 401):
        model.train()
        loss = model.loss(*args, ctc_weight=0.3).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            model.eval()
            with torch.no_grad():
                enc, enc_lens = model.encode(batch.waves, batch.wave_lens)
                hyps = [tokenizer.decode(h.tokens) for h in greedy_search(decoder, enc, enc_lens)]
            if hyps == batch.texts:
                break
    model.eval()
    return Recognizer(model, tokenizer, RATE, "<in memory>"), waves


@pytest.fixture(scope="module")
def overfit() -> tuple[Recognizer, list[torch.Tensor]]:
    return _overfit_recognizer(str(WAV))


def test_a_path_from_home_is_read_as_a_shell_reads_it(overfit, tmp_path, monkeypatch):
    """`~/a.wav`, as `load_model` takes `~/model.ckpt`: the file was not found."""
    recognizer, _ = overfit
    shutil.copy(WAV / f"{next(iter(UTTERANCES))}.wav", tmp_path / "a.wav")
    monkeypatch.setenv("HOME", str(tmp_path))
    home = recognizer.transcribe("~/a.wav", options=GREEDY)
    assert home.text == recognizer.transcribe(tmp_path / "a.wav", options=GREEDY).text != ""
    assert torch.equal(recognizer.load("~/a.wav"), recognizer.load(tmp_path / "a.wav"))
    here = tmp_path / "work"  # a folder really named `~` is read as given, as the shell would
    (here / "~").mkdir(parents=True)
    shutil.copy(tmp_path / "a.wav", here / "~" / "b.wav")
    monkeypatch.chdir(here)
    assert recognizer.transcribe("~/b.wav", options=GREEDY).text == home.text
    with pytest.raises(AudioError, match=r"^~/c\.wav: file not found"):  # named as given
        recognizer.load("~/c.wav")


FIT_CONFIG = """
seed_everything: 0
model:
  class_path: asr.lightning.ASRModule
  init_args:
    frontend:
      class_path: asr.frontends.Frontend
      init_args:
        features: {class_path: asr.frontends.LogMelFilterbank, init_args: {n_mels: 40}}
        normalize: {class_path: asr.frontends.GlobalCMVN, init_args: {stats_path: CMVN_STATS}}
    encoder:
      class_path: asr.models.transformer.TransformerEncoder
      init_args: {d_model: 32, num_heads: 2, ffn_dim: 64, num_layers: 1}
    decoder:
      class_path: asr.models.transformer.TransformerDecoder
      init_args: {d_model: 32, num_heads: 2, ffn_dim: 64, num_layers: 2}
    ctc_weight: 0.3
    plot_utterances: 0
data:
  class_path: asr.lightning.ASRDataModule
  init_args: {max_batch_seconds: 12, num_workers: 0}
trainer:
  max_epochs: 1
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
"""


def fit_tiny_checkpoint(root: Path) -> Path:
    """Train a tiny Transformer for one epoch with `asr fit`; reuse it if already there."""
    ckpt = root / "checkpoints" / "last.ckpt"
    if ckpt.is_file():
        return ckpt
    files = {WAV / f"{p}.wav": text for p, text in UTTERANCES.items()}
    utts = [Utterance(str(f), audio_info(f).duration, text, f.stem) for f, text in files.items()]
    write_manifest(root / "train.jsonl", utts)
    write_manifest(root / "dev.jsonl", utts[:2])
    train_tokenizer(root / "train.jsonl", "char", None, root / "tokenizer")
    compute_cmvn_stats(root / "train.jsonl", LogMelFilterbank(n_mels=40), root / "cmvn.json")
    (root / "config.yaml").write_text(FIT_CONFIG.replace("CMVN_STATS", str(root / "cmvn.json")))
    main([
        "fit", "--config", str(root / "config.yaml"),
        "--data.train_manifest", str(root / "train.jsonl"),
        "--data.val_manifest", str(root / "dev.jsonl"),
        "--data.tokenizer", str(root / "tokenizer"),
        "--trainer.default_root_dir", str(root),
    ])  # fmt: skip
    return ckpt


LM_CONFIG = """
seed_everything: 0
model:
  class_path: asr.lm.LMModule
  init_args:
    lm:
      class_path: asr.models.lm.LSTMLM
      init_args: {embed_dim: 16, hidden_size: 16, num_layers: 1, dropout: 0.0}
data:
  class_path: asr.lm.TextDataModule
  init_args: {max_batch_tokens: 256}
checkpoint: {monitor: val/loss, filename: "epoch{epoch:03d}"}
trainer:
  max_epochs: 1
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
"""


def fit_tiny_lm(root: Path, data: Path) -> Path:
    """A character LSTM LM on the transcripts and tokenizer of `fit_tiny_checkpoint(data)`."""
    ckpt = root / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        root.mkdir(parents=True, exist_ok=True)
        (root / "lm.yaml").write_text(LM_CONFIG)
        main([
            "fit", "--config", str(root / "lm.yaml"),
            "--data.train_manifest", str(data / "train.jsonl"),
            "--data.val_manifest", str(data / "dev.jsonl"),
            "--data.tokenizer", str(data / "tokenizer"),
            "--trainer.default_root_dir", str(root),
        ])  # fmt: skip
    return ckpt


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return fit_tiny_checkpoint(tmp_path_factory.getbasetemp() / "tiny_fit")


def _untrained(encoder, seed: int = 0) -> Recognizer:
    torch.manual_seed(seed)
    tokenizer = CharTokenizer.train(["ABC"])
    frontend = Frontend(LogMelFilterbank(n_mels=40))
    enc = encoder(frontend.output_dim)
    decoder = TransformerDecoder(tokenizer.vocab_size, enc.output_dim, d_model=16, num_heads=2,
                                 ffn_dim=32, num_layers=1)  # fmt: skip
    model = Seq2Seq(frontend, enc, decoder).eval()
    return Recognizer(model, tokenizer, RATE, "<untrained>")


# --------------------------------------------------------------------------- synthetic audio


def _concatenate(
    waves: list[np.ndarray], gap: float = 2.0, seed: int = 0
) -> tuple[np.ndarray, list[tuple[float, float]], list[tuple[float, float]]]:
    """Utterances separated (and surrounded) by `gap` seconds of faint noise; returns the
    audio, each utterance's span and each gap's span, in seconds."""
    rng = np.random.default_rng(seed)
    parts, spans, gaps, t = [], [], [], 0.0
    for wave in [*waves, None]:
        parts.append((GAP_NOISE * rng.standard_normal(round(gap * RATE))).astype(np.float32))
        gaps.append((t, t + gap))
        t += gap
        if wave is not None:
            parts.append(wave)
            spans.append((t, t + len(wave) / RATE))
            t += len(wave) / RATE
    return np.concatenate(parts), spans, gaps


@pytest.fixture(scope="module")
def three_minutes(tmp_path_factory) -> dict:
    return make_three_minutes(tmp_path_factory.mktemp("long"))


def make_three_minutes(folder: Path) -> dict:
    """~3 minutes: the fixture's six AN4 utterances over and over, 2 s silences between them;
    the file's path, its audio, and the utterances' and gaps' spans in seconds."""
    waves, total = [], 0.0
    for wav in itertools.cycle(sorted(WAV.rglob("*.wav"))):
        waves.append(load_audio(wav).numpy())
        total += len(waves[-1]) / RATE + 2.0
        if total > 180:
            break
    audio, spans, gaps = _concatenate(waves)
    path = folder / "three_minutes.wav"
    soundfile.write(path, audio, RATE)
    return {"path": path, "audio": audio, "spans": spans, "gaps": gaps}


def _loud(audio: np.ndarray, threshold_db: float = -35.0) -> np.ndarray:
    """The test's own energy VAD over 10 ms frames: True where speech."""
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160).astype(np.float64)
    energy = 10 * np.log10((frames**2).mean(1) + 1e-10)
    return energy >= energy.max() + threshold_db


# --------------------------------------------------------------------------- API


def _transformer(input_dim: int, subsampling: int = 4) -> TransformerEncoder:
    return TransformerEncoder(
        input_dim, d_model=16, num_heads=2, ffn_dim=32, num_layers=1, subsampling=subsampling
    )


def _rnn(input_dim: int, subsample: str = "2") -> RNNEncoder:
    layers = len(subsample.split("_"))
    return RNNEncoder(input_dim, hidden_size=8, num_layers=layers, projection_dim=8,
                      subsample=subsample)  # fmt: skip


@pytest.mark.parametrize(
    ("encoder", "frame_seconds"),
    [
        (_transformer, 0.04),
        (partial(_transformer, subsampling=6), 0.06),
        (partial(_rnn, subsample="2_2_2"), 0.08),
        (partial(_rnn, subsample="1"), 0.01),
    ],
)
def test_frame_seconds_are_measured_from_the_model(encoder, frame_seconds):
    recognizer = _untrained(encoder)
    assert recognizer.feature_seconds == 0.01
    assert recognizer.frame_seconds == frame_seconds


def test_recognises_and_batched_equals_one_at_a_time(overfit):
    recognizer, waves = overfit
    for options in (GREEDY, JOINT):
        results = recognizer.transcribe_batch(waves, options=options, batch_size=3)
        batched = [r.transcript for r in results]
        alone = [recognizer.transcribe(w, options=options) for w in waves]
        assert [t.text for t in batched] == list(UTTERANCES.values())
        assert [t.text for t in alone] == [t.text for t in batched]
        for a, b in zip(alone, batched):
            assert a.tokens == b.tokens and a.score == pytest.approx(b.score, abs=1e-4)
            np.testing.assert_allclose(a.token_starts, b.token_starts, atol=1e-6)


@pytest.mark.parametrize("step_rows", [1, 10**6])  # decoder steps in bf16 / in fp32
def test_bf16_runs_the_model_in_bf16_and_returns_float32_results(overfit, monkeypatch, step_rows):
    monkeypatch.setattr(asr.decoding, "BF16_STEP_ROWS", step_rows)
    recognizer, waves = overfit
    bf16 = dataclasses.replace(recognizer, precision="bf16")
    dtypes = {"encoder": [], "decoder": []}
    hooks = [
        next(
            m for m in getattr(recognizer.model, name).modules() if isinstance(m, nn.Linear)
        ).register_forward_hook(lambda module, args, out, seen=seen: seen.append(out.dtype))
        for name, seen in dtypes.items()
    ]
    step_dtype = torch.bfloat16 if step_rows == 1 else torch.float32
    try:
        for options in (GREEDY, JOINT):
            for seen in dtypes.values():
                seen.clear()
            exact = [r.transcript for r in recognizer.transcribe_batch(waves, options=options)]
            for seen in dtypes.values():
                assert set(seen) == {torch.float32}
                seen.clear()
            decoded = bf16.search(waves, options)
            assert [recognizer.tokenizer.decode(d.hypothesis.tokens) for d in decoded] == [
                t.text for t in exact
            ]
            assert set(dtypes["encoder"]) == {torch.bfloat16}
            assert set(dtypes["decoder"]) == {step_dtype}
            assert decoded[0].hypothesis.attention.dtype == torch.float32
            assert decoded[0].ctc_log_probs.dtype == torch.float32
        alignment = bf16.align(waves[3], "u m n y h six")
        assert dtypes["decoder"][-1] == torch.bfloat16, "teacher forcing: the whole model"
        assert alignment.attention.dtype == alignment.features.dtype == torch.float32
        reference = recognizer.align(waves[3], "u m n y h six")
        assert [w.text for w in alignment.ctc_words] == [w.text for w in reference.ctc_words]
        assert alignment.score == pytest.approx(reference.score, rel=0.05)
    finally:
        for hook in hooks:
            hook.remove()


def test_unknown_precision_is_refused(overfit, tmp_path):
    recognizer, _ = overfit
    with pytest.raises(ValueError, match="precision must be one of"):
        dataclasses.replace(recognizer, precision="fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        load_model(tmp_path / "missing.ckpt", precision="half")  # before reading the file


@pytest.mark.parametrize("timestamps", ["attention", "ctc"])
def test_timestamps_are_monotone_and_inside_the_audio(overfit, timestamps):
    recognizer, waves = overfit
    results = recognizer.transcribe_batch(waves, word_timestamps=timestamps)
    for wave, transcript in zip(waves, [r.transcript for r in results]):
        duration = len(wave) / RATE
        starts, ends = np.array(transcript.token_starts), np.array(transcript.token_ends)
        assert len(starts) == len(ends) == len(transcript.tokens) > 0
        assert np.all(np.diff(starts) >= 0) and np.all(np.diff(ends) >= 0)
        assert np.all((0 <= starts) & (starts <= ends) & (ends <= duration))
        assert [w.text for w in transcript.words] == transcript.text.split()
        times = [t for w in transcript.words for t in (w.start, w.end)]
        assert times == sorted(times) and 0 <= times[0] and times[-1] <= duration
    if timestamps == "ctc":  # CTC spans hold the emitting frames: the speech, not the margins
        yes = recognizer.transcribe(waves[0], word_timestamps="ctc").words[0]
        assert 0.1 < yes.start < yes.end < len(waves[0]) / RATE - 0.1


def test_files_of_any_format_and_rate_and_arrays_agree(overfit, tmp_path):
    recognizer, waves = overfit
    wave = waves[3].numpy()
    soundfile.write(tmp_path / "a.flac", wave, RATE)
    soundfile.write(tmp_path / "a.wav", wave, RATE, subtype="FLOAT")
    soundfile.write(tmp_path / "a22k.wav", load_audio(tmp_path / "a.wav", 22050).numpy(), 22050)
    int16 = (wave * 32768).round().astype(np.int16)
    expected = UTTERANCES["an4_clstk/fash/an255-fash-b"]
    batch = recognizer.transcribe_batch(
        [tmp_path / "a.wav", str(tmp_path / "a.flac"), wave, torch.from_numpy(wave), int16]
    )
    names = [
        str(tmp_path / "a.wav"),
        str(tmp_path / "a.flac"),
        *(f"<waveform {i}>" for i in (2, 3, 4)),
    ]
    assert [r.name for r in batch] == names
    results = [r.transcript for r in batch]
    assert [r.text for r in results] == [expected] * 5
    assert results[0].token_starts == results[2].token_starts  # same samples, same times
    with_none = recognizer.transcribe_batch([wave, None])  # what is no audio fails alone
    assert with_none[0].transcript.text == expected
    assert "got NoneType" in str(with_none[1].error)
    resampled = recognizer.transcribe(tmp_path / "a22k.wav")
    assert resampled.duration == pytest.approx(len(wave) / RATE, abs=1e-4)
    assert recognizer.transcribe(wave[::2].copy(), sample_rate=8000).duration == pytest.approx(
        len(wave) / RATE, abs=1e-3
    )


def test_bad_inputs_raise_naming_the_problem(overfit, tmp_path):
    recognizer, _ = overfit
    with pytest.raises(ValueError, match="missing.wav: file not found"):
        recognizer.transcribe(tmp_path / "missing.wav")
    with pytest.raises(ValueError, match="mono waveform"):
        recognizer.transcribe(np.zeros((2, 100), dtype=np.float32))
    with pytest.raises(ValueError, match="needs a CTC head"):
        _untrained(
            lambda d: RNNEncoder(d, hidden_size=8, num_layers=1, projection_dim=8, subsample="2")
        ).transcribe(np.zeros(RATE, dtype=np.float32), word_timestamps="ctc")
    with pytest.raises(ValueError, match="no CTC head"):
        _untrained(
            lambda d: RNNEncoder(d, hidden_size=8, num_layers=1, projection_dim=8, subsample="2")
        ).transcribe(np.zeros(RATE, dtype=np.float32), options=JOINT)


# --------------------------------------------------------------------------- long audio


def test_segmentation_cuts_inside_silences(three_minutes):
    audio, gaps = three_minutes["audio"], three_minutes["gaps"]
    duration = len(audio) / RATE
    assert 170 < duration < 200
    source = FileSource(three_minutes["path"], RATE)
    spans = segment_source(source, SegmenterOptions(edge_silence_seconds=None))
    assert spans[0][0] == 0 and spans[-1][1] == pytest.approx(duration)
    assert all(0 < end - start <= 20 for start, end in spans)
    for (_, end), (start, _) in pairwise(spans):
        assert end == start, "cut segments meet"
        assert any(g0 < end < g1 for g0, g1 in gaps), f"cut at {end:.2f} s is not in a silence"
    assert len(spans) >= duration / 20

    trimmed = segment_source(source, SegmenterOptions())  # default: edge silence trimmed
    loud = np.flatnonzero(_loud(audio)) * 0.01
    inside = [any(s <= t and t + 0.01 <= e for s, e in trimmed) for t in loud]
    assert all(inside), "every frame of speech stays in a segment"
    assert sum(e - s for s, e in trimmed) < sum(e - s for s, e in spans) - 10
    for start, end in trimmed:
        assert any(g0 <= start <= g1 for g0, g1 in gaps) or start == 0
        assert any(g0 <= end <= g1 for g0, g1 in gaps)


def test_long_audio_maps_words_onto_the_original_timeline(overfit, tmp_path):
    """Each utterance is recognised in its own segment, and its words land inside it."""
    recognizer, waves = overfit
    audio, spans, gaps = _concatenate([w.numpy() for w in waves] * 3)
    path = tmp_path / "repeated.wav"
    soundfile.write(path, audio, RATE)
    segmenter = SegmenterOptions(max_segment_seconds=5)  # 4.6 s fits one utterance, not two
    references = list(UTTERANCES.values()) * 3
    for timestamps, slack in (("ctc", 0.05), ("attention", 1.0)):
        transcript = recognizer.transcribe(path, options=GREEDY, word_timestamps=timestamps,
                                           segmenter=segmenter)  # fmt: skip
        assert transcript.duration == pytest.approx(len(audio) / RATE)
        assert len(transcript.segments) == len(spans)
        right = sum(s.text == ref for s, ref in zip(transcript.segments, references))
        assert right >= 9, [s.text for s in transcript.segments]
        for k, segment in enumerate(transcript.segments):
            assert gaps[k][0] < segment.start < spans[k][0] < spans[k][1] < segment.end
            assert segment.end < gaps[k + 1][1]
            words = [w for w in transcript.words if segment.start <= w.start <= segment.end]
            assert " ".join(w.text for w in words) == segment.text
            for word in words:
                assert spans[k][0] - slack <= (word.start + word.end) / 2 <= spans[k][1] + slack
        assert transcript.text == " ".join(s.text for s in transcript.segments if s.text)


def test_transcribe_cuts_at_the_recognizers_segment_length_by_default(overfit, tmp_path):
    """Without a segmenter, long audio is cut at `Recognizer.segment_seconds` (what `asr fit`
    stores: about the training utterances' length), or at 20 s when that is unknown."""
    recognizer, waves = overfit
    audio, spans, _ = _concatenate([w.numpy() for w in waves] * 3)
    path = tmp_path / "repeated.wav"
    soundfile.write(path, audio, RATE)

    def cuts(r: Recognizer, segmenter: SegmenterOptions | None = None) -> list[tuple]:
        return [
            (s.start, s.end)
            for s in r.transcribe(path, options=GREEDY, segmenter=segmenter).segments
        ]

    told = cuts(recognizer, SegmenterOptions(max_segment_seconds=5))
    assert len(told) == len(spans)  # 5 s holds one utterance
    own = dataclasses.replace(recognizer, segment_seconds=5.0)
    assert cuts(own) == told
    assert cuts(own, SegmenterOptions(read_seconds=30)) == told, "other settings keep it"
    assert len(cuts(own, SegmenterOptions(max_segment_seconds=20))) < len(spans)
    assert recognizer.segment_seconds is None and len(cuts(recognizer)) < len(spans)  # 20 s


def test_long_audio_reads_in_pieces(overfit, three_minutes):
    """Peak Python/numpy memory while transcribing 3 minutes stays far below the file's size
    as float32: it is never read whole (the slow test checks process memory on an hour)."""
    recognizer, _ = overfit
    whole = len(three_minutes["audio"]) * 4
    tracemalloc.start()
    try:
        [result] = transcribe_sources(
            recognizer, [three_minutes["path"]], options=GREEDY,
            segmenter=SegmenterOptions(read_seconds=10), batch_size=2,
        )  # fmt: skip
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(result.transcript, Transcript) and len(result.transcript.segments) >= 9
    assert peak < whole / 3, f"peak {peak / 1e6:.1f} MB for a {whole / 1e6:.1f} MB file"


MEMORY_SCRIPT = """
import resource, sys, tracemalloc, numpy as np, soundfile, torch
sys.path.insert(0, "TESTS")
from test_transcribe import _overfit_recognizer
from asr.search import SearchOptions
from asr.transcribe import transcribe_sources

torch.set_num_threads(1)  # as in the tests; more threads add malloc arenas, noise to the peak
recognizer, waves = _overfit_recognizer("WAV")
path = sys.argv[1]
rng = np.random.default_rng(0)
with soundfile.SoundFile(path, "w", 16000, 1, subtype="PCM_16") as out:
    for _ in range(60):  # an hour, written a minute at a time: speech with 2 s pauses
        minute = np.concatenate([np.concatenate([w.numpy(), 1e-4 * rng.standard_normal(32000)])
                                 for w in waves * 4])
        out.write(np.resize(minute, 60 * 16000))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
[r] = transcribe_sources(recognizer, [path], options=SearchOptions(beam_size=1), batch_size=2)
t = r.transcript
traced = tracemalloc.get_traced_memory()[1]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(t.segments), t.duration, traced, (after - before) * 1024)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_hour_file_keeps_memory_bounded(tmp_path):
    """Transcribing an hour: peak numpy/Python memory stays a few MB and the process's peak
    RSS grows far less than the hour as float32 (230 MB) that a whole read would add."""
    script = MEMORY_SCRIPT.replace("TESTS", str(REPO / "tests"))
    script = script.replace("WAV", str(WAV))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path / "hour.wav")],
        capture_output=True, text=True, timeout=850, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    segments, duration, traced, growth = map(float, proc.stdout.split()[-4:])
    assert duration == pytest.approx(3600) and segments > 180
    whole = 3600 * RATE * 4
    assert traced < 20e6, f"peak traced memory {traced / 1e6:.1f} MB"
    assert growth < whole / 2, f"peak RSS grew by {growth / 1e6:.0f} MB"


def test_plan_segments_properties():
    """Random energies: spans never exceed the maximum, cover the audio, and meet at cuts or
    overlap by exactly the window overlap."""
    rng = np.random.default_rng(0)
    options = SegmenterOptions(max_segment_seconds=3, drop_silent=False, edge_silence_seconds=None)
    for _ in range(50):
        frames = int(rng.integers(100, 3000))
        energy = rng.normal(-20, 5, frames)
        for _ in range(int(rng.integers(0, 8))):  # silences of random lengths
            start = int(rng.integers(0, frames))
            energy[start : start + int(rng.integers(5, 80))] = -90
        duration = frames * 0.01
        spans = plan_segments(energy, 0.01, duration, options)
        assert spans[0][0] == 0 and spans[-1][1] == pytest.approx(duration)
        assert all(0 < e - s <= 3 + 1e-9 for s, e in spans)
        for (_, end), (start, _) in pairwise(spans):
            assert start == end or start == pytest.approx(end - 1.0)
            if start == end:  # a cut: inside a silence
                assert energy[int(end / 0.01)] == -90 or energy[int(end / 0.01) - 1] == -90


def test_a_click_sets_no_level_and_a_dc_offset_fills_no_pause():
    """A 20 ms click 40 dB above quiet speech made all of the speech count as silence, and a
    1 % DC offset left no frame quiet enough for a pause."""
    speech = np.random.default_rng(0).normal(0, 0.01, 16000)  # -40 dBFS, 1 s
    pause = np.zeros(8000)
    wave = np.concatenate([speech, pause, speech, pause, speech, pause, speech])
    wave[30000:30320] = 1.0  # a click in the second utterance
    options = SegmenterOptions(max_segment_seconds=3, min_silence_seconds=0.3)
    for offset in (0.0, 0.01):
        energy = frame_energy_db(wave + offset, 160)
        spans = plan_segments(energy, 0.01, len(wave) / 16000, options)
        for k in range(4):  # every utterance kept whole, and cuts fall in pauses
            start, end = 1.5 * k, 1.5 * k + 1.0
            assert any(a <= start and end <= b for a, b in spans), (offset, k, spans)
        assert all(int(b * 100) % 150 >= 100 or b == 5.5 for _, b in spans), (offset, spans)


@pytest.mark.parametrize("loud", ["door slam", "louder talker"])
def test_a_loud_stretch_sets_the_level_of_its_neighbourhood_alone(loud):
    """A 0.5 s burst 45 dB above quiet speech, or a talker 40 dB louder before it, set the
    level a whole input was judged against: all of the quiet speech counted as silence."""
    rng = np.random.default_rng(0)
    pause = np.zeros(8000)

    def utterances(db, count, seconds=1.0):  # `count` utterances, each with a pause after
        return [np.concatenate([rng.normal(0, 10 ** (db / 20), int(16000 * seconds)), pause])
                for _ in range(count)]  # fmt: skip

    first = utterances(0, 1, 0.5) if loud == "door slam" else utterances(-5, 6)
    wave = np.concatenate(first + utterances(-45, 20))
    begin = sum(map(len, first)) / 16000  # where the quiet speech begins
    energy, duration = frame_energy_db(wave, 160), len(wave) / 16000
    quiet = [(begin + 1.5 * k, begin + 1.5 * k + 1.0) for k in range(20)]
    far = [u for u in quiet if u[0] >= begin + 6.0]  # beyond 5 whole seconds of the loud part
    options = SegmenterOptions(max_segment_seconds=3)
    spans = plan_segments(energy, 0.01, duration, options)
    for start, end in far:
        assert any(a <= start and end <= b for a, b in spans), (start, spans)
    whole = plan_segments(
        energy, 0.01, duration, dataclasses.replace(options, level_window_seconds=None)
    )
    assert not any(a < end and start < b for a, b in whole for start, end in quiet), whole
    with pytest.raises(ValueError, match=r"level_window_seconds must be None or >= 1, got 0\.5"):
        SegmenterOptions(level_window_seconds=0.5)


def test_digital_silence_is_silent_however_quiet_the_rest():
    """Levels are relative to the loudest stretch: an input of digital silence alone was all
    loud, and its windows were decoded into made-up words."""
    options = SegmenterOptions(max_segment_seconds=3)
    silence = frame_energy_db(np.zeros(16000 * 30), 160)
    assert plan_segments(silence, 0.01, 30.0, options) == []
    for db in (-70, -85):  # speech-like noise however quiet, as float samples keep it
        quiet = np.random.default_rng(0).normal(0, 10 ** (db / 20), 16000)
        quiet[4000:8000] *= 10 ** (-15 / 20)  # a softer syllable, 15 dB down
        wave = np.concatenate([np.zeros(16000 * 10), quiet, np.zeros(16000 * 10)])
        spans = plan_segments(frame_energy_db(wave, 160), 0.01, len(wave) / 16000, options)
        assert spans == [(9.5, 11.5)], "quiet speech is kept whole, the silence trimmed"


@pytest.mark.parametrize("seconds", [2, 8])
def test_a_silent_input_gives_no_segment_however_short(seconds):
    """Digital silence, 16-bit noise of one step and float noise at -120 dBFS give no segment
    to decode (made-up letters) however short, as longer inputs give none."""
    options = SegmenterOptions(max_segment_seconds=5)
    rng = np.random.default_rng(0)
    steps = rng.integers(-1, 2, 16000 * seconds) / 32768
    for wave in (0 * steps, steps, rng.normal(0, 1e-6, 16000 * seconds)):
        source = ArraySource(torch.from_numpy(wave).float(), 16000)
        assert segment_source(source, options) == []


def _window(tokenizer, span: tuple[float, float], held: list[Word]) -> tuple:
    """`(span, transcript)` of a window whose decode is the words `held` (times in the input),
    a token per letter, timed as its word, and per space."""
    start, end = span
    text = " ".join(w.text for w in held)
    pieces = tokenizer.pieces(tokenizer.encode(text))
    starts = [w.start - start for w in held for _ in range(len(w.text) + 1)][:-1]  # then space
    ends = [w.end - start for w in held for _ in range(len(w.text) + 1)][:-1]
    local = [Word(w.text, w.start - start, w.end - start) for w in held]
    return span, Transcript(text, tokenizer.encode(text), pieces, starts, ends, local, -1.0,
                            end - start, [Segment(0, end - start, text, -1.0)])  # fmt: skip


def test_overlapping_windows_keep_each_word_once():
    """Two fixed windows overlapping by 1 s, each transcribing the words it holds: the joined
    transcript has every word once, at its time in the input."""
    tokenizer = CharTokenizer.train(["ABCDEFGH"])
    words = [Word(c, 0.5 * k + 0.1, 0.5 * k + 0.4) for k, c in enumerate("ABCDEFGH")]  # 0-4 s
    spans = [(0.0, 2.5), (1.5, 4.0)]
    parts = [_window(tokenizer, (start, end), [w for w in words if start <= w.start and
                                               w.end <= end]) for start, end in spans]  # fmt: skip
    joined = join_segments(tokenizer, parts[::-1], 4.0)
    assert joined.text == "A B C D E F G H"
    assert [(w.text, w.start, w.end) for w in joined.words] == [
        (w.text, pytest.approx(w.start), pytest.approx(w.end)) for w in words
    ]
    # the segments' tokens meet with a space between, as their texts: "DE" had run together
    assert tokenizer.decode(joined.tokens) == joined.text
    assert "".join(joined.pieces).replace("\u2581", " ") == joined.text
    assert len(joined.token_starts) == len(joined.token_ends) == len(joined.tokens)
    assert joined.token_starts == sorted(joined.token_starts)
    assert [(s.start, s.end) for s in joined.segments] == [(0.0, 2.0), (2.0, 4.0)]
    assert math.isnan(joined.score), "both windows were cut: their scores count the overlap"


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [  # the words either window decoded around the cut at 4.5 s -> what the join keeps
        ([Word("U", 4.40, 4.48)], [Word("E", 4.36, 5.00)], "N E X"),  # an onset, then whole
        ([Word("E", 4.00, 4.80)], [Word("U", 4.52, 4.60)], "N E X"),  # whole, then its end
        ([Word("N", 4.40, 4.44)], [Word("N", 4.42, 4.70)], "N N X"),  # one N twice
        ([Word("U", 4.30, 4.48)], [Word("E", 4.46, 5.00)], "N U E X"),  # two words that touch
        # each window timed the word on the other's side of the cut: the longer is kept
        ([Word("U", 4.60, 4.76)], [Word("E", 4.32, 4.56)], "N E X"),
        ([Word("E", 4.56, 4.90)], [Word("U", 4.40, 4.48)], "N E X"),
        ([Word("E", 4.56, 4.90)], [Word("X", 5.00, 5.30)], "N E X X"),  # one side: kept
        ([Word("E", 4.46, 4.70)], [Word("E", 4.75, 5.00)], "N E X"),  # one word timed apart
        (
            [Word("N", 4.46, 4.62), Word("N", 4.70, 4.90)],  # N said thrice, the middle one timed
            [Word("N", 4.36, 4.49), Word("N", 4.68, 4.88)],
            "N N N X",
        ),  # across by both
        # each timed U across the cut, a frame into a word the other side kept (and see below)
        (
            [Word("N", 4.40, 4.44), Word("U", 4.48, 4.64)],
            [Word("U", 4.24, 4.56), Word("E", 4.60, 4.80)],
            "N N U E X",
        ),
    ],
)
def test_a_word_both_windows_decoded_at_their_cut_is_kept_once(first, second, kept):
    """A window cut through a word gives its onset ("U"), the next its whole ("ERASE"): both
    lie on their own side of the midpoint cut, but they are one stretch of speech, so the
    shorter is left out; words that only touch are both kept."""
    tokenizer = CharTokenizer.train(["NUEX"])
    before = [Word("N", 3.90, 4.20) if first[0].start > 4.2 else Word("N", 3.5, 3.8), *first]
    after = [*second, Word("X", 5.5, 6.0)]
    parts = [_window(tokenizer, (0.0, 5.0), before), _window(tokenizer, (4.0, 9.0), after)]
    joined = join_segments(tokenizer, parts, 9.0)
    assert joined.text == kept and " ".join(w.text for w in joined.words) == kept
    assert all(a.end <= b.start + 0.1 for a, b in pairwise(joined.words)), "in order"
    assert len(joined.tokens) == len(joined.pieces) == len(joined.token_starts)
    for word in joined.words:  # a word crossing the cut is held to its own segment
        [segment] = [s for s in joined.segments if s.start <= (word.start + word.end) / 2 < s.end]
        assert segment.start <= word.start <= word.end <= segment.end, (word, segment)
    assert all(0.0 <= a <= b <= 9.0 for a, b in zip(joined.token_starts, joined.token_ends))
    assert all(w.start < w.end for w in joined.words), "a word kept keeps its times"


def test_a_word_each_window_timed_into_the_others_kept_word_is_kept_once():
    """ "THREE NINE E" at a cut in long AN4 audio, as "A B C": the first window times B past the
    cut and over C, the second before the cut and a frame into A. The second's B is kept, the
    cut moved back to A's end so that A keeps its times."""
    tokenizer = CharTokenizer.train(["ABC"])
    before = [Word("A", 3.20, 3.40), Word("B", 3.44, 3.76)]
    after = [Word("B", 3.36, 3.52), Word("C", 3.56, 3.60)]
    parts = [_window(tokenizer, (0.0, 4.0), before), _window(tokenizer, (3.0, 7.0), after)]
    joined = join_segments(tokenizer, parts, 7.0)
    assert joined.text == "A B C"
    times = [(w.start, w.end) for w in joined.words]
    np.testing.assert_allclose(times, [(3.20, 3.40), (3.40, 3.52), (3.56, 3.60)], atol=1e-9)


def test_a_piece_of_a_word_kept_across_the_cut_is_not_kept_again():
    """The second window decoded the tail of the first's SIXTY as TY, overlapping it by a
    frame: its text ends the kept word's, so it is that word's speech, not a lost word."""
    tokenizer = CharTokenizer.train(["SIXTYEV"])
    before = [Word("SIXTY", 23.40, 24.40)]
    after = [Word("TY", 24.36, 24.44), Word("SEVE", 24.50, 24.72)]
    parts = [_window(tokenizer, (20.0, 25.0), before), _window(tokenizer, (24.0, 28.0), after)]
    assert join_segments(tokenizer, parts, 28.0).text == "SIXTY SEVE"


def test_the_guides_times_choose_the_words_kept_and_the_parts_own_are_reported():
    """Attention at a window's edge timed F 0.6 s early in one window (3.0-3.2) and late in the
    next (3.6-3.8), on either side of the cut: both were kept. CTC's times (the guides) put
    both copies on one stretch of speech: F is kept once, at its attention time."""
    tokenizer = CharTokenizer.train(["XFY"])
    before = [Word("X", 1.0, 1.4), Word("F", 3.0, 3.2)]
    after = [Word("F", 3.6, 3.8), Word("Y", 5.0, 5.4)]
    parts = [_window(tokenizer, (0.0, 4.0), before), _window(tokenizer, (3.0, 7.0), after)]
    assert join_segments(tokenizer, parts, 7.0).text == "X F F Y"
    guides = [
        _window(tokenizer, (0.0, 4.0), [Word("X", 1.0, 1.4), Word("F", 3.4, 3.6)])[1],
        _window(tokenizer, (3.0, 7.0), [Word("F", 3.42, 3.62), Word("Y", 5.0, 5.4)])[1],
    ]
    joined = join_segments(tokenizer, parts[::-1], 7.0, guides[::-1])  # in any order
    assert joined.text == "X F Y"
    np.testing.assert_allclose([(w.start, w.end) for w in joined.words],
                               [(1.0, 1.4), (3.6, 3.8), (5.0, 5.4)], atol=1e-9)  # fmt: skip
    with pytest.raises(ValueError, match="other tokens than the part"):
        join_segments(tokenizer, parts, 7.0, [guides[0], guides[0]])
    # a word kept by its guide whose own times lie past the cut takes the guide's, not an
    # instant at the cut
    late = [Word("X", 1.0, 1.4), Word("F", 3.7, 3.9)]  # attention: after the cut at 3.5
    guides = [_window(tokenizer, (0.0, 4.0), [Word("X", 1.0, 1.4), Word("F", 3.3, 3.45)])[1],
              _window(tokenizer, (3.0, 7.0), [Word("Y", 5.0, 5.4)])[1]]  # fmt: skip
    parts = [_window(tokenizer, (0.0, 4.0), late), _window(tokenizer, (3.0, 7.0), after[1:])]
    joined = join_segments(tokenizer, parts, 7.0, guides)
    assert joined.text == "X F Y"
    np.testing.assert_allclose([(w.start, w.end) for w in joined.words],
                               [(1.0, 1.4), (3.3, 3.45), (5.0, 5.4)], atol=1e-9)  # fmt: skip


def test_a_segment_whose_own_times_cross_its_cut_takes_its_guides_times_in_order():
    """Attention drifting late through a window (AN4 "... FOUR SIX SEVEN" at a cut at 4.5 s)
    put its last word kept past the cut. Taking CTC's times for that word alone set it before
    the word ahead of it; the segment's words and tokens all take CTC's instead."""
    tokenizer = CharTokenizer.train(["ABCDE"])
    own = [Word("A", 0.3, 0.7), Word("B", 1.0, 2.9), Word("C", 4.36, 4.48), Word("D", 4.52, 4.7)]
    ctc = [Word("A", 0.3, 0.7), Word("B", 1.0, 1.3), Word("C", 3.6, 3.8), Word("D", 4.0, 4.4)]
    after_own, after_ctc = [Word("D", 4.0, 4.2), Word("E", 4.8, 5.4)], [Word("D", 4.0, 4.4)]
    after_ctc.append(Word("E", 5.0, 5.3))
    parts = [_window(tokenizer, (0.0, 5.0), own), _window(tokenizer, (4.0, 6.0), after_own)]
    guides = [_window(tokenizer, (0.0, 5.0), ctc)[1], _window(tokenizer, (4.0, 6.0), after_ctc)[1]]
    joined = join_segments(tokenizer, parts, 6.0, guides)
    assert joined.text == "A B C D E"
    expected = [(w.start, w.end) for w in ctc] + [(4.8, 5.4)]  # the second keeps its own times
    np.testing.assert_allclose([(w.start, w.end) for w in joined.words], expected, atol=1e-9)
    letters = [k for k, piece in enumerate(joined.pieces) if piece != "▁"]
    np.testing.assert_allclose([joined.token_starts[k] for k in letters],
                               [start for start, _ in expected], atol=1e-9)  # fmt: skip
    assert joined.token_starts == sorted(joined.token_starts)


def test_long_audio_joins_its_windows_by_ctc_times_whichever_timestamps(
    checkpoint, tmp_path, monkeypatch
):
    """Which words windows keep at their cuts is chosen by CTC times where there is a CTC
    head: --timestamps changes the times alone, not the text."""
    waves = [load_audio(WAV / f"{p}.wav", 16000) for p in UTTERANCES]
    audio = tmp_path / "joined.wav"
    soundfile.write(audio, torch.cat([*waves, *waves]).numpy(), 16000)
    join, guided = asr.transcribe.join_segments, []

    def recording_join(tokenizer, parts, duration, guides=None):
        guided.append([[w.start for w in guide.words] for guide in guides or []])
        return join(tokenizer, parts, duration, guides)

    monkeypatch.setattr(asr.transcribe, "join_segments", recording_join)
    texts = []
    for timestamps in ("attention", "ctc"):
        main(["transcribe", str(audio), "--checkpoint", str(checkpoint), "--quiet",
              "--max-segment-seconds", "3", "--min-silence-seconds", "10",
              "--output-dir", str(tmp_path / timestamps), "--format", "txt", "json",
              "--timestamps", timestamps])  # fmt: skip
        texts.append((tmp_path / timestamps / "joined.txt").read_text())
    assert texts[0] == texts[1] and texts[0].strip()
    assert len(guided) == 2 and guided[0] == guided[1] and len(guided[0]) > 2, "CTC's both times"
    words = [json.loads((tmp_path / t / "joined.json").read_text())["words"]
             for t in ("attention", "ctc")]  # fmt: skip
    assert [w["start"] for w in words[0]] != [w["start"] for w in words[1]], "reported as asked"


def test_a_segment_cut_from_its_window_has_no_score_or_alternatives_of_the_window():
    """The search score and n-best of a window are of all its words: a segment that leaves some
    to its neighbour has neither, and a segment that keeps all its window's words keeps both."""
    tokenizer = CharTokenizer.train(["ABC"])
    before = [Word("A", 1.0, 1.4), Word("B", 4.6, 4.9)]  # B is the next segment's
    after = [Word("B", 4.6, 4.9), Word("C", 6.0, 6.4)]
    parts = [_window(tokenizer, (0.0, 5.0), before), _window(tokenizer, (4.0, 9.0), after)]
    for (_, part), other, logprob in zip(parts, ("A B B", "B C C"), (-0.5, -0.25)):
        part.segments[0].alternatives = [Alternative(other, tokenizer.encode(other), -3.0)]
        part.avg_logprob = part.segments[0].avg_logprob = logprob
    joined = join_segments(tokenizer, parts, 9.0)
    assert [s.text for s in joined.segments] == ["A", "B C"]
    cut, whole = joined.segments
    assert math.isnan(cut.score) and cut.alternatives == [] and cut.avg_logprob is None
    assert whole.score == -1.0 and [a.text for a in whole.alternatives] == ["B C C"]
    assert joined.avg_logprob == whole.avg_logprob == -0.25, "not the cut window's"
    # the transcript's score is its segments' sum: none either (both windows' counted the
    # overlap's words twice)
    assert math.isnan(joined.score) and joined.to_dict()["score"] is None
    cut, whole = joined.to_dict()["segments"]
    assert cut["score"] is None and "alternatives" not in cut
    assert whole["alternatives"] == [{"text": "B C C", "score": -3.0}]


def test_a_word_timed_apart_before_the_overlap_is_kept_once():
    tokenizer = CharTokenizer.train(["ADX"])
    before = [Word("A", 1.0, 1.4), Word("D", 3.90, 4.05)]  # its middle before the overlap
    after = [Word("D", 4.06, 4.20), Word("X", 6.0, 6.4)]
    parts = [_window(tokenizer, (0.0, 5.0), before), _window(tokenizer, (4.0, 9.0), after)]
    assert join_segments(tokenizer, parts, 9.0).text == "A D X"


def test_a_window_within_the_one_before_leaves_the_segments_in_order():
    """A silence cut a window short within the one before: segments still tile the input in
    order, and a word at the first cut keeps its time within its segment."""
    tokenizer = CharTokenizer.train(["ABC"])
    parts = [_window(tokenizer, (0.0, 5.0), [Word("B", 1.0, 1.4), Word("A", 4.55, 4.95)]),
             _window(tokenizer, (4.0, 4.9), []),
             _window(tokenizer, (4.9, 9.9), [Word("C", 5.3, 5.6)])]  # fmt: skip
    joined = join_segments(tokenizer, parts, 9.9)
    assert joined.text == "B A C"
    bounds = [t for segment in joined.segments for t in (segment.start, segment.end)]
    assert bounds == sorted(bounds) and bounds[0] == 0.0 and bounds[-1] == 9.9
    assert [(w.start, w.end) for w in joined.words] == [(1.0, 1.4), (4.55, 4.9), (5.3, 5.6)]


def test_a_window_without_words_of_its_own_takes_none_from_its_other_overlap():
    """Nothing is said between the cuts at 4.5 and 8.5 s: the middle window keeps no word, and
    its word of the first overlap, kept there from the first window, is not taken again at the
    second cut."""
    tokenizer = CharTokenizer.train(["AC"])
    spans, held = [(0.0, 5.0), (4.0, 9.0), (8.0, 13.0)], [["A"], ["A"], ["C"]]
    times = {"A": (4.30, 4.45), "C": (10.0, 10.5)}
    parts = [_window(tokenizer, span, [Word(c, *times[c]) for c in letters])
             for span, letters in zip(spans, held)]  # fmt: skip
    assert join_segments(tokenizer, parts, 13.0).text == "A C"


def test_frame_energy_matches_chunked_reading(three_minutes):
    source = FileSource(three_minutes["path"], RATE)
    energy, frame_seconds = source.energy_db(0.01, read_seconds=7.0)
    assert frame_seconds == 0.01
    whole = load_audio(three_minutes["path"]).numpy()
    np.testing.assert_allclose(energy, frame_energy_db(whole, 160), atol=1e-6)


# --------------------------------------------------------------------------- outputs and CLI


CUE_TIME = r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d)"


def _cues(text: str, marker: str) -> list[tuple[float, float, str]]:
    """Parse SRT or WebVTT cues strictly; returns (start, end, text)."""
    blocks = [b for b in text.strip().split("\n\n") if b]
    if marker == ".":
        assert blocks[0] == "WEBVTT"
        blocks = blocks[1:]
    cues = []
    for number, block in enumerate(blocks, 1):
        lines = block.split("\n")
        if marker == ",":
            assert lines.pop(0) == str(number)
        time = re.fullmatch(f"{CUE_TIME} --> {CUE_TIME}", lines[0])
        assert time and marker in lines[0], lines[0]
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, time.groups())
        start, end = h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000
        cues.append((start, end, " ".join(lines[1:])))
    return cues


def _check_outputs(stem: Path, audio_duration: float) -> dict:
    for fmt in FORMATS:
        assert stem.with_suffix(f".{fmt}").is_file(), f"{stem}.{fmt} missing"
    data = json.loads(stem.with_suffix(".json").read_text())
    assert stem.with_suffix(".txt").read_text() == data["text"] + "\n"
    assert {"text", "duration", "score", "segments", "words", "tokens"} <= set(data)
    for item in data["words"] + data["tokens"] + data["segments"]:
        assert 0 <= item["start"] <= item["end"] <= audio_duration + 1e-3
    for fmt, marker in (("srt", ","), ("vtt", ".")):
        cues = _cues(stem.with_suffix(f".{fmt}").read_text(), marker)
        assert " ".join(c[2] for c in cues) == data["text"]
        assert all(start <= end for start, end, _ in cues)
        assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in pairwise(cues))
    return data


def test_transcribe_files_writes_every_format(overfit, three_minutes, tmp_path, capsys):
    recognizer, waves = overfit
    short, minutes = tmp_path / "yes.wav", tmp_path / "three_minutes.wav"
    soundfile.write(short, waves[0].numpy(), RATE)
    minutes.symlink_to(three_minutes["path"])  # one folder: the outputs are named by stem
    failed = transcribe_files(
        recognizer, [short, minutes], tmp_path / "out", formats=FORMATS, options=GREEDY,
        words_per_cue=5, progress=False,
    )  # fmt: skip
    assert failed == []
    assert _check_outputs(tmp_path / "out" / "yes", 1.0)["text"] == "YES"
    long = _check_outputs(tmp_path / "out" / "three_minutes", 200.0)
    assert len(long["segments"]) >= 9
    cues = _cues((tmp_path / "out" / "three_minutes.srt").read_text(), ",")
    assert len(cues) >= len(long["segments"]) and max(len(c[2].split()) for c in cues) <= 5
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{short}\tYES" and lines[1].startswith(f"{minutes}\t")


def test_cli_reports_a_bad_file_and_transcribes_the_others(checkpoint, tmp_path, capsys):
    good = [str(tmp_path / f"{Path(p).name}.wav") for p in list(UTTERANCES)[:2]]
    for path, utterance in zip(good, UTTERANCES):  # one folder: the outputs are named by stem
        Path(path).symlink_to(WAV / f"{utterance}.wav")
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF not really a wave file")
    tiny = tmp_path / "tiny.wav"
    soundfile.write(tiny, np.zeros(80, dtype=np.float32), RATE)  # 5 ms: too short to encode
    out = tmp_path / "out"
    code = main([
        "transcribe", good[0], str(corrupt), str(tiny), good[1], "--checkpoint", str(checkpoint),
        "--output-dir", str(out), "--format", *FORMATS, "--beam-size", "2", "--quiet",
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    for path in good:
        _check_outputs(out / Path(path).stem, audio_info(path).duration)
    assert not list(out.glob("corrupt.*"))
    assert re.search(rf"{re.escape(str(corrupt))}: unreadable or corrupt audio", captured.err)
    assert (out / "tiny.txt").read_text() == "\n", "too short to hold a word: no words"
    printed = [line.split("\t")[0] for line in captured.out.splitlines()]
    assert printed == [good[0], str(tiny), good[1]]


def test_cli_refuses_bad_options(checkpoint, tmp_path, capsys):
    args = ["transcribe", "x.wav", "--checkpoint", str(checkpoint), "--output-dir", str(tmp_path)]
    assert main([*args, "--lm-weight", "0.5"]) == 2
    assert "--lm-weight needs --lm" in capsys.readouterr().err
    assert main([*args, "--lm", ""]) == 2  # `--lm "$LM"` with LM unset
    assert "--lm is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # at parsing (tests/cli/test_arguments.py)
        main([*args, "--max-segment-seconds", "0.5"])
    assert stopped.value.code == 2 and "--max-segment-seconds" in capsys.readouterr().err


def test_cli_warns_of_segments_longer_than_the_training_utterances(checkpoint, tmp_path, capsys):
    trained = load_model(checkpoint).segment_seconds  # what `asr fit` stored
    audio = str(WAV / "an4_clstk/fash/an251-fash-b.wav")
    args = ["transcribe", audio, "--checkpoint", str(checkpoint), "--beam-size", "1",
            "--output-dir", str(tmp_path), "--format", "txt", "--quiet"]  # fmt: skip
    assert main([*args, "--max-segment-seconds", str(trained)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*args, "--max-segment-seconds", str(trained + 1)]) == 0
    warning = capsys.readouterr().err
    assert f"--max-segment-seconds {trained + 1:g} is longer than 95% of this model's " in warning
    assert f"training utterances ({trained:g} s, its default)" in warning


def test_cli_nbest_lists_alternatives_and_confidences_in_json(checkpoint, tmp_path, capsys):
    audio = str(WAV / "an4_clstk/fash/an251-fash-b.wav")
    args = ["transcribe", audio, "--checkpoint", str(checkpoint), "--beam-size", "3",
            "--output-dir", str(tmp_path), "--format", "json", "--quiet"]  # fmt: skip
    assert main([*args, "--nbest", "3"]) == 0
    result = json.loads((tmp_path / "an251-fash-b.json").read_text())
    [segment] = result["segments"]
    assert len(segment["alternatives"]) == 2
    assert segment["score"] >= max(a["score"] for a in segment["alternatives"])
    assert 0 <= segment["no_speech_prob"] <= 1 and segment["avg_logprob"] < 0
    assert all(0 <= w["probability"] <= 1 for w in result["words"])
    assert all(0 <= w["ctc_probability"] <= 1 for w in result["words"]), "it has a CTC head"
    assert main([*args, "--nbest", "4"]) == 2  # more than the beam keeps
    said = "error: --nbest 4: more hypotheses than --beam-size 3 keeps; give --beam-size 4 or "
    assert said in capsys.readouterr().err
    unset = args[:4] + args[6:]  # a model that stores no search: asr's default beam
    assert main([*unset, "--nbest", "99"]) == 2
    said = "--nbest 99: more hypotheses than the default beam (10) keeps; give --beam-size 99"
    assert said in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"than the model's stored beam \(4\) keeps"):
        check_nbest(5, 4, stored=True)  # one that `asr finalize` set


def test_an_input_whose_files_cannot_be_written_is_named_and_the_others_go_on(
    checkpoint, tmp_path, capsys
):
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", tmp_path / "in" / f"{name}.wav")
    (tmp_path / "out" / "a.txt").mkdir(parents=True)  # a folder where a.txt goes
    args = ["transcribe", str(tmp_path / "in"), "--checkpoint", str(checkpoint),
            "--output-dir", str(tmp_path / "out"), "--format", "txt", "--quiet"]  # fmt: skip
    assert main(args) == 1
    said = capsys.readouterr().err
    blocked = tmp_path / "out" / "a.txt"  # named: which of its outputs is in the way
    assert (
        f"{tmp_path / 'in' / 'a.wav'}: cannot write its outputs ({blocked}: Is a directory)" in said
    )
    assert "1 of 2 files failed" in said and (tmp_path / "out" / "b.txt").is_file()
    assert not list((tmp_path / "out").glob(".*.partial")), "none left behind"
    blocked.rmdir()
    maps = tmp_path / "out" / "a.explore.npz"  # the explorer's maps: named alike
    maps.mkdir()
    assert main([*args, "--explorer"]) == 1
    said = capsys.readouterr().err
    assert f"a.wav: cannot write its outputs ({maps}: Is a directory)" in said


def test_cli_shallow_fusion_with_a_language_model(checkpoint, tmp_path, capsys):
    lm = fit_tiny_lm(checkpoint.parents[1] / "lm", checkpoint.parents[1])
    audio = str(WAV / "an4_clstk/fash/an251-fash-b.wav")
    args = ["transcribe", audio, "--checkpoint", str(checkpoint), "--beam-size", "2",
            "--output-dir", str(tmp_path), "--format", "json", "--quiet"]  # fmt: skip
    assert main([*args, "--lm", str(lm), "--lm-weight", "0.5"]) == 0
    assert json.loads((tmp_path / "an251-fash-b.json").read_text())["audio"] == audio
    assert main(args) == 0
    without = json.loads((tmp_path / "an251-fash-b.json").read_text())
    assert main([*args, "--lm", str(lm), "--lm-weight", "0"]) == 0  # a sweep's first point
    assert json.loads((tmp_path / "an251-fash-b.json").read_text()) == without
    manifest = tmp_path / "one.jsonl"
    line = {"audio_filepath": audio, "duration": audio_info(audio).duration, "text": "YES"}
    manifest.write_text(json.dumps(line) + "\n")
    for weight, recorded in (("0.5", str(lm)), ("0", None)):  # 0: no LM was used
        out = tmp_path / f"evaluate{weight}"
        assert main(["evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
                     "--out", str(out), "--lm", str(lm), "--lm-weight", weight, "--plots", "0",
                     "--quiet", "--beam-size", "2"]) == 0  # fmt: skip
        assert json.loads((out / "metrics.json").read_text())["lm"] == recorded
    other = tmp_path / "other_tokenizer"
    CharTokenizer.train([*UTTERANCES.values(), "QZ"]).save(other)  # two more characters
    foreign = fit_tiny_lm(tmp_path / "foreign_lm", _with_tokenizer(checkpoint.parents[1], other))
    capsys.readouterr()
    assert main([*args, "--lm", str(foreign)]) == 2
    said = capsys.readouterr().err
    assert f"{foreign}: the language model's vocabulary differs" in said
    assert f"is needed (the recognizer: {checkpoint})" in said, "both files named"


def _with_tokenizer(data: Path, tokenizer: Path) -> Path:
    """A copy of the training data folder whose tokenizer is `tokenizer`."""
    out = tokenizer.parent / "data"
    out.mkdir()
    for name in ("train.jsonl", "dev.jsonl"):
        (out / name).write_text((data / name).read_text())
    (out / "tokenizer").symlink_to(tokenizer)
    return out


# --------------------------------------------------------------------------- inputs and containers

SPEECH = {utterance.split("/")[-1]: WAV / f"{utterance}.wav" for utterance in UTTERANCES}


@pytest.fixture
def transcribe_cli(overfit, monkeypatch, capsys):
    """`asr transcribe ARGS`, greedy, with the overfit recognizer (which knows what was said):
    returns (exit status, stdout, stderr); `stdin` is the bytes piped in."""
    monkeypatch.setattr("asr.cli._load_model", lambda args: overfit[0])

    def run(*args, stdin: bytes | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        argv = ["transcribe", *map(str, args), "--checkpoint", "-", "--beam-size", "1", "--quiet"]
        code = main(argv)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_m4a_and_mp4_transcribe_as_the_wav_does(overfit, tmp_path):
    recognizer, _ = overfit
    wav = SPEECH["an255-fash-b"]
    wave = load_audio(wav).numpy()
    m4a = encode_audio(tmp_path / "speech.m4a", wave, RATE)  # AAC
    mp4 = encode_audio(tmp_path / "film.mp4", wave, RATE, video=True)  # AAC beside a video
    results = [r.transcript for r in recognizer.transcribe_batch([wav, m4a, mp4], options=GREEDY)]
    assert [r.text for r in results] == [UTTERANCES["an4_clstk/fash/an255-fash-b"]] * 3
    assert results[1].duration == results[2].duration == pytest.approx(len(wave) / RATE)


def test_cli_mirrors_a_folder_and_a_glob_under_the_output_dir(transcribe_cli, tmp_path):
    data = tmp_path / "data"
    for speaker, utterance in (("a", "an251-fash-b"), ("b", "an253-fash-b")):
        (data / speaker).mkdir(parents=True)
        shutil.copy(SPEECH[utterance], data / speaker / "1.wav")  # the same name twice
    (data / "a" / "notes.txt").write_text("not audio")
    out = tmp_path / "out"
    code, stdout, _ = transcribe_cli(data, "--output-dir", out, "--format", "txt", "tsv")
    assert code == 0
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.*"))
    assert written == ["a/1.tsv", "a/1.txt", "b/1.tsv", "b/1.txt"]
    assert [(out / f"{s}/1.txt").read_text() for s in "ab"] == ["YES\n", "GO\n"]
    rows = [row.split("\t") for row in (out / "a/1.tsv").read_text().splitlines()]
    assert rows[0] == ["start", "end", "text"] and [r[2] for r in rows[1:]] == ["YES"]
    assert 0 <= int(rows[1][0]) < int(rows[1][1]) <= 1000 * audio_info(data / "a/1.wav").duration
    assert stdout.splitlines() == [f"{data / 'a/1.wav'}\tYES", f"{data / 'b/1.wav'}\tGO"]
    code, _, _ = transcribe_cli(f"{data}/*/1.wav", "--output-dir", tmp_path / "glob")
    assert code == 0 and (tmp_path / "glob/b/1.txt").read_text() == "GO\n"
    assert (tmp_path / "glob/b/1.json").is_file()  # txt and json by default
    missing = tmp_path.parent / "elsewhere" / "gone.wav"  # outside data: moves no output
    code, _, _ = transcribe_cli(data / "a/1.wav", data / "b/1.wav", missing,
                                "--output-dir", tmp_path / "some", "--format", "txt")  # fmt: skip
    assert code == 1
    some = sorted(
        p.relative_to(tmp_path / "some").as_posix() for p in (tmp_path / "some").rglob("*")
    )
    assert some == ["a", "a/1.txt", "b", "b/1.txt"]


def test_cli_reads_a_manifest_with_offsets_and_names_its_bad_lines(
    transcribe_cli, tmp_path, monkeypatch
):
    yes, go = (load_audio(SPEECH[u]).numpy() for u in ("an251-fash-b", "an253-fash-b"))
    soundfile.write(tmp_path / "two.wav", np.concatenate([yes, np.zeros(RATE // 2), go]), RATE)
    cut = len(yes) / RATE
    lines = [
        json.dumps({"audio_filepath": "two.wav", "duration": cut}),  # relative to the manifest
        json.dumps(
            {"audio_filepath": "two.wav", "offset": cut + 0.5, "text": "a\u2028b\x85c"},
            ensure_ascii=False,
        ),  # line breaks to str.splitlines, not to JSON Lines
        "{not json",
        json.dumps({"audio_filepath": "missing.wav"}),
        '{"audio_filepath": "two.wav", "text": "caf\xe9"}',  # a byte that is not UTF-8
        json.dumps({"audio_filepath": "two.wav", "offset": cut, "duration": 9.0}),  # past its end
    ]
    manifest = tmp_path / "talks.jsonl"
    manifest.write_bytes(
        "\n".join(lines).encode("utf-8").replace(b"caf\xc3\xa9", b"caf\xe9") + b"\n"
    )
    out = tmp_path / "out"
    code, stdout, stderr = transcribe_cli(manifest, "--output-dir", out, "--format", "txt")
    assert code == 1
    first, second = f"two@0-{round(1000 * cut)}", f"two@{round(1000 * (cut + 0.5))}-end"
    assert (out / f"{first}.txt").read_text() == "YES\n"
    assert (out / f"{second}.txt").read_text() == "GO\n"
    two = tmp_path / "two.wav"
    assert stdout.splitlines() == [f"{two}{first[3:]}\tYES", f"{two}{second[3:]}\tGO"]
    assert f"error: {manifest}:3: invalid JSON" in stderr
    assert f"error: {manifest}:4: audio {tmp_path / 'missing.wav'}: file not found" in stderr
    assert f"error: {manifest}:5: not valid UTF-8 (byte 0xe9 at column 43)" in stderr
    assert f"duration 9.000 s from offset {cut:.3f} s exceeds the audio" in stderr  # as evaluate
    assert "4 of 6 files failed" in stderr
    monkeypatch.chdir(tmp_path)  # `--manifest <(head -2 talks.jsonl)`: names from here
    read, write = os.pipe()
    os.write(write, "\n".join(lines[:2]).encode() + b"\n")
    os.close(write)
    try:
        code, stdout, _ = transcribe_cli("--manifest", f"/dev/fd/{read}", "--output-dir", "o")
    finally:
        os.close(read)
    for named, said in (("none.jsonl", "manifest not found"), (".", "is a directory, not a")):
        assert transcribe_cli("--manifest", named)[2].startswith(
            f"asr transcribe: error: {named}: {said}"
        )
    assert code == 0 and stdout.splitlines() == [
        f"two.wav{first[3:]}\tYES",
        f"two.wav{second[3:]}\tGO",
    ]


def test_a_folder_that_cannot_be_listed_fails_alone(transcribe_cli, tmp_path, monkeypatch):
    """As a file that cannot be read: listed, and the rest transcribed (`lost+found` at the
    top of a volume is one, and cannot move)."""
    for name in ("open", "locked"):
        (tmp_path / "talks" / name).mkdir(parents=True)
        shutil.copy(SPEECH["an251-fash-b"], tmp_path / "talks" / name / "yes.wav")
    listed = os.scandir

    def refused(path=".", *args):
        if not isinstance(path, int) and Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return listed(path, *args)

    monkeypatch.setattr(os, "scandir", refused)
    code, stdout, stderr = transcribe_cli(tmp_path / "talks", "--output-dir", tmp_path / "out")
    assert code == 1 and stdout.endswith("yes.wav\tYES\n")
    locked = tmp_path / "talks" / "locked"
    assert f"error: {locked}: cannot list this folder (Permission denied)" in stderr, stderr
    code, _, stderr = transcribe_cli(locked, "--output-dir", tmp_path / "out")
    assert code == 1 and "no audio files in this folder" not in stderr  # none it could see


def test_a_manifest_span_holding_no_whole_sample_fails_alone(transcribe_cli, tmp_path):
    """Half a sample before the end, or 0.32 of one: the level analysis had nothing to read
    and the whole run stopped with numpy's "need at least one array to concatenate"."""
    wav = SPEECH["an251-fash-b"]
    end = soundfile.info(wav).duration
    lines = [{"audio_filepath": str(wav), "offset": end - 1e-5},
             {"audio_filepath": str(wav), "offset": 0.5, "duration": 2e-5},
             {"audio_filepath": str(wav)}]  # fmt: skip
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, stdout, stderr = transcribe_cli(manifest, "--output-dir", tmp_path / "out")
    assert code == 1 and stdout.endswith("\tYES\n")
    for number, span, offset in ((1, "1000-end", end - 1e-5), (2, "500-500", 0.5)):
        said = f"{manifest}:{number}: audio {wav}@{span}: the span from offset {offset} s holds"
        assert said in stderr, stderr
    assert "2 of 3 files failed" in stderr


def test_cli_reads_stdin_and_prints_timed_lines_without_an_output_dir(
    transcribe_cli, tmp_path, monkeypatch
):
    m4a = encode_audio(tmp_path / "speech.m4a", load_audio(SPEECH["an255-fash-b"]).numpy(), RATE)
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = transcribe_cli("-", stdin=m4a.read_bytes())
    assert code == 0
    assert re.fullmatch(r"\[00:00\.\d{3} --> 00:02\.\d{3}\] U M N Y H SIX\n", stdout), stdout
    assert os.listdir(tmp_path) == ["speech.m4a"], "nothing is written without --output-dir"
    code, stdout, _ = transcribe_cli(SPEECH["an251-fash-b"], "-", stdin=m4a.read_bytes())
    lines = stdout.splitlines()
    assert code == 0 and len(lines) == 4 and lines[0] == str(SPEECH["an251-fash-b"])
    assert lines[1].endswith("] YES") and lines[2] == "-" and lines[3].endswith("] U M N Y H SIX")
    code, stdout, _ = transcribe_cli("-", "--output-dir", "out", stdin=m4a.read_bytes())
    assert code == 0 and stdout == "-\tU M N Y H SIX\n"
    assert (tmp_path / "out/stdin.txt").read_text() == "U M N Y H SIX\n"
    assert json.loads((tmp_path / "out/stdin.json").read_text())["audio"] == "-"


def test_cli_prints_two_files_of_one_stem_and_refuses_to_write_them(transcribe_cli, tmp_path):
    wave = load_audio(SPEECH["an251-fash-b"]).numpy()
    m4a = encode_audio(tmp_path / "a.m4a", wave, RATE)
    soundfile.write(tmp_path / "a.wav", wave, RATE)
    code, stdout, _ = transcribe_cli(m4a, tmp_path / "a.wav")
    assert code == 0 and stdout.splitlines()[0::2] == [str(m4a), str(tmp_path / "a.wav")]
    assert all(line.endswith("] YES") for line in stdout.splitlines()[1::2])
    code, _, stderr = transcribe_cli(m4a, tmp_path / "a.wav", "--output-dir", tmp_path / "out")
    assert code == 2 and "would write the same output files" in stderr
    manifest = tmp_path / "a.jsonl"  # the file again, as a span of it
    manifest.write_text(json.dumps({"audio_filepath": "a.wav", "duration": 0.5}) + "\n")
    code, _, stderr = transcribe_cli(tmp_path / "a.wav", manifest, "--output-dir", tmp_path / "o")
    assert code == 2 and f"{tmp_path / 'a.wav'} is named twice with different spans" in stderr
    (tmp_path / "sd").mkdir()  # stdin is named as given, not by the file it was kept in
    soundfile.write(tmp_path / "sd/stdin.wav", wave, RATE)
    code, _, stderr = transcribe_cli("-", tmp_path / "sd/stdin.wav", "--output-dir", tmp_path / "p",
                                     stdin=m4a.read_bytes())  # fmt: skip
    assert code == 2 and f"- and {tmp_path / 'sd/stdin.wav'} would write the same" in stderr


def test_cli_writes_outputs_of_a_name_near_the_longest_a_folder_takes(transcribe_cli, tmp_path):
    """A stem of 246 bytes: its .json (251) fits the folder; the name of an earlier run's
    explorer maps, checked for, would not, and is no such file."""
    audio = tmp_path / ("録" * 82 + ".wav")
    shutil.copy(SPEECH["an251-fash-b"], audio)
    code, _, stderr = transcribe_cli(audio, "--output-dir", tmp_path / "out", "--format", "json")
    assert code == 0, stderr
    assert json.loads((tmp_path / "out" / f"{audio.stem}.json").read_text())["text"] == "YES"
    assert main(["explore", str(tmp_path / "out"), "--quiet"]) == 0


def test_audio_too_short_to_encode_transcribes_to_nothing(overfit, transcribe_cli, tmp_path):
    recognizer, _ = overfit
    shortest = recognizer.shortest_input
    assert 0 < shortest < RATE // 10
    for samples in (RATE // 100, shortest - 1):  # 10 ms, and one sample short of a frame
        transcript = recognizer.transcribe(np.zeros(samples, np.float32), beam_size=1)
        assert transcript.text == "" and transcript.words == []
        assert transcript.duration == pytest.approx(samples / RATE)
    assert recognizer.transcribe(np.zeros(shortest, np.float32), beam_size=1).duration > 0
    soundfile.write(tmp_path / "click.wav", np.zeros(RATE // 100, np.float32), RATE)
    code, stdout, _ = transcribe_cli(tmp_path / "click.wav", "--output-dir", tmp_path / "out")
    assert code == 0 and stdout == f"{tmp_path / 'click.wav'}\t\n"
    assert (tmp_path / "out/click.txt").read_text() == "\n"


def test_cli_names_each_input_that_fails_and_transcribes_the_others(transcribe_cli, tmp_path):
    good = encode_audio(tmp_path / "good.m4a", load_audio(SPEECH["an251-fash-b"]).numpy(), RATE)
    corrupt = tmp_path / "corrupt.m4a"
    corrupt.write_bytes(good.read_bytes()[:1500])  # cut off before the index
    (tmp_path / "empty").mkdir()
    pattern = f"{tmp_path}/*.ogg"
    code, stdout, stderr = transcribe_cli(corrupt, tmp_path / "empty", pattern, good)
    assert code == 1
    assert f"error: {corrupt}: unreadable or corrupt audio (" in stderr
    assert f"error: {tmp_path / 'empty'}: no audio files in this folder" in stderr
    assert f"error: {pattern}: no audio files match" in stderr
    assert "3 of 4 files failed" in stderr
    assert stdout.splitlines()[0] == str(good) and stdout.splitlines()[1].endswith("] YES")
    code, _, stderr = transcribe_cli(good, "--format", "srt")  # files, but where?
    assert code == 2 and "--format chooses the files written to --output-dir" in stderr
    for formats in ([], ["--output-dir", str(tmp_path / "o"), "--format", "txt", "json"]):
        code, _, stderr = transcribe_cli(good, "--words-per-cue", "1", *formats)  # no cues
        assert code == 2 and "--words-per-cue sets the cues of srt, vtt, tsv files" in stderr
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- align


def test_align_gives_monotone_word_times(overfit):
    recognizer, waves = overfit
    alignment = recognizer.align(waves[3], "u m n y h six")
    assert alignment.text == "U M N Y H SIX"
    for words in (alignment.words, alignment.ctc_words):
        times = [t for w in words for t in (w.start, w.end)]
        assert times == sorted(times) and 0 <= times[0] and times[-1] <= alignment.duration
    assert alignment.attention.shape[1] == len(alignment.tokens) + 1
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        recognizer.align(waves[0], "Q")


def _failing_plots(*args, **kwargs):
    raise OSError("no room left on the device")


def test_cli_align_writes_plots_and_prints_word_times(
    checkpoint, tmp_path, capsys, caplog, monkeypatch
):
    audio = WAV / "an4_clstk/fash/an255-fash-b.wav"
    out = tmp_path / "plot.png"
    code = main(["align", str(audio), "--checkpoint", str(checkpoint), "--text", "U M N Y H SIX",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "plot_heads.png").is_file(), "a Transformer also gets per-head maps"
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0][0] == "# word" and len(rows[0]) == 5
    assert [r[0] for r in rows[1:]] == "U M N Y H SIX".split()
    for column in (1, 2, 3, 4):
        times = [float(r[column]) for r in rows[1:]]
        assert times == sorted(times) and 0 <= times[0] and times[-1] <= 2.6
    piped = io.TextIOWrapper(io.BytesIO(audio.read_bytes()))  # as `... < audio.wav` gives it
    monkeypatch.setattr(sys, "stdin", piped)
    argv = ["align", "-", "--checkpoint", str(checkpoint), "--text", "U M N Y H SIX"]
    assert main([*argv, "--out", str(tmp_path / "piped.png")]) == 0
    assert capsys.readouterr().out.splitlines() == ["\t".join(r) for r in rows]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"not audio")))
    assert main([*argv, "--out", str(tmp_path / "piped.png")]) == 2
    assert capsys.readouterr().err.startswith("asr align: error: -: unreadable or corrupt audio")
    bare = tmp_path / "bare"  # no suffix: the PNG it names is the file written
    main(["align", str(audio), "--checkpoint", str(checkpoint), "--text", "U", "--out", str(bare)])
    said = f"plots: {tmp_path / 'bare.png'}, {tmp_path / 'bare_heads.png'}"
    assert capsys.readouterr().err.splitlines()[-1] == said
    assert (tmp_path / "bare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "plot.svg"  # another format: both plots in it
    main(["align", str(audio), "--checkpoint", str(checkpoint), "--text", "U", "--out", str(svg)])
    assert (tmp_path / "plot_heads.svg").read_text().lstrip().startswith("<?xml")
    capsys.readouterr()
    folder = tmp_path / "plots"
    folder.mkdir()
    argv = ["align", str(audio), "--checkpoint", str(checkpoint), "--text", "U", "--out"]
    with pytest.raises(SystemExit):  # as the command line is read, before the model
        main([*argv, str(folder)])
    assert f"{folder}: a folder; name the picture file to write" in capsys.readouterr().err
    assert not (tmp_path / "plots.png").exists()
    (tmp_path / "blocked_heads.png").mkdir()  # the second plot's place: before the work
    assert main([*argv, str(tmp_path / "blocked.png")]) == 2
    said = capsys.readouterr()
    assert said.err == (f"asr align: error: {tmp_path / 'blocked_heads.png'}: a folder where "
                        "the plot of every attention map goes\n")  # fmt: skip
    assert not said.out and not (tmp_path / "blocked.png").exists()
    with monkeypatch.context() as patch:
        patch.setattr("asr.plotting.save_alignment_plots", _failing_plots)
        assert main([*argv, str(tmp_path / "lost.png")]) == 2  # the times are said all the same
    assert capsys.readouterr().out.splitlines()[1].startswith("U\t")
    short = tmp_path / "short.wav"
    soundfile.write(short, np.zeros(160, dtype=np.float32), 16000)
    assert main(["align", str(short), *argv[2:], str(tmp_path / "s.png")]) == 2
    assert f"error: {short}: an input of " in capsys.readouterr().err
    brief = tmp_path / "brief.wav"  # 0.3 s: fewer encoder frames than the text has letters
    soundfile.write(brief, soundfile.read(audio, frames=4800)[0], 16000)
    argv = ["align", str(brief), "--checkpoint", str(checkpoint), "--text", "U M N Y H SIX"]
    assert main([*argv, "--out", str(tmp_path / "b.png")]) == 2
    said = capsys.readouterr().err  # refused before the CTC alignment could warn of it
    assert f"error: {brief}: text too long for the audio: its " in said
    assert not [r for r in caplog.records if "no CTC alignment" in r.getMessage()]
    long = tmp_path / "long.wav"  # four times over: longer than the model was trained on
    wave, rate = soundfile.read(audio)
    soundfile.write(long, np.tile(wave, 4), rate)
    argv = ["align", str(long), "--checkpoint", str(checkpoint), "--text", "U M N Y H SIX " * 4]
    assert main([*argv, "--out", str(tmp_path / "l.png")]) == 0
    said = capsys.readouterr().err
    assert f"warning: {long} lasts 10.4 s, longer than 95% of this model's training" in said
