"""Training throughput of the AN4 configs (conf/an4/transformer.yaml, conf/an4/rnn.yaml).

Each config's model, optimizer and LR schedule are built from its YAML exactly as `asr fit`
builds them; the batches are every batch of its first epoch (the config's sampler or shape
grid, speed perturbation, batch budget), loaded before timing. A step is what the Lightning
loop runs per batch: frontend (with SpecAugment), joint CTC/attention loss, backward,
gradient clipping at the config's value, optimizer and scheduler step; fp32, or bf16 autocast
as `--trainer.precision bf16-mixed`. Data loading is not included. What Lightning's loop adds to
that step is measured apart (`lightning_overhead`): the same batches through
`lightning.Trainer.fit`.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator
from functools import partial
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from asr.data.dataset import Batch
from asr.lightning import ASRModule
from asr.precision import PRECISIONS, autocast
from bench.common import (
    CONFIGS,
    Settings,
    audio_seconds,
    build_module,
    clip_value,
    count_flops,
    count_parameters,
    fastest_per_batch,
    kernel_ceiling,
    measure_steps,
    model_config,
    profile_ops,
    read_config,
    synchronize,
    timed,
    train_batches,
)


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
        return training_loss(self.module, batch, self.precision)

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


def training_loss(module: ASRModule, batch: Batch, precision: str) -> torch.Tensor:
    """`asr fit`'s loss on `batch` (`ASRModule.batch_loss`), in `precision`."""
    with autocast(batch.waves.device, precision):
        return module.batch_loss(batch).loss


def run_config(name: str, settings: Settings, batches: list[Batch]) -> dict[str, Any]:
    """fp32 and bf16 throughput of config `name`, its model FLOPs, the rate of its FLOP-counted
    kernels alone (`kernel_ceiling`) and a bf16 step profile."""
    config = model_config(name, settings.data)
    clip = clip_value(name)
    audio = [audio_seconds(b.wave_lens) for b in batches]
    results: dict[str, Any] = {"config": f"conf/an4/{CONFIGS[name].name}"}
    trainers = {}
    for precision in PRECISIONS:  # each from the same initial weights
        module = build_module(config, settings.seed).to(settings.device)
        trainers[precision] = trainer = Trainer(module, precision, clip)
        warmup = settings.pick(1, 2)
        results[precision] = measure_steps(
            trainer.step, batches, audio, warmup, settings.device, settings.pick(1, 3)
        )
    bf16, first = trainers["bf16"], batches[0]
    results["parameters"] = count_parameters(bf16.module)
    flops = sum(count_flops(partial(bf16.forward_backward, b)) for b in batches)  # = fp32's
    results["flops_per_audio_second"] = flops / sum(audio)
    for precision, trainer in trainers.items():  # the MFU bound of these kernel shapes
        step = partial(trainer.forward_backward, first)
        results[precision]["kernel_ceiling"] = kernel_ceiling(step, settings.device)
    path = settings.out / f"profile_train_{name}_bf16.txt"
    title = (
        f"one bf16 training step of {results['config']} "
        f"({audio[0]:.1f} s of audio, {len(first)} utterances)"
    )
    results["profile"] = profile_ops(lambda: bf16.step(first), settings.device, path, title)
    results["profile_file"] = path.name
    return results


class StepTimes(L.Callback):
    """Wall time of each training batch inside `Trainer.fit`, batch start to batch end."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - self._start)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """No banners ("GPU available ...") or data loader advice from `Trainer.fit`."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _as_is(batch: Batch) -> Batch:
    return batch


def fit_pass(module: ASRModule, batches: list[Batch], clip: float | None, device) -> list[float]:
    """Seconds of each step of one bf16 `Trainer.fit` epoch over `batches` (no validation)."""
    timer = StepTimes(device)
    with tempfile.TemporaryDirectory() as root, _quiet_lightning():
        trainer = L.Trainer(
            accelerator=device.type,
            devices=1,
            precision="bf16-mixed",
            gradient_clip_val=clip,
            max_epochs=1,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
            default_root_dir=root,
        )
        loader = DataLoader(batches, batch_size=None, collate_fn=_as_is)  # already on device
        trainer.fit(module, train_dataloaders=loader)
    return timer.seconds


def lightning_overhead(name: str, settings: Settings, batches: list[Batch]) -> dict[str, Any]:
    """bf16 step time of config `name` inside `lightning.Trainer.fit` (as `asr fit` runs it,
    less data loading and validation) against the plain `Trainer.step`: same batches and
    initial weights, passes alternating between the two so a slow phase of the VM hits both;
    each batch counts its fastest step."""
    config = model_config(name, settings.data)
    clip = clip_value(name)
    plain = Trainer(build_module(config, settings.seed).to(settings.device), "bf16", clip)
    module = build_module(config, settings.seed)
    for batch in batches[: settings.pick(1, 2)]:  # warm-up
        plain.step(batch)
    fitted, stepped = [], []
    for _ in range(settings.pick(1, 3)):
        fitted.append(fit_pass(module, batches, clip, settings.device))
        stepped.append([timed(lambda b=b: plain.step(b), settings.device) for b in batches])
    fit_seconds, plain_seconds = sum(fastest_per_batch(fitted)), sum(fastest_per_batch(stepped))
    return {
        "config": f"conf/an4/{CONFIGS[name].name}",
        "steps": len(batches),
        "passes": len(fitted),
        "fit_seconds": fit_seconds,
        "plain_seconds": plain_seconds,
        "ratio": fit_seconds / plain_seconds,
    }


def run(settings: Settings) -> dict[str, Any]:
    """Both configs: audio seconds per second, steps/s, peak memory, model FLOPs."""
    results: dict[str, Any] = {}
    for name in CONFIGS:
        steps = settings.pick(2, None)  # full: every batch of the first epoch
        budget = settings.pick(8.0, None)  # quick: small batches instead of the config's
        batches = train_batches(name, settings, steps, budget)
        results[name] = run_config(name, settings, batches)
        results[name]["max_batch_seconds"] = budget or read_config(name)["data"]["init_args"].get(
            "max_batch_seconds"
        )
        if name == "transformer":
            results[name]["lightning_overhead"] = lightning_overhead(name, settings, batches)
    return results
