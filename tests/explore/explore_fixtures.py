"""Decode folders of `asr evaluate` on the AN4 fixture, for the explorer's tests (a module of
its own: a conftest.py here would shadow tests/conftest.py under the name `conftest`)."""

from __future__ import annotations

from pathlib import Path

from test_transcribe import JOINT, WAV, _overfit_recognizer

from asr.audio import audio_info
from asr.data.manifest import Utterance, write_manifest
from asr.evaluate import evaluate

TEST_UTTERANCES = {  # two AN4 test utterances the overfit model gets partly wrong
    "an4test_clstk/fcaw/an406-fcaw-b": "RUBOUT G M E F THREE NINE",
    "an4test_clstk/fcaw/an407-fcaw-b": "ERASE C Q Q F SEVEN",
}


def decode(folder: Path, utterances: dict[str, str]) -> Path:
    """`folder/decode`: `evaluate` of the overfit recognizer (tests/test_transcribe.py) on the
    fixture's `utterances` (path under WAV: text), speakers from the folder names."""
    files = {WAV / f"{p}.wav": text for p, text in utterances.items()}
    rows = [Utterance(str(f), audio_info(f).duration, t, f.stem, speaker=f.parent.name)
            for f, t in files.items()]  # fmt: skip
    write_manifest(folder / "test.jsonl", rows)
    recognizer, _ = _overfit_recognizer(str(WAV))
    evaluate(recognizer, folder / "test.jsonl", folder / "decode", options=JOINT, plots=0,
             progress=False)  # fmt: skip
    return folder / "decode"
