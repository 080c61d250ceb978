"""Voice activity detection by Silero VAD: a pseudo-energy track for the segmenter, and the
silence that ends a live utterance."""

from __future__ import annotations

import bisect
import functools
import heapq
import importlib.util
from array import array
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from asr.audio import resample
from asr.levels import (
    ENERGY_FLOOR_DB,
    SILENT_DB,
    TRANSIENT_SECONDS,
    frame_energy_db,
    loud_level,
)

if TYPE_CHECKING:
    from asr.segment import AudioSource

VAD_METHODS = ("energy", "silero")
SILERO_CHUNKS = {16000: 512, 8000: 256}  # samples per probability at the rates it takes
SPEECH_DB = 0.0
NON_SPEECH_TOP_DB = -40.0  # below the splitter's default -35 dB threshold
# Quieter input is raised to this level (its loudest 0.1 s, dBFS) for Silero, which misses
# speech far below it; the splitter's levels are relative, and the model normalises its own
LEVEL_DB = -30.0
LEVEL_FRAME_SECONDS = 0.01  # the energy frames that measure a whole input's level


def silero_gain(level_db: float) -> float:
    """The factor that brings input whose loudest 0.1 s is `level_db` dBFS up to LEVEL_DB:
    1 for louder input, 0 under SILENT_DB (speechless, as for the energy splitter).

    >>> silero_gain(-20.0), silero_gain(-70.0), silero_gain(-95.0)
    (1.0, 100.0, 0.0)
    """
    if level_db < SILENT_DB:
        return 0.0
    return 10.0 ** (max(0.0, LEVEL_DB - level_db) / 20)


@functools.cache
def _silero_graph():
    """Silero's ONNX graph, whose recurrent state is an input: one session serves every stream."""
    import onnxruntime

    # The package's file, found without importing it: its import sets torch's threads to 1.
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("Silero VAD needs the silero-vad package (pip install silero-vad)")
    path = str(Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.onnx")
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


class StreamingVAD:
    """Silero VAD over audio that arrives in pieces: a speech probability per 32 ms as it comes.

    Pieces of any size give the same probabilities, and the same `silence`. `speech_end` is
    where the last chunk judged speech ended, in seconds from the first sample. Quiet input is
    raised by `silero_gain` of its level: the given one, or else the level heard so far (that
    of the loudest 0.1 s up to and including each chunk), so a chunk is never raised above
    LEVEL_DB.

    Args:
        sample_rate: 16000 or 8000, the rates Silero takes.
        threshold: the probability from which a chunk is speech.
        level_db: the input's level where it is known beforehand (a whole recording's
            `loud_level`); None: the level heard so far, for live audio.
    """

    def __init__(
        self, sample_rate: int, threshold: float = 0.5, level_db: float | None = None
    ) -> None:
        if sample_rate not in SILERO_CHUNKS:
            raise ValueError(f"Silero VAD takes 16000 or 8000 Hz audio, not {sample_rate} Hz")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"the VAD threshold must lie in (0, 1), got {threshold}")
        self.sample_rate, self.threshold, self.level_db = sample_rate, threshold, level_db
        self.chunk = SILERO_CHUNKS[sample_rate]
        self._loudest: list[float] = []  # the energies of the loudest 0.1 s of chunks so far
        self._transient = max(1, round(TRANSIENT_SECONDS * sample_rate / self.chunk))
        self._graph = _silero_graph()
        self._rate = np.array(sample_rate, dtype=np.int64)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, self.chunk // 8), dtype=np.float32)  # the graph's overlap
        self._pending = np.zeros(0, dtype=np.float32)
        self.chunks = 0
        self.speech_end = 0.0
        self._speech = array("I")  # the indices of the chunks judged speech, in order

    def push(self, samples: np.ndarray) -> np.ndarray:
        """Add mono float samples; returns the probabilities of the chunks they complete."""
        pending = np.concatenate([self._pending, np.asarray(samples, np.float32).reshape(-1)])
        whole = len(pending) // self.chunk
        probs = np.empty(whole, dtype=np.float32)
        # the chunks' energies at once (what sets their gain, where the level is not known)
        energies = [0.0] * whole
        if self.level_db is None and whole:
            energies = frame_energy_db(pending[: whole * self.chunk], self.chunk).tolist()
        for i in range(whole):
            samples = pending[i * self.chunk : (i + 1) * self.chunk]
            gain = silero_gain(self._level(energies[i]))
            if gain != 1.0:  # raised without its offset: no sound, which the gain would swell
                samples = (samples - samples.mean()) * np.float32(gain)
            x = np.concatenate([self._context, samples[None]], 1)
            out, self._state = self._graph.run(
                None, {"input": x, "state": self._state, "sr": self._rate}
            )
            self._context = x[:, -self._context.shape[1] :]
            probs[i] = out.reshape(-1)[0]
            self.chunks += 1
            if probs[i] >= self.threshold:
                self.speech_end = self.chunks * self.chunk / self.sample_rate
                self._speech.append(self.chunks - 1)
        self._pending = pending[whole * self.chunk :]
        return probs

    def _level(self, energy: float) -> float:
        """The level that sets the gain of a chunk of `energy` dBFS: the known one, or that
        heard so far with the chunk."""
        if self.level_db is not None:
            return self.level_db
        heapq.heappush(self._loudest, energy)
        if len(self._loudest) > self._transient:
            heapq.heappop(self._loudest)
        return max(self._loudest[0], energy)

    def flush(self) -> np.ndarray:
        """The probability of the incomplete last chunk, padded with silence (none if empty)."""
        if not len(self._pending):
            return np.zeros(0, dtype=np.float32)
        return self.push(np.zeros(self.chunk - len(self._pending), dtype=np.float32))

    def silence(self, until: float, since: float = 0.0) -> float:
        """Seconds without speech before `until`, counted from `since` at the earliest: from the
        end of the last speech chunk that ended by `until`. Chunks past `until` (audio the VAD
        read ahead of the decoder, more of it in bigger pieces) do not count."""
        done = int(until * self.sample_rate // self.chunk)  # chunks that ended by `until`
        last = bisect.bisect_left(self._speech, done) - 1
        end = (self._speech[last] + 1) * self.chunk / self.sample_rate if last >= 0 else 0.0
        return max(0.0, until - max(end, since))


@torch.inference_mode()
def speech_probabilities(
    source: AudioSource, read_seconds: float = 60.0
) -> tuple[np.ndarray, float]:
    """Silero's speech probability per chunk of `source`, read in pieces, and the chunk seconds.
    The source is read twice: first for its level, which sets Silero's gain."""
    rate = source.sample_rate
    energy, frame_seconds = source.energy_db(LEVEL_FRAME_SECONDS, read_seconds)
    level = loud_level(energy, frame_seconds)
    vad = StreamingVAD(rate if rate in SILERO_CHUNKS else 16000, level_db=level)
    probs = []
    start = 0.0
    while start < source.duration:
        end = min(source.duration, start + read_seconds)
        wave = source.read(start, end).float()
        if vad.sample_rate != rate:
            wave = resample(wave, rate, vad.sample_rate)
        probs.append(vad.push(wave.numpy()))
        start = end
    probs.append(vad.flush())
    return np.concatenate(probs), vad.chunk / vad.sample_rate


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
