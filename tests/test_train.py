"""`asr.train` helpers that need no training run (the runs are in test_lightning.py)."""

from __future__ import annotations

import copy
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from conftest import run_forked
from jsonargparse import Namespace

import asr.train
from asr.train import (
    EpochClock,
    _emulates_bf16,
    _run_root,
    reopen_cut_epoch,
    run_lightning_cli,
    sigterm_without_collective,
)


def _counts(ready: int, processed: int, completed: int) -> dict[str, int]:
    return {"ready": ready, "started": ready, "processed": processed, "completed": completed}


def _epoch_end_save(epoch: int, batches_done: int, last_batch: bool) -> dict:
    """The loop state Lightning saves from `on_train_epoch_end` of epoch `epoch` (0-based),
    after `batches_done` batches of it and 10 a finished epoch before."""
    total_batches = 10 * epoch + batches_done
    return {
        "loops": {
            "fit_loop": {
                "epoch_progress": {
                    "total": _counts(epoch + 1, epoch + 1, epoch),
                    "current": _counts(epoch + 1, epoch + 1, epoch),
                },
                "epoch_loop.batch_progress": {
                    "total": _counts(total_batches, total_batches, total_batches),
                    "current": _counts(batches_done, batches_done, batches_done),
                    "is_last_batch": last_batch,
                },
                "epoch_loop.state_dict": {"_batches_that_stepped": total_batches},
            }
        }
    }


def test_a_cut_epoch_gets_the_counters_of_a_save_at_its_last_batch_end():
    checkpoint = _epoch_end_save(epoch=1, batches_done=4, last_batch=False)
    reopen_cut_epoch(checkpoint)
    fit = checkpoint["loops"]["fit_loop"]
    for scope in ("total", "current"):
        epochs = fit["epoch_progress"][scope]
        assert (epochs["started"], epochs["processed"], epochs["completed"]) == (2, 1, 1)
    batches = fit["epoch_loop.batch_progress"]
    assert batches["current"] == {"ready": 4, "started": 4, "processed": 4, "completed": 3}
    assert batches["total"]["processed"] == 14 and batches["total"]["completed"] == 13
    assert fit["epoch_loop.state_dict"]["_batches_that_stepped"] == 13


