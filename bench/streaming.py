"""Live recognition benchmarks (a chunk-streaming model, e.g. conf/an4/conformer_streaming.yaml).

    python -m bench.streaming wer --model M --manifest data/an4/test.jsonl [--chunk-ms 0 320 ...]
        WER and CER of the streaming decoder (CTC prefix beam search over chunks, attention
        rescoring at the end of each recording, or with --final-search beam a joint beam
        search over its frames) at each chunk size (0: full context);
        Snt/Wrd/Corr/Sub/Del/Ins/Err/S.Err rows. With 0 among the sizes, each chunk size's word
        errors against full context's, with a 95 % paired bootstrap interval over utterances.
    python -m bench.streaming load --model M --manifest data/an4/test.jsonl [--streams 1 8 16]
        `asr serve` in a child process on 127.0.0.1; N WebSocket clients each play recordings in
        real time (100 ms packets), one connection per recording, for --seconds. Per N: the
        partial latency (from the sending of the last sample a chunk needs to the arrival of its
        partial; p50/p95), the final latency (from the end of the audio to the final), streams
        with a chunk lost or out of order, streams whose audio arrived short (the server's
        duration against the sent), and whether each final equals the offline streaming decode
        of the same audio (those unlike it named in the JSON). The most streams with p95 partial
        latency <= --budget-ms is reported.
    python -m bench.streaming screenshot --model M --manifest data/an4/test.jsonl
        The live page in headless Chromium, its microphone the manifest's first two recordings
        with a pause after each, the first final's cross-attention folded out: --png
        (default docs/live_page.png).
All take --backend onnx or onnx-int8 with a package folder (`asr export --format onnx`) as
--model. Results go to --out (default bench/results/streaming_{wer,load}.json) and are printed
as tables; the wer JSON also holds each decode's hypotheses, to compare two runs utterance by
utterance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asr.audio import load_audio
from asr.cli.numbers import count, non_negative, positive, weight
from asr.data.manifest import Utterance, read_manifest
from asr.loading import BACKENDS
from asr.metrics import char_errors, word_errors
from asr.recognizer import load_model
from asr.streaming import FINAL_SEARCHES, StreamingEngine, StreamOptions, stream_transcript

ROOT = Path(__file__).resolve().parents[1]  # defaults hold from any working folder

PACKET_SECONDS = 0.1
RATE = 16000


def error_row(name: str, refs: list[str], hyps: list[str], chars: bool = False) -> dict:
    """One Snt/Wrd/Corr/Sub/Del/Ins/Err/S.Err row, percentages."""
    c = (char_errors if chars else word_errors)(refs, hyps)
    n = c.reference_length
    wrong = sum(r != h for r, h in zip(refs, hyps))

    def pct(x: int, total: int = n) -> float:
        return round(100 * x / total, 1)

    return {
        "dataset": name, "Snt": len(refs), "Wrd": n, "Corr": pct(n - c.substitutions - c.deletions),
        "Sub": pct(c.substitutions), "Del": pct(c.deletions), "Ins": pct(c.insertions),
        "Err": pct(c.errors), "S.Err": pct(wrong, len(refs)),
    }  # fmt: skip


def ratio_interval(
    full: np.ndarray, chunked: np.ndarray, resamples: int = 5000, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of sum(chunked) / sum(full), the per-utterance word errors of the same
    utterances, by a paired bootstrap: utterances drawn with replacement, both sums from each
    draw, so what is common to both decodes cancels."""
    draws = np.random.default_rng(seed).integers(0, len(full), (resamples, len(full)))
    ratios = sorted(error_ratio(c, f) for c, f in zip(chunked[draws].sum(1), full[draws].sum(1)))
    return _percentile(ratios, 2.5), _percentile(ratios, 97.5)


def _percentile(ordered: list[float], q: float) -> float:
    """numpy's linear percentile of sorted values, which may end in infinities (numpy's
    arithmetic gives nan between two of them, and at a finite value just below one)."""
    at = q / 100 * (len(ordered) - 1)
    low, part = int(at), at - int(at)
    if part == 0:
        return float(ordered[low])
    below, above = ordered[low], ordered[low + 1]
    if math.isinf(above):
        return math.inf
    if part >= 0.5:  # as numpy interpolates, to the last bit
        return float(above - (above - below) * (1 - part))
    return float(below + (above - below) * part)


