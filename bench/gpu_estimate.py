"""What a config costs at scale, from its model FLOPs: `python -m bench.gpu_estimate`.

Counts the model FLOPs of one training step (forward and backward) per second of audio for
utterances of LibriSpeech's mean length, times that step on this machine (fp32), and turns
both into an estimate of a GPU's training throughput at an assumed model FLOPs utilisation:
audio seconds per second per GPU, the hours N epochs of a corpus take on G GPUs, and the
loading rate each GPU needs from its workers. An estimate, not a measurement: a lent GPU
runs recipes/librispeech/gpu_smoke.sh for the measured figure, and `--device cuda` times the
same synthetic step there (bf16; no loader, no padding), which gives the model's own
throughput and MFU on that GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml

from asr.cli.numbers import count, positive, whole
from asr.text import NUM_SPECIAL
from bench.common import (
    ROOT,
    Batch,
    CMVNStats,
    build_module,
    count_flops,
    count_parameters,
    device_option,
    synchronize,
    with_stats_path,
)
from bench.peak import matmul_gflops
from bench.train import Trainer

LIBRISPEECH_MEAN_SECONDS = 12.3  # train-960: 281,241 utterances, 960.9 h
TOKENS_PER_SECOND = 3.5  # BPE 5000 pieces a second of read English speech, about
SAMPLE_RATE = 16000
N_MELS = 80
# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets.
GPU_PEAKS = {"A100": 312.0, "H100 SXM": 989.0, "H200": 989.0}


def synthetic_batch(utterances: int, seconds: float, vocab_size: int) -> Batch:
    """`utterances` of `seconds` of noise with random token targets (FLOPs need no speech)."""
    generator = torch.Generator().manual_seed(0)
    samples, tokens = int(seconds * SAMPLE_RATE), max(1, round(seconds * TOKENS_PER_SECOND))
    return Batch(
        waves=0.1 * torch.randn(utterances, samples, generator=generator),
        wave_lens=torch.full((utterances,), samples),
        tokens=torch.randint(4, vocab_size, (utterances, tokens), generator=generator),
        token_lens=torch.full((utterances,), tokens),
        texts=[""] * utterances,
        ids=[f"u{i}" for i in range(utterances)],
    )


def module_of(config_path: Path, vocab_size: int, scratch: Path):
    """The config's `ASRModule`, its CMVN statistics made up (FLOPs do not depend on them)."""
    init = yaml.safe_load(config_path.read_text())["model"]["init_args"]
    stats = CMVNStats(
        1, torch.zeros(N_MELS, dtype=torch.float64), torch.ones(N_MELS, dtype=torch.float64)
    )
    stats.save(scratch / "cmvn.json")
    init = with_stats_path(init, scratch)
    return build_module({**init, "vocab_size": vocab_size, "tokenizer": ""})


def audio_rate(trainer: Trainer, batch: Batch, steps: int, warmup: int) -> float:
    """Audio seconds per second of `steps` training steps on `batch`, after `warmup` steps
    (kernels chosen, the allocator's pool filled)."""
    device = batch.waves.device
    for _ in range(warmup):
        trainer.step(batch)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step(batch)
    synchronize(device)
    audio = float(batch.wave_lens.sum()) / SAMPLE_RATE
    return steps * audio / (time.perf_counter() - start)


def matmul_peak(device: torch.device) -> float:
    """GFLOP/s of the device's matmuls in the precision `asr fit` trains in there (bf16 on a
    GPU, fp32 elsewhere), the best of two sizes."""
    if device.type == "cuda":
        return max(matmul_gflops(n, torch.bfloat16, device, 1.0) for n in (4096, 8192))
    return max(matmul_gflops(n, torch.float32, device, 1.0) for n in (1024, 2048))


def measure_device(
    config: Path, vocab_size: int, device: torch.device, utterances: int, steps: int,
    flops: float,
) -> dict[str, Any]:  # fmt: skip
    """Training steps of `config` on `device` (bf16 on a GPU, fp32 elsewhere, as `asr fit`
    runs them): audio s/s, and MFU against the device's measured matmul rate in that precision
    and, for a GPU named in GPU_PEAKS, its bf16 data-sheet peak."""
    gpu = device.type == "cuda"
    with tempfile.TemporaryDirectory() as scratch:
        module = module_of(config, vocab_size, Path(scratch)).to(device)
    trainer = Trainer(module, "bf16" if gpu else "fp32", 5.0)  # the configs' gradient clip
    batch = synthetic_batch(utterances, LIBRISPEECH_MEAN_SECONDS, vocab_size).to(device)
    rate = audio_rate(trainer, batch, steps, warmup=3)
    matmul = matmul_peak(device)
    name = torch.cuda.get_device_name(device) if gpu else str(device)
    sheet = next((peak for key, peak in GPU_PEAKS.items() if key.split()[0] in name), None)
    return {
        "device": name,
        "batch": f"{utterances} x {LIBRISPEECH_MEAN_SECONDS} s",
        "precision": trainer.precision,
        "audio_s_per_s": rate,
        "matmul_tflops": matmul / 1e3,
        "mfu_of_matmul": rate * flops / (matmul * 1e9),
        "mfu_of_sheet": rate * flops / (sheet * 1e12) if sheet else None,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9
        if gpu else None,
    }  # fmt: skip


