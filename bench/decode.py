"""Decoding speed on AN4 test: real-time factor (decode seconds per audio second) and
utterances per second of greedy, beam 10 and beam 10 + CTC (weight 0.3) search at batch
1, 8 and 32, in fp32 and under bf16 autocast (`Recognizer.precision`), beside the time of
the frontend + encoder alone; WER per cell as a check that the model decodes what it should.

Decoding runs `Recognizer.search` (frontend, encoder, CTC head, search) on waveforms loaded
beforehand, utterances sorted by length and batched in that order (as `asr evaluate`). Each
time is the fastest of 3 passes over the test set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from bench.common import (
    PRECISIONS,
    SAMPLE_RATE,
    Recognizer,
    SearchOptions,
    Settings,
    build_module,
    fastest,
    load_audio,
    load_model,
    model_config,
    profile_ops,
    read_manifest,
    timed,
    timed_call,
    word_errors,
)

MODES = {  # name -> search settings besides max_len_ratio
    "greedy": {"beam_size": 1},
    "beam10": {"beam_size": 10},
    "beam10_ctc": {"beam_size": 10, "ctc_weight": 0.3},
}


def search_options(mode: str, settings: Settings) -> SearchOptions:
    return SearchOptions(**MODES[mode], max_len_ratio=settings.max_len_ratio)


def load_recognizer(settings: Settings) -> tuple[Recognizer, str]:
    """The `--checkpoint` recognizer, or a randomly initialised conf/an4/transformer.yaml
    model; and a label that says which."""
    if settings.checkpoint is not None:
        recognizer = load_model(settings.checkpoint, settings.device)
        return recognizer, f"trained: {settings.checkpoint}"
    module = build_module(model_config("transformer", settings.data), settings.seed)
    model = module.model.to(settings.device).eval()
    label = "RANDOMLY INITIALISED conf/an4/transformer.yaml (no checkpoint): WER meaningless"
    return Recognizer(model, module.tokenizer, SAMPLE_RATE, label), label


@dataclass
class Utterances:
    """Test utterances loaded into memory, shortest first."""

    texts: list[str]
    waves: list[Tensor]  # (S,) each, at SAMPLE_RATE

    @property
    def seconds(self) -> float:
        return sum(len(w) for w in self.waves) / SAMPLE_RATE

    def batches(self, size: int) -> list[range]:
        return [range(i, min(i + size, len(self.waves))) for i in range(0, len(self.waves), size)]


def test_utterances(settings: Settings, limit: int | None) -> Utterances:
    """The first `limit` (all for None) test utterances of the manifest, sorted by length."""
    utterances = read_manifest(settings.data / "test.jsonl")[:limit]
    utterances = sorted(utterances, key=lambda u: u.duration)
    waves = [load_audio(u.audio_filepath, SAMPLE_RATE, u.offset, u.duration) for u in utterances]
    return Utterances([u.text for u in utterances], waves)


def pad_waves(waves: Sequence[Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """Zero-padded `(B, S)` batch and `(B,)` lengths on `device`."""
    batch = torch.nn.utils.rnn.pad_sequence(list(waves), batch_first=True)
    return batch.to(device), torch.tensor([len(w) for w in waves], device=device)


def time_search(
    recognizer: Recognizer, utts: Utterances, size: int, options: SearchOptions
) -> tuple[float, list[str]]:
    """Seconds to decode every utterance in batches of `size`, and the hypotheses' texts."""
    texts: list[str] = []
    seconds = 0.0
    for rows in utts.batches(size):
        waves = [utts.waves[i] for i in rows]
        took, decoded = timed_call(lambda w=waves: recognizer.search(w, options), recognizer.device)
        seconds += took
        texts += [recognizer.tokenizer.decode(d.hypothesis.tokens) for d in decoded]
    return seconds, texts


@torch.inference_mode()
def time_encoder(recognizer: Recognizer, utts: Utterances, size: int) -> tuple[float, None]:
    """Seconds of the frontend + encoder alone over every batch of `size` (and no value, as
    `fastest` takes it)."""
    device = recognizer.device
    seconds = 0.0
    for rows in utts.batches(size):
        waves, lens = pad_waves([utts.waves[i] for i in rows], device)
        seconds += timed(lambda w=waves, n=lens: recognizer.model.encode(w, n), device)
    return seconds, None


def _cell(seconds: float, utts: Utterances, wer: float | None = None) -> dict[str, Any]:
    cell = {
        "seconds": seconds,
        "rtf": seconds / utts.seconds,
        "utterances_per_second": len(utts.waves) / seconds,
    }
    if wer is not None:
        cell["wer"] = wer
    return cell


def run(settings: Settings) -> dict[str, Any]:
    """The decode grid in both precisions, the frontend + encoder alone, and a profile of one
    beam 10 + CTC batch."""
    recognizer, label = load_recognizer(settings)
    utts = test_utterances(settings, settings.pick(8, None))
    sizes = settings.pick([1, 8], [1, 8, 32])
    refs = [recognizer.tokenizer.normalizer(t) for t in utts.texts]
    first = Utterances(utts.texts[:2], utts.waves[:2])
    repeats = settings.passes(3)
    grid: dict[str, dict[str, Any]] = {}
    for precision in PRECISIONS:
        decoder = replace(recognizer, precision=precision)
        for mode in MODES:  # warm-up: allocator, kernels, positional tables
            time_search(decoder, first, 2, search_options(mode, settings))
        for mode in MODES:
            options = search_options(mode, settings)
            cells = grid[mode if precision == "fp32" else f"{mode}_{precision}"] = {}
            for size in sizes:
                seconds, hyps = fastest(repeats, partial(time_search, decoder, utts, size, options))
                cells[str(size)] = _cell(seconds, utts, 100 * word_errors(refs, hyps).rate)
    encoder = {
        str(size): _cell(fastest(repeats, partial(time_encoder, recognizer, utts, size))[0], utts)
        for size in sizes
    }
    full = [rows for rows in utts.batches(sizes[-1]) if len(rows) == sizes[-1]]
    waves = [utts.waves[i] for i in (full or [range(len(utts.waves))])[-1]]  # longest full batch
    path = settings.out / "profile_decode_beam10_ctc.txt"
    title = f"beam 10 + CTC 0.3 decode of {len(waves)} utterances ({label})"
    options = search_options("beam10_ctc", settings)
    return {
        "model": label,
        "utterances": len(utts.waves),
        "audio_seconds": utts.seconds,
        "batch_sizes": sizes,
        "grid": grid,
        "encoder": encoder,
        "profile_file": profile_ops(
            lambda: recognizer.search(waves, options), settings.device, path, title
        ),
    }