def test_a_cut_inside_an_accumulation_window_counts_no_step_for_the_cut_batch():
    """The cut batch stepped no optimizer: the count of batches that stepped stays."""
    checkpoint = _epoch_end_save(epoch=1, batches_done=5, last_batch=False)
    reopen_cut_epoch(checkpoint, accumulate=2)
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] == 15
    on_a_step = _epoch_end_save(epoch=1, batches_done=4, last_batch=False)
    reopen_cut_epoch(on_a_step, accumulate=2)
    assert on_a_step["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] == 13


def test_an_epoch_that_ran_out_of_batches_stays_finished():
    checkpoint = _epoch_end_save(epoch=1, batches_done=10, last_batch=True)
    saved = copy.deepcopy(checkpoint)
    reopen_cut_epoch(checkpoint)
    assert checkpoint == saved


def test_a_mid_epoch_save_and_an_unknown_layout_are_left_alone():
    mid_epoch = _epoch_end_save(epoch=1, batches_done=4, last_batch=False)
    for scope in ("total", "current"):  # saved at a batch end: the epoch not yet processed
        mid_epoch["loops"]["fit_loop"]["epoch_progress"][scope]["processed"] -= 1
    unknown = _epoch_end_save(epoch=1, batches_done=4, last_batch=False)
    del unknown["loops"]["fit_loop"]["epoch_loop.state_dict"]
    for checkpoint in (mid_epoch, unknown, {"state_dict": {}}):
        saved = copy.deepcopy(checkpoint)
        reopen_cut_epoch(checkpoint)
        assert checkpoint == saved


@pytest.mark.parametrize(
    ("precision", "accelerator", "bf16_cpu", "emulated"),
    [
        ("bf16-mixed", "cpu", False, True),
        ("bf16-mixed", "auto", False, True),  # no CUDA here
        ("bf16-mixed", "cpu", True, False),
        ("32-true", "cpu", False, False),
    ],
)
def test_bf16_on_a_cpu_without_bf16_instructions_is_emulated(
    monkeypatch, precision, accelerator, bf16_cpu, emulated
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_cpu)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    trainer = Namespace(precision=precision, accelerator=accelerator)
    assert _emulates_bf16(trainer) is emulated


# Runs `WatchedLauncher.watch` once per case "MODE;COMMAND;COMMAND...", the commands as its
# children (local ranks 1, 2, ...), in a process of its own: the watch may end its process.
# Its grace of 2 s lets every shell end first, even on a loaded machine.
WATCH = """
import subprocess, sys
from lightning.fabric.plugins.environments import LightningEnvironment
from asr.train import WatchedLauncher

for case in sys.argv[1:]:
    mode, *commands = case.split(";")
    launcher = WatchedLauncher(LightningEnvironment(), 4, 1, grace=2.0, period=0.05)
    launcher.procs = [subprocess.Popen(["sh", "-c", command]) for command in commands]
    print(" ".join(str(proc.pid) for proc in launcher.procs), flush=True)
    if mode == "reporting":
        launcher.reporting.set()
    launcher.watch()
    print("returned", flush=True)
"""


@pytest.fixture(scope="module")
def watched() -> subprocess.CompletedProcess:
    """One process, forked from this one (Lightning's import costs seconds), watches three cases
    in turn: all ranks end well; rank 0 reports a failure itself; ranks die and rank 0 does not
    notice (the watch then ends the process)."""
    cases = ["alone;exit 0;sleep 0.2", "reporting;exit 3", "alone;kill -9 $$;exit 3;exec sleep 60"]
    return run_forked(WATCH, cases)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_rank_watch_names_the_ranks_ended_and_ends_the_job_when_rank_0_does_not(watched):
    assert watched.returncode == 1, watched.stderr
    last = watched.stdout.splitlines()[4]  # the third case's children
    killed, failed, sleeper = (int(pid) for pid in last.split())
    assert watched.stdout.splitlines()[5:] == [], "the watch returned"
    assert watched.stderr.startswith(
        f"asr: training stopped: local rank 1 (PID {killed}) was killed by SIGKILL; local rank "
        f"2 (PID {failed}) exited with status 3 (rank 0 did not notice within 2 s). Where a "
        "rank that exited printed an error above, put it right first: the same command with "
        "--ckpt_path last resumes"
    ), watched.stderr
    assert not _running(sleeper), "the other local rank was left running"


def test_only_a_rank_that_exited_with_an_error_of_its_own_is_to_be_put_right_first() -> None:
    """A rank killed by a signal, or stopped by one through asr's handlers (143, 130), left no
    error that a resume would meet again; one that exited with 1..127 may have."""
    from asr.train import ended_ranks, stopped_message

    def said(*statuses: int) -> str:
        procs = [SimpleNamespace(poll=lambda s=s: s, pid=100 + s) for s in statuses]
        return stopped_message(ended_ranks(procs), "lost peer")

    plain = "The same command with --ckpt_path last resumes from the last checkpoint"
    for statuses in ((-9,), (143, 0), (-9, 130)):
        assert said(*statuses).endswith(f"(lost peer). {plain}"), statuses
    assert "local rank 1 (PID 243) stopped with status 143" in said(143)
    assert "local rank 1 (PID 65) was killed by signal 35;" in said(-35, -9)
    assert said(-9, 1).endswith(
        "(lost peer). Where a rank that exited printed an error above, put it right first: the "
        "same command with --ckpt_path last resumes from the last checkpoint"
    )


def test_the_rank_watch_ends_quietly_when_every_rank_ends_well_or_rank_0_reports(watched):
    assert watched.stdout.splitlines()[1:4:2] == ["returned", "returned"]
    assert watched.stderr.startswith("asr: training stopped: local rank 1"), "not quiet before"


def test_sigterm_under_ddp_raises_the_flag_and_passes_it_on_without_a_collective(monkeypatch):
    """A broadcast from the handler meets whatever collective the other rank is in (a
    deadlock); the training loop broadcasts rank 0's flag before each step instead."""
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False)
    killed = []
    monkeypatch.setattr(trainer.strategy, "_launcher", SimpleNamespace(kill=killed.append))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda *_, **__: pytest.fail("collective"))
    sigterm_without_collective(trainer)
    for _ in range(2):
        trainer._signal_connector._sigterm_notifier_fn(signal.SIGTERM, None)
    assert trainer.received_sigterm and killed == [signal.SIGTERM]