def estimate(
    config: Path,
    vocab_size: int,
    utterances: int,
    steps: int,
    mfus: Sequence[float],
    corpus_hours: float,
    epochs: int,
    gpus: int,
    device: torch.device | None = None,
    device_utterances: int = 48,
) -> dict[str, Any]:
    """FLOPs per audio second, this machine's fp32 step rate and MFU, and the GPU estimates;
    with `device`, also the step measured there."""
    with tempfile.TemporaryDirectory() as scratch:
        module = module_of(config, vocab_size, Path(scratch))
    batch = synthetic_batch(utterances, LIBRISPEECH_MEAN_SECONDS, vocab_size)
    audio = utterances * LIBRISPEECH_MEAN_SECONDS
    trainer = Trainer(module, "fp32", None)
    flops = count_flops(partial(trainer.forward_backward, batch)) / audio
    cpu_rate = audio_rate(trainer, batch, steps, warmup=1)
    cpu_peak = matmul_peak(torch.device("cpu"))
    cpu_mfu = cpu_rate * flops / (cpu_peak * 1e9)
    epoch_audio = corpus_hours * 3600
    gpu_rows = []
    for name, peak in GPU_PEAKS.items():
        for mfu in mfus:
            rate = peak * 1e12 * mfu / flops
            hours = epochs * epoch_audio / (gpus * rate) / 3600
            gpu_rows.append({"gpu": name, "mfu": mfu, "audio_s_per_s": rate, "hours": hours})
    measured = None
    if device is not None:
        measured = measure_device(config, vocab_size, device, device_utterances, 20, flops)
    return {
        "config": str(config),
        "parameters": count_parameters(module),
        "flops_per_audio_second": flops,
        "batch": f"{utterances} x {LIBRISPEECH_MEAN_SECONDS} s",
        "cpu": {
            "threads": torch.get_num_threads(),
            "audio_s_per_s": cpu_rate,
            "fp32_peak_gflops": cpu_peak,
            "mfu": cpu_mfu,
        },
        "corpus_hours": corpus_hours,
        "epochs": epochs,
        "gpus": gpus,
        "gpu": gpu_rows,
        "measured": measured,
    }


def markdown(result: dict[str, Any]) -> str:
    """The estimate as the tables of docs/scaling.md."""
    cpu = result["cpu"]
    lines = [
        f"- {result['config']}: {result['parameters'] / 1e6:.1f} M parameters, "
        f"{result['flops_per_audio_second'] / 1e9:.1f} GFLOP per second of audio for a training "
        f"step (forward and backward; batch {result['batch']})",
        f"- this CPU ({cpu['threads']} threads, fp32): {cpu['audio_s_per_s']:.2f} audio s/s, "
        f"fp32 matmul peak {cpu['fp32_peak_gflops']:.0f} GFLOP/s, MFU {cpu['mfu']:.2f}",
        "",
        f"| GPU (bf16 dense peak) | assumed MFU | audio s/s per GPU (estimate) | hours for "
        f"{result['epochs']} epochs of {result['corpus_hours']:g} h on {result['gpus']} GPUs |",
        "|---|---|---|---|",
    ]
    for row in result["gpu"]:
        peak = GPU_PEAKS[row["gpu"]]
        lines.append(
            f"| {row['gpu']} ({peak:g} TFLOP/s) | {row['mfu']:.2f} | {row['audio_s_per_s']:,.0f} "
            f"| {row['hours']:,.1f} |"
        )
    measured = result.get("measured")
    if measured:
        sheet = measured["mfu_of_sheet"]
        lines += [
            "",
            f"Measured on {measured['device']} ({measured['precision']}, synthetic batch "
            f"{measured['batch']}): {measured['audio_s_per_s']:,.0f} audio s/s; matmul "
            f"{measured['matmul_tflops']:.2f} TFLOP/s, MFU {measured['mfu_of_matmul']:.3f} "
            f"of it" + (f", {sheet:.3f} of the data-sheet peak" if sheet else "")
            + (f"; peak memory {measured['peak_memory_gb']:.1f} GB"
               if measured["peak_memory_gb"] else ""),
        ]  # fmt: skip
    return "\n".join(lines)


def _config_file(text: str) -> Path:
    """A config as given, else from the repository (conf/...)."""
    for path in (Path(text), ROOT / text):
        if path.is_file():
            return path
    raise argparse.ArgumentTypeError(f"no such config: {text}")


def _utilisation(text: str) -> float:
    value = positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {value:g}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_estimate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--config", type=_config_file, default=ROOT / "conf/librispeech/conformer.yaml"
    )
    parser.add_argument("--vocab-size", type=whole(NUM_SPECIAL + 1), default=5000)
    parser.add_argument("--utterances", type=count, default=4, help="batch of the timed step")
    parser.add_argument("--steps", type=count, default=3, help="timed CPU steps")
    parser.add_argument("--mfu", type=_utilisation, nargs="+", default=[0.05, 0.15])
    parser.add_argument("--corpus-hours", type=positive, default=960.9)
    parser.add_argument("--epochs", type=count, default=60)
    parser.add_argument("--gpus", type=count, default=8)
    parser.add_argument(
        "--device",
        type=device_option,
        help="also time training steps on this device (cuda: bf16): a measurement",
    )
    parser.add_argument(
        "--device-utterances", type=count, default=48,
        help="batch of the timed device steps (48 x 12.3 s: gpu_smoke.sh's 600 s per GPU)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    device = torch.device(args.device) if args.device else None
    result = estimate(
        args.config, args.vocab_size, args.utterances, args.steps, args.mfu,
        args.corpus_hours, args.epochs, args.gpus, device, args.device_utterances,
    )  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
