"""LightningCLI for `asr fit|validate|test`: YAML configs pick model and data modules by
`class_path`; the tokenizer and vocabulary size flow from the data module to the model."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.callbacks import ModelCheckpoint, Timer, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from asr.checkpoint import (
    LM_KEY,
    RECOGNIZER_KEY,
    CheckpointError,
    atomic_save,
    best_checkpoints,
    check_state_dict,
    load_checkpoint,
    payload_tokenizer,
    weight_differences,
)
from asr.config_check import (
    built_class,
    config_paths,
    config_problems,
    option_problems,
    where_built,
    where_set,
    without_empty_configs,
)
from asr.finetune import check_same_settings, decoder_differences, setting_differences
from asr.text import tokenizer_difference

DEFAULT_LOGGERS = (  # CSV first: it warns about a run folder another logger made already
    "lightning.pytorch.loggers.CSVLogger",
    "lightning.pytorch.loggers.TensorBoardLogger",
)
CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "val/wer",
    "checkpoint.mode": "min",
    "checkpoint.save_top_k": 5,
    "checkpoint.save_last": True,
    "checkpoint.filename": "epoch{epoch:03d}-wer{val/wer:.2f}",
    "checkpoint.auto_insert_metric_name": False,
}


class AtomicCheckpointIO(CheckpointIO):
    """Lightning checkpoint I/O: atomic writes and weights-only loading."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        return load_checkpoint(path)

    def remove_checkpoint(self, path) -> None:
        Path(path).unlink(missing_ok=True)


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that keeps its best-k record when its run folder is moved or copied."""

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key, so checkpoints load both ways and `best_checkpoints` finds it.
        return super().state_key.replace(type(self).__qualname__, "ModelCheckpoint", 1)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        recorded = state_dict.get("dirpath")
        if self.dirpath and recorded and recorded != self.dirpath:
            state_dict = _moved_record(state_dict, Path(self.dirpath)) or state_dict
        super().load_state_dict(state_dict)
        here = state_dict.get("dirpath", self.dirpath) == self.dirpath  # else another run's
        if self.save_last and self.dirpath and here and not self.last_model_path:
            # The first epoch's best is saved before the run's first last.ckpt and records
            # none: the last.ckpt beside it is the run's to write over, not another's to step
            # around (Lightning would write last-v1.ckpt and leave last.ckpt on the old branch).
            name = f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
            self.last_model_path = os.path.join(self.dirpath, name)

    _validated: tuple[int, Any] | None = None  # (step, monitored score) of the last validation

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if trainer.ckpt_path:  # resumed: its step is saved, as the file it was read from
            self._last_global_step_saved = trainer.global_step

    # Lightning writes last.ckpt only beside a new best-k checkpoint; refresh it every epoch,
    # validated or not (an epoch validated at its end has refreshed it at that step already).
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._stale_score(trainer) and not _cut_short(trainer) and self._scored(trainer):
            super().on_train_epoch_end(trainer, pl_module)
        self._refresh_last(trainer)

    def _scored(self, trainer: L.Trainer) -> bool:
        """Whether there may be a score to rank by: not where max_steps ended the run before a
        first validation, where Lightning would warn that the metric is never logged. Else a
        metric missing is Lightning's to warn of (a run that never validates) or refuse."""
        if self.monitor is None or self._validated is not None:
            return True
        cut = 0 <= trainer.max_steps <= trainer.global_step
        return not cut or self.monitor in self._monitor_candidates(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            score = self._monitor_candidates(trainer).get(self.monitor)
            self._validated = trainer.global_step, score
        if not _cut_short(trainer):
            super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)

    def _stale_score(self, trainer: L.Trainer) -> bool:
        """An epoch cut short (max_steps) ends without validating: ranking its weights by the
        previous validation's score would file them among the best under a score not theirs."""
        if self._validated is None or self._validated[0] == trainer.global_step:
            return False
        then, now = self._validated[1], self._monitor_candidates(trainer).get(self.monitor)
        if then is None or now is None:
            return False
        return bool(torch.equal(torch.as_tensor(now), torch.as_tensor(then)))

    def _refresh_last(self, trainer: L.Trainer) -> None:
        if self.save_last is True and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.fast_dev_run:  # Lightning's writes last.ckpt even then, unlike its banner
            super().on_train_end(trainer, pl_module)


def _cut_short(trainer: L.Trainer) -> bool:
    """Whether max_time stopped training inside an epoch: its weights are no epoch's to file
    among the best (the resumed run finishes that epoch and files it), though last.ckpt is.
    (A validation inside an epoch, or early stopping after one, files as it did.)"""
    return bool(trainer.should_stop) and _inside_an_epoch(trainer) and _out_of_time(trainer)


def _inside_an_epoch(trainer: L.Trainer) -> bool:
    """Whether training stopped before its epoch's last batch (Lightning counts that epoch as
    finished all the same, and resumes from its rest)."""
    progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
    return not getattr(progress, "is_last_batch", True)


def _out_of_time(trainer: L.Trainer) -> bool:
    """Whether the run's `max_time` (its Timer) has run out."""
    return any(isinstance(c, Timer) and c.time_remaining() <= 0 for c in trainer.callbacks)


PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def _moved_record(state: dict[str, Any], folder: Path) -> dict[str, Any] | None:
    """`state` with its paths moved into `folder`, or None unless every named file is there."""
    named = [p for p in (*state.get("best_k_models", {}), *map(state.get, PATH_KEYS)) if p]
    if not named or not all((folder / Path(p).name).is_file() for p in named):
        return None

    def moved(path: str) -> str:
        return str(folder / Path(path).name) if path else path

    best_k = {moved(p): score for p, score in state.get("best_k_models", {}).items()}
    paths = {key: moved(state.get(key, "")) for key in PATH_KEYS}
    return {**state, **paths, "dirpath": str(folder), "best_k_models": best_k}


EPOCH_PARTS = ("steps", "data", "validation", "other")


class SaveConfig(SaveConfigCallback):
    """Saves the config, and for a fit the checkpoint it resumed (empty for a fresh start)
    beside it: the config keeps `--ckpt_path last`, which may have named no file, and the
    curves tell a version that goes on with its run from one that starts another by it."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from asr.plotting import RESUMED_FROM

        log_dir = trainer.log_dir  # broadcast: on every rank
        if trainer.is_global_zero and self.save_to_log_dir and log_dir and not trainer.fast_dev_run:
            resumed = os.path.abspath(trainer.ckpt_path) if trainer.ckpt_path else ""
            (Path(log_dir) / RESUMED_FROM).write_text(resumed + "\n", encoding="utf-8")


class EpochClock(L.Callback):
    """Logs each training epoch's wall time split into `EPOCH_PARTS`, and resident memory.

    Args:
        path: JSON file rewritten after every epoch (None: the loggers only).
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.epochs: list[dict[str, float]] = []
        self._epoch: dict[str, float] | None = None
        self._mark = 0.0
        self._validation_start = 0.0
        self._validated = False  # since the last batch
        self._sample_rate: int | None = None

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        now = time.perf_counter()
        self._close(trainer, now)
        self._open(trainer, now)

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, *args) -> None:
        now = time.perf_counter()
        if self._epoch is None:  # a run resumed mid-epoch starts without the epoch hook
            self._open(trainer, now)
        if not self._validated:  # else the checkpoints saved after a validation: other
            self._epoch["data"] += now - self._mark
        self._mark, self._validated = now, False

    def _open(self, trainer: L.Trainer, now: float) -> None:
        self._epoch = {"start": now, "steps": 0.0, "data": 0.0, "validation": 0.0, "audio": 0.0}
        self._mark, self._validated = now, False
        hparams = getattr(trainer.datamodule, "hparams", None)
        self._sample_rate = hparams.get("sample_rate") if hparams is not None else None

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, out: Any, batch: Any, *a) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        now = time.perf_counter()
        self._epoch["steps"] += now - self._mark
        if self._sample_rate and hasattr(batch, "wave_lens"):
            self._epoch["audio"] += float(batch.wave_lens.sum()) / self._sample_rate
        self._mark = now

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self._epoch is not None and not trainer.sanity_checking:
            self._epoch["validation"] += time.perf_counter() - self._validation_start
            self._validated = True  # within the epoch: not the next batch's loading

    def on_fit_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._close(trainer, time.perf_counter())

    def _close(self, trainer: L.Trainer, now: float) -> None:
        if self._epoch is None:
            return
        epoch, self._epoch = self._epoch, None
        epoch["wall"] = now - epoch.pop("start")
        epoch["other"] = epoch["wall"] - sum(epoch[part] for part in EPOCH_PARTS[:-1])
        rss = resident_gb()
        if rss is not None:
            epoch["rss_gb"] = rss
        self.epochs.append(epoch)
        if trainer.is_global_zero:
            names = {"wall": "epoch", **{part: part for part in (*EPOCH_PARTS, "audio")}}
            metrics = {f"time/{names[k]}_s": epoch[k] for k in names}
            if rss is not None:
                metrics["memory/rss_gb"] = rss
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
            if self.path is not None and not trainer.fast_dev_run:  # a smoke test writes none
                self.path.write_text(json.dumps(self.epochs, indent=1))


