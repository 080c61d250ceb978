"""Levels of audio in dBFS: frame energies, and the level of a recording's loud part that
silence is judged against (by the splitter, around each frame, and by Silero's gain)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

ENERGY_FLOOR_DB = -100.0  # the energy of digital silence
# A stretch whose loudest part is quieter holds no speech: below a 16-bit recording's
# dither (levels relative to it would make an input of digital silence loud throughout)
SILENT_DB = -90.0
TRANSIENT_SECONDS = 0.1  # a louder stretch this short (a click) does not set the level


def frame_energy_db(wave: np.ndarray, frame_samples: int) -> np.ndarray:
    """RMS energy in dBFS of non-overlapping frames around their mean (a DC offset is no
    sound, and would fill every pause), a short last frame included.

    >>> frame_energy_db(np.array([1.0, -1.0, 0.1, -0.1, 0.5]), 2).round(1).tolist()
    [0.0, -20.0, -100.0]
    """
    whole = len(wave) // frame_samples * frame_samples
    frames = wave[:whole].reshape(-1, frame_samples)
    frames = frames - frames.mean(axis=1, keepdims=True)
    power = np.einsum("ij,ij->i", frames, frames) / frame_samples  # no squared copy
    if whole < len(wave):
        power = np.append(power, np.var(wave[whole:]))
    return 10.0 * np.log10(power.astype(np.float64) + 10.0 ** (ENERGY_FLOOR_DB / 10))


def loud_level(energy_db: np.ndarray, frame_seconds: float) -> float:
    """The level thresholds are relative to: the loudest frame but for clicks and pops, that
    of the loudest `TRANSIENT_SECONDS` (a click at the loudest frame made speech 35 dB below
    it count as silence, and be cut away).

    >>> loud_level(np.array([-40.0] * 50 + [0.0, 0.0]), 0.01)
    -40.0
    """
    loudest = min(len(energy_db), max(1, round(TRANSIENT_SECONDS / frame_seconds)))
    return float(np.partition(energy_db, -loudest)[-loudest])


def local_loud_levels(
    energy_db: np.ndarray, frame_seconds: float, window_seconds: float
) -> np.ndarray:
    """`loud_level` around each frame: the loudest of the 1 s blocks' `loud_level`s within
    `window_seconds / 2` (in whole blocks) either side of the frame's block. A door slam or a
    louder talker then sets the level of its neighbourhood alone, where one level for the
    whole recording makes all quieter speech in it count as silence.

    >>> energy = np.array([-20.0] * 100 + [-60.0] * 500 + [-20.0] * 20)  # 1 s loud, then quiet
    >>> local_loud_levels(energy, 0.01, 2.0)[::100].tolist()
    [-20.0, -20.0, -60.0, -60.0, -60.0, -20.0, -20.0]
    """
    block = max(1, round(1.0 / frame_seconds))
    levels = [
        loud_level(energy_db[start : start + block], frame_seconds)
        for start in range(0, len(energy_db), block)
    ]
    half = int(window_seconds / 2 / (block * frame_seconds) + 1e-9)  # blocks either side
    padded = np.pad(np.array(levels), half, constant_values=-np.inf)
    nearby = sliding_window_view(padded, 2 * half + 1).max(axis=1)
    return np.repeat(nearby, block)[: len(energy_db)]
