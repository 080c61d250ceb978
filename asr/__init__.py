"""asr: attention-based speech recognition.

    import asr

    recognizer = asr.load_model("exp/an4/transformer/checkpoints/last.ckpt")
    print(recognizer.transcribe("speech.wav").text)

`load_model` and the inference types are imported on first use, so `import asr` (and every
`asr` command) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asr.inference import Recognizer, Transcript, load_model
    from asr.search import SearchOptions
    from asr.transcribe import SegmenterOptions

__all__ = ["Recognizer", "SearchOptions", "SegmenterOptions", "Transcript", "load_model"]

_HOMES = {
    "Recognizer": "asr.inference",
    "Transcript": "asr.inference",
    "load_model": "asr.inference",
    "SearchOptions": "asr.search",
    "SegmenterOptions": "asr.transcribe",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'asr' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_HOMES[name]), name)