def resident_gb() -> float | None:
    """This process's resident memory in GB (Linux /proc), or None where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e9


class StepCheckpoint(L.Callback):
    """Writes `<dirpath>/last.ckpt` every `every_n_steps` optimizer steps, mid-epoch included.

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
        self._logged_from: int | None = None  # see `close_ended_epoch`
        self._folder: str | None = None  # where it writes, once it has

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step
        due = self.every_n_steps and step and step % self.every_n_steps == 0
        if not due or step == self._saved_at:  # accumulation repeats a step's batch end
            return
        if trainer.fast_dev_run:  # a smoke test saves nothing, as Lightning's banner says
            return
        self._saved_at = step
        loop = trainer.fit_loop.epoch_loop
        if loop.batch_progress.is_last_batch and loop._should_check_val_epoch():
            # the epoch's own checkpoint follows its validation; resumed from one written
            # before it, Lightning would go on without validating the epoch
            return
        folder = self.dirpath or Path(trainer.default_root_dir) / "checkpoints"
        path = Path(os.path.expanduser(folder)) / "last.ckpt"
        for keeper in trainer.checkpoint_callbacks:
            # The run's ModelCheckpoint takes last.ckpt for its own, to write over at its next
            # save; a file it did not write would send it to last-v1.ckpt, last.ckpt left stale.
            # It keeps its folder as Lightning does: `~` expanded and resolved (links too).
            if isinstance(keeper, ModelCheckpoint) and keeper.save_last and keeper.dirpath:
                if os.path.realpath(path.parent) == os.path.realpath(keeper.dirpath):
                    path = Path(keeper.dirpath) / "last.ckpt"
                    keeper.last_model_path = str(path)
        self._folder = os.path.realpath(path.parent)
        trainer.save_checkpoint(path, weights_only=False)  # said, or Lightning says it each time

    def state_dict(self) -> dict[str, Any]:
        """Its folder, recorded in the checkpoints: there, a last.ckpt is where it was written
        (`asr average` then reads the best checkpoints it records, not a moved run's)."""
        return {"dirpath": self._folder} if self._folder else {}

    def on_load_checkpoint(self, trainer: L.Trainer, module: Any, checkpoint: dict) -> None:
        reopen_cut_epoch(checkpoint, trainer.accumulate_grad_batches)
        if trainer.max_steps != -1:
            self._logged_from = close_ended_epoch(checkpoint)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self._logged_from is not None:  # Lightning's restart may have counted one more
            trainer.fit_loop.epoch_loop._batches_that_stepped = self._logged_from
            self._logged_from = None


def close_ended_epoch(checkpoint: dict[str, Any]) -> int | None:
    """Count an epoch saved as it ended completed, as Lightning does on resume but where
    `max_steps` is set: it then replayed the epoch with no batches, one epoch fewer trained.
    Returns the step the next batch logs at where it did so: Lightning's restart counts a
    batch that steps once more, or not, as the next epoch validates at its start or not."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs, batches = fit.get("epoch_progress"), fit.get("epoch_loop.batch_progress")
    epoch_loop = fit.get("epoch_loop.state_dict", {})
    if epochs is None or batches is None or "_batches_that_stepped" not in epoch_loop:
        return None
    total = epochs["total"]
    ended = total["processed"] == total["started"] == total["ready"] == total["completed"] + 1
    if not (ended and batches["is_last_batch"]):
        return None
    for progress in (epochs["total"], epochs["current"]):
        progress["completed"] = progress["processed"]
    batches["current"] = dict.fromkeys(batches["current"], 0)  # the next epoch's, not begun
    batches["is_last_batch"] = False
    return epoch_loop["_batches_that_stepped"]


def reopen_cut_epoch(checkpoint: dict[str, Any], accumulate: int = 1) -> None:
    """Make a checkpoint of an epoch cut short (by `max_time`, or by `max_steps` where the
    epoch was not validated) resume inside that epoch; `accumulate`: the run's
    accumulate_grad_batches."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epochs, batches = fit.get("epoch_progress"), fit.get("epoch_loop.batch_progress")
    epoch_loop = fit.get("epoch_loop.state_dict", {})
    if epochs is None or batches is None or "_batches_that_stepped" not in epoch_loop:
        return
    current = epochs["current"]
    # saved as the epoch ended: before Lightning counted it completed (max_time), or after
    saved_at_epoch_end = current["processed"] == current["ready"] > 0 and current["completed"] in (
        current["processed"] - 1,
        current["processed"],
    )
    if not saved_at_epoch_end or batches["is_last_batch"]:
        return
    for progress in (epochs["total"], epochs["current"]):
        progress["processed"] -= 1
        progress["completed"] = min(progress["completed"], progress["processed"])
    for progress in (batches["total"], batches["current"]):
        progress["completed"] -= 1
    # Counted for the cut batch already, where it stepped; a batch-end save counts it on resume.
    if batches["current"]["ready"] % accumulate == 0:
        epoch_loop["_batches_that_stepped"] -= 1


class LostRank(L.Callback):
    """Names the local ranks that have ended when a distributed fit fails on a lost peer."""

    def on_exception(self, trainer: L.Trainer, module: Any, exception: BaseException) -> None:
        launcher = trainer.strategy.launcher
        if isinstance(launcher, WatchedLauncher):
            launcher.reporting.set()  # rank 0 ends the job itself, with this exception
        if lost_peer(exception):
            for note in ended_ranks(getattr(launcher, "procs", None) or []):
                exception.add_note(note)


class ResumedEpochBar(L.Callback):
    """Lightning skips `on_train_epoch_start` in an epoch resumed mid-way, where the progress
    bar takes the epoch's number and length: it showed "Training: 27/?". The bar gets them at
    the resumed epoch's first batch instead."""

    def __init__(self) -> None:
        self.resumed = False

    def on_train_start(self, trainer: L.Trainer, module: Any) -> None:
        self.resumed = bool(getattr(trainer.fit_loop, "restarted_mid_epoch", False))

    def on_train_batch_start(self, trainer: L.Trainer, module: Any, batch: Any, index: int) -> None:
        bar = trainer.progress_bar_callback
        if self.resumed and isinstance(bar, TQDMProgressBar) and bar.is_enabled:
            bar.on_train_epoch_start(trainer, module)
            progress = bar.train_progress_bar
            progress.n = progress.initial = index  # done before the stop: not in the rate
            progress.refresh()
        self.resumed = False

    def on_train_epoch_end(self, trainer: L.Trainer, module: Any) -> None:
        bar = trainer.progress_bar_callback
        if isinstance(bar, TQDMProgressBar) and bar.is_enabled:
            bar.train_progress_bar.initial = 0  # else the next epoch's reset shows a rate < 0


OPTIMIZATION_KEY = "asr_optimization"
OPTIMIZATION = ("optimizer", "lr_scheduler")  # the module's arguments a resume restores


