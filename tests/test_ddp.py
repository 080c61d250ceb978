"""Data-parallel training over two CPU processes (gloo): equal to one process, equal counts
per rank, and a lost rank stopped clearly and resumed exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import test_lightning
from conftest import REPO, run_forked
from test_lightning import SHAPE_GRID, _fit_args

pytestmark = [pytest.mark.needs_corpus, pytest.mark.timeout(600)]
tiny_an4 = test_lightning.tiny_an4  # the fixture

# Runs `asr fit` and writes each rank's report. AS_RANKS=N: one process plays N ranks, taking
# their batches in turn (to be accumulated). KILL_AT_STEP: rank KILL_RANK SIGKILLs itself
# right after the first checkpoint at or past that step, and rank 0 then sleeps LATE_RANK0_S
# seconds before its next collective, as a loaded machine can make it.
SCRIPT = """
import json, os, signal, sys, time
import lightning as L
import asr.lightning
from asr.data.sampler import DynamicBucketSampler
from asr.train import run_lightning_cli

losses = []
training_step = asr.lightning.ASRModule.training_step

def recording_step(self, batch, batch_idx):
    loss = training_step(self, batch, batch_idx)
    losses.append(float(loss))
    return loss

asr.lightning.ASRModule.training_step = recording_step
ranks = int(os.environ.get("AS_RANKS", "0"))

class RanksInTurn(DynamicBucketSampler):
    def __init__(self, *args, num_replicas=None, rank=None, **kwargs):
        super().__init__(*args, num_replicas=1, rank=0, **kwargs)
        self.ranks = [DynamicBucketSampler(*args, num_replicas=ranks, rank=r, **kwargs)
                      for r in range(ranks)]

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        for sampler in self.ranks:
            sampler.set_epoch(epoch)

    def __iter__(self):
        for batches in zip(*self.ranks, strict=True):
            yield from batches

    def __len__(self):
        return sum(len(sampler) for sampler in self.ranks)

if ranks:
    asr.lightning.DynamicBucketSampler = RanksInTurn

kill_at, kill_rank = int(os.environ.get("KILL_AT_STEP", "0")), int(os.environ.get("KILL_RANK", "1"))
late = float(os.environ.get("LATE_RANK0_S", "0"))
save = L.Trainer.save_checkpoint

def save_then_die(self, *args, **kwargs):
    save(self, *args, **kwargs)
    if kill_at and self.global_step >= kill_at:
        if self.global_rank == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.global_rank == 0:
            time.sleep(late)