def error_ratio(chunked: int, full: int) -> float:
    """chunked / full word errors: 1 where neither made any, infinite where full context
    made none (a draw of only its perfect utterances, or a test set it gets all right)."""
    if full:
        return chunked / full
    return math.inf if chunked else 1.0


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def load_waves(utterances: list[Utterance]) -> list[torch.Tensor]:
    """Each manifest line's span of its file (`offset`, `duration`), mono at RATE, `(S,)`."""
    return [load_audio(u.audio_filepath, RATE, u.offset, u.duration) for u in utterances]


def wer(args: argparse.Namespace) -> dict:
    recognizer = load_model(args.model, backend=args.backend)
    utterances = read_manifest(args.manifest)
    waves = load_waves(utterances)
    norm = recognizer.tokenizer.normalizer
    refs = [norm(u.text) for u in utterances]
    if not any(ref.split() for ref in refs):
        raise SystemExit(f"{args.manifest}: no reference has words to score against")
    out: dict = {"model": args.model, "backend": args.backend, "manifest": args.manifest,
                 "beam": args.beam, "ctc_weight": args.ctc_weight,
                 "final_search": args.final_search, "first_chunk_ms": args.first_chunk_ms,
                 "rows": {}, "seconds": {}, "against full context": {}, "hyps": {}}  # fmt: skip
    audio_seconds = sum(w.numel() for w in waves) / RATE
    errors = {}  # chunk ms: word errors per utterance
    for asked in args.chunk_ms:
        options = StreamOptions(
            chunk_ms=asked or None,
            first_chunk_ms=args.first_chunk_ms if asked else None,  # full context has no chunks
            beam=args.beam,
            ctc_weight=args.ctc_weight,
            endpoint=None,
            final_search=args.final_search,
        )
        chunk, first_ms = decoded_ms(recognizer, options)
        first = f" (the first {first_ms:g} ms)" if first_ms != chunk else ""
        size = f"{chunk:g} ms chunks{first}" if chunk else "full context"
        name = f"{Path(args.manifest).stem}, {size}"
        if name in out["rows"]:  # 300 and 320 ms are both 8 frames of 40 ms
            print(f"{asked:g} ms decodes as {size}, decoded already: skipped", flush=True)
            continue
        started = time.perf_counter()
        hyps = decode_streams(recognizer, waves, options)
        out["seconds"][name] = round(time.perf_counter() - started, 1)
        out["hyps"][name] = hyps  # to compare decodes (backends, options) utterance by utterance
        errors[chunk or 0] = np.array([word_errors([r], [h]).errors for r, h in zip(refs, hyps)])
        out["rows"][name] = {
            "wer": error_row(name, refs, hyps),
            "cer": error_row(name, refs, hyps, True),
        }
        print(
            f"{name}: WER {out['rows'][name]['wer']['Err']} CER {out['rows'][name]['cer']['Err']} "
            f"({out['seconds'][name]} s for {audio_seconds:.0f} s of audio)",
            flush=True,
        )
    for unit in ("wer", "cer"):
        print(f"\n{unit.upper()}\n\n" + table([r[unit] for r in out["rows"].values()]))
    if 0 in errors:
        print("\nword errors against full context (95 % paired bootstrap interval):")
        for chunk in [c for c in errors if c]:
            low, high = ratio_interval(errors[0], errors[chunk])
            ratio = error_ratio(errors[chunk].sum(), errors[0].sum())
            out["against full context"][f"{chunk:g} ms"] = {  # JSON has no infinity: null
                key: round(float(value), 3) if math.isfinite(value) else None
                for key, value in (("ratio", ratio), ("low", low), ("high", high))
            }
            print(f"{chunk:g} ms chunks: {ratio:.2f}x [{low:.2f}, {high:.2f}]")
    return out


def decode_streams(recognizer, waves: list[torch.Tensor], options: StreamOptions) -> list[str]:
    """Each wave as a live stream; 16 streams step through the model together (which gives
    what each alone gives: tests/streaming/test_streaming.py)."""
    engine = StreamingEngine(recognizer, options)
    texts = []
    for start in range(0, len(waves), 16):
        streams = [engine.stream() for _ in waves[start : start + 16]]
        for stream, wave in zip(streams, waves[start : start + 16]):
            stream.feed(wave)
        engine.run(streams)
        texts += [stream.final().text for stream in streams]
    return texts


