"""asr: attention-based speech recognition.

    import asr

    recognizer = asr.load_model("exp/an4/transformer/avg.ckpt")
    transcript = recognizer.transcribe("speech.wav", beam_size=10)
    print(transcript.text)
    asr.write_srt(transcript, "speech.srt")

Layers, bottom to top; a module imports only from its own layer or those below, and nothing
below training imports Lightning (tests/test_layers.py holds the package to this):

    leaves      text (tokenizers, the special ids), audio, perturb, frontends, metrics, precision,
                models/ (plain nn.Modules), data/manifest
    format      checkpoint (what a checkpoint holds; building its model), package (the
                shareable folder: safetensors, config.json, model card; hf://), finetune
                (a new model's weights from a trained one), onnx_runtime (ONNX export and
                the ONNX Runtime backend)
    algorithms  search, ctc_prefix, timing (DTW, CTC forced alignment), confidence (word
                probabilities made calibrated), segment (long audio), vad (Silero speech
                probabilities for segment), guard (attention failures)
    recognizer  results, writers, transcribe, recognizer (`load_model`, `load_lm`)
    users       evaluate, robustness, plotting, heads (the attention maps that time words)
    training    data/, lightning, lm, optim, train (LightningCLI), cli (the `asr` command;
                `python -m asr` through __main__)

The public names below are imported on first use, so `import asr` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asr.recognizer import Recognizer, load_lm, load_model
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
    "load_lm": "asr.recognizer",
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
