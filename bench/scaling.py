"""Scaling: data-parallel training on CPU, decode time against utterance length, and training
step time against batch size.

- DDP: conf/an4/transformer.yaml trained (bf16 autocast) by 1 and by 2 processes (gloo, one
  thread each), each process with the same per-process batches; the ratio of the aggregate
  audio seconds per second says how much a second core buys.
- Length: one recording, a block of whole AN4 test utterances repeated, cut to 1, 2, 5 s and
  to whole blocks up to 60 s, decoded as one utterance (greedy and beam 10 + CTC:
  `Recognizer.search`), as `asr transcribe` decodes it (beam 10 + CTC in segments:
  `Recognizer.transcribe`), and through the frontend + encoder alone; the log-log slope of
  time against length, fitted over the whole blocks, is the growth exponent (1 = linear).
- Batch: training steps (bf16) on batches of ~3 s utterances holding 10 .. 80 s of audio;
  the slope of step time against batch seconds.
"""

from __future__ import annotations

import json
import math
import socket
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bench.common import (
    SAMPLE_RATE,
    Batch,
    Recognizer,
    SearchOptions,
    SegmenterOptions,
    Settings,
    SpeechDataset,
    Tokenizer,
    audio_seconds,
    build_module,
    clip_value,
    collate,
    fastest,
    load_audio,
    measure_steps,
    model_config,
    read_manifest,
    segment_seconds_for,
    timed_call,
    train_batches,
    word_errors,
    write_json,
)
from bench.decode import Utterances, load_recognizer, search_options, time_encoder, time_search
from bench.train import Trainer

TYPICAL_SECONDS = (2.5, 3.5)  # training utterances used for the batch-size sweep
DDP_LIMIT = 900  # seconds a DDP run may take
BLOCK_SECONDS = 10.0  # the decode-vs-length recording repeats a block at least this long
MAX_SECONDS = 60.0  # and is decoded up to this long
# Whole-recording search, and the segmented decoding of `asr transcribe` / Recognizer.transcribe.
LENGTH_MODES = ("greedy", "beam10_ctc", "transcribe_beam10_ctc")


def growth_exponent(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size).

    >>> round(growth_exponent([1, 2, 4], [3, 6, 12]), 6)
    1.0
    """
    xs, ys = [math.log(s) for s in sizes], [math.log(t) for t in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    return cov / sum((x - mean_x) ** 2 for x in xs)


# ---------------------------------------------------------------- DDP


class _LossModel(nn.Module):
    """`Trainer.loss` as a forward, so DistributedDataParallel sees (and syncs) the step."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.module = trainer.module
        self.trainer = trainer

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.trainer.loss(batch)


def _ddp_worker(
    rank: int, world: int, port: int, config: dict, batches: list[Batch], warmup: int, out: str
) -> None:
    """One DDP process: train on `batches` (every process the same ones, so per-process work
    is equal); rank 0 writes the throughput."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = _ddp_measure(config, batches, warmup)
        total = torch.tensor([result["audio_seconds"], result["seconds"]], dtype=torch.float64)
        dist.all_reduce(total[:1])  # audio of every process
        dist.all_reduce(total[1:], op=dist.ReduceOp.MAX)  # the slowest process's time
        if rank == 0:
            write_json(Path(out), {"audio_seconds": float(total[0]), "seconds": float(total[1])})
    finally:
        dist.destroy_process_group()


def _ddp_measure(config: dict, batches: list[Batch], warmup: int) -> dict[str, Any]:
    """Timed DDP steps. The DDP model is freed when this returns, while the process group
    still exists (freed after it, its destructor can hang the process at exit)."""
    clip = clip_value("transformer")
    trainer = Trainer(build_module(config), "bf16", clip)
    model = nn.parallel.DistributedDataParallel(_LossModel(trainer))

    def step(batch: Batch) -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        model(batch).backward()  # gradients averaged over the processes
        trainer.update()

    for batch in batches[:warmup]:
        step(batch)
    dist.barrier()
    audio = [audio_seconds(b.wave_lens) for b in batches[warmup:]]
    return measure_steps(step, batches[warmup:], audio, 0, torch.device("cpu"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _join(context: mp.ProcessContext, out: Path) -> None:
    """Wait for the DDP processes (errors propagate). Ones still alive 30 s after the result
    was written, or after DDP_LIMIT seconds, are terminated: a hung exit must not stall the
    benchmark."""
    start, written = time.monotonic(), None
    while not _joined(context, out):
        now = time.monotonic()
        if written is None and out.exists():
            written = now
        if (written is not None and now - written > 30) or now - start > DDP_LIMIT:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            return


def _joined(context: mp.ProcessContext, out: Path) -> bool:
    """Whether all processes ended; one that dies after the result was written (gloo may
    abort in teardown) does not void the measurement."""
    try:
        return context.join(timeout=1)
    except mp.ProcessExitedException:
        if out.exists():
            return True
        raise


def ddp_throughput(world: int, config: dict, batches: list[Batch], warmup: int) -> dict:
    """Aggregate audio seconds per second of `world` CPU processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        args = (world, _free_port(), config, batches, warmup, str(out))
        _join(mp.spawn(_ddp_worker, args=args, nprocs=world, join=False), out)
        if not out.exists():
            raise RuntimeError(f"DDP with {world} processes wrote no result in {DDP_LIMIT} s")
        result = json.loads(out.read_text())
    result["audio_seconds_per_second"] = result["audio_seconds"] / result["seconds"]
    return result