class SavedOptimization(L.Callback):
    """Keeps the optimizer's and schedule's settings in each checkpoint: a resumed run goes on
    with their saved states, whatever its own settings say, so it compares them first."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def on_save_checkpoint(self, trainer: L.Trainer, module: Any, checkpoint: dict) -> None:
        checkpoint[OPTIMIZATION_KEY] = self.settings


def _optimization(model: Namespace) -> dict[str, Any]:
    """The module's `optimizer` and `lr_scheduler` settings as plain JSON (a default function
    by its dotted name)."""
    init_args = model.get("init_args", model)

    def plain(value: Any) -> Any:
        if isinstance(value, Namespace):
            value = value.as_dict()
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        if callable(value):
            return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', value)}"
        return value

    settings = {name: plain(init_args.get(name)) for name in OPTIMIZATION}
    return json.loads(json.dumps(settings, default=str))


def _check_resumed_optimization(
    checkpoint: dict | None, path: str | None, settings: dict, argv: Sequence[str]
) -> bool:
    """Refuse a resume (from `checkpoint`, read from `path`) whose optimizer or schedule
    settings differ from its checkpoint's: Lightning restores their saved states over them (a
    new lr is ignored, a new warmup takes over from the next step). Returns whether `settings`
    are known to be the run's, to save."""
    if checkpoint is None:
        return True
    saved = checkpoint.get(OPTIMIZATION_KEY)
    if saved is None:  # a checkpoint that does not say: any such option is refused
        given = [g for g in _model_options(argv) if _model_argument(g) in OPTIMIZATION]
        if given:
            raise ValueError(
                f"{', '.join(given)}: resuming ({path}) goes on with the optimizer and schedule "
                "as saved; start a new run from its weights for others "
                "(--model.init_args.init_from CHECKPOINT)"
            )
        return False
    if saved == settings:
        return True
    changed = []
    for name in OPTIMIZATION:
        then, now = saved.get(name), settings.get(name)
        if not (isinstance(then, dict) and isinstance(now, dict)):  # one is None or a function
            then, now = _class_of(then), _class_of(now)
        then, now = _flat(then, name), _flat(now, name)
        changed += [
            f"--model.init_args.{key}: {now.get(key)!r} now, {then.get(key)!r} when saved"
            for key in sorted(then.keys() | now.keys())
            if then.get(key) != now.get(key)
        ]
    raise ValueError(
        f"{'; '.join(changed)}: resuming ({path}) goes on with the optimizer and "
        "schedule as saved; give their saved settings, or start a new run from its weights "
        "(--model.init_args.init_from CHECKPOINT)"
    )


def _class_of(setting: Any) -> Any:
    return setting.get("class_path") if isinstance(setting, dict) else setting


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat |= _flat(value, f"{prefix}.{key}" if prefix else key)
    return flat


class Sigterm(L.Callback):
    """Notes that this process had SIGTERM when its fit failed: under DDP a rank's collective
    may fail on a peer that SIGTERM stopped first, which is no lost peer to report."""

    def __init__(self) -> None:
        self.received = False

    def on_exception(self, trainer: L.Trainer, module: Any, exception: BaseException) -> None:
        self.received = self.received or bool(trainer.received_sigterm)


class CtrlC(L.Callback):
    """Notes a Ctrl-C, after which Lightning shuts down and exits 1, so that the command can
    say so and exit 130 as others do."""

    def __init__(self) -> None:
        self.pressed = False

    def on_exception(self, trainer: L.Trainer, module: Any, exception: BaseException) -> None:
        self.pressed = self.pressed or isinstance(exception, KeyboardInterrupt)


EXITED = "exited with status"  # maybe a rank's own error, printed: a resume would repeat it


def ended_ranks(procs: Sequence[subprocess.Popen]) -> list[str]:
    """How each of the local ranks 1..N-1 (Lightning starts them as children of rank 0) that
    has ended badly ended, e.g. "local rank 1 (PID 4242) was killed by SIGKILL"."""
    notes = []
    for rank, proc in enumerate(procs, 1):
        status = proc.poll()
        if status:
            if status < 0:
                try:
                    how = f"was killed by {signal.Signals(-status).name}"
                except ValueError:  # a real-time signal has no name
                    how = f"was killed by signal {-status}"
            elif status > 128:  # a signal's exit status (asr's own handlers: 143, 130, 129)
                how = f"stopped with status {status}"
            else:
                how = f"{EXITED} {status}"
            notes.append(f"local rank {rank} (PID {proc.pid}) {how}")
    return notes


def _how_to_go_on() -> str:
    """How a fit stopped by a signal goes on: from its last.ckpt, where one was saved (in
    either folder, where step checkpoints are kept apart: `last` is the later)."""
    if not ASRCLI.lasts or any(last.is_file() for last in ASRCLI.lasts):
        return "the same command with --ckpt_path last resumes it from the last checkpoint"
    return f"no last.ckpt was saved yet ({ASRCLI.lasts[0]}): the same command starts it again"


def _later_last(last: Path, config: Namespace) -> Path | None:
    """What `--ckpt_path last` reads: the run's `last`, or where step checkpoints are kept in a
    folder of their own, the later of the two `last.ckpt` by step; None where neither is."""
    folder = (config.get("step_checkpoint") or {}).get("dirpath")
    steps = Path(os.path.expanduser(folder)) / "last.ckpt" if folder else None
    found = [p for p in (last, steps) if p is not None and p.is_file()]
    if len(found) < 2:
        return found[0] if found else None
    return max(found, key=_global_step)


def _global_step(path: Path) -> int:
    """The step a checkpoint was saved at; -1 where it cannot be read (said when loaded)."""
    try:
        return int(
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"]
        )
    except Exception:  # noqa: BLE001 - any unreadable file ranks last
        return -1


def stopped_message(ended: Sequence[str], reason: str) -> str:
    """The one line a fit stopped by a lost rank ends with, whichever process noticed."""
    what = "; ".join(ended) or "another process of the job ended"
    resume = "the same command with --ckpt_path last resumes from the last checkpoint"
    if any(EXITED in note for note in ended):  # its error, or that it lost a peer too
        resume = f"where a rank that exited printed an error above, put it right first: {resume}"
    return f"asr: training stopped: {what} ({reason}). {resume[0].upper()}{resume[1:]}"


class WatchedLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher of local ranks 1..N-1, with a watch over them that names a lost one.

    Lightning's own watch SIGKILLs every process, rank 0 included, within 5 s of a child's
    end: when rank 0 is slow to reach the collective that fails and reports it (`LostRank`),
    the job ends with -9 and no word of which rank ended or how to resume. This watch leaves
    rank 0 `grace` seconds to do so, then reports it itself, kills the other children and
    exits 1.
    """

    def __init__(self, *args: Any, grace: float = 10.0, period: float = 1.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.grace, self.period = grace, period
        self.reporting = threading.Event()  # set once rank 0 handles an exception itself

    def launch(self, function: Any, *args: Any, trainer: L.Trainer | None = None, **kwargs: Any):
        # Lightning's `launch`, with this watch in place of its own.
        self.cluster_environment.validate_settings(
            num_devices=self.num_processes, num_nodes=self.num_nodes
        )
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            threading.Thread(target=self.watch, name="asr-rank-watch", daemon=True).start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)

    def kill(self, signum: Any) -> None:
        self.reporting.set()
        super().kill(signum)

    def watch(self) -> None:
        """Returns when every child has ended well or rank 0 reports; ends the job when a child
        has ended badly and rank 0 has not reported it within `grace` seconds."""
        ended_at = None
        while not self.reporting.wait(self.period):
            statuses = [proc.poll() for proc in self.procs]
            if all(status == 0 for status in statuses):
                return
            if not any(statuses):
                continue
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at < self.grace:
                continue
            reason = f"rank 0 did not notice within {self.grace:g} s"
            print(stopped_message(ended_ranks(self.procs), reason), file=sys.stderr, flush=True)
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
            os._exit(1)


def watch_ranks(trainer: L.Trainer) -> None:
    """Give `trainer` a `WatchedLauncher` where it would start local ranks with Lightning's."""
    launcher = trainer.strategy.launcher
    if type(launcher) is _SubprocessScriptLauncher:
        trainer.strategy._launcher = WatchedLauncher(
            launcher.cluster_environment, launcher.num_processes, launcher.num_nodes
        )


def sigterm_without_collective(trainer: L.Trainer) -> None:
    """Lightning's SIGTERM handler broadcasts from within the signal handler, in whatever
    collective the other ranks are then in: a deadlock more often than not. Its training
    loop broadcasts rank 0's flag before every step anyway, so this handler only raises the
    flag and passes the signal on to the local ranks, as Lightning's does besides."""
    trainer._signal_connector._sigterm_notifier_fn = SigtermNotifier(trainer)  # set at fit


