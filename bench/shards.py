"""Sharded training data (`asr shard`, asr.data.shards): memory and loading speed.

    python -m bench.shards [--scratch /tmp/asr-bench-shards] [--hours 2 20]

Under --scratch (never inside the repository) it prepares Mini LibriSpeech train-clean-5
(Ogg Opus, 4.4 h) and a 16-bit FLAC copy of it, repeats each under new ids to every --hours,
and writes them as shards of 1 h. One epoch of each set is then read in a fresh process as a
single stream, the work of one DataLoader worker (tar reading, decoding, batching and padding;
no speed perturbation), its files read once beforehand so that they come from the page cache
(the figures are the loader's, not the disk's): the seconds to plan the epoch from the index,
the loading throughput in audio seconds per second and in MB of shards per second (what a
worker asks of the disk), and the process's peak resident memory, which should not grow with
the corpus (only the index, the shuffle buffer and the pending batches are held). The
scratch folder is reused by the next run; delete it afterwards. Results: --out (default
bench/results/shards.json) and a table on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import soundfile

from asr.audio import load_audio_with_rate
from asr.data.dataset import collate
from asr.data.manifest import Utterance, read_manifest, write_manifest
from asr.data.prepare import prepare_corpus
from asr.data.shards import (
    DEFAULT_SHUFFLE_BUFFER,
    INDEX_NAME,
    ShardedSpeechDataset,
    StreamOptions,
    read_index,
    stream_loader,
    write_shards,
)

# Not bench.common: the measured process imports what reading shards needs and no more.
ROOT = Path(__file__).resolve().parents[1]
CORPORA = Path(os.environ.get("ASR_CORPORA", ROOT.parent / "shared" / "corpora"))
SAMPLE_RATE = 16000
SPLIT = "train-clean-5"
MAX_BATCH_SECONDS = 200.0  # conf/mini_librispeech/transformer.yaml's budget


def prepare(scratch: Path, hours: list[float]) -> dict[tuple[str, float], Path]:
    """Shard folders of `hours` of Opus and of FLAC, built once under `scratch`."""
    manifests = scratch / "manifests"
    if not (manifests / f"{SPLIT}.jsonl").exists():
        prepare_corpus("librispeech", CORPORA / "mini_librispeech" / "LibriSpeech", manifests,
                       splits=[SPLIT])  # fmt: skip
    opus = read_manifest(manifests / f"{SPLIT}.jsonl")
    sources = {"opus": opus, "flac": flac_copy(opus, scratch / "flac")}
    folders = {}
    for codec, utterances in sources.items():
        for h in hours:
            folder = scratch / f"shards_{codec}_{h:g}h"
            if not (folder / INDEX_NAME).exists():
                manifest = scratch / "manifests" / f"{codec}_{h:g}h.jsonl"
                write_manifest(manifest, repeated(utterances, h * 3600))
                write_shards(manifest, folder, shard_hours=1.0, progress=True)
            folders[codec, h] = folder
    return folders


def flac_copy(utterances: list[Utterance], folder: Path) -> list[Utterance]:
    """The utterances decoded and written as 16-bit FLAC files in `folder` (once)."""
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for utterance in utterances:
        path = folder / f"{utterance.utt_id}.flac"
        if not path.exists():
            wave, rate = load_audio_with_rate(utterance.audio_filepath, None)
            soundfile.write(path, wave.numpy(), rate, format="FLAC", subtype="PCM_16")
        copies.append(replace(utterance, audio_filepath=str(path)))
    return copies


def repeated(utterances: list[Utterance], seconds: float) -> list[Utterance]:
    """The utterances over and over, each pass under new ids, up to `seconds` of audio."""
    out, total, k = [], 0.0, 0
    while total < seconds:
        utterance = utterances[k % len(utterances)]
        out.append(replace(utterance, id=f"{utterance.utt_id}-r{k // len(utterances)}"))
        total += utterance.duration
        k += 1
    return out


def measure(folder: Path, buffer: int) -> dict:
    """One epoch of a shard folder read as one stream, in this process."""
    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    start = time.perf_counter()
    index = read_index(folder)
    options = StreamOptions(MAX_BATCH_SECONDS, shuffle_buffer=buffer)
    dataset = ShardedSpeechDataset(index, None, options, SAMPLE_RATE)
    batches = len(dataset)
    planned = time.perf_counter() - start
    audio, start = 0.0, time.perf_counter()
    for batch in stream_loader(dataset, collate):
        audio += float(batch.wave_lens.sum()) / SAMPLE_RATE
    seconds = time.perf_counter() - start
    return {
        "utterances": int(index.offsets[-1]),
        "shards": len(index.shards),
        "hours": round(sum(s.seconds for s in index.shards) / 3600, 2),
        "gb": round(sum(s.bytes for s in index.shards) / 1e9, 3),
        "batches": batches,
        "plan_s": round(planned, 2),
        "read_s": round(seconds, 1),
        "audio_s_per_s": round(audio / seconds, 1),
        "mb_per_s": round(sum(s.bytes for s in index.shards) / 1e6 / seconds, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def warm(folder: Path) -> None:
    """Read every file of `folder` once, so that the measurement finds them in the page cache."""
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as file:
            while file.read(1 << 24):
                pass


def environment(argv: list[str]) -> dict:
    """Where, with what and how the figures were measured."""
    describe = ["git", "describe", "--always", "--dirty", "--abbrev=7"]
    git = subprocess.run(describe, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    return {
        "command": "python -m bench.shards " + " ".join(argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "git": git,
        "python": platform.python_version(),
        "torch": importlib.metadata.version("torch"),
        "webdataset": importlib.metadata.version("webdataset"),
        "libsndfile": soundfile.__libsndfile_version__,
        "cpu": cpu,
    }


def table(rows: list[dict]) -> str:
    keys = ["codec", "hours", "utterances", "shards", "gb", "batches", "plan_s", "read_s",
            "audio_s_per_s", "mb_per_s", "peak_rss_mib"]  # fmt: skip
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m bench.shards",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/asr-bench-shards"))
    parser.add_argument("--hours", type=float, nargs="+", default=[2.0, 20.0])
    parser.add_argument("--buffer", type=int, default=DEFAULT_SHUFFLE_BUFFER,
                        help="shuffle buffer, utterances (%(default)s)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/shards.json")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.buffer)))
        return 0
    if args.scratch.resolve().is_relative_to(ROOT):
        raise SystemExit(f"--scratch {args.scratch} is inside the repository")
    rows = []
    for (codec, _), folder in prepare(args.scratch, args.hours).items():
        warm(folder)
        child = [sys.executable, "-m", "bench.shards", "--measure", str(folder),
                 "--buffer", str(args.buffer)]  # fmt: skip
        done = subprocess.run(child, cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append({"codec": codec, **json.loads(done.stdout.splitlines()[-1])})
        print(json.dumps(rows[-1]), flush=True)
    result = {"environment": environment(argv), "buffer": args.buffer, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{table(rows)}\n\n{args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
