"""Long-audio segmentation by energy against Silero VAD, on a recording made of the test set.

Joins the AN4 test utterances, in manifest order, with 1-4 s of silence between them (seed 0)
into one 16 kHz file of about 10 minutes, and makes copies of it:

    white 10 dB SNR    white noise over all of it, 10 dB below the speech
    40 dB down         all of it 40 dB quieter
    40 dB down, burst  that with a 0.5 s white noise burst at -9 dBFS after the middle utterance
    half 30 dB down    its second half 30 dB quieter (a quieter talker, a gain change)
    60 s pause, ...    a 60 s pause after the middle utterance, white noise 40 dB below the
                       speech over all of it

transcribes each with the energy splitter (`energy`: its level judged around each frame, the
default; `energy-whole`: over the whole input) and Silero VAD, with the model's stored
decoding; and prints one table:

    WER            the whole transcript against the joined references
    words placed   of the hypothesis words aligned to a reference word (jiwer), the share
                   whose middle lies inside that word's utterance
    wall s         seconds `Recognizer.transcribe` took, reading and segmenting included

    python recipes/an4/local/vad_long.py --checkpoint exp/an4/transformer/avg.ckpt \
        --manifest data/an4/test.jsonl --out exp/an4/vad_long
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jiwer
import numpy as np
import soundfile
import torch

from asr import perturb
from asr.audio import load_audio
from asr.data.manifest import read_manifest
from asr.recognizer import load_model
from asr.segment import SegmenterOptions

RATE = 16000
GAP_SECONDS = (1.0, 4.0)
SEGMENTERS = {
    "energy": SegmenterOptions(),
    "energy-whole": SegmenterOptions(level_window_seconds=None),  # one level for all of it
    "silero": SegmenterOptions(vad="silero"),
}


def joined_test_set(manifest: str, normalize) -> tuple[np.ndarray, list[dict]]:
    """The utterances joined by silences, and each one's span and normalised words."""
    rng = np.random.default_rng(0)
    parts, spans, t = [], [], 0.0
    for utterance in read_manifest(manifest):
        gap = np.zeros(round(rng.uniform(*GAP_SECONDS) * RATE), np.float32)
        wave = load_audio(utterance.audio_filepath, RATE, utterance.offset, utterance.duration)
        parts += [gap, wave.numpy()]
        t += len(gap) / RATE
        words = normalize(utterance.text).split()
        spans.append({"start": t, "end": t + len(wave) / RATE, "words": words})
        t += len(wave) / RATE
    parts.append(np.zeros(round(GAP_SECONDS[0] * RATE), np.float32))
    return np.concatenate(parts), spans


def with_noise(audio: np.ndarray, spans: list[dict], snr_db: float) -> np.ndarray:
    """White noise over all of `audio`, `snr_db` below the speech's power."""
    pieces = [audio[round(s["start"] * RATE) : round(s["end"] * RATE)] for s in spans]
    speech = np.concatenate(pieces)
    noise = perturb.colored_noise(len(audio), "white", np.random.default_rng(1))
    wave = torch.from_numpy(audio)
    return perturb.add_noise(wave, noise, snr_db, torch.from_numpy(speech)).numpy()


