"""`asr fit` of an AN4 config on the bucketing sampler's batches against a shape grid.

    .venv/bin/python -m bench.shape_grid [--config transformer] [--epochs 20] [--ratio 1.1]

Three fits of `conf/an4/<config>.yaml` (bf16-mixed, its batch budget), each in a child
process as `bench.epochs` runs them, one after the other: the sampler's batches at oneDNN's
default kernel cache (1024), the grid (`data.shape_grid`) at 1024, and the grid at the cache it
sets itself (4096). Each reports the steps' and the whole epochs' audio seconds per second (the
first epoch left out), the steps' rate over the last 5 epochs (a cache too small for the shapes
shows as a falling rate), the wall time of the fit's epochs and its peak RSS. Not part of
`bench all`: ~4-5 min per fit of 20 Transformer epochs on 2 cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from asr.precision import KERNEL_CACHE_VARIABLE
from bench.common import CONFIGS, ROOT, Settings
from bench.epochs import run_fit, summarise


def variants(ratio: float) -> list[tuple[str, dict, dict]]:
    """(label, data module overrides, environment changes) of the three fits."""
    grid = {"shape_grid": ratio}
    return [
        ("bucketing sampler, cache 1024", {"shape_grid": None}, {KERNEL_CACHE_VARIABLE: "1024"}),
        (f"shape grid {ratio}, cache 1024", grid, {KERNEL_CACHE_VARIABLE: "1024"}),
        (f"shape grid {ratio}, cache 4096 (its own)", grid, {KERNEL_CACHE_VARIABLE: None}),
    ]


def measure(
    settings: Settings, config: str, epochs: int, data: dict, env: dict
) -> dict[str, float]:
    fit = run_fit(config, settings, epochs, data, env)
    last = fit[-5:]
    return {
        **summarise(fit),
        "last5_steps_audio_per_second": sum(e["audio"] for e in last)
        / sum(e["steps"] for e in last),
        "wall_seconds": sum(e["wall"] for e in fit),
        "max_rss_gib": max(e["max_rss_gib"] for e in fit),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=CONFIGS, default="transformer", help="AN4 config")
    parser.add_argument("--epochs", type=int, default=20, help="epochs per fit (20)")
    parser.add_argument("--ratio", type=float, default=1.1, help="the grid's ratio (1.1)")
    parser.add_argument("--data", type=Path, default=ROOT / "data/an4", help="prepared AN4")
    parser.add_argument("--quick", action="store_true", help="3 batches per epoch: a smoke run")
    args = parser.parse_args(argv)
    cpu = torch.device("cpu")
    settings = Settings(ROOT / "bench/results", args.quick, cpu, 0, args.data, None)
    print(
        "| batches | steps: audio s/s | last 5 epochs | whole epochs | wall of the epochs "
        "| peak RSS |\n|---|---|---|---|---|---|"
    )
    for label, data, env in variants(args.ratio):
        r = measure(settings, args.config, args.epochs, data, env)
        print(
            f"| {label} | {r['steps_audio_per_second']:.1f} | "
            f"{r['last5_steps_audio_per_second']:.1f} | {r['audio_per_second']:.1f} | "
            f"{r['wall_seconds']:.0f} s | {r['max_rss_gib']:.2f} GiB |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
