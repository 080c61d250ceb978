"""Decode folders of `asr evaluate` on the AN4 fixture, for the explorer's tests (a module of
its own: a conftest.py here would shadow tests/conftest.py under the name `conftest`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from conftest import TINY_MODEL_CONFIG, TINY_RNN
from test_transcribe import JOINT, WAV, _overfit_recognizer

from asr.audio import audio_info
from asr.checkpoint import instantiate
from asr.data.manifest import Utterance, write_manifest
from asr.evaluate import evaluate
from asr.models.seq2seq import build_seq2seq
from asr.recognizer import Recognizer
from asr.text import CharTokenizer

TEST_UTTERANCES = {  # two AN4 test utterances the overfit model gets partly wrong
    "an4test_clstk/fcaw/an406-fcaw-b": "RUBOUT G M E F THREE NINE",
    "an4test_clstk/fcaw/an407-fcaw-b": "ERASE C Q Q F SEVEN",
}


def decode(folder: Path, utterances: dict[str, str], recognizer: Recognizer | None = None) -> Path:
    """`folder/decode`: `evaluate` of `recognizer` (by default the overfit Transformer of
    tests/test_transcribe.py) on the fixture's `utterances` (path under WAV: text), speakers
    from the folder names."""
    files = {WAV / f"{p}.wav": text for p, text in utterances.items()}
    rows = [Utterance(str(f), audio_info(f).duration, t, f.stem, speaker=f.parent.name)
            for f, t in files.items()]  # fmt: skip
    write_manifest(folder / "test.jsonl", rows)
    recognizer = recognizer or _overfit_recognizer(str(WAV))[0]
    evaluate(recognizer, folder / "test.jsonl", folder / "decode", options=JOINT, plots=0,
             progress=False)  # fmt: skip
    return folder / "decode"


def rnn_recognizer(texts: Iterable[str]) -> Recognizer:
    """An untrained RNN-attention recognizer (location-aware attention) over `texts`' letters:
    its maps are what the page shows, not what it recognises."""
    tokenizer = CharTokenizer.train(texts)
    torch.manual_seed(0)
    config = TINY_MODEL_CONFIG | TINY_RNN | {"vocab_size": tokenizer.vocab_size}
    model = instantiate(build_seq2seq, config)
    return Recognizer(model.eval(), tokenizer, 16000, "rnn")
