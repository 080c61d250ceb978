"""Checkpoints: atomic writes, safe loading (tensors only, never code), averaging."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import CheckpointIO


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely or is malformed; names the file."""


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`: tensors and plain containers, never code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path}: refused to load: it holds objects other than tensors and plain "
            f"containers, which could run code ({str(err).splitlines()[0]})"
        ) from None
    except (RuntimeError, EOFError) as err:
        raise CheckpointError(f"{path}: not a readable checkpoint ({err})") from None


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save` to a temporary file beside `path`, fsync, then rename over `path`.

    A kill at any moment leaves either the old file or the new one, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class AtomicCheckpointIO(CheckpointIO):
    """Lightning checkpoint I/O: atomic writes and weights-only loading."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        return load_checkpoint(path)

    def remove_checkpoint(self, path) -> None:
        Path(path).unlink(missing_ok=True)


class StepCheckpoint(L.Callback):
    """Writes `<dirpath>/last.ckpt` every `every_n_steps` optimizer steps, mid-epoch included,
    so a killed run resumed with `--ckpt_path last` loses at most that many steps. The
    checkpoint holds the sampler position and RNG state (see `asr.lightning`), so the resumed
    run continues the same batches and random draws.

    Args:
        every_n_steps: steps between saves; 0 disables (epoch-end checkpoints remain).
        dirpath: folder of the checkpoints; `asr fit` sets it to the ModelCheckpoint's.
    """

    def __init__(self, every_n_steps: int = 500, dirpath: str | None = None) -> None:
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.dirpath = dirpath
        self._saved_at = -1

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        due = self.every_n_steps and step and step % self.every_n_steps == 0
        if not due or step == self._saved_at:  # accumulation repeats a step's batch end
            return
        self._saved_at = step
        dirpath = Path(self.dirpath or Path(trainer.default_root_dir) / "checkpoints")
        trainer.save_checkpoint(dirpath / "last.ckpt")


def best_checkpoints(last: str | os.PathLike, count: int) -> list[Path]:
    """The `count` best checkpoints recorded by the ModelCheckpoint state inside `last`.

    Lightning records absolute paths; where one no longer exists but a file of that name sits
    beside `last` (the run folder was moved or copied), that file is used.
    """
    state = load_checkpoint(last)
    scored: dict[str, float] = {}
    mode = "min"
    for key, value in state.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and value.get("best_k_models"):
            scored.update({p: float(s) for p, s in value["best_k_models"].items()})
            mode = "max" if "'mode': 'max'" in key else "min"
    if not scored:
        raise CheckpointError(f"{last}: records no best checkpoints (was a metric monitored?)")
    ranked = sorted(scored, key=scored.get, reverse=mode == "max")
    return [_beside(Path(p), Path(last).parent) for p in ranked[:count]]


def _beside(recorded: Path, folder: Path) -> Path:
    """`recorded` if it exists, else the file of the same name in `folder` if that exists."""
    moved = folder / recorded.name
    return moved if not recorded.exists() and moved.exists() else recorded


def average_checkpoints(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Average the floating-point weights of several checkpoints of one model.

    Integer buffers come from the first checkpoint; everything else in the written file (hyper-
    parameters, loops) too, so it loads like any checkpoint of the run.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    first = states[0]["state_dict"]
    for path, state in zip(paths[1:], states[1:]):
        if state["state_dict"].keys() != first.keys():
            raise CheckpointError(f"{path}: parameters differ from {paths[0]}")
    averaged = {}
    for name, tensor in first.items():
        if tensor.is_floating_point():
            stacked = torch.stack([s["state_dict"][name].double() for s in states])
            averaged[name] = stacked.mean(0).to(tensor.dtype)
        else:
            averaged[name] = tensor
    result = {k: v for k, v in states[0].items() if k not in ("optimizer_states", "lr_schedulers")}
    result["state_dict"] = averaged
    result["averaged_from"] = [str(p) for p in paths]
    atomic_save(result, out)
    return Path(out)
