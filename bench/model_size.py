"""Training MFU against model size, in the AN4 Transformer pipeline.

Each row is a bf16 training step as `python -m bench train` times it: conf/an4/transformer.yaml's
frontend with SpecAugment, joint CTC/attention loss, backward, clipping and optimizer, over the
batches of its first epoch. Only the encoder and decoder sizes (and, in two rows, the
positions) change. The rows show what the MFU target (>= 40 % of the bf16 matmul peak) asks of
the model: small matmuls at d=144 leave most of the step to elementwise work, and larger models
use more of the peak but train fewer audio seconds per second.

    python -m bench.model_size            # 7-9 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench import peak
from bench.common import (
    ROOT,
    Settings,
    audio_seconds,
    build_module,
    clip_value,
    count_flops,
    count_parameters,
    measure_steps,
    model_config,
    train_batches,
)
from bench.train import Trainer


def resized(d_model: int, ffn: int, encoder: int, decoder: int, relative: bool = True) -> dict:
    """`model_config` overrides for an encoder and decoder of this size (4 heads)."""
    size = {"d_model": d_model, "num_heads": 4, "ffn_dim": ffn}
    return {
        "encoder": {"init_args": {**size, "num_layers": encoder, "relative_positions": relative}},
        "decoder": {"init_args": {**size, "num_layers": decoder}},
    }


SIZES = {
    "d=144, FFN 576, 6/2 blocks (conf/an4/transformer.yaml)": {},
    "d=144, FFN 576, 6/2, absolute positions": resized(144, 576, 6, 2, relative=False),
    "d=256, FFN 1024, 6/2": resized(256, 1024, 6, 2),
    "d=256, FFN 2048, 6/2": resized(256, 2048, 6, 2),
    "d=256, FFN 2048, 12/6 (the peer's size)": resized(256, 2048, 12, 6),
    "d=256, FFN 2048, 12/6, absolute positions": resized(256, 2048, 12, 6, relative=False),
}


def measure(overrides: dict, settings: Settings, batches: list, audio: list[float]) -> dict:
    """Parameters, model FLOPs per audio second and bf16 throughput of one model size."""
    module = build_module(model_config("transformer", settings.data, overrides), settings.seed)
    trainer = Trainer(module.to(settings.device), "bf16", clip_value("transformer"))
    flops = sum(count_flops(partial(trainer.forward_backward, b)) for b in batches)
    timing = measure_steps(trainer.step, batches, audio, 2, settings.device, passes=3)
    return {
        "parameters": count_parameters(module),
        "flops_per_audio_second": flops / sum(audio),
        "audio_seconds_per_second": timing["audio_seconds_per_second"],
        "gflops": flops / timing["seconds"] / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.model_size", description=__doc__)
    parser.add_argument("--data", type=Path, default=ROOT / "data/an4")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device("cpu")
    settings = Settings(ROOT / "bench/results", False, device, torch.get_num_threads(),
                        args.data, None, args.seed)  # fmt: skip
    batches = train_batches("transformer", settings)
    audio = [audio_seconds(b.wave_lens) for b in batches]
    rows: dict[str, Any] = {name: measure(o, settings, batches, audio) for name, o in SIZES.items()}
    bf16_peak = peak.run(settings)["peak_gflops"]["bf16"]  # as `python -m bench peak`
    print(f"{len(batches)} batches, {sum(audio):.0f} s of audio; "
          f"bf16 peak {bf16_peak:.1f} GFLOP/s, {torch.get_num_threads()} threads\n")  # fmt: skip
    print("| model | parameters | GFLOP per audio s | audio s/s | GFLOP/s | MFU |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['parameters'] / 1e6:.1f} M "
            f"| {row['flops_per_audio_second'] / 1e9:.3f} | {row['audio_seconds_per_second']:.1f} "
            f"| {row['gflops']:.1f} | {100 * row['gflops'] / bf16_peak:.1f} % |"
        )


if __name__ == "__main__":
    main()