def ddp_scaling(settings: Settings) -> dict[str, Any]:
    """1 vs 2 processes, the same batches per process."""
    steps, warmup = settings.pick(2, 8), 1
    budget = settings.pick(8.0, None)
    batches = train_batches("transformer", settings, steps + warmup, budget)
    batches = [b.to("cpu") for b in batches]
    config = model_config("transformer", settings.data)
    one = ddp_throughput(1, config, batches, warmup)
    two = ddp_throughput(2, config, batches, warmup)
    return {
        "steps_per_process": steps,
        "one_process": one,
        "two_processes": two,
        "speedup": two["audio_seconds_per_second"] / one["audio_seconds_per_second"],
    }


# ---------------------------------------------------------------- decode vs length


def speech_block(settings: Settings) -> tuple[torch.Tensor, str]:
    """Whole AN4 test utterances, joined in manifest order until at least `BLOCK_SECONDS`,
    and their transcripts, joined."""
    pieces, texts, total = [], [], 0
    for utt in read_manifest(settings.data / "test.jsonl"):
        pieces.append(load_audio(utt.audio_filepath, SAMPLE_RATE, utt.offset, utt.duration))
        texts.append(utt.text)
        total += len(pieces[-1])
        if total >= BLOCK_SECONDS * SAMPLE_RATE:
            return torch.cat(pieces), " ".join(texts)
    raise ValueError(f"the test set has only {total / SAMPLE_RATE:.0f} s of audio")