def test_the_sigterm_handler_goes_with_the_trainer_ddp_spawn_pickles():
    """ddp_spawn pickles the trainer for its processes: a local function as its handler
    stopped it with a traceback."""
    trainer = L.Trainer(accelerator="cpu", strategy="ddp_spawn", devices=2, logger=False)
    sigterm_without_collective(trainer)
    copied = pickle.loads(pickle.dumps(trainer))
    copied._signal_connector._sigterm_notifier_fn(signal.SIGTERM, None)  # no ranks started
    assert copied.received_sigterm and not trainer.received_sigterm


@pytest.mark.parametrize(
    ("sigterm", "status", "said"),
    [(True, 128 + signal.SIGTERM, "asr: training stopped by SIGTERM; the same command"),
     (False, 1, "asr: training stopped: another process of the job ended (")],
)  # fmt: skip
def test_a_rank_that_had_sigterm_says_so_where_its_peer_stopped_first(
    monkeypatch, capsys, sigterm, status, said
):
    """Under DDP, a rank told of SIGTERM may fail in a collective on its peer that SIGTERM
    stopped first: it reported a lost peer and exited 1."""
    error = RuntimeError("[pair.cc:547] Connection closed by peer [127.0.0.1]:34470")
    trainer = SimpleNamespace(received_sigterm=sigterm)

    def fit_failing_on_its_peer(cli, *args, **kwargs):  # Lightning tells every callback
        for callback in vars(asr.train.ASRCLI).values():
            if isinstance(callback, L.Callback):
                callback.on_exception(trainer, None, error)
        raise error

    monkeypatch.setattr(asr.train.ASRCLI, "__init__", fit_failing_on_its_peer)
    with pytest.raises(SystemExit) as stopped:
        run_lightning_cli(["fit"])
    err = capsys.readouterr().err
    assert stopped.value.code == status and err.startswith(said) and err.count("\n") == 1, err


def _saved_run(folder: Path, logger) -> tuple[Path, Namespace]:
    """A run's saved config.yaml in `folder` with `logger`, and the config it reads as."""
    saved = {"trainer": {"default_root_dir": str(folder)},
             "checkpoint": {"dirpath": str(folder / "checkpoints")}}  # fmt: skip
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    config = Namespace(
        trainer=Namespace(default_root_dir=str(folder), logger=logger),
        checkpoint=Namespace(dirpath=str(folder / "checkpoints")),
        step_checkpoint=Namespace(dirpath=str(folder / "checkpoints")),
    )
    return folder / "config.yaml", config