def with_burst(audio: np.ndarray, spans: list[dict]) -> np.ndarray:
    """`audio` with 0.5 s of white noise (RMS -9 dBFS) from 0.3 s after the middle utterance."""
    start = round((spans[len(spans) // 2]["end"] + 0.3) * RATE)
    burst = 0.35 * np.random.default_rng(2).standard_normal(RATE // 2).astype(np.float32)
    audio = audio.copy()
    audio[start : start + len(burst)] += burst
    return audio


def with_pause(audio: np.ndarray, spans: list[dict], seconds: float) -> tuple[np.ndarray, list]:
    """`audio` with a pause of `seconds` after the middle utterance, white noise over all of it
    40 dB below the speech; the spans moved with it."""
    middle = len(spans) // 2
    at = round((spans[middle]["end"] + 0.5) * RATE)
    longer = np.concatenate([audio[:at], np.zeros(round(seconds * RATE), np.float32), audio[at:]])
    moved = [s | {"start": s["start"] + seconds, "end": s["end"] + seconds} for s in spans]
    moved = spans[: middle + 1] + moved[middle + 1 :]
    return with_noise(longer, moved, 40.0), moved


def conditions(audio: np.ndarray, spans: list[dict]) -> dict[str, tuple[np.ndarray, list]]:
    """The joined recording and its changed copies, with their utterances' spans, by name."""
    quiet = audio * np.float32(10 ** (-40 / 20))
    half = audio.copy()
    half[len(half) // 2 :] *= np.float32(10 ** (-30 / 20))
    return {
        "clean": (audio, spans),
        "white 10 dB SNR": (with_noise(audio, spans, 10.0), spans),
        "40 dB down": (quiet, spans),
        "40 dB down, burst": (with_burst(quiet, spans), spans),
        "half 30 dB down": (half, spans),
        "60 s pause, white 40 dB SNR": with_pause(audio, spans, 60.0),
    }


def placed_share(transcript, spans: list[dict]) -> float:
    """Of the hypothesis words aligned to a reference word, the share whose middle lies inside
    the utterance of that reference word."""
    owner = [k for k, s in enumerate(spans) for _ in s["words"]]
    ref = " ".join(w for s in spans for w in s["words"])
    hyp_words = transcript.words
    hyp = " ".join(w.text for w in hyp_words)
    if not hyp:
        return 0.0
    aligned, inside = 0, 0
    for chunk in jiwer.process_words(ref, hyp).alignments[0]:
        if chunk.type not in ("equal", "substitute"):
            continue
        for r, h in zip(range(chunk.ref_start_idx, chunk.ref_end_idx),
                        range(chunk.hyp_start_idx, chunk.hyp_end_idx)):  # fmt: skip
            span, word = spans[owner[r]], hyp_words[h]
            aligned += 1
            inside += span["start"] <= (word.start + word.end) / 2 <= span["end"]
    return inside / aligned if aligned else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--conditions", nargs="+", metavar="NAME", help="a subset (default: all)")
    parser.add_argument(
        "--segmenters", nargs="+", choices=list(SEGMENTERS), default=list(SEGMENTERS)
    )
    args = parser.parse_args()
    recognizer = load_model(args.checkpoint)
    audio, spans = joined_test_set(args.manifest, recognizer.tokenizer.normalizer)
    audios = conditions(audio, spans)
    unknown = set(args.conditions or []) - set(audios)
    if unknown:
        parser.error(f"--conditions: no {sorted(unknown)}; there are {list(audios)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reference = " ".join(w for s in spans for w in s["words"])
    recognizer.transcribe(torch.from_numpy(audio[: 30 * RATE]), sample_rate=RATE)  # warm-up
    rows = []
    for condition in args.conditions or audios:
        path = out / f"{condition.replace(' ', '_').replace(',', '')}.wav"
        changed, changed_spans = audios[condition]
        soundfile.write(path, changed.clip(-1, 1), RATE, subtype="PCM_16")
        for name in args.segmenters:
            start = time.perf_counter()
            transcript = recognizer.transcribe(path, segmenter=SEGMENTERS[name])
            seconds = time.perf_counter() - start
            rows.append({
                "audio": condition, "segmenter": name, "minutes": len(changed) / RATE / 60,
                "wer": 100 * jiwer.wer(reference, transcript.text or " "),
                "placed": 100 * placed_share(transcript, changed_spans), "wall_seconds": seconds,
                "segments": len(transcript.segments),
            })  # fmt: skip
            print(rows[-1], flush=True)
    (out / "vad_long.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| audio | segmenter | segments | WER | words placed (%) | wall s |", "|---" * 6 + "|"]
    lines += [f"| {r['audio']} | {r['segmenter']} | {r['segments']} | {r['wer']:.1f} "
              f"| {r['placed']:.1f} | {r['wall_seconds']:.1f} |" for r in rows]  # fmt: skip
    (out / "vad_long.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