@dataclass
class Connection:
    """What one client saw of one recording."""

    uid: str
    pcm: bytes
    sent_at: list[float] = field(default_factory=list)  # time each packet left
    partials: list[tuple[float, float]] = field(default_factory=list)  # (audio s, arrival)
    finals: list[str] = field(default_factory=list)
    end_sent: float = 0.0
    done_at: float = 0.0
    done_text: str | None = None
    done_duration: float | None = None  # the audio the server says it heard
    error: str | None = None

    def sent_time(self, audio_seconds: float) -> float:
        """When the packet holding the sample at `audio_seconds` (its last needed) was sent."""
        index = max(0, math.ceil(audio_seconds / PACKET_SECONDS - 1e-9) - 1)
        return self.sent_at[min(index, len(self.sent_at) - 1)]


async def play(url: str, uid: str, pcm: bytes) -> Connection:
    from websockets.asyncio.client import connect

    seen = Connection(uid, pcm)
    packet = int(PACKET_SECONDS * RATE) * 2
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": RATE, "format": "s16le"}))
        json.loads(await ws.recv())

        async def reader() -> None:
            async for message in ws:
                m = json.loads(message)
                now = time.perf_counter()
                if m["type"] == "partial":
                    seen.partials.append((m["audio_seconds"], now))
                elif m["type"] == "final":
                    seen.finals.append(m["text"])
                elif m["type"] == "done":
                    seen.done_at, seen.done_text = now, m["text"]
                    seen.done_duration = m["duration"]
                elif m["type"] == "error":
                    seen.error = m["message"]

        task = asyncio.create_task(reader())
        start = time.perf_counter()
        for k, offset in enumerate(range(0, len(pcm), packet)):
            delay = start + k * PACKET_SECONDS - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            # a packet leaves once its audio has been "recorded": at the end of its 100 ms
            await asyncio.sleep(max(0.0, start + (k + 1) * PACKET_SECONDS - time.perf_counter()))
            await ws.send(pcm[offset : offset + packet])
            seen.sent_at.append(time.perf_counter())
        seen.end_sent = time.perf_counter()
        await ws.send(json.dumps({"type": "end"}))
        await task
    return seen


async def client(
    url: str, items: list[tuple[str, bytes]], until: float, first: int
) -> list[Connection]:
    out, k = [], first
    while time.perf_counter() < until:
        uid, pcm = items[k % len(items)]
        out.append(await play(url, uid, pcm))
        k += 1
    return out