class SigtermNotifier:
    """`sigterm_without_collective`'s handler: a class, as ddp_spawn pickles the trainer."""

    def __init__(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def __call__(self, signum: Any, frame: Any) -> None:
        connector, launcher = self.trainer._signal_connector, self.trainer.strategy.launcher
        if not connector.received_sigterm and launcher is not None:
            launcher.kill(signum)
        connector.received_sigterm = True


LOST_PEER_MESSAGES = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def lost_peer(error: BaseException) -> bool:
    """Whether `error` is a collective failing because another process of the job is gone."""
    if isinstance(error, torch.distributed.DistNetworkError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in LOST_PEER_MESSAGES)


def _worker_killed(error: BaseException) -> bool:
    """Whether `error` is PyTorch's for a DataLoader worker gone ("is killed by signal", or
    "exited unexpectedly" where it is found gone first)."""
    return isinstance(error, RuntimeError) and str(error).startswith("DataLoader worker")


class Trainer(L.Trainer):
    """The options of the training loop (Lightning's Trainer).

    Its batch limits are read as counts where written whole: under Lightning's own annotation
    (float first) `--trainer.limit_val_batches 1` would parse as 1.0, every batch.

    Args:
        limit_train_batches: training batches an epoch runs: a count (1 is one batch), or a
            fraction written with a point (0.25, 1.0). Per device. Default: all.
        limit_val_batches: validation batches, as `limit_train_batches`.
        limit_test_batches: test batches, as `limit_train_batches`.
        limit_predict_batches: prediction batches, as `limit_train_batches`.
    """

    def __init__(
        self,
        *args: Any,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            *args,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            **kwargs,
        )


class _Parser(LightningArgumentParser):
    """Writes the parsed config without validating it again: parsing validated it, and a
    second validation was most of what a dump costs (Lightning dumps it twice a run)."""

    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        kwargs.setdefault("skip_validation", True)
        return super().dump(namespace, *args, **kwargs)

    def save(self, namespace: Namespace, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("skip_validation", True)
        return super().save(namespace, *args, **kwargs)


class ASRCLI(LightningCLI):
    """LightningCLI with argument links, checkpoint callbacks and default loggers."""

    ctrl_c = CtrlC()  # `run_lightning_cli` makes a new one per command and reads it after
    sigterm = Sigterm()  # as ctrl_c
    time_cut: _NoFalseEpochEnd | None = None  # as ctrl_c, given the trainer as it is built

    @classmethod
    def subcommands(cls) -> dict[str, set[str]]:
        """Lightning's, less predict (transcription is `asr transcribe`); of those, the one
        run alone, as `asr` has chosen it: each parser built costs start-up time."""
        ours = {k: v for k, v in LightningCLI.subcommands().items() if k != "predict"}
        chosen = cls.argv[0] if cls.argv else None
        return {chosen: ours[chosen]} if chosen in ours else ours

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.init_args.tokenizer", "model.init_args.tokenizer")
        parser.link_arguments(
            "data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate"
        )
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        parser.add_lightning_class_args(StepCheckpoint, "step_checkpoint")
        parser.add_lightning_class_args(EpochClock, "epoch_clock")
        parser.add_argument(
            "--bf16_fallback",
            type=bool,
            default=True,
            help="train a bf16-mixed config in fp32 on a CPU without bf16 instructions "
            "(AVX-512 bf16 or AMX), where bf16 is emulated and several times slower",
        )
        parser.add_argument(
            "--onednn_kernel_cache",
            type=int | None,
            default=None,
            help="compiled oneDNN kernels kept for reuse (its default: 1024). With "
            "data.shape_grid on a CPU, bf16 training reuses more kernels than that "
            "(docs/performance.md); None leaves oneDNN's setting alone",
        )
        # The sampler shards by rank itself, and its batch count changes from epoch to epoch.
        parser.set_defaults(
            {
                "trainer.use_distributed_sampler": False,
                "trainer.reload_dataloaders_every_n_epochs": 1,
            }
        )

    argv: Sequence[str] = ()  # the command's options, set by `run_lightning_cli`
    _checkpoint: dict | None = None  # --ckpt_path's, read once, until the classes are checked
    lasts: tuple[Path, ...] = ()  # where the run's last.ckpt may be, for what a stopped run says
    _init_from: str | None = None  # the model a resumed fine-tune started from
    _last: str | None = None  # the file `--ckpt_path last` resumes, the config keeping `last`

    def _parse_ckpt_path(self) -> None:
        # Lightning rebuilds the model from a checkpoint file's hyperparameters, over the
        # config and --model options: refuse those that differ rather than drop them silently.
        # `last` and `best` are read as their files, so that naming a checkpoint either way
        # sets the same model.
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else None
        path = given_path = config.get("ckpt_path") if config is not None else None
        if isinstance(path, str) and path.startswith("~"):  # `--ckpt_path=~/x`: no shell expands it
            path = config.ckpt_path = os.path.expanduser(path)
        if path in ("last", "best") and subcommand in ("fit", "validate", "test"):
            root = _run_root(config, self.argv)
            last = Path(config.checkpoint.dirpath or Path(root) / "checkpoints") / "last.ckpt"
            later = _later_last(last, config) if path == "last" else None
            if subcommand != "fit":
                path = config.ckpt_path = str(later or _named_checkpoint(path, last))
            elif later is not None:  # else a fresh start, or refused later
                path = config.ckpt_path = self._last = str(later)
        if path and Path(path).is_file():
            self._checkpoint = load_checkpoint(path)  # a file that is none: said in one line
            check_state_dict(path, self._checkpoint)  # another tool's list or tensor
            _check_checkpoint_kind(path, self._checkpoint, config.get("model"))
        model = config.get("model") if config is not None else None
        arguments = model.get("init_args") if model is not None else None
        if self._checkpoint is not None and arguments is not None:
            named = given_path if given_path == path else f"{given_path} ({path})"
            _check_given_hyperparameters(
                named, self._checkpoint.get("hyper_parameters", {}), arguments, self.argv
            )
        reports = {k: arguments[k] for k in REPORTING if arguments is not None and k in arguments}
        super()._parse_ckpt_path()
        config = self.config[subcommand] if subcommand else None
        for name, value in reports.items():  # what validation reports, as the config says
            config.model.init_args[name] = value
        if config is not None and given_path == "last" and subcommand == "fit":
            config.ckpt_path = "last"  # what a stopped run tells to give again

    def before_fit(self) -> None:
        if self._last is not None:  # Lightning would take the epoch checkpoints' last.ckpt
            self.config_init[self.subcommand].ckpt_path = self._last

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        keeps_every = config.checkpoint.save_top_k == -1 or not config.checkpoint.monitor
        if self.subcommand == "fit" and config.checkpoint.save_last == "link" and not keeps_every:
            # Lightning links last.ckpt to the last file it kept: an old one, where only the
            # best are kept
            raise ValueError(
                "checkpoint.save_last link: last.ckpt would point at the last checkpoint kept "
                "among the best, not the latest epoch, and --ckpt_path last lose the epochs "
                "after it; give true (or keep every checkpoint, checkpoint.save_top_k -1)"
            )
        if self.subcommand == "fit" and not config.checkpoint.save_last:
            if config.step_checkpoint.every_n_steps:  # nothing would refresh it at epoch ends
                raise ValueError(
                    "checkpoint.save_last false: the step checkpoints write last.ckpt, which "
                    "would then stay at the last step checkpoint, behind each epoch's end; "
                    "give step_checkpoint.every_n_steps 0 too, or keep save_last"
                )
        _keep_compiled_kernels(config.onednn_kernel_cache)
        if config.bf16_fallback and _emulates_bf16(config.trainer):
            print(
                "asr: this CPU has no bf16 instructions (AVX-512 bf16, AMX): training in fp32 "
                "instead of bf16-mixed (--bf16_fallback false keeps bf16)",
                file=sys.stderr,
            )
            config.trainer.precision = "32-true"
        if self.subcommand == "fit" and config.ckpt_path:
            # A resumed run writes into its own checkpoint folder: no caution that it is in use.
            warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty")
        for name in ("optimizer", "lr_scheduler"):
            if config.get(name) is not None:  # LightningCLI's: it would replace both, or none
                raise ValueError(
                    f"--{name}: the modules here take theirs as model.init_args.{name} "
                    f"(e.g. --model.init_args.{name}.init_args.lr), the optimizer and its "
                    "schedule together"
                )
        if self.subcommand == "fit":
            _check_monitor(config)
            _name_by_monitor(config)
        _check_trainer_and_data(config)
        if str(config.trainer.precision) in HALF_WEIGHTS and _kind(config) != LM_CLASS:
            raise ValueError(
                f"--trainer.precision {config.trainer.precision}: the frontend makes float32 "
                "features, which half-precision weights cannot take; use bf16-mixed or 16-mixed"
            )
        root = _run_root(config, self.argv)
        # the option that gives a new run another folder: the root, where the folder is its own
        moved_by = "--checkpoint.dirpath"
        if config.checkpoint.dirpath is None:
            # One checkpoint folder per experiment, so `--ckpt_path last` resumes a rerun.
            config.checkpoint.dirpath = str(Path(root) / "checkpoints")
            moved_by = "--trainer.default_root_dir"
        folders = {Path(config.checkpoint.dirpath): moved_by}
        steps = config.step_checkpoint.dirpath
        if steps is not None and Path(steps) not in folders:  # kept apart: a run's too
            folders[Path(steps)] = "--step_checkpoint.dirpath"
        for folder, option in folders.items():
            _check_checkpoint_choice(self.subcommand, config.ckpt_path, folder, option)
        last = Path(config.checkpoint.dirpath) / "last.ckpt"
        if config.ckpt_path == "last" and last.is_file() and self._checkpoint is None:
            self._checkpoint = load_checkpoint(last)
        model = config.model.get("init_args") if config.get("model") else None
        if self._checkpoint is not None and model is not None and model.get("init_from"):
            # the checkpoint's weights replace its: it is not read (nor need it be there), and
            # named again once the model is built, so that the run's records keep it
            self._init_from, model.init_from = model.init_from, None
        if config.step_checkpoint.dirpath is None:
            config.step_checkpoint.dirpath = config.checkpoint.dirpath
        ASRCLI.lasts = (last, Path(config.step_checkpoint.dirpath) / "last.ckpt")
        if config.trainer.logger in (None, True):
            version = _next_version(Path(root) / "logs")
            config.trainer.logger = [
                Namespace(
                    class_path=cls,
                    init_args=Namespace(save_dir=root, name="logs", version=version),
                )
                for cls in DEFAULT_LOGGERS
            ]
        else:
            _fresh_versions(config.trainer.logger, root)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self._init_from is not None:
            config.model.init_args.init_from = self.model.hparams["init_from"] = self._init_from
        _check_sample_rates(self.model, self.datamodule)
        watch_ranks(self.trainer)
        sigterm_without_collective(self.trainer)
        self.trainer.callbacks += [LostRank(), self.ctrl_c, self.sigterm, ResumedEpochBar()]
        if self.time_cut is not None:
            self.time_cut.trainer = self.trainer
        checkpoint, self._checkpoint = self._checkpoint, None  # not held while training
        path = config.ckpt_path
        if path == "last":  # the file it was read from, the step checkpoints' it may be
            path = self._last or str(Path(config.checkpoint.dirpath) / "last.ckpt")
        if checkpoint is not None:
            _check_checkpoint_fits(path, checkpoint, self.model)
        if self.subcommand == "fit" and checkpoint is not None:
            _check_resumable(path, checkpoint)
        if self.subcommand == "fit":
            settings = _optimization(config.model)
            if _check_resumed_optimization(checkpoint, path, settings, self.argv):
                self.trainer.callbacks.append(SavedOptimization(settings))
        # The init args alone: checkpoint loaders know their module class (ASRModule, LMModule).
        model_config = config.model.init_args.as_dict()
        for training_only in OPTIMIZATION:
            model_config.pop(training_only, None)
        model_config["vocab_size"] = self.datamodule.vocab_size
        transfer = getattr(self.model, "transfer", None)
        if transfer is not None:
            check_same_settings(transfer.trained_config, model_config)
            rank_zero_info(transfer.summary())  # once the settings are known to fit
            note = decoder_differences(transfer.trained_config, model_config)
            if note:
                rank_zero_warn(note)
        # Plain JSON types only, so checkpoints load with weights_only=True.
        self.model.model_config = json.loads(json.dumps(model_config))
        if checkpoint is not None:
            _check_same_network(path, checkpoint, self.model.model_config)


def _payload(checkpoint: dict) -> dict:
    """The recognizer's or LM's self-describing part of a checkpoint (none: empty)."""
    return checkpoint.get(RECOGNIZER_KEY) or checkpoint.get(LM_KEY) or {}


def _check_same_network(path: str, checkpoint: dict, model_config: dict) -> None:
    """CheckpointError where --ckpt_path's network was built with other settings than the
    config's in what holds no weights (a frontend's hop, say): its weights fit, and it would
    validate, test or train on as another model."""
    saved = _payload(checkpoint).get("model_config")
    parts = ("frontend", "encoder", "decoder", "lm")
    differ = (
        setting_differences(saved, model_config, parts, fine_tune=False)
        if isinstance(saved, dict)
        else []
    )
    if differ:
        (key, then, now), more = differ[0], len(differ) - 1
        raise CheckpointError(
            f"{path}: trained with other settings than this config's: {key} is {then!r} "
            f"there, {now!r} here{f' (and {more} more)' if more else ''}; give the config it "
            "was trained with"
        )


def _check_checkpoint_kind(path: str, checkpoint: dict, model: Any) -> None:
    """CheckpointError where --ckpt_path holds another kind of model than the config's (a
    recognizer for an LM config, or the other way): Lightning's parser would print a page."""
    saved = (checkpoint.get("hyper_parameters") or {}).get("_class_path")
    wanted = model.get("class_path") if model is not None else None
    if saved and wanted and saved != wanted:
        kinds = {"asr.lightning.ASRModule": "recognizer", "asr.lm.LMModule": "language model"}
        raise CheckpointError(
            f"{path}: a {kinds.get(saved, saved)} checkpoint, and the config trains a "
            f"{kinds.get(wanted, wanted)}: give the config it was trained with"
        )


def _check_checkpoint_fits(path: str, checkpoint: dict, module: L.LightningModule) -> None:
    """CheckpointError where `checkpoint` (--ckpt_path's) is not of this config's model or
    tokenizer: Lightning would stop in load_state_dict with a page of shapes, or, given a
    vocabulary of the same size in another order, train on with every label remapped."""
    check_state_dict(path, checkpoint)
    weights = checkpoint["state_dict"]
    # a recognizer's init_from takes weights of another shape or vocabulary, an LM's does not
    remaps = f"{type(module).__module__}.{type(module).__qualname__}" != LM_CLASS
    differ = weight_differences(module.state_dict(), weights)
    if differ:
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        hint = " (--model.init_args.init_from starts another model from its weights)"
        raise CheckpointError(
            f"{path}: its weights are not this config's model: {differ[0]}{more}; give the "
            f"config it was trained with{hint if remaps else ''}"
        )
    tokenizer = getattr(module, "tokenizer", None)
    payload = _payload(checkpoint)
    if tokenizer is None or "tokenizer" not in payload:
        return
    difference = tokenizer_difference(payload_tokenizer(payload), tokenizer)
    if difference:
        hint = " (--model.init_args.init_from starts a model of this vocabulary from its weights)"
        raise CheckpointError(
            f"{path}: trained with another tokenizer than --data.tokenizer's ({difference}); "
            f"give the one it was trained with{hint if remaps else ''}"
        )


def _check_resumable(path: str, checkpoint: dict) -> None:
    """CheckpointError where `checkpoint` holds weights without the training state that
    `fit --ckpt_path` resumes (an average, or a weights-only save)."""
    if "optimizer_states" not in checkpoint:
        raise CheckpointError(
            f"{path}: weights without a training state (optimizer, schedule, epoch) to resume; "
            f"--model.init_args.init_from {path} starts a new run from its weights"
        )


def _named_checkpoint(name: str, last: Path) -> Path:
    """`--ckpt_path last` or `best`'s file: the run's `last`, or the best it records (Lightning
    knows the best only within the run that found it)."""
    if not last.is_file():
        raise ValueError(f"--ckpt_path {name}: no {last}")
    if name == "last":
        return last
    best = best_checkpoints(last, 1)[0]
    if not best.is_file():
        raise ValueError(f"--ckpt_path best: {best}, the best that {last} records, is gone")
    return best


# ASRModule arguments that change what validation reports and plots, never the weights
REPORTING = ("greedy_validation", "plot_utterances", "plot_every_n_epochs")


def _check_given_hyperparameters(
    path: str, saved: dict, arguments: Namespace, argv: Sequence[str]
) -> None:
    """Refuse a config or --model options that set a hyperparameter `saved` in --ckpt_path's
    checkpoint to another value: the checkpoint's would replace it unsaid. (`init_from` is not
    read when a run resumes, what validation reports may change, and the tokenizer is checked
    by its vocabulary.)"""
    linked = {"init_from", "tokenizer", "vocab_size"}
    kept = [k for k in saved if k not in {*REPORTING, *linked} and not k.startswith("_")]
    options = {_model_argument(option): option for option in _model_options(argv)}
    changed = [
        f"{options.get(name, f'model.init_args.{name}')}: {arguments.get(name)!r} now, "
        f"{saved[name]!r} when trained"
        for name in kept
        if name in arguments and arguments.get(name) != saved[name]
    ]
    if changed:
        raise ValueError(
            f"{'; '.join(changed)}: --ckpt_path {path} sets it as it was trained, whatever "
            "the config or --model options say (asr evaluate decodes with other settings; "
            "--model.init_args.init_from starts a new run from its weights)"
        )


def _model_options(argv: Sequence[str]) -> list[str]:
    """The `--model.` options given in `argv`, by name.

    >>> _model_options(["--model.init_args.ctc_weight=0.3", "--model.init_args.lr", "1"])
    ['--model.init_args.ctc_weight', '--model.init_args.lr']
    """
    return [a.split("=")[0] for a in argv if a.startswith("--model.")]


def _model_argument(option: str) -> str:
    """The init argument a --model option sets: `--model.init_args.ctc_weight` -> ctc_weight.

    >>> _model_argument("--model.init_args.frontend.init_args.n_mels")
    'frontend'
    """
    parts = option.removeprefix("--model.").split(".")
    return parts[1] if parts[0] == "init_args" and len(parts) > 1 else parts[0]


def _check_sample_rates(module: L.LightningModule, datamodule: Any) -> None:
    """The data module resamples audio to its rate, the frontend's filters are made for
    its own: trained on another, the model hears every recording at the wrong speed."""
    network, hparams = getattr(module, "model", None), getattr(datamodule, "hparams", {})
    expected, given = getattr(network, "sample_rate", None), hparams.get("sample_rate")
    if expected is not None and given is not None and expected != given:
        raise ValueError(
            f"the data are read at {given} Hz (data.sample_rate), the frontend takes "
            f"{expected} Hz: give both the same rate"
        )


def _say_where(cli: ASRCLI) -> None:
    """After a fit, where its checkpoints and logs are (Lightning's last line says neither)."""
    trainer = cli.trainer
    if cli.subcommand != "fit" or not trainer.is_global_zero or trainer.checkpoint_callback is None:
        return
    if trainer.fast_dev_run:  # nothing written, as Lightning's banner has said
        return
    logs = f"; logs and config.yaml in {trainer.logger.log_dir}" if trainer.logger else ""
    print(f"asr fit: checkpoints in {trainer.checkpoint_callback.dirpath}{logs}", file=sys.stderr)
    epochs = trainer.max_epochs
    done = max(trainer.current_epoch - _inside_an_epoch(trainer), 0)  # epochs finished
    if not _out_of_time(trainer) or epochs in (None, -1) or done >= epochs:
        return
    print(
        f"asr fit: warning: trainer.max_time ended the run with {done} of its {epochs} epochs "
        "done: the model has not had the training its config plans. The same command with "
        "--ckpt_path last and a longer --trainer.max_time goes on from there.",
        file=sys.stderr,
    )


def _run_root(config: Namespace, argv: Sequence[str]) -> str:
    """The run's root folder, its folders' `~` expanded first, as Lightning expands them
    (every check on `last.ckpt` then reads the file Lightning writes and resumes), and a saved
    run's folders forgotten where another root is given (its config among `argv`'s)."""
    loggers = _loggers(config)
    groups = [(config.get(name), key) for name, key in (
        ("trainer", "default_root_dir"), ("checkpoint", "dirpath"), ("step_checkpoint", "dirpath")
    )]  # fmt: skip
    groups += [(getattr(lg, "init_args", None), "save_dir") for lg in loggers]
    for group, key in groups:
        if group is not None and isinstance(group.get(key), str):
            group[key] = os.path.expanduser(group[key])
    root = config.trainer.default_root_dir or "."
    _forget_another_runs_folders(config, root, argv)
    return root


def _loggers(config: Namespace) -> list:
    """The loggers --trainer.logger sets up: a list, one alone, or none (true, false, None)."""
    logger = config.trainer.logger
    return logger if isinstance(logger, list) else [logger] if isinstance(logger, Namespace) else []


def _forget_another_runs_folders(config: Namespace, root: str, argv: Sequence[str]) -> None:
    """A run's saved config.yaml names its checkpoint folder and logger versions, which this
    class derives from --trainer.default_root_dir. Given again with another root folder, they
    would send this run into the saved run's folders (resuming and overwriting it): they are
    derived anew from the root."""
    loggers = _loggers(config)
    folders = {str(getattr(getattr(lg, "init_args", None), "save_dir", "")) for lg in loggers}
    # the saved run's root: its loggers' folder, else the root a config file names beside them
    told = [next(iter(folders)) if len(folders) == 1 else None]
    told += map(_root_of_saved_run, reversed(config_paths(argv)))
    saved = next(
        (r for r in told if r and config.checkpoint.dirpath == str(Path(r) / "checkpoints")), None
    )  # else not the folders of a saved run: chosen on purpose
    if not saved or os.path.abspath(saved) == os.path.abspath(root):
        return
    ours = {os.path.abspath(f) for f in folders} == {os.path.abspath(saved)}  # else chosen
    logs = ours or config.trainer.logger in (None, True)  # the default loggers, below the root
    print(
        f"asr: the config's run folder {saved} is not --trainer.default_root_dir {root}: "
        f"{'checkpoints and logs' if logs else 'checkpoints'} go below {root}",
        file=sys.stderr,
    )
    if config.step_checkpoint.dirpath == config.checkpoint.dirpath:
        config.step_checkpoint.dirpath = None
    config.checkpoint.dirpath = None
    if ours:  # its loggers, each kept, log below this root (else none, or chosen folders)
        version = _next_version(Path(root) / "logs")  # the default ones', one for both
        for logger in loggers:
            logger.init_args.save_dir = root
            if "version" in logger.init_args:  # a new run of its own
                ours_too = logger.class_path in DEFAULT_LOGGERS
                logger.init_args.version = version if ours_too else None


def _root_of_saved_run(path: str) -> str | None:
    """The root folder the config file `path` names where it names the checkpoint folder that
    `asr fit` derives from it, as a run's saved config does; else None."""
    try:
        read = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # LightningCLI says what is wrong with it
    if not isinstance(read, dict):
        return None
    trainer, checkpoint = read.get("trainer"), read.get("checkpoint")
    root = trainer.get("default_root_dir") if isinstance(trainer, dict) else None
    folder = checkpoint.get("dirpath") if isinstance(checkpoint, dict) else None
    if not isinstance(root, str) or not isinstance(folder, str):
        return None
    root = os.path.expanduser(root)
    return root if os.path.expanduser(folder) == str(Path(root) / "checkpoints") else None


def _check_checkpoint_choice(
    command: str | None, ckpt_path: str | None, folder: Path, option: str
) -> None:
    """Refuse what would silently work on the wrong model: validating or testing no trained
    one, or a new run writing its checkpoints among an earlier run's (`last.ckpt` stale) in
    `folder`, which `option` moves."""
    last = folder / "last.ckpt"
    if command in ("validate", "test") and not ckpt_path:
        raise ValueError(
            f"asr {command} scores a trained model: give --ckpt_path (a file, last or best)"
        )
    if command == "fit" and ckpt_path == "best":  # Lightning's error names a wrong cause
        raise ValueError(
            "--ckpt_path best: asr fit resumes a run from last (or a checkpoint file); best "
            "is for validate and test, and asr average --best N averages the best"
        )
    if command == "fit" and not ckpt_path and last.is_file():
        raise ValueError(
            f"{folder} holds an earlier run's checkpoints: --ckpt_path last resumes it; to "
            f"start afresh, give another {option} or remove that folder"
        )
    others = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
    if command == "fit" and ckpt_path in (None, "last") and others and not last.is_file():
        # a fresh start, its checkpoints among the earlier run's (-v1 beside each)
        raise ValueError(
            f"{folder} holds an earlier run's checkpoints ({others[-1].name}...) but no "
            "last.ckpt: give one of them as --ckpt_path to resume from it; to start afresh, "
            f"give another {option} or remove that folder"
        )


HALF_WEIGHTS = ("bf16-true", "16-true")  # weights, not only the arithmetic, in 16 bits
LM_CLASS = "asr.lm.LMModule"  # an LM has no frontend: it may train in half-precision weights


# What each module's validation logs, to choose checkpoints by
RISING = ("val/acc",)  # validation metrics that rise as a model gets better; the others fall
VALIDATION_METRICS = {
    "asr.lightning.ASRModule": ("val/loss", "val/att_loss", "val/acc", "val/ctc_loss",
                                "val/inter_ctc_loss", "val/wer", "val/cer"),
    "asr.lm.LMModule": ("val/loss", "val/ppl"),
}  # fmt: skip


def _check_monitor(config: Namespace) -> None:
    """ValueError where checkpoints are chosen by a metric that validation will not log (a WER
    without greedy decoding, a misspelt name): the run stopped with a traceback after its
    first epoch, and no checkpoint to resume from; or under the mode that takes its worst
    value for the best (val/acc under the default mode, min, kept the worst checkpoints)."""
    model = config.model.get("init_args", config.model) if config.get("model") else None
    greedy = model.get("greedy_validation", True) if model is not None else True
    monitor = config.checkpoint.monitor
    if not greedy and monitor in ("val/wer", "val/cer"):
        raise ValueError(
            f"model.greedy_validation false logs no {monitor} to choose checkpoints by: set "
            "--checkpoint.monitor val/acc --checkpoint.mode max (or val/loss, min)"
        )
    logged, why_not = _validation_metrics(config)
    callbacks = config.trainer.get("callbacks") or []
    checkpoint = ("--checkpoint.monitor", monitor, config.checkpoint.get("mode"), "--checkpoint")
    watched = [checkpoint] + [
        (
            f"--trainer.callbacks {c.class_path.rsplit('.', 1)[-1]} monitor",
            c.init_args.monitor,
            c.init_args.get("mode"),
            "--trainer.callbacks",
        )  # fmt: skip
        for c in (callbacks if isinstance(callbacks, list) else [callbacks])
        if isinstance(c, Namespace) and isinstance(c.get("init_args.monitor"), str)
    ]
    for option, name, _, _ in watched:
        if not logged or not str(name).startswith("val/") or name in logged:
            continue
        if name in why_not:
            raise ValueError(f"{option} {name}: validation logs none ({why_not[name]})")
        close = get_close_matches(name, logged, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(
            f"{option} {name}: validation logs no such metric{hint}; it logs {', '.join(logged)}"
        )
    for option, name, mode, group in watched:
        if name in logged and mode in ("min", "max") and (mode == "max") != (name in RISING):
            better = "max" if name in RISING else "min"
            raise ValueError(
                f"{option} {name} under mode {mode} takes the worst value for the best: give "
                f"{group}.mode {better}"
            )


def _validation_metrics(config: Namespace) -> tuple[list[str], dict[str, str]]:
    """What validation of the config's module logs, and why it logs none of the others."""
    logged = list(VALIDATION_METRICS.get(_kind(config), ()))
    model = config.model.get("init_args", config.model) if config.get("model") else None
    why_not = {}
    if _kind(config) == "asr.lightning.ASRModule" and model is not None:
        if model.get("ctc_weight") == 0:
            why_not["val/ctc_loss"] = "model.ctc_weight is 0: no CTC head"
            why_not["val/inter_ctc_loss"] = why_not["val/ctc_loss"]
        elif not model.get("inter_ctc_weight"):
            why_not["val/inter_ctc_loss"] = "model.inter_ctc_weight is 0: no intermediate CTC"
        if model.get("greedy_validation") is False:
            why_not["val/wer"] = "model.greedy_validation is false: nothing is decoded"
            why_not["val/cer"] = why_not["val/wer"]
    return [m for m in logged if m not in why_not], why_not


def _name_by_monitor(config: Namespace) -> None:
    """Checkpoints chosen by another metric than the WER are named by it (`epoch003-acc0.4123`),
    where the config keeps the default name: that would give a WER Lightning fills in as 0."""
    monitor = config.checkpoint.monitor
    default = config.checkpoint.filename == CHECKPOINT_DEFAULTS["checkpoint.filename"]
    if default and monitor not in (None, "val/wer"):
        digits = 2 if monitor == "val/cer" else 4  # percentages as the WER
        name = monitor.rsplit("/", 1)[-1]
        config.checkpoint.filename = f"epoch{{epoch:03d}}-{name}{{{monitor}:.{digits}f}}"


def _kind(config: Namespace) -> str | None:
    """The class path of the config's module (`asr.lightning.ASRModule`, `asr.lm.LMModule`)."""
    return config.model.get("class_path") if config.get("model") else None


def _check_trainer_and_data(config: Namespace) -> None:
    """ValueError for settings Lightning or torch would stop on with a traceback only once
    the data are read (or after a first batch); named by key, as a config file or the command
    line may have set them."""
    trainer = config.trainer
    accumulate = trainer.get("accumulate_grad_batches")
    if isinstance(accumulate, int) and accumulate < 1:
        raise ValueError(f"trainer.accumulate_grad_batches is {accumulate}: must be at least 1")
    clip = trainer.get("gradient_clip_val")
    if _is_number(clip) and not clip >= 0:  # a negative limit turns the gradients around
        raise ValueError(f"trainer.gradient_clip_val is {clip}: must be at least 0 (0: none)")
    every = trainer.get("check_val_every_n_epoch")
    if _is_number(every) and every < 1:
        raise ValueError(f"trainer.check_val_every_n_epoch is {every}: must be at least 1")
    interval = trainer.get("val_check_interval")
    if _is_number(interval) and not interval > 0:
        raise ValueError(
            f"trainer.val_check_interval is {interval}: must be above 0 (a share of an epoch up "
            "to 1.0, or a number of batches)"
        )
    data = config.data.get("init_args", config.data) if config.get("data") else None
    workers = data.get("num_workers") if data is not None else None
    if isinstance(workers, int) and workers < 0:
        raise ValueError(f"data.num_workers is {workers}: must be at least 0")
    accelerator = str(config.trainer.get("accelerator"))
    gpus = torch.cuda.is_available() or (accelerator == "gpu" and torch.backends.mps.is_available())
    if accelerator in ("gpu", "cuda") and not gpus:  # Lightning's "gpu" is MPS on a Mac too
        raise ValueError(
            f"--trainer.accelerator {accelerator}: this machine has no CUDA GPU (a GPU config "
            "runs here with --trainer.accelerator cpu --trainer.devices 1)"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _placed(error: BaseException, argv: Sequence[str]) -> str:
    """A refusal led by the config file and line that set what it refuses, where no option on
    the command line set it instead: the setting it begins with (`augment.noise.prob must
    be...`, as a class of options checks its values), or the argument it names of the class
    that refused it as it was built (`f_min` of a LogMelFilterbank)."""
    said = str(error)
    match = re.match(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)[ :]", said)
    if match is not None:
        where = where_set(config_paths(argv), match.group(1))
        by_option = _set_by_option(match.group(1).split("."), argv)
    elif (built := built_class(error)) and (found := where_built(config_paths(argv), built, said)):
        where, key = found  # an option may have set what the message names, or left unnamed
        by_option = _sets_within(key[:-1], argv)
    else:
        return said
    return said if where is None or by_option else f"{where}: {said}"


def _set_by_option(key: list[str], argv: Sequence[str]) -> bool:
    """Whether an option in `argv` sets the setting whose key path ends in `key` (itself, or a
    mapping that holds it: `--data.augment '{...}'` sets `augment.noise.prob`)."""
    # the option's path ends with the key's first n parts: n = len(key) is the key itself
    return any(
        any(path[-n:] == key[:n] for n in range(1, min(len(path), len(key)) + 1))
        for path in _option_paths(argv)
    )


def _sets_within(key: list[str], argv: Sequence[str]) -> bool:
    """Whether an option in `argv` sets the setting at the whole key path `key`, something
    within it, or a mapping that holds it."""
    return any(path[: len(key)] == key or key[: len(path)] == path for path in _option_paths(argv))


def _option_paths(argv: Sequence[str]) -> Iterator[list[str]]:
    """The key path each option in `argv` sets (`init_args` left out), `--config` aside."""
    for arg in argv:
        if arg.startswith("--") and not arg.startswith("--config"):
            yield [part for part in arg[2:].split("=", 1)[0].split(".") if part != "init_args"]


def _refusal_within(error: BaseException) -> BaseException | None:
    """`error` where `_said_by_asr`; where jsonargparse wrapped the error of building a class
    (a missing tokenizer or CMVN file, inside a 100-line dump of the config), that error."""
    if _said_by_asr(error) or isinstance(error, MisconfigurationException):  # said to a user
        return error
    frames = traceback.extract_tb(error.__traceback__)
    cause = error.__cause__ or error.__context__
    if frames and "jsonargparse" in Path(frames[-1].filename).parts and cause is not None:
        return _refusal_within(cause)
    return None


def _said_by_asr(error: BaseException) -> bool:
    """Whether `error` is a refusal with its own message: a path the system could not open, or
    a ValueError this package raised (not a library's, whose traceback a bug report needs)."""
    if isinstance(error, OSError):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    package = Path(__file__).resolve().parent
    return (
        isinstance(error, ValueError)
        and bool(frames)
        and Path(frames[-1].filename).resolve().is_relative_to(package)
    )


def _emulates_bf16(trainer: Namespace) -> bool:
    """Whether `trainer` would run bf16 on a CPU that has no bf16 instructions."""
    if str(trainer.precision) not in ("bf16-mixed", "bf16"):
        return False
    on_cpu = trainer.accelerator == "cpu" or (
        trainer.accelerator == "auto" and not torch.cuda.is_available()
    )
    return on_cpu and not (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )


KERNEL_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def _keep_compiled_kernels(capacity: int | None) -> None:
    """Ask oneDNN to keep `capacity` compiled kernels unless the user has set the variable."""
    if capacity is None or KERNEL_CACHE_VARIABLE in os.environ:
        return
    if capacity < 1:
        raise ValueError(f"onednn_kernel_cache must be >= 1, got {capacity}")
    os.environ[KERNEL_CACHE_VARIABLE] = str(capacity)


def _fresh_versions(loggers: Any, root: str) -> None:
    """The default loggers of a run's saved config.yaml (in `root/logs`) name its own version:
    given again (to test, validate or resume), Lightning would delete that version's logs, the
    training curves among them. Where it holds files, they log into the next version instead;
    loggers a user set up otherwise are left as they are."""
    ours = (
        [lg for lg in loggers if getattr(lg, "class_path", None) in DEFAULT_LOGGERS]
        if isinstance(loggers, list)
        else []
    )
    for logger in ours:
        args = getattr(logger, "init_args", None)
        version, save_dir = getattr(args, "version", None), getattr(args, "save_dir", None)
        if (
            not isinstance(version, int)
            or save_dir is None
            or getattr(args, "name", None) != "logs"
        ):
            continue
        if os.path.abspath(str(save_dir)) != os.path.abspath(root):
            continue
        logs = Path(save_dir) / "logs"
        if (logs / f"version_{version}").is_dir() and any((logs / f"version_{version}").iterdir()):
            args.version = _next_version(logs)


def _next_version(logs: Path) -> int:
    versions = [int(p.name.split("_")[1]) for p in logs.glob("version_*") if p.name[8:].isdigit()]
    return max(versions, default=-1) + 1


class _NoAdverts(logging.Filter):
    """Drops Lightning's tips that advertise its cloud services in every training log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


_NO_ADVERTS = _NoAdverts()
MAX_EPOCHS_REACHED = "`Trainer.fit` stopped: `max_epochs="


class _NoFalseEpochEnd(logging.Filter):
    """Drops Lightning's "`max_epochs=N` reached" where max_time cut the last epoch short:
    Lightning counts that epoch as done (`_say_where` says how many were)."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: L.Trainer | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        trainer = self.trainer
        if trainer is None or not str(record.msg).startswith(MAX_EPOCHS_REACHED):
            return True
        return not (_inside_an_epoch(trainer) and _out_of_time(trainer))


def _sigterm_exit() -> SystemExit:
    """Says that SIGTERM stopped the fit; the exit to raise. (Lightning exits 0 on SIGTERM: a
    recipe would then average an unfinished model.)"""
    print(f"asr: training stopped by SIGTERM; {_how_to_go_on()}", file=sys.stderr)
    return SystemExit(128 + signal.SIGTERM)


def run_lightning_cli(argv: Sequence[str]) -> ASRCLI:
    """Run `asr fit|validate|test ...` (argv without the program name)."""
    classes: dict[str, tuple[Any, str]] = {}  # what each config names, for those laid over it
    paths = config_paths(argv)
    problems = [p for path in paths for p in config_problems(path, classes, argv[0])]
    problems += option_problems(argv, classes)
    if problems:
        for problem in problems:
            print(f"asr {argv[0]}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    argv = without_empty_configs(argv)
    torch.set_float32_matmul_precision("high")
    ASRCLI.ctrl_c, ASRCLI.sigterm, ASRCLI.lasts = CtrlC(), Sigterm(), ()
    ASRCLI.time_cut = time_cut = _NoFalseEpochEnd()
    ASRCLI.argv = list(argv)
    loggers = [
        logging.getLogger(f"lightning.{p}.utilities.rank_zero") for p in ("pytorch", "fabric")
    ]
    for logger in loggers:
        logger.addFilter(_NO_ADVERTS)
        logger.addFilter(time_cut)
    try:
        with warnings.catch_warnings():  # the filters last as long as the run
            # ASRDataModule checkpoints the sampler position itself (Lightning cannot see it).
            warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before")
            # Lightning's use of a torch API deprecated in torch 2.11: nothing a user can change.
            warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated")
            # The model summary's size estimate counts 32-bit weights under bf16: nothing to do.
            warnings.filterwarnings("ignore", "Precision .* is not supported by the model summary")
            # A shard stream plans every (rank, worker) stream's batches: its length is exact.
            warnings.filterwarnings("ignore", "Your `IterableDataset` has `__len__` defined")
            # The command's own options, as `args` where configs that hold no settings are left out.
            warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended")
            cli = ASRCLI(
                L.LightningModule,
                L.LightningDataModule,
                trainer_class=Trainer,
                parser_class=_Parser,
                subclass_mode_model=True,
                subclass_mode_data=True,
                args=None if list(argv) == sys.argv[1:] else list(argv),
                save_config_callback=SaveConfig,
                save_config_kwargs={"overwrite": True},
                parser_kwargs={"prog": "asr"},
                trainer_defaults={"plugins": [{"class_path": "asr.train.AtomicCheckpointIO"}]},
            )
            _say_where(cli)
            return cli
    except Exception as error:
        from asr.lightning import NonFiniteStreak

        if isinstance(error, NonFiniteStreak):  # a line that says what to do, not a traceback
            print(f"asr {argv[0]}: error: {error}", file=sys.stderr)
            raise SystemExit(1) from None
        said = _refusal_within(error)
        if said is not None and not lost_peer(error):  # a file, a manifest...: its message
            print(f"asr {argv[0]}: error: {_placed(said, argv)}", file=sys.stderr)
            raise SystemExit(2) from None
        # A peer, or a loader worker (a scheduler or `timeout` signals the whole process
        # group), stopped by the SIGTERM this process had too
        if ASRCLI.sigterm.received and (lost_peer(error) or _worker_killed(error)):
            raise _sigterm_exit() from None
        if not lost_peer(error):
            raise
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(stopped_message(getattr(error, "__notes__", []), reason), file=sys.stderr)
        raise SystemExit(1) from None
    except SIGTERMException:
        raise _sigterm_exit() from None
    except SystemExit:  # Lightning's own exit after a Ctrl-C is 1
        if not ASRCLI.ctrl_c.pressed:
            raise
        print(f"asr: training interrupted; {_how_to_go_on()}", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        for logger in loggers:
            logger.removeFilter(_NO_ADVERTS)
            logger.removeFilter(time_cut)