@pytest.mark.parametrize("logger", [False, "run", "tb"])
def test_a_saved_run_without_a_list_of_loggers_given_another_root_goes_there(
    tmp_path, logger, capsys
):
    """Its checkpoint folder is derived anew from the root given, as with the default loggers;
    before, no logger list told it was the saved run's, which was refused or resumed. A logger
    of the saved run's folder logs below the new root, a new run of its own; one of a folder of
    its own, or none, is kept as it is."""
    one = Namespace(class_path="lightning.pytorch.loggers.WandbLogger",
                    init_args=Namespace(save_dir=str(tmp_path / str(logger)), version="abc",
                                        project="mine"))  # fmt: skip
    path, config = _saved_run(tmp_path / "run", one if logger else False)
    config.trainer.default_root_dir = str(tmp_path / "other")
    argv = ["fit", "--config", str(path), "--trainer.default_root_dir", str(tmp_path / "other")]
    assert _run_root(config, argv) == str(tmp_path / "other")
    assert config.checkpoint.dirpath is None and config.step_checkpoint.dirpath is None
    assert config.trainer.logger is (one if logger else False)
    moved = Namespace(save_dir=str(tmp_path / "other"), version=None, project="mine")
    kept = Namespace(save_dir=str(tmp_path / "tb"), version="abc", project="mine")
    if logger:
        assert one.init_args == (moved if logger == "run" else kept)
    said = f"is not --trainer.default_root_dir {tmp_path / 'other'}: checkpoints "
    said += "and logs go below" if logger == "run" else "go below"
    assert said in capsys.readouterr().err


def test_a_checkpoint_folder_chosen_beside_another_root_is_kept(tmp_path):
    """A config whose checkpoint folder is not the one derived from its root chose it."""
    path, config = _saved_run(tmp_path / "run", False)
    chosen = {"trainer": {"default_root_dir": str(tmp_path / "run")},
              "checkpoint": {"dirpath": str(tmp_path / "chosen")}}  # fmt: skip
    path.write_text(yaml.safe_dump(chosen))
    config.checkpoint.dirpath = config.step_checkpoint.dirpath = str(tmp_path / "chosen")
    config.trainer.default_root_dir = str(tmp_path / "other")
    assert _run_root(config, ["fit", "--config", str(path)]) == str(tmp_path / "other")
    assert config.checkpoint.dirpath == str(tmp_path / "chosen")


def test_the_epoch_clock_counts_a_validation_within_an_epoch_once(monkeypatch):
    """A validation within the epoch (val_check_interval) is validation time only, and the
    checkpoints saved after it (Lightning runs ModelCheckpoint last) other time: neither is
    the next batch's loading."""
    now = [0.0]
    monkeypatch.setattr("asr.train.time.perf_counter", lambda: now[0])
    trainer = SimpleNamespace(datamodule=None, sanity_checking=False, is_global_zero=False)
    module = SimpleNamespace(device=torch.device("cpu"))
    clock = EpochClock()

    def at(seconds: float, hook: str, *args) -> None:
        now[0] = seconds
        getattr(clock, hook)(trainer, module, *args)

    at(0.0, "on_train_epoch_start")
    at(1.0, "on_train_batch_start", None, 0)  # 1 s loading
    at(3.0, "on_train_batch_end", None, None, 0)  # 2 s step
    at(3.5, "on_validation_start")
    at(9.5, "on_validation_end")  # 6 s validation, then checkpoints saved
    at(10.0, "on_train_batch_start", None, 1)
    at(12.0, "on_train_batch_end", None, None, 1)  # 2 s step
    at(12.5, "on_train_batch_start", None, 2)  # 0.5 s loading
    at(14.5, "on_train_batch_end", None, None, 2)  # 2 s step
    at(15.0, "on_validation_start")
    at(16.0, "on_validation_end")  # the epoch's own validation: its loading counts in the next
    at(16.5, "on_train_epoch_start")
    at(17.5, "on_train_batch_start", None, 0)  # 1 s loading
    at(18.0, "on_fit_end")
    epoch, following = clock.epochs
    assert following["data"] == 1.0
    assert {k: epoch[k] for k in ("wall", "steps", "data", "validation", "other")} == {
        "wall": 16.5,
        "steps": 6.0,
        "data": 1.5,
        "validation": 7.0,
        "other": 2.0,
    }
