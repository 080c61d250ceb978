"""Training throughput of the AN4 configs (conf/an4/{transformer,conformer,rnn}.yaml).

The step: each config's model, optimizer and LR schedule built from its YAML as `asr fit`
builds them, stepped over every batch of its first epoch (the config's sampler or shape grid,
speed perturbation, batch budget), loaded beforehand: frontend with SpecAugment, joint
CTC/attention loss, backward, gradient clipping, optimizer and scheduler, in fp32 and under
bf16 autocast, each in a fresh process of its own, so that its peak memory (RSS on a CPU, the
CUDA allocator's on a GPU) holds nothing an earlier measurement left. Model FLOPs are counted
over the same batches, for MFU.

Whole epochs: `asr fit` itself on each config in a child process, as a recipe runs it, with
`asr.train.EpochClock` splitting each epoch's wall time into steps, data, validation and the rest.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch
import yaml

from asr.train import EPOCH_PARTS
from bench.common import (
    CONFIGS,
    PRECISIONS,
    ROOT,
    ASRModule,
    Batch,
    Settings,
    audio_seconds,
    autocast,
    build_module,
    clip_value,
    count_flops,
    count_parameters,
    data_args,
    measure_steps,
    model_config,
    profile_ops,
    read_config,
    train_batches,
    with_stats_path,
)

QUICK_BATCH_SECONDS = 8.0  # a smoke run's batch budget, instead of the config's


class Trainer:
    """The per-batch work of `asr fit` for one `ASRModule`, without Lightning."""

    def __init__(self, module: ASRModule, precision: str, clip: float | None) -> None:
        self.module = module.train()
        self.precision = precision
        self.clip = clip
        configured = module.configure_optimizers()
        if isinstance(configured, dict):
            self.optimizer = configured["optimizer"]
            self.scheduler = configured["lr_scheduler"]["scheduler"]
        else:
            self.optimizer, self.scheduler = configured, None

    def loss(self, batch: Batch) -> torch.Tensor:
        """`asr fit`'s loss on `batch` (`ASRModule.batch_loss`), in this trainer's precision."""
        with autocast(batch.waves.device, self.precision):
            return self.module.batch_loss(batch).loss

    def step(self, batch: Batch) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.loss(batch).backward()
        self.update()

    def update(self) -> None:
        """Clip the gradients, step the optimizer and the LR schedule."""
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def forward_backward(self, batch: Batch) -> None:
        """What model FLOPs are counted over: one forward and backward."""
        self.loss(batch).backward()
        self.optimizer.zero_grad(set_to_none=True)


def measure_config(name: str, settings: Settings) -> dict[str, Any]:
    """fp32 and bf16 step throughput of config `name`, each precision in a fresh process of its
    own (so that its peak memory is its own), and its model FLOPs and a bf16 profile."""
    results: dict[str, Any] = {"config": f"conf/an4/{CONFIGS[name].name}"}
    for precision in PRECISIONS:  # each from the same initial weights
        results.update(in_own_process(measure_precision, name, precision, settings))
    return results


def measure_precision(name: str, precision: str, settings: Settings) -> dict[str, Any]:
    """Config `name`'s step in `precision` over its batches; with bf16 also the parameters,
    model FLOPs (= fp32's) and a profile of one step."""
    torch.set_num_threads(settings.threads)  # a spawned process starts with torch's default
    budget = settings.pick(QUICK_BATCH_SECONDS, None)
    batches = train_batches(name, settings, settings.pick(2, None), budget)
    audio = [audio_seconds(b.wave_lens) for b in batches]
    module = build_module(model_config(name, settings.data), settings.seed).to(settings.device)
    trainer = Trainer(module, precision, clip_value(name))
    warmup, passes = settings.pick(1, 2), settings.pick(1, 3)
    step = measure_steps(trainer.step, batches, audio, warmup, settings.device, passes)
    kind = "CUDA allocated" if settings.on_gpu else "RSS"
    step["memory"]["label"] = f"peak {kind} MiB (own process)"  # the report's column
    results: dict[str, Any] = {precision: step}
    if precision != "bf16":
        return results
    results["parameters"] = count_parameters(module)
    flops = sum(count_flops(partial(trainer.forward_backward, b)) for b in batches)
    results["flops_per_audio_second"] = flops / sum(audio)
    config = f"conf/an4/{CONFIGS[name].name}"
    title = f"one bf16 training step of {config} ({audio[0]:.1f} s of audio)"
    path = settings.out / f"profile_train_{name}_bf16.txt"
    first = batches[0]
    results["profile_file"] = profile_ops(lambda: trainer.step(first), settings.device, path, title)
    return results


def in_own_process(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a fresh (spawned) Python process: nothing an earlier measurement left in
    this one counts towards its memory."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


# ---------------------------------------------------------------- whole `asr fit` epochs


def fit_config(name: str, settings: Settings, root: Path, epochs: int) -> dict[str, Any]:
    """Config `name` for `epochs` epochs into `root`, over `settings.data`, with `EpochClock`."""
    config = read_config(name)
    config["data"]["init_args"] = data_args(config, settings.data)
    config["model"]["init_args"] = with_stats_path(config["model"]["init_args"], settings.data)
    config["seed_everything"] = settings.seed
    trainer = config["trainer"]
    trainer.update(max_epochs=epochs, default_root_dir=str(root))
    if settings.on_gpu:
        trainer.update(accelerator="gpu", devices=[settings.device.index or 0])
    else:
        trainer["accelerator"] = "cpu"
    config["epoch_clock"] = {"path": str(root / "epochs.json")}  # asr.train.EpochClock
    if settings.quick:
        trainer.update(limit_train_batches=3, limit_val_batches=2)
        config["data"]["init_args"]["max_batch_seconds"] = QUICK_BATCH_SECONDS
    return config


def run_fit(name: str, settings: Settings, epochs: int) -> list[dict[str, float]]:
    """`asr fit` on config `name` for `epochs` epochs in a child process; its epochs."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(fit_config(name, settings, root, epochs)))
        pythonpath = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": str(settings.threads)}
        command = [sys.executable, "-m", "asr.cli", "fit", "--config", str(path)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"asr fit ({CONFIGS[name].name}) failed:\n{done.stderr[-3000:]}")
        return json.loads((root / "epochs.json").read_text())


def summarise(epochs: list[dict[str, float]]) -> dict[str, Any]:
    """Totals over `epochs` (the first, a warm-up, left out when there are more): audio
    seconds per wall second of whole epochs and of their steps alone, and each part's share.

    >>> e = {"wall": 10.0, "audio": 300.0, "steps": 8.0, "data": 1.0, "validation": 1.0,
    ...      "other": 0.0}
    >>> s = summarise([{**e, "wall": 99.0}, e])
    >>> s["epochs"], s["audio_per_second"], s["steps_audio_per_second"], s["shares"]["steps"]
    (1, 30.0, 37.5, 0.8)
    """
    timed = epochs[1:] or epochs
    total = {key: sum(epoch[key] for epoch in timed) for key in ("wall", "audio", *EPOCH_PARTS)}
    return {
        "epochs": len(timed),
        "seconds_per_epoch": total["wall"] / len(timed),
        "audio_per_second": total["audio"] / total["wall"],
        "steps_audio_per_second": total["audio"] / total["steps"],
        "shares": {part: total[part] / total["wall"] for part in EPOCH_PARTS},
    }


def run(settings: Settings) -> dict[str, Any]:
    """Each config: the step (throughput, memory, model FLOPs), then whole `asr fit` epochs."""
    results: dict[str, Any] = {}
    for name in CONFIGS:
        results[name] = measure_config(name, settings)
        results[name]["epochs"] = summarise(run_fit(name, settings, settings.pick(2, 4)))
    return results
