"""asr: attention-based speech recognition.

    import asr

    recognizer = asr.load_model("exp/an4/conformer/avg.ckpt")
    transcript = recognizer.transcribe("speech.wav", beam_size=10)
    print(transcript.text)
    asr.write_srt(transcript, "speech.srt")

The modules form layers that import one way (tests/test_layers.py); public names load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asr.loading import load_lm
    from asr.recognizer import Recognizer, load_model
    from asr.results import BatchResult, Transcript
    from asr.search import SearchOptions
    from asr.segment import SegmenterOptions
    from asr.writers import write_json, write_srt, write_tsv, write_txt, write_vtt

__all__ = [
    "BatchResult",
    "Recognizer",
    "SearchOptions",
    "SegmenterOptions",
    "Transcript",
    "load_lm",
    "load_model",
    "write_json",
    "write_srt",
    "write_tsv",
    "write_txt",
    "write_vtt",
]

_HOMES = {
    "Recognizer": "asr.recognizer",
    "load_model": "asr.recognizer",
    "load_lm": "asr.loading",
    "Transcript": "asr.results",
    "BatchResult": "asr.results",
    "SearchOptions": "asr.search",
    "SegmenterOptions": "asr.segment",
    "write_txt": "asr.writers",
    "write_json": "asr.writers",
    "write_srt": "asr.writers",
    "write_vtt": "asr.writers",
    "write_tsv": "asr.writers",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'asr' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_HOMES[name]), name)
