"""How far bf16 attention kernels move the training gradient from fp32, and how fast each
trains, before a training run says whether the difference matters.

    .venv/bin/python -m bench.attention_precision [--checkpoint CKPT] [--batches 24] [--passes 4]

The AN4 Transformer's joint CTC/attention loss on its first training batches, with dropout and
SpecAugment off so that only arithmetic differs, is differentiated in fp32 and under bf16
autocast with each attention variant. Each variant's error is |g - g_fp32| / |g_fp32| over all
parameters' gradients, per batch, for the model at initialisation (`--seed`) and, with
`--checkpoint`, for trained weights (where the scores are larger and bf16 rounds them more).

Speed: the bf16 training step (`bench.train.Trainer`: loss, backward, clipping, AdamW) of each
variant over the first 12 batches, passes alternating, each batch counting its fastest step.

Variants:
  shipped      what `asr` runs: torch's math kernel up to 192 keys (fp32 inside), else flash
  flash        torch's default kernel choice at every length
  bf16_scores  explicit bf16 matmuls, fp32 softmax, bf16 weights (the trial of sessions 12 and
               18: faster, see recipes/an4/RESULTS.md)
Not part of `bench all` (~40 s on the 2-core CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from unittest import mock

import torch

import asr.models.transformer as transformer
from asr.checkpoint import load_checkpoint
from asr.data.dataset import Batch
from asr.lightning import ASRModule
from bench.common import (
    ROOT,
    Settings,
    audio_seconds,
    build_module,
    clip_value,
    measure_alternating,
    model_config,
    train_batches,
)
from bench.train import Trainer, training_loss

_head_contexts = transformer.MultiHeadAttention.head_contexts


def _bf16_scores(self, query, key, value, mask=None, need_weights=False, is_causal=False):
    """`head_contexts` through its explicit path, whose matmuls run in the inputs' dtype."""
    context, weights = _head_contexts(self, query, key, value, mask, True, is_causal)
    return context, weights if need_weights else None


def _default_kernel(query, key) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "shipped": contextlib.nullcontext,
    "flash": lambda: mock.patch.object(transformer, "_sdpa_backend", _default_kernel),
    "bf16_scores": lambda: mock.patch.object(
        transformer.MultiHeadAttention, "head_contexts", _bf16_scores
    ),
}


def gradient(module: ASRModule, batch: Batch, precision: str) -> torch.Tensor:
    """All parameters' gradients of the training loss on `batch`, flattened."""
    module.zero_grad(set_to_none=True)
    training_loss(module, batch, precision).backward()
    return torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])


def errors(module: ASRModule, batches: list[Batch]) -> dict[str, list[float]]:
    """Per variant, each batch's relative gradient error against fp32."""
    found: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for batch in batches:
        reference = gradient(module, batch, "fp32")
        for name, variant in VARIANTS.items():
            with variant():
                bf16 = gradient(module, batch, "bf16")
            found[name].append(((bf16 - reference).norm() / reference.norm()).item())
    return found


def models(settings: Settings) -> Iterator[tuple[str, ASRModule]]:
    """The AN4 Transformer at initialisation, then with the checkpoint's weights (if any)."""
    config = model_config("transformer", settings.data)
    yield f"initialisation (seed {settings.seed})", build_module(config, settings.seed).eval()
    if settings.checkpoint is not None:
        module = build_module(config, settings.seed)
        module.load_state_dict(load_checkpoint(settings.checkpoint)["state_dict"])
        yield str(settings.checkpoint), module.eval()


def speeds(settings: Settings, batches: list[Batch], passes: int) -> dict[str, float]:
    """Per variant, bf16 training audio seconds per second, from the same initial weights."""
    config, clip = model_config("transformer", settings.data), clip_value("transformer")
    steps = {}
    for name, variant in VARIANTS.items():
        trainer = Trainer(build_module(config, settings.seed), "bf16", clip)
        steps[name] = partial(_within, variant, trainer.step)
    audio = [audio_seconds(b.wave_lens) for b in batches]
    found = measure_alternating(steps, batches, audio, 2, settings.device, passes)
    return {name: result["audio_seconds_per_second"] for name, result in found.items()}


def _within(variant: Callable[[], contextlib.AbstractContextManager], step, batch) -> None:
    with variant():
        step(batch)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.attention_precision")
    parser.add_argument("--checkpoint", type=Path, help="trained conf/an4/transformer.yaml model")
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--passes", type=int, default=4, help="timed passes per variant")
    parser.add_argument("--data", type=Path, default=ROOT / "data/an4")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cpu = torch.device("cpu")
    threads = torch.get_num_threads()
    out = ROOT / "bench/results"
    settings = Settings(out, False, cpu, threads, args.data, args.checkpoint, args.seed)
    batches = train_batches("transformer", settings, args.batches)
    rates = speeds(settings, batches[:12], args.passes)
    print("| variant | bf16 training audio s / s | vs shipped |")
    print("|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} | {rate / rates['shipped']:.2f}x |")
    print()
    print("| weights | variant | gradient error, mean | max | worse than shipped |")
    print("|---|---|---|---|---|")
    for label, module in models(settings):
        found = errors(module, batches)
        for name, values in found.items():
            worse = sum(v > s for v, s in zip(values, found["shipped"], strict=True))
            versus = "" if name == "shipped" else f"{worse} of {len(values)}"
            mean = statistics.mean(values)
            print(f"| {label} | {name} | {mean:.4f} | {max(values):.4f} | {versus} |")


if __name__ == "__main__":
    main()