L.Trainer.save_checkpoint = save_then_die
cli = run_lightning_cli(sys.argv[1:])
trainer = cli.trainer
report = {
    "world": trainer.world_size, "steps": trainer.global_step, "losses": losses,
    "batches": trainer.num_training_batches,
    "epoch_loss": float(trainer.callback_metrics["train/loss_epoch"]),
    "weights": {name: value.tolist() for name, value in cli.model.state_dict().items()},
}
with open(f"{trainer.default_root_dir}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(report, f)
"""

DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2"]

# Runs `asr validate` and writes each rank's logged metrics.
VALIDATE_SCRIPT = """
import json, sys
from asr.train import run_lightning_cli
trainer = run_lightning_cli(sys.argv[1:]).trainer
with open(f"{trainer.default_root_dir}/metrics{trainer.global_rank}.json", "w") as f:
    json.dump({name: float(value) for name, value in trainer.callback_metrics.items()}, f)
"""


def _steps_args(data: dict[str, str], root: Path, steps: int) -> list[str]:
    """`steps` optimizer steps over epochs of small batches, without validation."""
    return _fit_args(data, root) + [
        "--trainer.max_steps", str(steps),
        "--trainer.max_epochs", "-1",
        "--trainer.check_val_every_n_epoch", "100000",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "false",
        "--data.init_args.max_batch_seconds", "6",
    ]  # fmt: skip


def _start(tmp_path: Path, args: list[str], **env: str) -> subprocess.Popen:
    script = tmp_path / "fit.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=500)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _fit(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    return _wait(_start(tmp_path, args, **env))


def _reports(root: Path, world: int) -> list[dict]:
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(world)]


def test_two_processes_train_as_one_process_accumulating_both_ranks_batches(tiny_an4, tmp_path):
    """Same global batch, same seed: DDP's averaged gradients are one process's accumulated
    ones, so 200 steps give the same loss on every batch, the same weights and the same logged
    epoch loss."""
    no_dropout = [
        "--model.init_args.encoder.init_args.dropout", "0",
        "--model.init_args.decoder.init_args.dropout", "0",
    ]  # fmt: skip
    two, one = tmp_path / "two", tmp_path / "one"
    ranks = _start(tmp_path, _steps_args(tiny_an4, two, 200) + no_dropout + DDP)
    accumulate = ["--trainer.accumulate_grad_batches", "2"]
    # Forked from this process, the one-process run need not import Lightning again; it runs
    # while the ranks start theirs.
    args = _steps_args(tiny_an4, one, 200) + no_dropout + accumulate
    proc = run_forked(textwrap.dedent(SCRIPT), args, {"AS_RANKS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _wait(ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]

    (rank0, rank1), (alone,) = _reports(two, 2), _reports(one, 1)
    assert rank0["steps"] == rank1["steps"] == alone["steps"] == 200
    # Nine utterances over many epochs: each epoch gives both ranks the same batch count
    # (else one would wait at its end) and leaves them the same weights.
    assert rank0["batches"] == rank1["batches"] > 0, "equal batch counts per rank"
    assert rank0["weights"] == rank1["weights"], "ranks hold the same weights"
    assert len(rank0["losses"]) == len(rank1["losses"]) == 200
    in_turn = [loss for pair in zip(rank0["losses"], rank1["losses"]) for loss in pair]
    assert rank0["losses"] != rank1["losses"], "the ranks should train on different batches"
    assert in_turn == pytest.approx(alone["losses"], rel=1e-5, abs=1e-6)
    # the last epoch's mean loss is over both ranks' batches, as one process logs it
    assert rank0["epoch_loss"] == rank1["epoch_loss"] == pytest.approx(alone["epoch_loss"], 1e-5)
    for name, value in alone["weights"].items():
        np.testing.assert_allclose(rank0["weights"][name], value, 1e-4, 1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["mid-epoch", "epoch-end"])
def test_an_epoch_resumed_on_two_ranks_logs_the_mean_of_all_its_batches(tiny_an4, tmp_path, stop):
    """Both ranks' sums of the batches before the stop go into the checkpoint; every rank logs
    them again when resumed (at the epoch's end, one rank alone would leave the other waiting
    in the sync of the epoch's means)."""
    epochs = ["--trainer.max_epochs", "2"]
    whole = _fit(tmp_path, [*_steps_args(tiny_an4, tmp_path / "whole", -1), *epochs, *DDP])
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = _reports(tmp_path / "whole", 2)[0]
    batches = expected["batches"]
    at = batches + batches // 2 if stop == "mid-epoch" else batches
    assert _fit(tmp_path, [*_steps_args(tiny_an4, tmp_path / "stopped", at), *DDP]).returncode == 0
    args = [*_steps_args(tiny_an4, tmp_path / "stopped", 2 * batches), *DDP, "--ckpt_path", "last"]
    resumed = _wait(_start(tmp_path, args))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reports = _reports(tmp_path / "stopped", 2)
    assert reports[0]["steps"] == expected["steps"] == 2 * batches
    for report in reports:  # the second epoch's mean: whole, or begun before the stop
        assert report["epoch_loss"] == pytest.approx(expected["epoch_loss"], rel=1e-5)


# The default sampler's equal shares over processes are asserted by the 200-step test above;
# the grid's in-process in tests/data/test_sampler.py.
@pytest.mark.slow
def test_ranks_get_equal_batch_counts_from_an_odd_count_on_the_shape_grid(tiny_an4, tmp_path):
    """Nine utterances cannot be shared equally: a rank with fewer batches would leave the
    other waiting at the epoch's end. Both ranks finish each epoch with the same weights, and
    validating the result on two processes gives one process's metrics."""
    quiet = [
        "--trainer.check_val_every_n_epoch", "100000",  # epochs end on both ranks: no decoding
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "false",
    ]  # fmt: skip
    proc = _fit(tmp_path, _fit_args(tiny_an4, tmp_path) + quiet + SHAPE_GRID + DDP)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = _reports(tmp_path, 2)
    assert [r["world"] for r in reports] == [2, 2]
    assert reports[0]["batches"] == reports[1]["batches"] > 0, "equal batch counts per rank"
    assert reports[0]["steps"] == reports[1]["steps"]
    assert reports[0]["weights"] == reports[1]["weights"], "ranks hold the same weights"
    _validating_on_two_processes_gives_one_processs_metrics(tiny_an4, tmp_path)


def _validating_on_two_processes_gives_one_processs_metrics(tiny_an4, tmp_path: Path) -> None:
    """Three dev utterances, one a batch: a rank gets a repeat, which its metrics ignore."""
    script, last = tmp_path / "validate.py", tmp_path / "checkpoints" / "last.ckpt"
    script.write_text(textwrap.dedent(VALIDATE_SCRIPT))
    metrics, said = [], []
    for world, root in ((2, tmp_path / "v2"), (1, tmp_path / "v1")):
        args = ["validate", *_fit_args(tiny_an4, root)[1:], "--ckpt_path", str(last),
                "--data.init_args.max_batch_size", "1", "--trainer.logger", "false",
                "--trainer.enable_progress_bar", "false"]  # fmt: skip
        if world > 1:  # Lightning starts the other rank as this script again
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            proc = subprocess.run([sys.executable, str(script), *args, *DDP], env=env,
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
        else:
            proc = run_forked(textwrap.dedent(VALIDATE_SCRIPT), args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics.append([json.loads((root / f"metrics{r}.json").read_text()) for r in range(world)])
        said.append(proc.stderr)
    (first, second), (single,) = metrics
    assert "repeating utterance(s)" in said[0] and "repeating" not in said[1]
    assert first == second and set(first) >= {"val/wer", "val/cer", "val/loss", "val/acc"}
    assert first == pytest.approx(single, rel=1e-5)


@pytest.mark.slow  # three two-rank runs, one waiting out Lightning's watch: tens of seconds
def test_a_killed_rank_stops_the_job_clearly_and_the_resumed_run_is_exact(tiny_an4, tmp_path):
    """SIGKILL of rank 1 mid-epoch: rank 0 stops with a message naming it (no hang), and the
    same command with --ckpt_path last ends as the uninterrupted run does, dropout and
    SpecAugment included (each rank's random state is in the checkpoint)."""
    augmented = [
        "--model.init_args.frontend.init_args.augment", "asr.frontends.SpecAugment",
        "--step_checkpoint.every_n_steps", "5",
    ]  # fmt: skip
    full, killed = tmp_path / "full", tmp_path / "killed"
    # the uninterrupted run beside the killed one, which mostly waits
    uninterrupted = _start(tmp_path, _steps_args(tiny_an4, full, 20) + augmented + DDP)

    args = _steps_args(tiny_an4, killed, 20) + augmented + DDP
    # Rank 0 reaches its next collective 7 s after the kill: later than Lightning's own
    # watch over its children (every 5 s), which SIGKILLs every process with no word of why.
    proc = _fit(tmp_path, args, KILL_AT_STEP="10", LATE_RANK0_S="7")
    done = _wait(uninterrupted)
    assert done.returncode == 0, done.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "local rank 1" in proc.stderr and "killed by SIGKILL" in proc.stderr, proc.stderr[-3000:]
    assert "--ckpt_path last resumes" in proc.stderr
    assert not (killed / "rank0.json").exists()

    proc = _fit(tmp_path, args + ["--ckpt_path", "last"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (expected, _), (resumed, other) = _reports(full, 2), _reports(killed, 2)
    assert resumed["steps"] == expected["steps"] == 20
    assert resumed["weights"] == expected["weights"], "the resumed run differs"
    assert other["weights"] == resumed["weights"]
