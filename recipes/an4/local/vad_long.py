"""Long-audio segmentation by energy against Silero VAD, on a recording made of the test set.

Joins the AN4 test utterances, in manifest order, with 1-4 s of silence between them (seed 0)
into one 16 kHz file of about 10 minutes, and a copy with white noise at 10 dB SNR (to the
speech) over all of it; transcribes each with `--vad energy` and `--vad silero`, with the
model's stored decoding; and prints one table:

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

RATE = 16000
GAP_SECONDS = (1.0, 4.0)


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
    args = parser.parse_args()
    recognizer = load_model(args.checkpoint)
    audio, spans = joined_test_set(args.manifest, recognizer.tokenizer.normalizer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"clean": out / "joined.wav", "white 10 dB SNR": out / "joined_white10.wav"}
    soundfile.write(files["clean"], audio, RATE, subtype="PCM_16")
    soundfile.write(files["white 10 dB SNR"], with_noise(audio, spans, 10.0).clip(-1, 1), RATE,
                    subtype="PCM_16")  # fmt: skip
    reference = " ".join(w for s in spans for w in s["words"])
    rows = []
    for condition, path in files.items():
        for vad in ("energy", "silero"):
            start = time.perf_counter()
            transcript = recognizer.transcribe(path, vad=vad)
            seconds = time.perf_counter() - start
            rows.append({
                "audio": condition, "vad": vad, "minutes": len(audio) / RATE / 60,
                "wer": 100 * jiwer.wer(reference, transcript.text or " "),
                "placed": 100 * placed_share(transcript, spans), "wall_seconds": seconds,
                "segments": len(transcript.segments),
            })  # fmt: skip
            print(rows[-1], flush=True)
    (out / "vad_long.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| audio | vad | segments | WER | words placed (%) | wall s |", "|---" * 6 + "|"]
    lines += [f"| {r['audio']} | {r['vad']} | {r['segments']} | {r['wer']:.1f} | {r['placed']:.1f} "
              f"| {r['wall_seconds']:.1f} |" for r in rows]  # fmt: skip
    (out / "vad_long.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