def recording_lengths(settings: Settings, block_seconds: float) -> list[float]:
    """Seconds decoded: a few short cuts, then every whole number of blocks up to
    `MAX_SECONDS` (the growth exponent is fitted over those: they all hold as much speech per
    second, where longer cuts of the joined test set hold more)."""
    if settings.quick:
        return [1.0, 3.0, 6.0]
    blocks = [k * block_seconds for k in range(1, int(MAX_SECONDS // block_seconds) + 1)]
    return [1.0, 2.0, 5.0, *blocks]


def segment_seconds(recognizer: Recognizer, settings: Settings) -> float:
    """The longest segment the segmented decodes cut: the one `asr transcribe` cuts by default,
    as the checkpoint stores it, or for checkpoints from before it was stored, the same rule
    (`segment_seconds_for`) over the training set (5 s on AN4)."""
    if recognizer.segment_seconds is not None:
        return recognizer.segment_seconds
    return segment_seconds_for(
        [utt.duration for utt in read_manifest(settings.data / "train.jsonl")]
    )


def decode_alone(
    recognizer: Recognizer,
    wave: torch.Tensor,
    options: SearchOptions,
    segmenter: SegmenterOptions | None,
) -> tuple[float, str]:
    """Seconds to decode one recording and its text: as one utterance (`Recognizer.search`),
    or, given a `segmenter`, as `asr transcribe` does (`Recognizer.transcribe`)."""
    if segmenter is not None:
        took, transcript = timed_call(
            lambda: recognizer.transcribe(wave, options=options, segmenter=segmenter),
            recognizer.device,
        )
        return took, transcript.text
    took, texts = time_search(recognizer, Utterances([""], [wave]), 1, options)
    return took, texts[0]


def decode_vs_length(settings: Settings) -> dict[str, Any]:
    """Decode time of one recording cut to each length: greedy and beam 10 + CTC over the whole
    recording, and beam 10 + CTC through `Recognizer.transcribe` (segmented at
    `segment_seconds`); each time the fastest of 3 decodes. Lengths of whole blocks also get
    the transcript's WER. Then the frontend + encoder alone, which bounds how close to linear
    the unsegmented searches can grow."""
    block, block_text = speech_block(settings)
    block_seconds = len(block) / SAMPLE_RATE
    lengths = recording_lengths(settings, block_seconds)
    repeats = settings.passes(3)
    recognizer, label = load_recognizer(settings)
    recording = block.repeat(math.ceil(max(lengths) * SAMPLE_RATE / len(block)))
    longest = segment_seconds(recognizer, settings)
    results: dict[str, Any] = {"model": label, "lengths": lengths, "segment_seconds": longest}
    fitted_from = settings.pick(1, block_seconds)  # whole blocks: as much speech per second
    for mode in LENGTH_MODES:
        options = search_options(mode.removeprefix("transcribe_"), settings)
        segmented = mode.startswith("transcribe_")  # else decoded as one utterance
        segmenter = SegmenterOptions(max_segment_seconds=longest) if segmented else None
        decode_alone(recognizer, recording[:SAMPLE_RATE], options, segmenter)  # warm-up
        seconds, wers = [], []
        for length in lengths:
            wave = recording[: round(length * SAMPLE_RATE)]
            took, text = fastest(
                repeats, partial(decode_alone, recognizer, wave, options, segmenter)
            )
            seconds.append(took)
            wers.append(_block_wer(text, block_text, length / block_seconds))
        results[mode] = {
            "seconds": seconds,
            "wer": wers,  # % against the blocks' transcripts; None for a part of a block
            **_growth(lengths, seconds, fitted_from),
        }
    seconds = [
        fastest(repeats, partial(time_encoder, recognizer, Utterances([""], [wave]), 1))[0]
        for wave in (recording[: round(n * SAMPLE_RATE)] for n in lengths)
    ]
    results["encoder"] = {"seconds": seconds, **_growth(lengths, seconds, fitted_from)}
    return results


def _growth(lengths: list[float], seconds: list[float], start: float) -> dict[str, float]:
    """The growth exponent of `seconds` against `lengths`, fitted from `start` seconds up."""
    fit = [(n, t) for n, t in zip(lengths, seconds) if n >= start]
    exponent = growth_exponent([n for n, _ in fit], [t for _, t in fit])
    return {"exponent": exponent, "exponent_from_seconds": fit[0][0]}


def _block_wer(text: str, block_text: str, blocks: float) -> float | None:
    """WER (%) of `text` against `blocks` repetitions of `block_text`; None unless `blocks`
    is a whole number."""
    whole = round(blocks)
    if abs(blocks - whole) > 1e-6 or whole < 1:
        return None
    return 100 * word_errors([" ".join([block_text] * whole)], [text]).rate


# ---------------------------------------------------------------- train step vs batch size


def typical_batch(settings: Settings, budget: float) -> Batch:
    """A batch of ~3 s training utterances holding about `budget` seconds of audio."""
    low, high = TYPICAL_SECONDS
    utts = [u for u in read_manifest(settings.data / "train.jsonl") if low <= u.duration <= high]
    count = 0
    while count < len(utts) and sum(u.duration for u in utts[: count + 1]) <= budget:
        count += 1
    dataset = SpeechDataset(utts[: max(count, 1)], Tokenizer.load(settings.data / "tokenizer"))
    return collate([dataset[i] for i in range(len(dataset))]).to(settings.device)


def step_vs_batch(settings: Settings) -> dict[str, Any]:
    """bf16 training step time of conf/an4/transformer.yaml against batch seconds."""
    budgets = settings.pick([4, 8], [10, 20, 40, 80])
    if settings.on_gpu and not settings.quick:
        budgets += [160, 320, 640]  # a GPU's step is launch-bound far past the CPU's sizes
    config = model_config("transformer", settings.data)
    clip = clip_value("transformer")
    trainer = Trainer(build_module(config, settings.seed).to(settings.device), "bf16", clip)
    rows = []
    for budget in budgets:
        batch = typical_batch(settings, budget)
        repeats = settings.pick(2, 4)
        audio = audio_seconds(batch.wave_lens)
        result = measure_steps(
            trainer.step, [batch] * repeats, [audio] * repeats, 1, settings.device
        )
        rows.append(
            {
                "batch_seconds": audio,
                "utterances": len(batch),
                "step_seconds": result["seconds"] / repeats,
                "memory": result["memory"],
            }
        )
    exponent = growth_exponent(
        [r["batch_seconds"] for r in rows], [r["step_seconds"] for r in rows]
    )
    return {"rows": rows, "exponent": exponent}


def run(settings: Settings) -> dict[str, Any]:
    """DDP ratio (CPU only), decode time by length, training step time by batch size."""
    results: dict[str, Any] = {}
    if settings.device.type == "cpu":
        results["ddp"] = ddp_scaling(settings)
    else:
        results["ddp"] = {"skipped": "CPU (gloo) only"}
    results["decode_length"] = decode_vs_length(settings)
    results["train_batch"] = step_vs_batch(settings)
    return results
