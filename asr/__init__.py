"""asr: attention-based speech recognition.

    import asr

    recognizer = asr.load_model("exp/an4/transformer/avg.ckpt")
    print(recognizer.transcribe("speech.wav").text)

Layers, bottom to top; a module imports only from its own layer or those below, and nothing
below training imports Lightning (tests/test_layers.py holds the package to this):

    leaves      text (tokenizers, the special ids), audio, perturb, frontends, metrics, precision,
                models/ (plain nn.Modules), data/manifest
    format      checkpoint (what a checkpoint holds; building its model)
    algorithms  search, ctc_prefix, timing (DTW, CTC forced alignment), segment (long audio)
    recognizer  results, writers, transcribe, recognizer (`load_model`, `load_lm`)
    users       evaluate, robustness, plotting
    training    data/, lightning, lm, optim, train (LightningCLI), cli (the `asr` command)

The public names below are imported on first use, so `import asr` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asr.recognizer import Recognizer, load_lm, load_model
    from asr.results import Transcript
    from asr.search import SearchOptions
    from asr.segment import SegmenterOptions

__all__ = [
    "Recognizer",
    "SearchOptions",
    "SegmenterOptions",
    "Transcript",
    "load_lm",
    "load_model",
]

_HOMES = {
    "Recognizer": "asr.recognizer",
    "load_model": "asr.recognizer",
    "load_lm": "asr.recognizer",
    "Transcript": "asr.results",
    "SearchOptions": "asr.search",
    "SegmenterOptions": "asr.segment",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'asr' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_HOMES[name]), name)