async def everyone(url: str, items: list, until: float, n: int) -> list[list[Connection]]:
    """N clients at once, each starting at another recording."""
    return await asyncio.gather(*[client(url, items, until, 7 * k) for k in range(n)])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(
    args: argparse.Namespace, port: int, streams: int, endpoints: bool = False
) -> subprocess.Popen:
    """`asr serve` on 127.0.0.1:`port`, once it listens; without `endpoints`, a final only at
    each recording's end."""
    command = [sys.executable, "-m", "asr", "serve", "--model", args.model, "--port", str(port),
               "--chunk-ms", str(args.chunk), *([] if endpoints else ["--endpoint-silence", "0"]),
               "--final-search", args.final_search, "--max-connections", str(max(streams, 1)),
               "--backend", args.backend,
               *(["--first-chunk-ms", str(args.first_chunk_ms)] if args.first_chunk_ms else []),
               *shlex.split(args.server_args)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    while True:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("asr serve ended before listening:\n" + "".join(said[-20:]))
        if f"127.0.0.1:{port}/ (" in line:
            return process
        said.append(line)


def decoded_ms(recognizer, options: StreamOptions) -> tuple[float | None, float | None]:
    """The chunk and each utterance's first chunk the streams decode, in ms (None: full
    context): whole encoder frames, which the options' sizes are rounded to."""
    engine = StreamingEngine(recognizer, options)
    seconds = engine.chunk_seconds, engine.first_chunk_seconds
    return tuple(None if s is None else round(s * 1000, 1) for s in seconds)


def percentile(values: list[float], q: float) -> float | None:
    return None if not values else round(float(np.percentile(values, q)) * 1000, 1)


def summarise(connections: list[Connection], chunk_s: float) -> dict:
    partial_ms, final_ms, bad_order = [], [], 0
    for c in connections:
        times = [a for a, _ in c.partials]
        steps = np.diff(times)
        # every chunk once, in order: steps of one chunk (partials come from whole chunks)
        if any(abs(s - chunk_s) > 0.002 for s in steps):
            bad_order += 1
        partial_ms += [arrived - c.sent_time(a) for a, arrived in c.partials]
        if c.done_at:
            final_ms.append(c.done_at - c.end_sent)
    return {
        "connections": len(connections),
        "errors": sum(c.error is not None for c in connections),
        "unfinished": sum(c.done_text is None for c in connections),
        "chunks": len(partial_ms),
        "streams with a chunk lost or out of order": bad_order,
        "streams whose audio arrived short": sum(
            c.done_duration is not None and c.done_duration < len(c.pcm) / 2 / RATE - 0.001
            for c in connections
        ),
        "partial p50 ms": percentile(partial_ms, 50),
        "partial p95 ms": percentile(partial_ms, 95),
        "final p50 ms": percentile(final_ms, 50),
        "final p95 ms": percentile(final_ms, 95),
    }


def load(args: argparse.Namespace) -> dict:
    utterances = read_manifest(args.manifest)[: args.recordings]
    items = []
    for u, wave in zip(utterances, load_waves(utterances)):
        pcm = (wave.clamp(-1, 1) * 32767).round().short().numpy().astype("<i2").tobytes()
        items.append((u.utt_id, pcm))  # an id per segment, also where the manifest has none
    recognizer = load_model(args.model, backend=args.backend)
    options = StreamOptions(
        chunk_ms=args.chunk,
        first_chunk_ms=args.first_chunk_ms,
        endpoint=None,
        final_search=args.final_search,
    )
    offline = {}
    chunk_ms, first_chunk_ms = decoded_ms(recognizer, options)  # the server rounds them so
    out = {"model": args.model, "backend": args.backend, "chunk_ms": chunk_ms,
           "seconds": args.seconds, "final_search": args.final_search,
           "first_chunk_ms": first_chunk_ms,
           "server_args": args.server_args, "runs": []}  # fmt: skip
    for n in args.streams:
        port = free_port()
        server = start_server(args, port, n)
        try:
            until = time.perf_counter() + args.seconds
            url = f"ws://127.0.0.1:{port}/"
            groups = asyncio.run(everyone(url, items, until, n))
            connections = [c for group in groups for c in group]
        finally:
            server.terminate()
            server.wait(10)
        row = {"streams": n, **summarise(connections, chunk_ms / 1000)}
        unlike = []
        for c in connections:
            if c.uid not in offline:
                heard = torch.from_numpy(
                    np.frombuffer(c.pcm, dtype="<i2").astype(np.float32) / 32768
                )
                offline[c.uid] = stream_transcript(recognizer, heard, options).text
            if c.done_text != offline[c.uid]:
                unlike.append({"uid": c.uid, "live": c.done_text, "offline": offline[c.uid]})
        row["finals unlike the offline stream"] = len(unlike)
        out["runs"].append(row)
        print(json.dumps(row), flush=True)
        out.setdefault("unlike", {})[n] = unlike  # which, to look into (JSON only)
    held = [r["streams"] for r in out["runs"]
            if r["partial p95 ms"] is not None and r["partial p95 ms"] <= args.budget_ms
            and not r["errors"] and not r["unfinished"]]  # fmt: skip
    out["most streams within budget"] = max(held) if held else 0
    print("\n" + table(out["runs"]))
    most = out["most streams within budget"]
    print(f"\nmost streams with p95 partial latency <= {args.budget_ms:g} ms: {most}")
    return out


def screenshot(args: argparse.Namespace) -> Path:
    """The live page with two finals, the first's cross-attention folded out, as --png."""
    import base64
    import tempfile

    import soundfile as sf
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from bench.explorer import chromium

    pause = np.zeros(RATE, dtype=np.float32)
    waves = load_waves(read_manifest(args.manifest)[:2])
    wave = np.concatenate([part for w in waves for part in (w.numpy(), pause)])
    out = Path(args.png)
    with tempfile.TemporaryDirectory() as scratch:
        microphone = Path(scratch) / "microphone.wav"
        sf.write(microphone, wave, RATE, subtype="PCM_16")
        port = free_port()
        server = start_server(args, port, 1, endpoints=True)
        driver = chromium(900, 640, "--use-fake-ui-for-media-stream",
                          "--use-fake-device-for-media-stream",
                          f"--use-file-for-fake-audio-capture={microphone}%noloop")  # fmt: skip
        if driver is None:
            server.terminate()
            raise SystemExit("the screenshot needs Chromium and chromedriver (make browser)")
        try:
            seconds = len(wave) / RATE
            driver.get(f"http://127.0.0.1:{port}/?autostart=1&seconds={seconds:.2f}")
            WebDriverWait(driver, 120, 0.1).until(
                lambda d: d.execute_script("return document.body.dataset.done !== undefined")
            )
            driver.find_element(By.CSS_SELECTOR, "details.alignment summary").click()
            height = driver.execute_script("return document.documentElement.scrollHeight")
            metrics = {"width": 900, "height": height, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            driver.quit()
            server.terminate()
            server.wait()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streaming",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("wer", help="WER at full context and at each chunk size")
    p.add_argument("--manifest", required=True, help="JSONL manifest with references")
    p.add_argument(
        "--chunk-ms",
        type=non_negative,
        nargs="+",
        default=[0, 320, 640, 1280],
        help="chunk sizes, ms (0: full context)",
    )
    p.add_argument(
        "--beam",
        type=count,
        help="CTC prefix beam (and the final's beam); default: the model's, as the live decoder",
    )
    p.add_argument(
        "--ctc-weight",
        type=weight,
        help="CTC's share in rescoring; default: the model's, as the live decoder",
    )
    p = sub.add_parser("load", help="latency and streams held by `asr serve` under load")
    p.add_argument("--manifest", required=True, help="JSONL manifest of the recordings to play")
    p.add_argument(
        "--streams",
        type=count,
        nargs="+",
        default=[1, 4, 8, 16, 24],
        help="concurrent real-time clients, one run each",
    )
    p.add_argument("--seconds", type=positive, default=30.0, help="each run's length")
    p.add_argument("--chunk", type=positive, default=640.0, help="chunk ms")
    p.add_argument("--recordings", type=count, default=40, help="recordings the clients play")
    p.add_argument(
        "--budget-ms",
        type=positive,
        default=300.0,
        help="p95 partial latency a stream count must keep to count as held",
    )
    p.add_argument("--server-args", default="", help="more options for asr serve, one string")
    p = sub.add_parser("screenshot", help="the live page with two finals, for the docs")
    p.add_argument("--manifest", required=True, help="JSONL manifest: its first two recordings")
    p.add_argument("--png", default=ROOT / "docs/live_page.png", help="where the screenshot goes")
    p.add_argument("--chunk", type=positive, default=640.0, help="chunk ms")
    p.add_argument("--server-args", default="", help="more options for asr serve, one string")
    for p in sub.choices.values():
        p.add_argument("--model", required=True, help="a streaming model's checkpoint or package")
        p.add_argument("--out", help="JSON results (default bench/results/streaming_PART.json)")
        p.add_argument(
            "--final-search",
            choices=FINAL_SEARCHES,
            default="rescore",
            help="the final: the CTC n-best rescored, or a joint beam search (beam)",
        )
        p.add_argument(
            "--first-chunk-ms",
            type=positive,
            help="each utterance's first chunk, ms (default: as the others)",
        )
        p.add_argument(
            "--backend",
            choices=BACKENDS,
            default="torch",
            help="what runs the networks: onnx and onnx-int8 need a package folder "
            "exported with `asr export --format onnx`",
        )
    args = parser.parse_args(argv)
    if args.part == "screenshot":
        print(screenshot(args))
        return 0
    result = wer(args) if args.part == "wer" else load(args)
    path = Path(args.out or ROOT / f"bench/results/streaming_{args.part}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"\n{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
