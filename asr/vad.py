"""Voice activity detection by Silero VAD, read by the segmenter as a pseudo-energy track."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import torch
import torchaudio.functional as AF

if TYPE_CHECKING:
    from asr.segment import AudioSource

VAD_METHODS = ("energy", "silero")
SILERO_CHUNKS = {16000: 512, 8000: 256}  # samples per probability at the rates it takes
SPEECH_DB = 0.0
NON_SPEECH_TOP_DB = -40.0  # below the splitter's default -35 dB threshold
ENERGY_FLOOR_DB = -100.0


@functools.cache
def _silero_model() -> torch.jit.ScriptModule:
    """The packaged Silero VAD model, loaded once per process."""
    try:
        from silero_vad import load_silero_vad
    except ImportError as err:
        raise RuntimeError(
            "--vad silero needs the silero-vad package (pip install silero-vad)"
        ) from err
    return load_silero_vad(onnx=False)


@torch.inference_mode()
def speech_probabilities(
    source: AudioSource, read_seconds: float = 60.0
) -> tuple[np.ndarray, float]:
    """Silero's speech probability per chunk of `source`, read in pieces, and the chunk seconds."""
    rate = source.sample_rate
    vad_rate = rate if rate in SILERO_CHUNKS else 16000
    chunk = SILERO_CHUNKS[vad_rate]
    model = _silero_model()
    model.reset_states()
    probs: list[float] = []
    pending = torch.zeros(0)
    start = 0.0
    while start < source.duration:
        end = min(source.duration, start + read_seconds)
        wave = source.read(start, end).float()
        if vad_rate != rate:
            wave = AF.resample(wave, rate, vad_rate)
        pending = torch.cat([pending, wave])
        whole = len(pending) // chunk * chunk
        for i in range(0, whole, chunk):
            probs.append(float(model(pending[i : i + chunk], vad_rate)))
        pending, start = pending[whole:], end
    if len(pending):
        last = torch.nn.functional.pad(pending, (0, chunk - len(pending)))
        probs.append(float(model(last, vad_rate)))
    return np.asarray(probs), chunk / vad_rate


def speech_track(probabilities: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Pseudo-energy in dB for `plan_segments`: lower the less likely speech, so cuts fall there.

    >>> speech_track(np.array([0.9, 0.5, 0.25, 0.0])).tolist()
    [0.0, 0.0, -70.0, -100.0]
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"the VAD threshold must lie in (0, 1), got {threshold}")
    below = NON_SPEECH_TOP_DB + (ENERGY_FLOOR_DB - NON_SPEECH_TOP_DB) * (
        1.0 - probabilities / threshold
    )
    return np.where(probabilities >= threshold, SPEECH_DB, below)
