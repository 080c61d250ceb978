"""Word-shifted copies of yes/no training recordings, as extra manifest entries.

Every training recording of the yes/no corpus starts with "lo" (NO) and every test recording
with "ken" (YES): the standard split sorts the file names. A model trained on the recordings
alone learns that a transcript starts with NO. This adds, for each training recording, the
segments that start at its 2nd, 3rd, ... word (manifest `offset` + `duration`, no audio is
written), so transcripts start with either word. Words are found as the runs of frames
within `THRESHOLD_DB` of the recording's loudest frame; a recording where the count of runs
is not its count of words gets no copies.

    python recipes/yesno/shift.py data/yesno/train.jsonl data/yesno/train_shifted.jsonl
"""

from __future__ import annotations

import argparse
import logging

import numpy as np

from asr.audio import load_audio
from asr.data.manifest import Utterance, read_manifest, write_manifest
from asr.segment import frame_energy_db

FRAME_SECONDS = 0.01  # energy frame
THRESHOLD_DB = -15.0  # a word frame is at most this far below the loudest frame
MIN_GAP_FRAMES = 5  # quieter stretches shorter than this do not separate words
MIN_WORD_FRAMES = 5  # shorter loud runs are clicks, not words

logger = logging.getLogger("shift")


def word_spans(energy_db: np.ndarray) -> list[tuple[int, int]]:
    """Frame spans `[start, stop)` of the loud runs, close runs merged, short ones dropped.

    >>> loud, quiet = [0.0] * 6, [-40.0] * 6
    >>> word_spans(np.array(quiet + loud + [-40.0] * 2 + loud + quiet + loud))
    [(6, 20), (26, 32)]
    """
    loud = np.concatenate(([False], energy_db > energy_db.max() + THRESHOLD_DB, [False]))
    edges = np.diff(loud.astype(np.int8))
    spans: list[list[int]] = []
    for start, stop in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        if spans and start - spans[-1][1] < MIN_GAP_FRAMES:
            spans[-1][1] = int(stop)
        else:
            spans.append([int(start), int(stop)])
    return [(a, b) for a, b in spans if b - a >= MIN_WORD_FRAMES]


def shifted(utterance: Utterance, sample_rate: int) -> list[Utterance]:
    """Copies of `utterance` starting at each word after the first (none if unsure)."""
    wave = load_audio(utterance.audio_filepath, sample_rate).numpy()
    spans = word_spans(frame_energy_db(wave, round(sample_rate * FRAME_SECONDS)))
    words = utterance.text.split()
    if len(spans) != len(words):
        found = f"{len(words)} words but {len(spans)} loud runs"
        logger.warning("%s: %s: no copies", utterance.utt_id, found)
        return []
    end = len(wave) / sample_rate
    copies = []
    for k in range(1, len(words)):
        start = round((spans[k - 1][1] + spans[k][0]) / 2 * FRAME_SECONDS, 3)  # mid-gap
        text, utt_id = " ".join(words[k:]), f"{utterance.utt_id}-from{k}"
        duration = round(end - start, 6)
        copies.append(
            Utterance(utterance.audio_filepath, duration, text, utt_id, utterance.speaker, start)
        )
    return copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", help="training manifest of the yes/no corpus")
    parser.add_argument("out", help="output manifest: the input's entries, then the copies")
    parser.add_argument("--sample-rate", type=int, default=8000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    utterances = read_manifest(args.manifest)
    copies = [c for u in utterances for c in shifted(u, args.sample_rate)]
    write_manifest(args.out, [*utterances, *copies])
    added = f"{len(utterances)} utterances + {len(copies)} word-shifted copies"
    logger.info("%s: %s", args.out, added)


if __name__ == "__main__":
    main()
