"""Whole `asr fit` epochs: what a user waits for, against the step rate of `bench.train`.

`bench.train` times steps on batches loaded beforehand (each batch its fastest of 3 passes).
Here `asr fit` itself runs a few epochs of an AN4 config in a child process, as the recipe
runs it (data loading in-process, per-epoch validation with greedy decoding, checkpoints,
TensorBoard and CSV logs, progress bar), and `EpochClock` splits each epoch's wall time into
steps (forward, backward, optimizer: `on_train_batch_start` to `on_train_batch_end`), data
(fetching the next batch, and the loop between batches), validation, and the rest (epoch-end
checkpoints, hooks, the loader rebuilt each epoch). The first epoch is left out (warm-up).
The model starts untrained; its validations took 1.6-2.2 s per epoch of the Transformer
config, and `asr validate` with a trained run's last checkpoint about 2.1 s (session 20).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from bench.common import (
    CONFIGS,
    ROOT,
    Settings,
    audio_seconds,
    data_args,
    read_config,
    synchronize,
    with_stats_path,
)

PARTS = ("steps", "data", "validation", "other")


class EpochClock(L.Callback):
    """Per-epoch wall time of a fit, split into `PARTS`, and the audio seconds trained;
    written to `path` (JSON, a list with one entry per finished epoch) after every epoch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.epochs: list[dict[str, float]] = []
        self._epoch: dict[str, float] | None = None
        self._mark = 0.0  # the end of the last timed span in the epoch
        self._validation_start = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        now = time.perf_counter()
        self._close(now)
        self._epoch = {"start": now, "steps": 0.0, "data": 0.0, "validation": 0.0, "audio": 0.0}
        self._mark = now

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, *args: Any) -> None:
        now = time.perf_counter()
        self._epoch["data"] += now - self._mark
        self._mark = now

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, *a) -> None:
        synchronize(module.device)  # the step's queued GPU work belongs to the step
        now = time.perf_counter()
        self._epoch["steps"] += now - self._mark
        self._epoch["audio"] += audio_seconds(batch.wave_lens)
        self._mark = now

    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self._epoch is not None and not trainer.sanity_checking:
            self._epoch["validation"] += time.perf_counter() - self._validation_start

    def on_fit_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._close(time.perf_counter())

    def _close(self, now: float) -> None:
        """Record the running epoch as ending at `now`."""
        if self._epoch is None:
            return
        epoch, self._epoch = self._epoch, None
        epoch["wall"] = now - epoch.pop("start")
        epoch["other"] = epoch["wall"] - sum(epoch[part] for part in PARTS[:-1])
        epoch["max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB
        self.epochs.append(epoch)
        self.path.write_text(json.dumps(self.epochs, indent=1))


def fit_config(
    name: str, settings: Settings, root: Path, epochs: int, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Config `name` for `epochs` epochs into `root`, over `settings.data`, with `EpochClock`;
    `data` overrides data module arguments."""
    config = read_config(name)
    config["data"]["init_args"] = data_args(config, settings.data) | (data or {})
    config["model"]["init_args"] = with_stats_path(config["model"]["init_args"], settings.data)
    config["seed_everything"] = settings.seed
    trainer = config["trainer"]
    trainer.update(max_epochs=epochs, default_root_dir=str(root))
    if settings.on_gpu:
        trainer.update(accelerator="gpu", devices=[settings.device.index or 0])
    else:
        trainer["accelerator"] = "cpu"
    clock = {
        "class_path": "bench.epochs.EpochClock",
        "init_args": {"path": str(root / "epochs.json")},
    }
    trainer["callbacks"] = [*trainer.get("callbacks", []), clock]
    if settings.quick:
        trainer.update(limit_train_batches=3, limit_val_batches=2)
    return config


def run_fit(
    name: str,
    settings: Settings,
    epochs: int,
    data: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
) -> list[dict[str, float]]:
    """Run `asr fit` on config `name` for `epochs` epochs in a child process; its epochs.
    `data` overrides data module arguments; `env` sets (or, with None, removes) variables."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(fit_config(name, settings, root, epochs, data)))
        env = child_environment(env or {})
        if settings.threads:
            env["OMP_NUM_THREADS"] = str(settings.threads)
        command = [sys.executable, "-m", "asr.cli", "fit", "--config", str(path)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"asr fit ({CONFIGS[name].name}) failed:\n{done.stderr[-3000:]}")
        return json.loads((root / "epochs.json").read_text())


def summarise(epochs: list[dict[str, float]]) -> dict[str, Any]:
    """Totals over `epochs` (the first left out when there are more), audio seconds per wall
    second of the whole epochs and of their steps alone, and each part's share of the wall."""
    timed = epochs[1:] or epochs
    total = {key: sum(epoch[key] for epoch in timed) for key in ("wall", "audio", *PARTS)}
    return {
        "epochs": len(timed),
        "seconds_per_epoch": total["wall"] / len(timed),
        "audio_per_second": total["audio"] / total["wall"],
        "steps_audio_per_second": total["audio"] / total["steps"],
        "shares": {part: total[part] / total["wall"] for part in PARTS},
    }


def run(settings: Settings) -> dict[str, Any]:
    """`asr fit` epochs of each AN4 config, summarised."""
    epochs = settings.pick(2, 4)
    return {
        name: {
            **summarise(run_fit(name, settings, epochs)),
            "config": f"conf/an4/{CONFIGS[name].name}",
        }
        for name in CONFIGS
    }


def child_environment(changes: dict[str, str | None]) -> dict[str, str]:
    """This process's environment with the repository on PYTHONPATH and `changes` applied."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
