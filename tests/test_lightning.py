"""End-to-end training through the `asr fit` LightningCLI in one process (two: test_ddp.py)."""

from __future__ import annotations

import csv
import dataclasses
import gc
import json
import logging
import math
import os
import re
import shutil
import signal
import textwrap
import warnings
import weakref
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import soundfile
import torch
from conftest import corpus_path, run_forked
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.loops.progress import _BatchProgress

import asr.lightning
from asr.checkpoint import RECOGNIZER_KEY, best_checkpoints
from asr.cli import main
from asr.data.cmvn import compute_cmvn_stats
from asr.data.dataset import set_loader_epoch
from asr.data.manifest import read_manifest, write_manifest
from asr.data.prepare import prepare_corpus
from asr.data.sampler import LengthGrid
from asr.data.shards import write_shards
from asr.frontends import Frontend, LogMelFilterbank
from asr.lightning import TOKEN_MULTIPLE, ASRDataModule, ASRModule, _position_keeper
from asr.lm import LMModule, TextDataModule
from asr.models.lm import LSTMLM
from asr.models.transformer import TransformerDecoder, TransformerEncoder
from asr.recognizer import load_model
from asr.search import length_bound
from asr.segment import segment_seconds_for
from asr.text import train_tokenizer
from asr.train import KERNEL_CACHE_VARIABLE, RunCheckpoint, _keep_compiled_kernels

pytestmark = pytest.mark.needs_corpus

TINY_CONFIG = """
seed_everything: 0
model:
  class_path: asr.lightning.ASRModule
  init_args:
    frontend:
      class_path: asr.frontends.Frontend
      init_args:
        features: {class_path: asr.frontends.LogMelFilterbank, init_args: {n_mels: 40}}
        normalize:
          class_path: asr.frontends.GlobalCMVN
          init_args: {stats_path: CMVN_STATS_FILE}
    encoder:
      class_path: asr.models.transformer.TransformerEncoder
      init_args: {d_model: 32, num_heads: 2, ffn_dim: 64, num_layers: 1}
    decoder:
      class_path: asr.models.transformer.TransformerDecoder
      init_args: {d_model: 32, num_heads: 2, ffn_dim: 64, num_layers: 1}
    ctc_weight: 0.3
    plot_utterances: 1
data:
  class_path: asr.lightning.ASRDataModule
  init_args:
    max_batch_seconds: 12
    num_workers: 0
trainer:
  max_epochs: 2
  accelerator: cpu
  log_every_n_steps: 1
  enable_model_summary: false
"""


@pytest.fixture(scope="module")
def tiny_an4(tmp_path_factory) -> dict[str, str]:
    """Nine short AN4 training utterances (an odd count), three for validation, a tokenizer."""
    out = tmp_path_factory.mktemp("tiny_an4")
    prepare_corpus("an4", corpus_path("an4"), out / "full")
    train = [u for u in read_manifest(out / "full" / "train.jsonl") if u.duration < 2.5][:9]
    dev = [u for u in read_manifest(out / "full" / "dev.jsonl") if u.duration < 2.5][:3]
    write_manifest(out / "train.jsonl", train)
    write_manifest(out / "dev.jsonl", dev)
    train_tokenizer(out / "train.jsonl", "char", None, out / "tokenizer")
    compute_cmvn_stats(out / "train.jsonl", LogMelFilterbank(n_mels=40), out / "cmvn.json")
    (out / "config.yaml").write_text(TINY_CONFIG.replace("CMVN_STATS_FILE", str(out / "cmvn.json")))
    return {
        "config": str(out / "config.yaml"),
        "train": str(out / "train.jsonl"),
        "dev": str(out / "dev.jsonl"),
        "tokenizer": str(out / "tokenizer"),
    }


SHAPE_GRID = ["--data.shape_grid", "1.1"]


def _fit_args(data: dict[str, str], root: Path) -> list[str]:
    return [
        "fit",
        "--config", data["config"],
        "--data.train_manifest", data["train"],
        "--data.val_manifest", data["dev"],
        "--data.tokenizer", data["tokenizer"],
        "--trainer.default_root_dir", str(root),
    ]  # fmt: skip


def test_fit_writes_config_checkpoints_logs_and_plots(
    tiny_an4, tmp_path, caplog, recwarn, capsys, monkeypatch
):
    with caplog.at_level(logging.INFO):
        main(_fit_args(tiny_an4, tmp_path))
    said = f"asr fit: checkpoints in {tmp_path / 'checkpoints'}; logs and config.yaml in "
    err = capsys.readouterr().err
    assert said + str(tmp_path / "logs" / "version_0") in err and "max_time" not in err
    assert "Trainer.fit` stopped" in caplog.text, "Lightning's own log is kept"
    assert "Tip:" not in caplog.text, "no advertisement in the training log"
    assert not [w for w in recwarn if "LeafSpec" in str(w.message)]
    run = tmp_path / "logs" / "version_0"
    assert (run / "config.yaml").is_file(), "the resolved config is saved with the run"
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "last.ckpt" in ckpts and any(n.startswith("epoch001-wer") for n in ckpts)
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    wers = [float(r["val/wer"]) for r in rows if r.get("val/wer")]
    assert len(wers) == 2 and all(0 <= w <= 100 * 20 for w in wers)
    assert list((run / "attention").glob("epoch001_*.png")), "attention plots are written"
    assert list(run.glob("events.out.tfevents.*")), "TensorBoard logs are written"
    clocks = [r for r in rows if r.get("time/epoch_s")]
    assert len(clocks) == 2, "each epoch's wall time and its parts are logged"
    for r in clocks:
        parts = sum(float(r[f"time/{p}_s"]) for p in ("steps", "data", "validation", "other"))
        assert float(r["time/epoch_s"]) == pytest.approx(parts)
        assert float(r["time/steps_s"]) > 0 and float(r["time/validation_s"]) > 0
        assert float(r["time/audio_s"]) > 0
        if Path("/proc/self/statm").exists():
            assert 0 < float(r["memory/rss_gb"]) < 1000

    # The saved config again, into another folder: the run goes there, the first one is kept.
    before = (run / "metrics.csv").read_text(), (tmp_path / "checkpoints" / "last.ckpt").stat()
    other = tmp_path / "again"
    main(["fit", "--config", str(run / "config.yaml"), "--trainer.default_root_dir", str(other),
          "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
          "--data.init_args.max_batch_size", "1",
          "--model.init_args.plot_utterances", "2"])  # fmt: skip
    assert (other / "checkpoints" / "last.ckpt").is_file()
    assert (other / "logs" / "version_0" / "metrics.csv").is_file()
    # validation batches of one utterance: the plots are of the first batches
    assert len(list((other / "logs" / "version_0" / "attention").glob("epoch000_*.png"))) == 2
    after = (run / "metrics.csv").read_text(), (tmp_path / "checkpoints" / "last.ckpt").stat()
    assert after == before
    # its folders spelt from `~`, as a config written by hand may: the same, expanded alike
    monkeypatch.setenv("HOME", str(tmp_path.parent))
    home = (run / "config.yaml").read_text().replace(str(tmp_path), f"~/{tmp_path.name}")
    (tmp_path / "home.yaml").write_text(home)
    main(["fit", "--config", str(tmp_path / "home.yaml"), "--trainer.default_root_dir",
          str(tmp_path / "home"), "--trainer.max_epochs", "1",
          "--trainer.limit_train_batches", "1"])  # fmt: skip
    assert (tmp_path / "home" / "checkpoints" / "last.ckpt").is_file()
    after = (run / "metrics.csv").read_text(), (tmp_path / "checkpoints" / "last.ckpt").stat()
    assert after == before


def test_a_fast_dev_run_writes_nothing(tiny_an4, tmp_path, capsys):
    """Lightning's smoke test left a last.ckpt, which refused the real run in the folder (or,
    resumed as advised, trained its first epoch on one batch), and an attention plot."""
    every_step = ["--step_checkpoint.every_n_steps", "1"]
    clock = ["--epoch_clock.path", str(tmp_path / "new" / "epochs.json")]  # its folder: none
    assert main([*_fit_args(tiny_an4, tmp_path), "--trainer.fast_dev_run", "true", *every_step,
                 *clock]) == 0  # fmt: skip
    assert not [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]
    assert "asr fit: checkpoints in" not in capsys.readouterr().err, "said: logs in None"


def test_validation_without_decoding_keeps_checkpoints_by_accuracy(tiny_an4, tmp_path):
    """As `asr fit` advises; the checkpoints are named by the accuracy (by default they were
    named by a WER that Lightning filled in as 0.00)."""
    args = _fit_args(tiny_an4, tmp_path) + [
        "--model.init_args.greedy_validation", "false",
        "--checkpoint.monitor", "val/acc", "--checkpoint.mode", "max",
    ]  # fmt: skip
    main(args)
    run = tmp_path / "logs" / "version_0"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r for r in rows if r.get("val/acc")] and not any(r.get("val/wer") for r in rows)
    assert any(p.name.startswith("epoch001-acc") for p in (tmp_path / "checkpoints").iterdir())
    assert list((run / "attention").glob("epoch001_*.png")), "the references' attention"


def test_validation_runs_every_epoch_when_the_batch_count_changes(tiny_an4, tmp_path):
    """Shuffled buckets pack differently each epoch, so epochs differ in batch count (here
    5, 5, 5, 4, 5, 4); every epoch must still end with a validation (Lightning counts an
    epoch's batches when it builds the loader)."""
    args = _fit_args(tiny_an4, tmp_path) + [
        "--trainer.max_epochs", "6",
        "--data.max_batch_seconds", "5",
        "--data.num_buckets", "1",
        "--trainer.limit_val_batches", "1",
        "--model.init_args.plot_every_n_epochs", "3",
    ]  # fmt: skip
    main(args)
    run = tmp_path / "logs" / "version_0"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    val_steps = [int(r["step"]) for r in rows if r.get("val/wer")]
    assert len(val_steps) == 6, "one validation per epoch"
    per_epoch = {b - a for a, b in zip([-1, *val_steps], val_steps)}
    assert len(per_epoch) > 1, "the epochs should differ in batch count for this test to bite"
    plotted = sorted(p.name[:8] for p in (run / "attention").glob("*.png"))
    assert plotted == ["epoch002", "epoch005"], "plots after every third epoch only"


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_the_same_seed_twice_gives_identical_weights(tiny_an4, tmp_path, precision, recwarn):
    """Reproducibility as users need it: a config and seed trained twice give the same model
    (dropout, SpecAugment, speed perturbation and shuffling all follow the seed)."""
    weights = []
    for run in ("a", "b"):
        root = tmp_path / run
        main(_fit_args(tiny_an4, root) + ["--trainer.max_epochs", "1",
                                          "--trainer.precision", precision,
                                          "--trainer.enable_model_summary", "true"])  # fmt: skip
        state = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
        weights.append(state["state_dict"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # the summary's bf16 size warning is filtered: nothing a user could act on
    assert not [w for w in recwarn if "model summary" in str(w.message)]


def test_a_whole_batch_limit_is_a_count_of_batches(tiny_an4, tmp_path):
    """`--trainer.limit_train_batches 1` runs one batch an epoch, not every batch (1.0, as
    Lightning's float-first annotation reads it); a fraction stays a fraction."""
    steps = {}
    for limit in ("1", "0.5", "1.0"):
        root = tmp_path / limit
        main(_fit_args(tiny_an4, root) + ["--trainer.max_epochs", "1",
                                          "--trainer.limit_train_batches", limit])  # fmt: skip
        state = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
        steps[limit] = state["global_step"]
    assert steps["1"] == 1 and steps["1.0"] > 2, steps
    assert steps["0.5"] == pytest.approx(steps["1.0"] / 2, abs=1)


def test_last_ckpt_is_the_final_state_when_that_epoch_is_not_among_the_best(tiny_an4, tmp_path):
    """Lightning writes last.ckpt only beside a best-k save; a later epoch outside the best k
    must still refresh it, or a resumed run repeats epochs and `last.ckpt` is not the last."""
    never_better = ["--checkpoint.monitor", "step", "--checkpoint.mode", "min"]
    main(_fit_args(tiny_an4, tmp_path) + never_better + ["--checkpoint.save_top_k", "1"])
    folder = tmp_path / "checkpoints"
    assert len(list(folder.glob("epoch*.ckpt"))) == 1, "only the first epoch is the best 1"
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] == 2 * _steps_per_epoch(tmp_path)


def test_an_epoch_cut_short_by_max_steps_is_not_ranked_by_the_last_validation(tiny_an4, tmp_path):
    """max_steps ends the second epoch before its validation: its weights go to last.ckpt,
    not among the best under the first epoch's score."""
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.limit_train_batches", "2",
                                          "--trainer.max_steps", "3"])  # fmt: skip
    folder = tmp_path / "checkpoints"
    assert [p.name[:8] for p in folder.glob("epoch*.ckpt")] == ["epoch000"]
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3
    (record,) = (v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert [Path(p).name[:8] for p in record["best_k_models"]] == ["epoch000"]


def test_a_first_epoch_cut_short_by_max_steps_says_nothing_of_its_score(tiny_an4, tmp_path, capsys):
    """Not validated, it has no val/wer to rank by: rightly not filed among the best, but
    Lightning warned that the monitored key was never logged, as if the config were wrong.
    A metric that validation has not logged once it ran is still refused."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_steps", "2"])
    assert not [w for w in caught if "could not find the monitored key" in str(w.message)]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["last.ckpt"]
    misnamed = ["--trainer.max_epochs", "1", "--checkpoint.monitor", "train/loss"]
    said = refused([*_fit_args(tiny_an4, tmp_path / "misnamed"), *misnamed], capsys)
    assert "(monitor='train/loss')` could not find the monitored key" in said
    never = ["--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0"]
    with warnings.catch_warnings(record=True) as caught:  # a run that never validates: said
        warnings.simplefilter("always")
        main([*_fit_args(tiny_an4, tmp_path / "never"), *never])
    assert [w for w in caught if "could not find the monitored key" in str(w.message)]


def _steps_per_epoch(root: Path) -> int:
    first = torch.load(next((root / "checkpoints").glob("epoch000*.ckpt")), weights_only=True)
    return first["global_step"]


def test_resume_from_last_and_average(tiny_an4, tmp_path, capsys, monkeypatch):
    """A rerun with `--ckpt_path last` continues the same experiment; `asr average` writes a
    checkpoint whose weights are the mean of the best ones."""
    filters = list(warnings.filters)
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "1"])
    assert warnings.filters == filters, "a fit's warning filters end with it"
    assert not logging.getLogger("lightning.pytorch.utilities.rank_zero").filters
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "2", "--ckpt_path", "last"])
    # resuming writes into the run's own checkpoint folder by design: no caution about it
    assert not [w for w in caught if "exists and is not empty" in str(w.message)]
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 1 and resumed["global_step"] > 0
    assert (tmp_path / "logs" / "version_1").is_dir(), "the resumed run logs to a new version"
    # the file `last` named, for the curves: the config keeps `last`, which may name none
    recorded = [(tmp_path / f"logs/version_{v}/resumed_from.txt").read_text() for v in (0, 1)]
    assert recorded == ["\n", f"{last}\n"]
    # the optimizer's and schedule's saved states would override these, or half of them
    capsys.readouterr()
    argv = [*_fit_args(tiny_an4, tmp_path), "--ckpt_path", "last"]
    for option, value in (("optimizer", "torch.optim.SGD"), ("lr_scheduler", "asr.optim.NoamLR")):
        said = refused([*argv, f"--model.init_args.{option}", value], capsys)
        assert said.startswith(f"asr fit: error: --model.init_args.{option}")
        assert "resuming" in said and "init_from" in said
    overlay = tmp_path / "schedule.yaml"  # in a config file as on the command line
    overlay.write_text("model:\n  init_args:\n    lr_scheduler: asr.optim.NoamLR\n")
    assert "--model.init_args.lr_scheduler: " in refused([*argv, "--config", str(overlay)], capsys)
    saved = torch.load(last, weights_only=True)  # a checkpoint that does not say what it ran
    del saved["asr_optimization"]
    torch.save(saved, last)
    said = refused([*argv, "--model.init_args.lr_scheduler", "asr.optim.NoamLR"], capsys)
    assert said.startswith("asr fit: error: --model.init_args.lr_scheduler: resuming")
    # a vocabulary of the same size in another order would train on with every label remapped
    spec = json.loads((Path(tiny_an4["tokenizer"]) / "tokenizer.json").read_text())
    trained = spec["vocab"]
    spec["vocab"] = trained[::-1]
    reordered = tmp_path / "reordered"
    reordered.mkdir()
    (reordered / "tokenizer.json").write_text(json.dumps(spec))
    said = refused([*argv, "--data.tokenizer", str(reordered)], capsys)
    assert said.startswith(f"asr fit: error: {last}: trained with another tokenizer")
    assert f"id 4 is '▁' there, {trained[-1]!r} here" in said  # pieces show a space as ▁
    # resuming by name or by file sets the model as trained: a changed setting is refused alike
    weighted = tmp_path / "weighted.yaml"  # an edited config as the option
    weighted.write_text("model:\n  init_args:\n    ctc_weight: 0.5\n")
    for name, named in (("last", f"last ({last})"), (str(last), str(last))):
        argv = [*_fit_args(tiny_an4, tmp_path), "--ckpt_path", name]
        said = refused([*argv, "--model.init_args.ctc_weight", "0.5"], capsys)
        assert f"ctc_weight: 0.5 now, 0.3 when trained: --ckpt_path {named} sets it" in said
        said = refused([*argv, "--config", str(weighted)], capsys)
        assert f"model.init_args.ctc_weight: 0.5 now, 0.3 when trained: --ckpt_path {named}" in said
    monkeypatch.setenv("HOME", str(tmp_path.parent))  # the run's folder spelt from `~`
    argv = [*_fit_args(tiny_an4, Path("~") / tmp_path.name), "--ckpt_path", "last"]
    said = refused([*argv, "--model.init_args.ctc_weight", "0.5"], capsys)
    assert f"ctc_weight: 0.5 now, 0.3 when trained: --ckpt_path last ({last}) sets it" in said

    out = tmp_path / "avg.ckpt"
    assert main(["average", "--last", str(last), "--best", "2", "--out", str(out)]) == 0
    averaged = torch.load(out, weights_only=True)
    sources = [torch.load(p, weights_only=True) for p in averaged["averaged_from"]]
    assert len(sources) == 2
    name = "model.decoder.output.bias"
    expected = (sources[0]["state_dict"][name] + sources[1]["state_dict"][name]) / 2
    torch.testing.assert_close(averaged["state_dict"][name], expected)
    # weights: no state to resume, nor records of a run's best checkpoints
    assert not {"optimizer_states", "lr_schedulers", "loops", "callbacks"} & set(averaged)
    said = refused([*_fit_args(tiny_an4, tmp_path), "--ckpt_path", str(out)], capsys)
    assert f"{out}: weights without a training state" in said and "init_from" in said
    kept = last.read_bytes()
    sources = [str(p) for p in averaged["averaged_from"]]
    assert main(["average", "--checkpoints", *sources, "--out", str(last)]) == 2
    assert f"{last} holds a training state" in capsys.readouterr().err
    assert last.read_bytes() == kept

    def latest() -> Path:
        return max((tmp_path / "logs").glob("version_*"), key=lambda p: int(p.name[8:]))

    test_args = _fit_args(tiny_an4, tmp_path)[1:] + ["--data.test_manifest", tiny_an4["dev"]]
    main(["test", *test_args, "--ckpt_path", str(out)])  # the averaged model scores the test set
    tested = latest()
    rows = list(csv.DictReader((tested / "metrics.csv").open()))
    assert [r for r in rows if r.get("test/wer")], "asr test reports the test WER"
    logged = (tested / "metrics.csv").read_text()
    main(["test", "--config", str(tested / "config.yaml")])  # the config it saved re-runs
    assert (tested / "metrics.csv").read_text() == logged, "its logs kept: a version of its own"
    assert latest() != tested and (latest() / "metrics.csv").is_file()
    # `best` in a new process: the best that last.ckpt records
    main(["test", *test_args, "--ckpt_path", "best"])
    saved = (latest() / "config.yaml").read_text()
    assert f"ckpt_path: {best_checkpoints(last, 1)[0]}" in saved
    said = refused(["test", *test_args, "--ckpt_path", "best", "--model.init_args.ctc_weight",
                    "0.9"], capsys)  # fmt: skip
    best = best_checkpoints(last, 1)[0]
    assert f"ctc_weight: 0.9 now, 0.3 when trained: --ckpt_path best ({best}) sets it" in said
    # what validation reports is not the model's: as the config (file or options) says
    overlay = tmp_path / "quiet.yaml"
    overlay.write_text("model:\n  init_args:\n    greedy_validation: false\n")
    main(["validate", *test_args, "--ckpt_path", str(out), "--config", str(overlay)])
    assert "val/wer" not in (latest() / "metrics.csv").read_text().splitlines()[0]
    # model options the checkpoint's hyperparameters would replace, silently
    unheard = ["--model.init_args.ctc_weight", "0.1"]
    said = f"--model.init_args.ctc_weight: 0.1 now, 0.3 when trained: --ckpt_path {out} sets it"
    assert said in refused(["test", *test_args, "--ckpt_path", str(out), *unheard], capsys)
    heard = ["--model.init_args.frontend.init_args.normalize.init_args.stats_path", "moved.json"]
    assert "moved.json" in refused(["test", *test_args, "--ckpt_path", str(out), *heard], capsys)
    # a setting that holds no weights: the weights fit, and it scored as another model
    hop = ["--model.init_args.frontend.init_args.features.init_args.hop_length", "320"]
    said = refused(["test", *test_args, "--ckpt_path", str(out), *hop], capsys)
    setting = "frontend.features.hop_length is 160 there, 320 here"
    expected = f"{out}: trained with other settings than this config's: {setting}; give the "
    assert said.startswith(f"asr test: error: {expected}config it was trained with"), said
    # settings of training alone, one given as trained, and a class spelled by another module
    # of it, pass
    same = ["--model.init_args.encoder.init_args.dynamic_chunk", "16",
            "--model.init_args.ctc_weight", "0.3",
            "--model.init_args.frontend.init_args.features",
            "asr.frontends.features.LogMelFilterbank"]  # fmt: skip
    assert main(["test", *test_args, "--ckpt_path", str(out), *same]) == 0
    # files that are no checkpoint of this model: one line naming the file, no traceback
    text, torn, other = tmp_path / "notes.ckpt", tmp_path / "torn.ckpt", tmp_path / "other.ckpt"
    text.write_text("not a checkpoint\n")
    torn.write_bytes(out.read_bytes()[:5000])
    averaged["state_dict"]["model.decoder.output.bias"] = torch.zeros(3)
    torch.save(averaged, other)
    lm = tmp_path / "lm.ckpt"  # another kind: Lightning's parser printed a page, no file named
    torch.save(averaged | {"hyper_parameters": {"_class_path": "asr.lm.LMModule"}}, lm)
    for path, says in (
        (lm, "a language model checkpoint, and the config trains a recognizer"),
        (text, "not a checkpoint"),
        (torn, "not a readable checkpoint"),
        (other, "its weights are not this config's model: model.decoder.output.bias is (3,) "),
    ):
        for command in ("validate", "test"):
            said = refused([command, *test_args, "--ckpt_path", str(path)], capsys)
            assert said.startswith(f"asr {command}: error: {path}: {says}"), said
    # `--ckpt_path=~/x`, which no shell expands: the file in the home folder
    monkeypatch.setenv("HOME", str(tmp_path))
    said = refused(["validate", *test_args, f"--ckpt_path=~/{text.name}"], capsys)
    assert said.startswith(f"asr validate: error: {text}: not a checkpoint"), said


@pytest.mark.gpu
def test_fit_resume_and_decode_on_a_gpu(tiny_an4, tmp_path):
    """The user path on CUDA in bf16: fit, resume with `--ckpt_path last`, decode on the GPU,
    and load the GPU-trained checkpoint on a CPU."""
    args = _fit_args(tiny_an4, tmp_path) + ["--trainer.accelerator", "gpu"]
    args += ["--trainer.devices", "1", "--trainer.precision", "bf16-mixed"]
    main(args + ["--trainer.max_epochs", "1"])
    main(args + ["--trainer.max_epochs", "2", "--ckpt_path", "last"])
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 1

    out = tmp_path / "decode"
    decode = ["--manifest", tiny_an4["dev"], "--out", str(out), "--beam-size", "2"]
    assert main(["evaluate", "--checkpoint", str(last), "--device", "cuda", *decode]) == 0
    assert json.loads((out / "metrics.json").read_text())["utterances"] == 3
    assert load_model(last, "cpu").device.type == "cpu"


def test_a_moved_run_folder_resumes_as_its_own(tiny_an4, tmp_path):
    """A run folder copied or moved elsewhere and resumed there keeps its best-k record
    (remapped to the new folder) and its single `last.ckpt`."""
    main(_fit_args(tiny_an4, tmp_path / "old") + ["--trainer.max_epochs", "1"])
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")
    main(
        _fit_args(tiny_an4, tmp_path / "new") + ["--trainer.max_epochs", "2", "--ckpt_path", "last"]
    )
    folder = tmp_path / "new" / "checkpoints"
    assert sorted(p.name for p in folder.glob("last*")) == ["last.ckpt"]
    state = torch.load(folder / "last.ckpt", weights_only=True)
    assert state["epoch"] == 1
    (record,) = [v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert record["dirpath"] == str(folder)
    kept = sorted(Path(p).name for p in record["best_k_models"])
    assert kept == sorted(p.name for p in folder.glob("epoch*.ckpt")) and len(kept) == 2
    assert all(Path(p).parent == folder for p in record["best_k_models"])
    assert Path(record["last_model_path"]) == folder / "last.ckpt"


def test_run_checkpoint_keeps_a_record_whose_files_are_elsewhere(tmp_path):
    """Resuming another run's checkpoint into a new folder starts a fresh best-k record there
    (Lightning's rule); the state key is ModelCheckpoint's, so either class loads the other's."""
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "epoch000.ckpt").touch()  # one of the two recorded files
    record = {
        "dirpath": str(tmp_path / "old"),
        "best_model_path": str(tmp_path / "old" / "epoch000.ckpt"),
        "best_model_score": torch.tensor(50.0),
        "best_k_models": {str(tmp_path / "old" / f"epoch00{i}.ckpt"): 50.0 for i in (0, 1)},
    }
    callback = RunCheckpoint(dirpath=tmp_path / "new", monitor="val/wer")
    callback.load_state_dict(record)
    assert callback.best_k_models == {}
    assert callback.state_key == ModelCheckpoint(monitor="val/wer").state_key


def refused(argv: list[str], capsys) -> str:
    """What `asr fit ARGV` says as it stops with status 2 (a one-line error, no traceback)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err, err
    return err


def _with_a_short_clip(tiny_an4, tmp_path, stated: float) -> list[str]:
    """One epoch's `asr fit` arguments, the training manifest with a 0.12 s clip "short" added
    whose line states `stated` seconds."""
    from asr.data.manifest import Utterance

    wave = tmp_path / "short.wav"
    soundfile.write(wave, np.random.default_rng(0).normal(0, 0.1, 1920), 16000)
    train = tmp_path / "train.jsonl"
    write_manifest(
        train, [*read_manifest(tiny_an4["train"]), Utterance(str(wave), stated, "A", "short")]
    )
    return [*_fit_args(tiny_an4 | {"train": str(train)}, tmp_path), "--trainer.max_epochs", "1"]


def test_an_utterance_too_short_for_the_encoder_is_named_before_training(
    tiny_an4, tmp_path, capsys
):
    """A clip above data.min_duration that subsampling by 8 (or the fastest speed
    perturbation) leaves no encoder frame: training stopped at the first batch holding it,
    perhaps epochs in, with no name."""
    args = _with_a_short_clip(tiny_an4, tmp_path, 0.12)
    eight = ["--model.init_args.encoder.init_args.subsampling", "8"]
    said = refused([*args, *eight], capsys)
    assert "1 training utterance(s) too short for the encoder, which needs 0.1" in said
    assert "short (0.120 s); leave them out with data.min_duration 0.1" in said
    fast = ["--data.speed_perturb", "[1.0, 1.5]"]  # 0.08 s at 1.5x: too short for 4x too
    said = refused([*args, *fast], capsys)
    assert "before speed perturbation by 1.5): short (0.120 s)" in said
    shards = tmp_path / "shards"  # a stream's ids are not at hand, its durations are
    write_shards(tmp_path / "train.jsonl", shards, shard_hours=1.0)
    said = refused([*args, *eight, "--data.train_manifest", str(shards)], capsys)
    assert "which needs 0.1" in said and ": the shortest 0.120 s; shard a manifest without" in said


def test_audio_shorter_than_its_manifest_says_is_named_when_its_batch_comes(
    tiny_an4, tmp_path, capsys
):
    """Within the manifest check's tolerance, a duration that overstates the audio passes the
    check before training; the batch that holds it then names it."""
    args = _with_a_short_clip(tiny_an4, tmp_path, 0.2)
    said = refused([*args, "--model.init_args.encoder.init_args.subsampling", "8"], capsys)
    assert "asr fit: error: utterance short has 0.120 s of audio" in said
    assert "too short for subsampling by 8" in said


def test_a_missing_tokenizer_is_one_line_not_the_config_dumped(tiny_an4, tmp_path, capsys):
    """jsonargparse wraps the error of building the data module in a dump of its config; the
    error alone was a bare errno and a path, no option."""
    args = _fit_args(tiny_an4 | {"tokenizer": str(tmp_path / "no_tokenizer")}, tmp_path)
    said = refused(args, capsys)
    missing = f"data.tokenizer: {tmp_path / 'no_tokenizer'}: no tokenizer there (`asr tokenizer`"
    assert said.startswith(f"asr fit: error: {missing}") and "Given value" not in said


def test_a_setting_lightning_refuses_is_one_line_not_a_traceback(tiny_an4, tmp_path, capsys):
    said = refused([*_fit_args(tiny_an4, tmp_path), "--checkpoint.monitor", "null"], capsys)
    assert said.startswith("asr fit: error: ModelCheckpoint(save_top_k=") and "monitor=None" in said


def test_checkpoints_chosen_by_a_wer_validation_will_not_log_are_refused(tiny_an4, tmp_path,
                                                                         capsys):  # fmt: skip
    """greedy_validation false under the default monitor (val/wer) trained an epoch, then
    stopped with a MisconfigurationException."""
    args = _fit_args(tiny_an4, tmp_path) + ["--model.init_args.greedy_validation", "false"]
    assert "logs no val/wer to choose checkpoints by: set --checkpoint.monitor val/acc" in (
        refused(args, capsys))  # fmt: skip
    assert not (tmp_path / "checkpoints").exists()
    misspelt = _fit_args(tiny_an4, tmp_path) + ["--checkpoint.monitor", "val/los"]
    assert ("--checkpoint.monitor val/los: validation logs no such metric (did you mean "
            "val/loss?); it logs val/loss, val/att_loss") in refused(misspelt, capsys)  # fmt: skip
    # metrics of parts the model has not: logged by no validation of it
    no_ctc = ["--model.init_args.ctc_weight", "0", "--checkpoint.monitor", "val/ctc_loss"]
    assert "val/ctc_loss: validation logs none (model.ctc_weight is 0: no CTC head)" in refused(
        _fit_args(tiny_an4, tmp_path) + no_ctc, capsys
    )
    inter = _fit_args(tiny_an4, tmp_path) + ["--checkpoint.monitor", "val/inter_ctc_loss"]
    assert "(model.inter_ctc_weight is 0: no intermediate CTC)" in refused(inter, capsys)
    greedy_off = ["--model.init_args.greedy_validation", "false", "--checkpoint.monitor", "val/acc"]
    stopped_on_wer = [
        "--trainer.callbacks+=EarlyStopping",
        "--trainer.callbacks.monitor",
        "val/wer",
    ]
    said = refused(_fit_args(tiny_an4, tmp_path) + greedy_off + stopped_on_wer, capsys)
    assert "EarlyStopping monitor val/wer: validation logs none (model.greedy_validation" in said
    stopping = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/accuracy"]
    assert (
        "--trainer.callbacks EarlyStopping monitor val/accuracy: validation logs no such "
        "metric (did you mean val/acc?)"
    ) in refused(  # fmt: skip
        _fit_args(tiny_an4, tmp_path) + stopping, capsys
    )
    # an accuracy under the default mode, min: the worst checkpoints kept, an early stop at best
    said = refused(_fit_args(tiny_an4, tmp_path) + greedy_off, capsys)
    assert "--checkpoint.monitor val/acc under mode min takes the worst value for the best: " \
        "give --checkpoint.mode max" in said  # fmt: skip
    stopping = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/acc"]
    said = refused(_fit_args(tiny_an4, tmp_path) + stopping, capsys)
    assert "EarlyStopping monitor val/acc under mode min takes the worst value for the best: " \
        "give --trainer.callbacks.mode max" in said  # fmt: skip
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--trainer.accumulate_grad_batches", "0"], "accumulate_grad_batches is 0: must be at"),
        (["--data.num_workers", "-1"], "data.num_workers is -1: must be at least 0"),
        (["--trainer.gradient_clip_val=-1"], "gradient_clip_val is -1: must be at least 0"),
        (["--trainer.check_val_every_n_epoch", "0"], "check_val_every_n_epoch is 0: must be at"),
        (["--trainer.val_check_interval", "0"], "val_check_interval is 0: must be above 0"),
        (["--data.max_batch_seconds", "0"], "max_batch_seconds must be > 0, got 0"),
        (["--model.init_args.optimizer", "torch.optim.AdamW",
          "--model.init_args.optimizer.init_args.lr", "-0.001"],
         "model.init_args.optimizer: Invalid learning rate: -0.001"),  # once the model is built
        pytest.param(["--trainer.accelerator", "gpu"], "this machine has no CUDA GPU",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here")),
    ],
)  # fmt: skip
def test_settings_torch_or_lightning_stop_on_are_said_not_dumped(
    tiny_an4, tmp_path, capsys, option, said
):
    assert said in refused(_fit_args(tiny_an4, tmp_path) + option, capsys)


def test_data_read_at_another_rate_than_the_frontends_is_refused(tiny_an4, tmp_path, capsys):
    """16 kHz features of 8 kHz audio: every recording heard at twice its speed, silently."""
    args = _fit_args(tiny_an4, tmp_path) + ["--data.init_args.sample_rate", "8000"]
    said = "the data are read at 8000 Hz (data.sample_rate), the frontend takes 16000 Hz"
    assert said in refused(args, capsys)


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_half_precision_weights_are_refused_before_training(tiny_an4, tmp_path, capsys,
                                                            precision):  # fmt: skip
    """They met the frontend's float32 features with a torch dtype RuntimeError."""
    args = _fit_args(tiny_an4, tmp_path) + ["--trainer.precision", precision]
    assert f"--trainer.precision {precision}: the frontend makes float32 features" in (
        refused(args, capsys))  # fmt: skip


def test_bad_manifest_fails_up_front_or_is_skipped(tiny_an4, tmp_path, capsys):
    lines = Path(tiny_an4["train"]).read_text().splitlines()
    missing = json.loads(lines[1]) | {"audio_filepath": str(tmp_path / "gone.wav")}
    lines[1] = json.dumps(missing)
    bad = tmp_path / "train_bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    args = _fit_args(tiny_an4 | {"train": str(bad)}, tmp_path) + ["--trainer.max_epochs", "1"]
    assert re.search(r"asr fit: error: .*train_bad.jsonl:2: .*gone.wav", refused(args, capsys))
    main(args + ["--data.skip_bad", "true"])
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    lines[0] = json.dumps(json.loads(lines[0]) | {"audio_filepath": str(tmp_path / "gone.wav")})
    again = tmp_path / "again"  # every line bad: nothing to train on, even skipping
    bad.write_text("\n".join(lines[:2]) + "\n")
    skipped = _fit_args(tiny_an4 | {"train": str(bad)}, again) + ["--data.skip_bad", "true"]
    assert "0 good, 2 bad: no utterance to use" in refused(skipped, capsys)


@pytest.mark.parametrize(
    ("edit", "options", "reason"),
    [
        ({"duration": 0.05}, [], r"duration 0.050 s is below 0.1 s"),
        ("nan", ["--data.check_audio", "full"], r"NaN or infinite samples"),
    ],
    ids=["too-short", "nan-samples"],
)
def test_fit_start_rejects_short_and_nan_audio(tiny_an4, tmp_path, edit, options, reason, capsys):
    lines = Path(tiny_an4["train"]).read_text().splitlines()
    entry = json.loads(lines[2])
    if edit == "nan":
        samples = np.zeros(16000, np.float32)
        samples[10] = np.nan
        soundfile.write(tmp_path / "nan.wav", samples, 16000, subtype="FLOAT")
        entry |= {"audio_filepath": str(tmp_path / "nan.wav"), "duration": 1.0}
    else:
        entry |= edit
    lines[2] = json.dumps(entry)
    bad = tmp_path / "train_bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    args = _fit_args(tiny_an4 | {"train": str(bad)}, tmp_path) + ["--trainer.max_epochs", "1"]
    assert re.search(rf"train_bad.jsonl:3: .*{reason}", refused(args + options, capsys))


def test_checkpoints_are_never_taken_for_another_runs(tiny_an4, tmp_path, capsys):
    """Validating or testing no trained model, and a new run among an earlier run's
    checkpoints (whose stale last.ckpt `asr average --last` would read), are refused."""
    for command in ("validate", "test"):
        argv = [command, *_fit_args(tiny_an4, tmp_path)[1:]]
        assert "give --ckpt_path" in refused(argv, capsys)
        assert "--ckpt_path last: no " in refused([*argv, "--ckpt_path", "last"], capsys)
    step = ["torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size", "1"]
    optimizers = {"optimizer": ["torch.optim.SGD"], "lr_scheduler": step}
    for name, value in optimizers.items():  # LightningCLI's own: not this module's
        argv = [*_fit_args(tiny_an4, tmp_path), f"--{name}", *value]
        assert f"the modules here take theirs as model.init_args.{name}" in refused(argv, capsys)
    said = refused([*_fit_args(tiny_an4, tmp_path), "--ckpt_path", "best"], capsys)
    assert "--ckpt_path best: asr fit resumes a run from last" in said
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch003-wer9.00.ckpt").write_bytes(b"")
    for resume in ([], ["--ckpt_path", "last"]):  # last.ckpt gone: a fresh run began among them
        said = refused([*_fit_args(tiny_an4, tmp_path), *resume], capsys)
        assert "holds an earlier run's checkpoints (epoch003-wer9.00.ckpt...) but no last" in said
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    said = refused(_fit_args(tiny_an4, tmp_path), capsys)
    assert "holds an earlier run's checkpoints: --ckpt_path last resumes it; to start afresh, " \
        "give another --trainer.default_root_dir" in said  # fmt: skip
    given = [
        *_fit_args(tiny_an4, tmp_path / "new"),
        "--checkpoint.dirpath",
        str(tmp_path / "checkpoints"),
    ]
    assert "give another --checkpoint.dirpath" in refused(given, capsys), "the root moves it not"


def test_checkpoint_is_self_contained(tiny_an4, tmp_path):
    """load_model rebuilds the recognizer from the checkpoint alone: config, tokenizer and CMVN
    statistics travel inside it (the training files are moved away first)."""
    data = {k: str(tmp_path / "data" / Path(v).name) for k, v in tiny_an4.items()}
    shutil.copytree(Path(tiny_an4["config"]).parent, tmp_path / "data")
    config = Path(data["config"])
    config.write_text(config.read_text().replace(str(Path(tiny_an4["config"]).parent),
                                                 str(tmp_path / "data")))  # fmt: skip
    main(_fit_args(data, tmp_path) + ["--trainer.max_epochs", "1"])
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    shutil.rmtree(tmp_path / "data")
    recognizer = load_model(ckpt)
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    for name, value in recognizer.model.state_dict().items():
        torch.testing.assert_close(value, state[f"model.{name}"])
    assert recognizer.tokenizer.vocab_size == recognizer.model.vocab_size
    assert recognizer.sample_rate == 16000 and not recognizer.model.training
    durations = [utt.duration for utt in read_manifest(tiny_an4["train"])]
    assert recognizer.segment_seconds == segment_seconds_for(durations)  # for transcribe
    rates = [
        (len(recognizer.tokenizer.encode(utt.text)) + 1) / utt.duration
        for utt in read_manifest(tiny_an4["train"])
    ]
    assert recognizer.tokens_per_second >= max(rates)  # the output bound (speed perturbed)


def test_a_transcript_too_long_for_its_audio_is_named_and_not_taken_for_fast_speech(
    tiny_an4, tmp_path, caplog
):
    """Its CTC loss is zero (no path fits): the fit says so, and the output bound stored for
    decoding stays that of the real speech."""
    utterances = read_manifest(tiny_an4["train"])
    wrong = dataclasses.replace(utterances[3], text="YES " * 300)
    write_manifest(tmp_path / "train.jsonl", [*utterances[:3], wrong, *utterances[4:]])
    args = _fit_args({**tiny_an4, "train": str(tmp_path / "train.jsonl")}, tmp_path)
    with caplog.at_level(logging.WARNING, logger="asr.lightning"):
        main([*args, "--trainer.max_epochs", "1"])
    said = [r.getMessage() for r in caplog.records if "too long for their audio" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 training transcript(s) too long")
    recognizer = load_model(tmp_path / "checkpoints" / "last.ckpt")
    frames = recognizer.model.encoder_frames(round(wrong.duration * 16000))
    assert f"{wrong.utt_id} (1199 CTC frames, audio gives {frames})" in said[0]
    assert said[0].endswith("Check their text and duration")
    rates = [(len(recognizer.tokenizer.encode(u.text)) + 1) / u.duration for u in utterances]
    assert max(rates) <= recognizer.tokens_per_second < 2 * max(rates)
    # none fits the encoder's 40 ms frames, all the features' 10 ms: the frames are too few,
    # which the data alone was blamed for; none fitting either, the data are
    for letters, said in ((2, "None fits: the encoder gives a frame per 40 ms"),
                          (20, "Check their text and duration")):  # fmt: skip
        caplog.clear()
        long = [dataclasses.replace(u, text="YES" * round(letters / 3 * u.duration / 0.04))
                for u in utterances]  # fmt: skip
        write_manifest(tmp_path / f"all{letters}.jsonl", long)
        data = {**tiny_an4, "train": str(tmp_path / f"all{letters}.jsonl")}
        args = _fit_args(data, tmp_path / f"all{letters}")
        with caplog.at_level(logging.WARNING, logger="asr.lightning"):
            main([*args, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"])
        assert f"{len(utterances)} training transcript(s) too long" in caplog.text
        assert said in caplog.text


KILL_SCRIPT = """
import os, signal, sys
import lightning as L
from asr.train import run_lightning_cli

kill_at = int(os.environ["KILL_AT_STEP"])
save = L.Trainer.save_checkpoint

kill_with = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))
group = "KILL_GROUP" in os.environ  # as a scheduler or `timeout` signals: loader workers too
if group:  # the signal comes while the loop waits for a slow loader worker's batch
    import threading, time
    import asr.data.dataset as dataset

    os.setsid()
    load = dataset.load_audio
    dataset.load_audio = lambda *args, **kwargs: time.sleep(0.2) or load(*args, **kwargs)

def save_then_die(self, *args, **kwargs):  # the signal right after the step checkpoint is written
    save(self, *args, **kwargs)
    if self.global_step >= kill_at and group:
        threading.Timer(0.1, os.killpg, (0, kill_with)).start()
    elif self.global_step >= kill_at:
        os.kill(os.getpid(), kill_with)

L.Trainer.save_checkpoint = save_then_die
run_lightning_cli(sys.argv[1:])
"""


def fit_then_signal(args: list[str], at_step: int, signal: str = "SIGKILL", group: bool = False):
    """`asr fit args` that sends itself (`group`: its process group) `signal` right after the
    first checkpoint at or past `at_step`: KILL_SCRIPT forked from this process, which has
    imported Lightning already."""
    env = {"KILL_AT_STEP": str(at_step), "KILL_SIGNAL": signal} | (
        {"KILL_GROUP": ""} if group else {}
    )
    return run_forked(textwrap.dedent(KILL_SCRIPT), args, env)


WAVE_AUGMENT = {
    "noise": {"prob": 0.6, "kinds": ["pink", "babble"]},
    "reverb": {"prob": 0.4},
    "narrowband": {"prob": 0.4},
    "gain": {"prob": 0.5},
}


def _augmented_args(data: dict[str, str], root: Path) -> list[str]:
    """Speed perturbation, waveform augmentation (babble included), SpecAugment and dropout
    on: every RNG consumer must resume."""
    return _fit_args(data, root) + [
        "--trainer.max_epochs", "3",
        "--data.speed_perturb", "[0.9, 1.0, 1.1]",
        "--data.augment", json.dumps(WAVE_AUGMENT),
        "--model.init_args.frontend.init_args.augment", "asr.frontends.SpecAugment",
        "--step_checkpoint.every_n_steps", "1",
    ]  # fmt: skip


LOGGED = ["--trainer.log_every_n_steps", "1"]
ACCUMULATE_LOGGED = ["--trainer.accumulate_grad_batches", "2", *LOGGED]


@pytest.fixture(scope="module")
def uninterrupted(tiny_an4, tmp_path_factory):
    """`uninterrupted(grid)`: last.ckpt of the 3-epoch `_augmented_args` run that an
    interrupted one must match, trained once per batch-shape option."""
    runs: dict[tuple[str, ...], dict] = {}

    def run(grid: list[str]) -> dict:
        if tuple(grid) not in runs:
            root = tmp_path_factory.mktemp("uninterrupted")
            main(_augmented_args(tiny_an4, root) + grid)
            last = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
            runs[tuple(grid)] = last | {"epoch_means": _epoch_means(root)}
        return runs[tuple(grid)]

    return run


def _epoch_means(root: Path) -> dict[tuple[int, str], float]:
    """Each epoch's training means, as the last of the run's log versions to log them gave."""
    means = {}
    for version in sorted((root / "logs").iterdir(), key=lambda p: int(p.name.split("_")[1])):
        for row in csv.DictReader((version / "metrics.csv").open()):
            for name, value in row.items():
                if name.startswith("train/") and name.endswith("_epoch") and value:
                    means[int(row["epoch"]), name] = float(value)
    return means


def _middle_of_second_epoch(full: dict) -> tuple[int, int]:
    """(steps per epoch, a step in the middle of the second epoch) of a 3-epoch run."""
    steps_per_epoch = full["global_step"] // 3
    middle = steps_per_epoch + steps_per_epoch // 2
    assert steps_per_epoch >= 2 and middle % steps_per_epoch
    return steps_per_epoch, middle


def _assert_same_end(full: dict, resumed: dict) -> None:
    assert resumed["global_step"] == full["global_step"], "steps were skipped or repeated"
    for name, value in full["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), f"{name} differs after resume"


@pytest.mark.timeout(600)
# The grid sampler's exact resume is asserted in tests/data/test_sampler.py, in-process.
@pytest.mark.parametrize(
    "grid", [[], pytest.param(SHAPE_GRID, marks=pytest.mark.slow)], ids=["longest", "grid"]
)
def test_sigkill_mid_epoch_then_resume_equals_uninterrupted_run(
    tiny_an4, tmp_path, grid, uninterrupted
):
    full, killed_root = uninterrupted(grid), tmp_path / "killed"
    steps_per_epoch, kill_at = _middle_of_second_epoch(full)

    args = _augmented_args(tiny_an4, killed_root) + grid
    proc = fit_then_signal(args, kill_at)
    assert proc.returncode == -9, proc.stderr[-3000:]
    last = killed_root / "checkpoints" / "last.ckpt"
    killed = torch.load(last, weights_only=True)
    assert killed["global_step"] == kill_at and killed["epoch"] == 1
    assert killed["ASRDataModule"]["train_sampler"]["batches_yielded"] == kill_at % steps_per_epoch

    main(args + ["--ckpt_path", "last"])  # the same command, resumed
    _assert_same_end(full, torch.load(last, weights_only=True))
    assert _epoch_means(killed_root) == pytest.approx(full["epoch_means"], rel=1e-5)


def test_a_resume_with_other_loader_workers_trains_its_restarted_epoch_whole(tiny_an4, tmp_path):
    """Another count of loader workers (or processes) deals other batches: the resumed epoch
    starts again from its first batch, and runs to its last, as the same run started afresh;
    not the batches left after those trained before the stop."""
    shards = tmp_path / "shards"
    write_shards(tiny_an4["train"], shards, shard_hours=2 / 3600)
    quick = ["--data.train_manifest", str(shards), "--data.max_batch_seconds", "3",
             "--trainer.max_epochs", "1", "--trainer.check_val_every_n_epoch", "100",
             "--trainer.num_sanity_val_steps", "0",
             "--step_checkpoint.every_n_steps", "1"]  # fmt: skip

    def batches(root: Path) -> int:  # a step a batch
        return torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]

    main([*_fit_args(tiny_an4, tmp_path / "afresh"), *quick, "--data.num_workers", "2"])
    whole = batches(tmp_path / "afresh")
    args = [*_fit_args(tiny_an4, tmp_path / "resumed"), *quick]
    proc = fit_then_signal([*args, "--data.num_workers", "0"], 2)
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert batches(tmp_path / "resumed") == 2 < whole
    main([*args, "--data.num_workers", "2", "--ckpt_path", "last"])
    assert batches(tmp_path / "resumed") == 2 + whole
    # its means are over the restarted epoch's utterances, not those before the stop too
    sizes = [
        {k: n for k, (_, n) in torch.load(path, weights_only=True)["asr_epoch_sums"].items()}
        for path in (tmp_path / run / "checkpoints" / "last.ckpt" for run in ("afresh", "resumed"))
    ]
    assert sizes[1] == sizes[0]


def test_an_epoch_resumed_mid_way_shows_its_number_and_length(tiny_an4, tmp_path, capfd):
    """Lightning skips the epoch-start hook where the bar takes them: "Training: 2/?"."""
    args = [*_fit_args(tiny_an4, tmp_path), "--trainer.max_epochs", "2",
            "--trainer.limit_train_batches", "4", "--trainer.num_sanity_val_steps", "0",
            "--trainer.limit_val_batches", "0", "--step_checkpoint.every_n_steps", "1",
            "--data.max_batch_seconds", "3", "--trainer.enable_progress_bar", "true"]  # fmt: skip
    assert fit_then_signal(args, 2).returncode == -9
    capfd.readouterr()
    main([*args, "--ckpt_path", "last"])
    bar = capfd.readouterr().out.replace("\r", "\n")  # Lightning's bar writes to stdout
    assert re.search(r"^Epoch 0: +50%.* 2/4 ", bar, re.M), bar
    assert re.search(r"^Epoch 0: +100%.* 4/4 ", bar, re.M), bar
    assert re.search(r"^Epoch 1: +100%.* 4/4 ", bar, re.M), bar
    assert set(re.findall(r"(\d+)/\?", bar)) <= {"0"}, bar
    assert not re.search(r"<-|-[\d.]+it/s", bar), "no rate < 0 as the next epoch starts"


def test_a_plateau_schedule_resumed_goes_on_as_if_never_stopped(tiny_an4, tmp_path):
    """Lightning steps ReduceLROnPlateau after the epoch's checkpoints are written, and skips
    the step of an epoch resumed mid-way: a run resumed at an epoch's end, or killed in the
    middle of one, goes on as the uninterrupted run, its rate halved after epoch 1."""
    plateau = [
        "--model.init_args.lr_scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau",
        "--model.init_args.lr_scheduler.init_args.patience", "0",
        "--model.init_args.lr_scheduler.init_args.factor", "0.5",
        "--model.init_args.lr_scheduler.init_args.threshold", "0.9",  # every epoch a plateau
        "--trainer.limit_train_batches", "2", "--step_checkpoint.every_n_steps", "1",
    ]  # fmt: skip

    def fit(root: Path, epochs: int, *more: str) -> list[str]:
        args = [*_fit_args(tiny_an4, root), *plateau, "--trainer.max_epochs", str(epochs), *more]
        main(args)
        return args

    fit(tmp_path / "straight", 3)
    fit(tmp_path / "resumed", 1)
    fit(tmp_path / "resumed", 3, "--ckpt_path", "last")
    killed = [*_fit_args(tiny_an4, tmp_path / "killed"), *plateau, "--trainer.max_epochs", "3"]
    proc = fit_then_signal(killed, 3)  # in epoch 1, of 2 steps each
    assert proc.returncode == -9, proc.stderr[-3000:]
    main([*killed, "--ckpt_path", "last"])
    full, *resumed = (
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
        for run in ("straight", "resumed", "killed")
    )
    # epoch 0's step set the best loss, epoch 1's halved the rate (epoch 2's comes after)
    assert full["optimizer_states"][0]["param_groups"][0]["lr"] == 0.5e-3
    for run in resumed:
        assert run["lr_schedulers"] == full["lr_schedulers"]
        _assert_same_end(full, run)


def test_training_plots_take_the_frontends_hop(tiny_an4, tmp_path, monkeypatch):
    """A 20 ms hop drew every utterance at half its length (the 10 ms default)."""
    import asr.plotting

    hops, plot = [], asr.plotting.plot_attention
    monkeypatch.setattr(
        asr.plotting,
        "plot_attention",
        lambda *args, **kw: hops.append(kw.get("frame_shift")) or plot(*args, **kw),
    )
    hop_20ms = ["--model.init_args.frontend.init_args.features.init_args.hop_length", "320"]
    main(_fit_args(tiny_an4, tmp_path) + hop_20ms + ["--trainer.max_epochs", "1"])
    assert hops and all(h == pytest.approx(0.02) for h in hops)


def test_an_audio_cache_with_loader_workers_is_said_to_keep_nothing(tiny_an4, caplog):
    """Each epoch's loader starts new workers (the loaders are made again every epoch)."""
    data = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                         cache_audio=True, num_workers=2)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        data.setup("fit")
    assert "data.num_workers 2 caches nothing for later epochs" in caplog.text


def test_a_resume_point_of_another_batch_plan_restarts_its_epoch(tiny_an4, caplog):
    """Batches are dealt out per world size, and by the batching options: skipping the
    batches of another plan dropped or repeated utterances without a word."""
    data = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                         max_batch_seconds=3, num_workers=0)  # fmt: skip
    data.setup("fit")
    loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=_BatchProgress()))
    data.trainer = SimpleNamespace(
        current_epoch=1, world_size=1, is_global_zero=True, global_rank=0, fit_loop=loop
    )
    whole = len(data.train_dataloader())
    position = {"epoch": 1, "batches_yielded": 2, "seed": 0}
    for world, batches in ((1, whole - 2), (2, whole)):
        data.load_state_dict({"train_sampler": position, "world_size": world})
        with caplog.at_level(logging.WARNING):
            assert len(list(data.train_dataloader())) == batches
    assert "resumed with 1 processes from a checkpoint of 2: epoch 1 starts again" in caplog.text
    planned = position | {"plan": _position_keeper(data.train_dataloader()).plan_digest()}
    other = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                          max_batch_seconds=10, num_buckets=1, num_workers=0)  # fmt: skip
    other.setup("fit")
    other.trainer = data.trainer
    for module, batches in ((data, whole - 2), (other, len(other.train_dataloader()))):
        module.load_state_dict({"train_sampler": planned, "world_size": 1})
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert len(list(module.train_dataloader())) == batches
    assert "resumed with other batches than the checkpoint's" in caplog.text
    seeded = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                           max_batch_seconds=3, num_workers=0, seed=7)  # fmt: skip
    seeded.setup("fit")
    seeded.trainer = data.trainer
    seeded.load_state_dict({"train_sampler": planned, "world_size": 1})
    with caplog.at_level(logging.WARNING):
        assert len(list(seeded.train_dataloader())) == whole
    assert "resumed with data.seed 7 from a checkpoint of 0: epoch 1 starts again" in caplog.text
    assert _position_keeper(seeded.train_dataloader()).seed == 7, "the seed given goes on"


@pytest.mark.timeout(600)
def test_time_limit_mid_epoch_then_longer_limit_resumes_that_epoch(
    tiny_an4, tmp_path, monkeypatch, uninterrupted
):
    """`--trainer.max_time` ends the fit in the middle of an epoch and Lightning saves that
    epoch as finished; the resumed run must still train on the epoch's remaining batches."""
    full, stopped_root = uninterrupted([]), tmp_path / "stopped"
    _, stop_at = _middle_of_second_epoch(full)

    out_of_time = []

    def out_of_time_at_step(timer, trainer):  # the Timer's check, with the clock made a step count
        if trainer.global_step >= stop_at:
            trainer.should_stop = True
            out_of_time.append(True)

    args = _augmented_args(tiny_an4, stopped_root) + ["--step_checkpoint.every_n_steps", "0"]
    with monkeypatch.context() as patch:
        patch.setattr(Timer, "_check_time_remaining", out_of_time_at_step)
        patch.setattr(
            Timer, "time_remaining", lambda timer, mode="train": 0.0 if out_of_time else 60.0
        )
        main(args + ["--trainer.max_time", "00:00:01:00"])
    last = stopped_root / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == stop_at
    # the cut epoch's weights are not filed among the best: its rest is still to train
    assert not list((stopped_root / "checkpoints").glob("epoch001*"))

    main(args + ["--trainer.max_time", "00:01:00:00", "--ckpt_path", "last"])
    _assert_same_end(full, torch.load(last, weights_only=True))  # the cut epoch's rest trained
    assert _epoch_means(stopped_root) == pytest.approx(full["epoch_means"], rel=1e-5)
    assert len(list((stopped_root / "checkpoints").glob("epoch001*"))) == 1, "filed once, whole"


@pytest.mark.timeout(600)
def test_a_time_limit_inside_an_accumulation_window_resumes_exactly(
    tiny_an4, tmp_path, monkeypatch, uninterrupted
):
    """`max_time` may stop a run between two batches of one optimizer step: the gradients of
    the window's batches before the stop are kept for the step, and the resumed run logs its
    steps as the uninterrupted one does."""
    accumulate = ACCUMULATE_LOGGED
    full, stopped_root = uninterrupted(accumulate), tmp_path / "stopped"
    stopped = []

    def out_of_time_mid_window(timer, trainer):  # the third batch of the second epoch
        if (
            trainer.current_epoch == 1
            and trainer.fit_loop.epoch_loop.batch_progress.current.ready == 3
        ):
            trainer.should_stop = True
            stopped.append(True)

    args = _augmented_args(tiny_an4, stopped_root) + accumulate
    args += ["--step_checkpoint.every_n_steps", "0"]
    with monkeypatch.context() as patch:
        patch.setattr(Timer, "_check_time_remaining", out_of_time_mid_window)
        patch.setattr(Timer, "time_remaining", lambda timer, mode="train": 0.0 if stopped else 60.0)
        main(args + ["--trainer.max_time", "00:00:01:00"])
    last = stopped_root / "checkpoints" / "last.ckpt"
    cut = torch.load(last, weights_only=True)
    assert ASRModule.GRADS_KEY in cut, "stopped inside the window"
    main(args + ["--trainer.max_time", "00:01:00:00", "--ckpt_path", "last"])
    _assert_same_end(full, torch.load(last, weights_only=True))
    rows = csv.DictReader((stopped_root / "logs" / "version_1" / "metrics.csv").open())
    steps = [int(row["step"]) for row in rows if row.get("train/loss_step")]
    assert steps[0] == cut["global_step"], "the first step after the stop is logged as its own"


def test_a_step_limit_mid_epoch_then_none_resumes_that_epoch(tiny_an4, tmp_path, uninterrupted):
    """`--trainer.max_steps` ends the fit in the middle of an epoch that is not validated, and
    Lightning saves it as a finished epoch: a run resumed without the limit must still train
    the epoch's rest."""
    unvalidated = ["--trainer.check_val_every_n_epoch", "1000"]
    full, stopped_root = uninterrupted(unvalidated), tmp_path / "stopped"
    _, stop_at = _middle_of_second_epoch(full)
    args = _augmented_args(tiny_an4, stopped_root) + unvalidated
    args += ["--step_checkpoint.every_n_steps", "0"]
    main(args + ["--trainer.max_steps", str(stop_at)])
    last = stopped_root / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == stop_at
    main(args + ["--ckpt_path", "last"])
    _assert_same_end(full, torch.load(last, weights_only=True))
    # the cut epoch's means are over all its batches, those trained before the stop too
    assert _epoch_means(stopped_root) == pytest.approx(full["epoch_means"], rel=1e-5)
    assert (1, "train/loss_epoch") in full["epoch_means"]


def test_an_epoch_not_validated_is_saved_as_last_and_resumed_after(tiny_an4, tmp_path, monkeypatch):
    """Validating every second epoch of three: last.ckpt was left at the second epoch's end, the
    third's training lost to a resume. A resumed run does not write its start again (Lightning
    replays the epoch's end, and a file saved then resumes otherwise)."""
    every_second = ["--trainer.check_val_every_n_epoch", "2"]
    main([*_fit_args(tiny_an4, tmp_path), "--trainer.max_epochs", "2", *every_second])
    last = tmp_path / "checkpoints" / "last.ckpt"
    second = torch.load(last, weights_only=True)
    saved_at, save = [], L.Trainer.save_checkpoint

    def recording_save(trainer, *args, **kwargs):
        saved_at.append(trainer.global_step)
        return save(trainer, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "save_checkpoint", recording_save)
    for epochs in (3, 4):
        main([*_fit_args(tiny_an4, tmp_path), "--trainer.max_epochs", str(epochs),
              *every_second, "--ckpt_path", "last"])  # fmt: skip
        ended = torch.load(last, weights_only=True)
        assert ended["epoch"] == epochs - 1
        assert ended["global_step"] == second["global_step"] * epochs // 2
    assert second["global_step"] not in saved_at, "the step it resumed from, saved again"


def test_a_run_the_time_limit_cut_short_says_so(tiny_an4, tmp_path, capsys):
    """A config's max_time is a guard; where it ends the run first (a slower or busy CPU), the
    recipe would go on to average and decode the half-trained model without a word."""
    main([*_fit_args(tiny_an4, tmp_path), "--trainer.max_epochs", "1000",
          "--trainer.max_time", "00:00:00:01"])  # fmt: skip
    said = capsys.readouterr().err
    assert "asr fit: warning: trainer.max_time ended the run with " in said
    assert "of its 1000 epochs done" in said and "--ckpt_path last and a longer" in said


def test_a_time_limit_in_the_last_epoch_is_not_logged_as_every_epoch_done(
    tiny_an4, tmp_path, capsys, caplog, monkeypatch
):
    """Lightning counts the epoch max_time cut as done: its log said "`max_epochs=1`
    reached" above asr's warning that no epoch was."""
    out_of_time = []

    def out_of_time_at_step_1(timer, trainer):  # the Timer's check, the clock made a step count
        if trainer.global_step >= 1:
            trainer.should_stop = True
            out_of_time.append(True)

    monkeypatch.setattr(Timer, "_check_time_remaining", out_of_time_at_step_1)
    monkeypatch.setattr(
        Timer, "time_remaining", lambda timer, mode="train": 0.0 if out_of_time else 60.0
    )
    with caplog.at_level(logging.INFO):
        main([*_fit_args(tiny_an4, tmp_path), "--trainer.max_epochs", "1",
              "--trainer.max_time", "00:00:01:00"])  # fmt: skip
    assert "with 0 of its 1 epochs done" in capsys.readouterr().err
    assert "Trainer.fit` stopped" not in caplog.text, "it stopped on max_time, said by asr"


def test_a_saved_configs_version_moves_on_and_a_users_own_stays(tmp_path):
    from jsonargparse import Namespace

    from asr.train import _fresh_versions

    (tmp_path / "logs" / "version_0").mkdir(parents=True)
    (tmp_path / "logs" / "version_0" / "metrics.csv").write_text("epoch\n")
    (tmp_path / "tb" / "mine" / "version_0").mkdir(parents=True)
    (tmp_path / "tb" / "mine" / "version_0" / "events").write_text("")

    def logger(save_dir, name):
        args = Namespace(save_dir=str(save_dir), name=name, version=0)
        return Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=args)

    saved, own = logger(tmp_path, "logs"), logger(tmp_path / "tb", "mine")
    _fresh_versions([saved, own], str(tmp_path))
    assert (saved.init_args.version, own.init_args.version) == (1, 0)


def test_a_last_checkpoint_as_a_link_is_refused(tiny_an4, tmp_path, capsys):
    """Lightning's link points at the last best-k file: after epochs that kept none, last.ckpt
    was an old epoch, and --ckpt_path last threw the later ones away."""
    said = refused([*_fit_args(tiny_an4, tmp_path), "--checkpoint.save_last", "link"], capsys)
    assert "checkpoint.save_last link: last.ckpt would point at the last checkpoint kept" in said
    # none: the step checkpoints' last.ckpt was left behind each epoch's end, and resumed from
    said = refused([*_fit_args(tiny_an4, tmp_path), "--checkpoint.save_last", "false"], capsys)
    assert "checkpoint.save_last false: the step checkpoints write last.ckpt" in said
    every = ["--checkpoint.save_last", "link", "--checkpoint.save_top_k", "-1",
             "--trainer.max_steps", "1"]  # fmt: skip
    main([*_fit_args(tiny_an4, tmp_path / "every"), *every])  # each kept: the link is the last


def test_an_epoch_the_time_limit_cut_is_not_counted_as_done(monkeypatch, capsys):
    """Lightning counts the cut epoch as finished: a run cut in its last epoch said nothing,
    one cut in its third said three epochs were done."""
    from asr.train import _say_where

    timer = Timer(duration="00:00:00:01")
    monkeypatch.setattr(Timer, "time_remaining", lambda self: 0.0)
    for is_last_batch, said in ((False, "with 2 of its 3 epochs done"), (True, None)):
        progress = SimpleNamespace(is_last_batch=is_last_batch)
        trainer = SimpleNamespace(
            is_global_zero=True, checkpoint_callback=SimpleNamespace(dirpath="ckpts"), logger=None,
            callbacks=[timer], max_epochs=3, current_epoch=3, fast_dev_run=0,
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
        )  # fmt: skip
        _say_where(SimpleNamespace(subcommand="fit", trainer=trainer))
        err = capsys.readouterr().err
        assert (said in err) if said else "warning" not in err, err


@pytest.mark.parametrize(
    ("name", "status", "said", "every"),
    [("SIGTERM", 128 + signal.SIGTERM, "stopped by SIGTERM", "1"),
     ("SIGINT", 130, "interrupted", "1"),
     ("SIGINT", 130, "interrupted; no last.ckpt was saved yet", "0")],  # nothing to resume
)  # fmt: skip
def test_sigterm_stops_fit_with_a_failing_status_that_says_how_to_resume(
    tiny_an4, tmp_path, name, status, said, every
):
    """Lightning leaves on SIGTERM with status 0 (on Ctrl-C with 1); `asr fit` must fail, or a
    recipe would go on to average and decode an unfinished model, and say how to go on."""
    args = _fit_args(tiny_an4, tmp_path) + ["--step_checkpoint.every_n_steps", every]
    proc = fit_then_signal(args, 2, name)
    assert proc.returncode == status, proc.stderr[-3000:]
    assert said in proc.stderr and ("--ckpt_path last" in proc.stderr) == (every == "1")
    if every == "1":
        last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
        assert last["global_step"] == 2, "stopped at the step the signal came"


def test_sigterm_to_the_process_group_stops_a_fit_with_a_loader_worker_alike(tiny_an4, tmp_path):
    """The worker dies of the signal too, and the loader's error on it came as a traceback
    and status 1, with no word of resuming."""
    args = _fit_args(tiny_an4, tmp_path) + ["--step_checkpoint.every_n_steps", "1"]
    proc = fit_then_signal([*args, "--data.num_workers", "1"], 2, "SIGTERM", group=True)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "stopped by SIGTERM" in proc.stderr and "Traceback" not in proc.stderr


def test_a_run_killed_as_its_first_epoch_validates_validates_it_when_resumed(tiny_an4, tmp_path):
    """A step checkpoint at an epoch's last batch came before its validation: killed during
    that validation, the run resumed from it went on without ever validating the epoch (no
    epoch000 checkpoint, no dev WER for it)."""
    args = _fit_args(tiny_an4, tmp_path / "whole") + ["--trainer.max_epochs", "1"]
    main(args)
    steps = torch.load(tmp_path / "whole" / "checkpoints" / "last.ckpt", weights_only=True)
    root = tmp_path / "killed"
    args = _fit_args(tiny_an4, root) + ["--trainer.max_epochs", "1"]
    args += ["--step_checkpoint.every_n_steps", "1"]
    proc = fit_then_signal(args, steps["global_step"])  # at the first save at the epoch's end
    assert proc.returncode == -9, proc.stderr[-3000:]
    main(args + ["--ckpt_path", "last"])
    assert list((root / "checkpoints").glob("epoch000-*.ckpt")), "the epoch was validated"
    whole = _epoch_means(tmp_path / "whole")
    assert _epoch_means(root) == pytest.approx(whole, rel=1e-5) and whole


@pytest.mark.parametrize("validates", [True, False])
def test_a_step_checkpoint_at_an_epochs_last_batch_waits_for_its_validation(tmp_path, validates):
    """Left to the epoch's own checkpoint after its validation; an epoch that does not
    validate keeps it (no other checkpoint follows), and either way the step counts as saved
    (the next epoch's first batches, accumulating, share its step)."""
    from types import SimpleNamespace

    from asr.train import StepCheckpoint

    saved = []
    loop = SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=True),
                           _should_check_val_epoch=lambda: validates)  # fmt: skip

    def save(path, weights_only=None):  # said: else Lightning prints a line into the bar
        assert weights_only is False
        saved.append(path)

    trainer = SimpleNamespace(global_step=4, fit_loop=SimpleNamespace(epoch_loop=loop),
                              checkpoint_callbacks=[], save_checkpoint=save,
                              fast_dev_run=0)  # fmt: skip
    keeper = StepCheckpoint(every_n_steps=2, dirpath=str(tmp_path))
    keeper.on_train_batch_end(trainer)
    loop.batch_progress.is_last_batch = False  # the next epoch's first batch, same step
    keeper.on_train_batch_end(trainer)
    assert saved == ([] if validates else [tmp_path / "last.ckpt"])


def test_a_step_checkpoint_takes_last_ckpt_in_a_home_folder_as_lightning_does(
    tmp_path, monkeypatch
):
    """Lightning expands `~` in its ModelCheckpoint's folder: compared unexpanded, the step
    save went to a folder named `~` and the epoch's to last-v1.ckpt."""
    from types import SimpleNamespace

    from asr.train import StepCheckpoint

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    run = ModelCheckpoint(dirpath="~/run", save_last=True)
    saved = []
    loop = SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=False))
    trainer = SimpleNamespace(
        global_step=2,
        fit_loop=SimpleNamespace(epoch_loop=loop),
        checkpoint_callbacks=[run],
        save_checkpoint=lambda path, weights_only: saved.append(path),
        fast_dev_run=0,
    )
    keeper = StepCheckpoint(every_n_steps=2, dirpath="~/run")
    assert keeper.state_dict() == {}, "no folder written to yet"
    keeper.on_train_batch_end(trainer)
    assert saved == [tmp_path / "run" / "last.ckpt"]
    assert run.last_model_path == str(tmp_path / "run" / "last.ckpt")
    assert keeper.state_dict() == {"dirpath": os.path.realpath(tmp_path / "run")}  # recorded


def test_step_checkpoints_leave_one_last_checkpoint_the_latest(tiny_an4, tmp_path, monkeypatch):
    """A step checkpoint before the first epoch's end wrote last.ckpt behind Lightning's back:
    it then wrote last-v1.ckpt, and last.ckpt (what average and resume read) stayed stale. The
    run folder is given as recipes give it, relative (here through a link too), where
    Lightning keeps its folder as a resolved path."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    main(_fit_args(tiny_an4, Path("link")) + ["--step_checkpoint.every_n_steps", "1"])
    names = sorted(p.name for p in (tmp_path / "real" / "checkpoints").iterdir())
    assert "last.ckpt" in names and not [n for n in names if n.startswith("last-")], names
    last = torch.load(tmp_path / "real" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["epoch"] == 1, "the end of the run, not a step of the first epoch"


def test_resumed_from_the_first_epochs_checkpoint_the_run_writes_over_last(tiny_an4, tmp_path):
    """The first epoch's best is saved before the run's first last.ckpt, so it records none:
    a run resumed from it took the last.ckpt beside it for another's, wrote last-v1.ckpt, and
    left last.ckpt (what `--ckpt_path last` and `asr average` read) on the old branch."""
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "2"])
    first = next((tmp_path / "checkpoints").glob("epoch000*.ckpt"))
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "3", "--ckpt_path", str(first)])
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert not [n for n in names if n.startswith("last-")], names
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3 * _steps_per_epoch(tmp_path)
    other = tmp_path / "other"  # a checkpoint of another folder: that folder's is not its own
    main(_fit_args(tiny_an4, other) + ["--trainer.max_epochs", "1"])
    own = (other / "checkpoints" / "last.ckpt").read_bytes()
    second = min((tmp_path / "checkpoints").glob("epoch001*.ckpt"))  # the first run's
    main(_fit_args(tiny_an4, other) + ["--trainer.max_epochs", "3", "--ckpt_path", str(second)])
    assert (other / "checkpoints" / "last.ckpt").read_bytes() == own


class _PoisonedLoss(L.Callback):
    """Makes the training loss NaN on every step."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        loss = type(module.model).loss

        def nan_loss(*args, **kwargs):
            out = loss(module.model, *args, **kwargs)
            return dataclasses.replace(out, loss=out.loss * float("nan"))

        module.model.loss = nan_loss

    def on_train_end(self, trainer, module) -> None:
        del module.model.loss  # back to the class's method


def _tiny_module(
    tiny_an4: dict[str, str], num_layers: int = 1, **options
) -> tuple[ASRModule, ASRDataModule]:
    """A d=32 Transformer `ASRModule` (with `options`) and its AN4 data module."""
    data = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                         max_batch_seconds=12, num_workers=0)  # fmt: skip
    layers = {"d_model": 32, "num_heads": 2, "ffn_dim": 64, "num_layers": num_layers}
    module = ASRModule(
        Frontend(LogMelFilterbank(n_mels=40)),
        partial(TransformerEncoder, **layers),
        partial(TransformerDecoder, **layers),
        vocab_size=data.vocab_size,
        tokenizer=tiny_an4["tokenizer"],
        **options,
    )
    return module, data


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("ctc_weight", 3.0, r"ctc_weight must lie in \[0, 1\), got 3.0"),  # maximises att. loss
        ("ctc_weight", -0.5, r"ctc_weight must lie in \[0, 1\), got -0.5"),
        (
            "ctc_weight",
            1.0,
            r"ctc_weight must lie in \[0, 1\), got 1.0: at 1 the attention "
            r"decoder, which validation and decoding read, would never learn \(0.3 trains both; "
            r"`--ctc-weight 1` decodes with CTC alone\)",
        ),  # it was ranked by a decoder not trained
        ("label_smoothing", 1.5, r"label_smoothing must lie in \[0, 1\), got 1.5"),
        ("freeze_encoder_steps", -1, "freeze_encoder_steps must be >= 0, got -1"),
    ],
)
def test_loss_options_out_of_range_are_refused_up_front(tiny_an4, option, value, said):
    with pytest.raises(ValueError, match=f"^{said}$"):
        _tiny_module(tiny_an4, **{option: value})


@pytest.fixture
def kernel_cache_unset(monkeypatch):
    """oneDNN's kernel-cache variable absent for the test and restored after it."""
    monkeypatch.setenv(KERNEL_CACHE_VARIABLE, "")  # records the original value for teardown
    monkeypatch.delenv(KERNEL_CACHE_VARIABLE)


def test_onednn_kernel_cache_is_set_only_when_asked(kernel_cache_unset):
    _keep_compiled_kernels(None)
    assert KERNEL_CACHE_VARIABLE not in os.environ
    _keep_compiled_kernels(2048)
    assert os.environ[KERNEL_CACHE_VARIABLE] == "2048"
    _keep_compiled_kernels(4096)
    assert os.environ[KERNEL_CACHE_VARIABLE] == "2048", "a value already set is kept"
    del os.environ[KERNEL_CACHE_VARIABLE]
    with pytest.raises(ValueError, match="onednn_kernel_cache"):
        _keep_compiled_kernels(0)


def test_shape_grid_pads_batches_to_grid_points(tiny_an4, kernel_cache_unset):
    data = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                         max_batch_seconds=6, speed_perturb=[0.9, 1.1], shape_grid=1.1)  # fmt: skip
    assert KERNEL_CACHE_VARIABLE not in os.environ, "the library changes no process-wide state"
    data.setup("fit")
    grid, seen = LengthGrid(1.1), set()
    for epoch in range(3):
        loader = data.train_dataloader()
        set_loader_epoch(loader, epoch)
        for batch in loader:
            longest = int(batch.wave_lens.max())
            assert batch.waves.shape[1] == grid.samples(longest, 16000) >= longest
            assert batch.tokens.shape[1] % TOKEN_MULTIPLE == 0
            assert batch.tokens.shape[1] - TOKEN_MULTIPLE < int(batch.token_lens.max())
            assert len(batch) * batch.waves.shape[1] <= 6 * 16000 or len(batch) == 1
            seen.update(batch.ids)
    assert len(seen) == len(data.datasets["train"])


@pytest.mark.parametrize("grid", [None, 1.1])
def test_shortest_first_epochs_reach_the_training_sampler(tiny_an4, grid):
    data = ASRDataModule(tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"],
                         max_batch_seconds=3, shortest_first_epochs=1, shape_grid=grid,
                         num_workers=0)  # fmt: skip
    data.setup("fit")
    longest = []
    for epoch in range(2):
        loader = data.train_dataloader()
        set_loader_epoch(loader, epoch)
        longest.append([int(batch.wave_lens.max()) for batch in loader])
    assert longest[0] == sorted(longest[0])
    assert longest[1] != sorted(longest[1]), "later epochs are shuffled"


def test_building_the_modules_leaves_the_callers_locals_to_reference_counting(tiny_an4):
    """No module's hyperparameters keep a frame cycle: held until a garbage collection, a
    caller's DataLoader stops its persistent workers only after 5 s each."""

    class Local:
        pass

    def build(make) -> weakref.ref:
        local = Local()
        make()
        return weakref.ref(local)

    makers = {
        "ASRModule, ASRDataModule": lambda: _tiny_module(tiny_an4),
        "LMModule": lambda: LMModule(lambda v: LSTMLM(v, 8, 16, 1), vocab_size=12),
        "TextDataModule": lambda: TextDataModule(
            tiny_an4["train"], tiny_an4["dev"], tiny_an4["tokenizer"]
        ),  # fmt: skip
    }
    gc.collect()
    gc.disable()
    try:
        alive = [name for name, make in makers.items() if build(make)() is not None]
    finally:
        gc.enable()
    assert alive == []


def test_validation_greedy_steps_leave_bf16_autocast_below_bf16_step_rows(tiny_an4, monkeypatch):
    module, _ = _tiny_module(tiny_an4)
    seen = []

    def recording_search(decoder, enc, enc_lens, max_len_ratio, max_len_extra=0):
        seen.append((torch.is_autocast_enabled("cpu"), enc.dtype))
        return []

    monkeypatch.setattr(asr.lightning, "greedy_search", recording_search)
    enc, enc_lens = torch.randn(3, 5, 32, dtype=torch.bfloat16), torch.full((3,), 5)
    with torch.autocast("cpu", torch.bfloat16):
        module._greedy(enc, enc_lens)  # 3 rows: fp32 steps
        monkeypatch.setattr(asr.lightning, "BF16_STEP_ROWS", 3)
        module._greedy(enc, enc_lens)  # 3 rows from 3 on: bf16 steps
    module._greedy(enc.float(), enc_lens)  # no autocast: as given
    assert seen == [(False, torch.float32), (True, torch.bfloat16), (False, torch.float32)]


def _tiny_fit(
    module: ASRModule, data: ASRDataModule, steps: int, callbacks=(), **trainer_options
) -> None:
    options = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, callbacks=list(callbacks),
                        **options | trainer_options)  # fmt: skip
    trainer.fit(module, data)


def test_a_plateau_schedule_steps_on_the_dev_loss_each_epoch(tiny_an4, tmp_path):
    """Its threshold never met after the first epoch: the rate halves once per epoch after."""
    plateau = partial(torch.optim.lr_scheduler.ReduceLROnPlateau, factor=0.5, patience=0,
                      threshold=1e9, threshold_mode="abs")  # fmt: skip
    module, data = _tiny_module(tiny_an4, lr_scheduler=plateau, greedy_validation=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=1, num_sanity_val_steps=0,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, data)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3 / 4)
    # validating every other epoch: it steps after those alone (epochs 2 and 4 of 4)
    module, data = _tiny_module(tiny_an4, lr_scheduler=plateau, greedy_validation=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=1, num_sanity_val_steps=0,
                        check_val_every_n_epoch=2, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(module, data)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(1e-3 / 2)
    trainer = L.Trainer(accelerator="cpu", max_epochs=4, logger=False, val_check_interval=4,
                        check_val_every_n_epoch=None)  # fmt: skip
    with pytest.raises(ValueError, match="check_val_every_n_epoch null validates by steps"):
        trainer.fit(module, data)


def test_a_frozen_encoder_keeps_its_batch_statistics(tiny_an4):
    """freeze_encoder_steps: the Conformer's BatchNorm running statistics are buffers, not
    gradients; they too stay as trained while frozen, and learn again after."""
    from asr.models.conformer import ConformerEncoder

    module, data = _tiny_module(tiny_an4, freeze_encoder_steps=2)
    layers = {"d_model": 32, "num_heads": 2, "ffn_dim": 64, "num_layers": 1, "kernel_size": 7}
    module.model.encoder = ConformerEncoder(40, **layers)
    before = {k: v.clone() for k, v in module.model.encoder.state_dict().items()}
    assert any("running_mean" in k for k in before)
    _tiny_fit(module, data, steps=2)
    after = {k: v.clone() for k, v in module.model.encoder.state_dict().items()}
    assert all(torch.equal(after[k], v) for k, v in before.items()), "changed while frozen"
    _tiny_fit(module, data, steps=3)  # a new run: two frozen steps and one not
    assert any(not torch.equal(after[k], v) for k, v in module.model.encoder.state_dict().items()
               if "running_mean" in k)  # fmt: skip


def test_nonfinite_loss_skips_the_step_and_stops_after_a_streak(tiny_an4):
    module, data = _tiny_module(tiny_an4, max_nonfinite_steps=3)
    _tiny_fit(module, data, steps=1)  # optimizer moments exist from here on
    before = {k: v.clone() for k, v in module.state_dict().items()}
    _tiny_fit(module, data, steps=2, callbacks=[_PoisonedLoss()])
    assert module._skipped_steps == 2, "both NaN steps were counted"
    for name, value in module.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed on a skipped step"

    _tiny_fit(module, data, steps=1)
    assert module._nonfinite_streak == 0, "a finite step ends the streak"
    changed = [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "finite steps still train"

    with pytest.raises(FloatingPointError, match="3 consecutive training steps"):
        _tiny_fit(module, data, steps=20, callbacks=[_PoisonedLoss()])


def test_a_streak_of_nonfinite_steps_ends_asr_fit_with_a_line(tiny_an4, tmp_path, monkeypatch,
                                                              capsys):  # fmt: skip
    """Its message says what to do; a page of traceback came before it."""
    from asr.models.seq2seq import Seq2Seq

    loss = Seq2Seq.loss

    def nan_loss(*args, **kwargs):
        out = loss(*args, **kwargs)
        return dataclasses.replace(out, loss=out.loss * float("nan"))

    monkeypatch.setattr(Seq2Seq, "loss", nan_loss)
    argv = [*_fit_args(tiny_an4, tmp_path), "--model.init_args.max_nonfinite_steps", "2"]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err, err
    assert "asr fit: error: stopping: 2 consecutive training steps had a non-finite loss" in err


def test_a_skipped_steps_loss_is_logged_as_it_was(tiny_an4, tmp_path):
    """Not as the step before's, which Lightning would write again; the epoch's mean leaves
    it out."""
    module, data = _tiny_module(tiny_an4)

    class SecondStepPoisoned(_PoisonedLoss):
        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if batch_idx == 1:
                super().on_train_batch_start(trainer, module, batch, batch_idx)
            elif batch_idx == 2:
                super().on_train_end(trainer, module)

        def on_train_end(self, trainer, module) -> None:
            pass

    poison = SecondStepPoisoned()
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="", version="")
    _tiny_fit(module, data, steps=3, callbacks=[poison], logger=logger, log_every_n_steps=1)
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    losses = [float(r["train/loss_step"]) for r in rows if r.get("train/loss_step")]
    assert len(losses) == 3 and math.isnan(losses[1]) and not math.isnan(losses[2])
    assert losses[0] != losses[2] and module._skipped_steps == 1


def test_intermediate_ctc_is_trained_and_logged(tiny_an4):
    module, data = _tiny_module(tiny_an4, num_layers=2, inter_ctc_layers=[1], inter_ctc_weight=0.3)
    _tiny_fit(module, data, steps=2)
    logged = module.trainer.callback_metrics
    assert torch.isfinite(logged["train/inter_ctc_loss_epoch"])
    assert logged["train/inter_ctc_loss_epoch"] != logged["train/ctc_loss_epoch"]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"ctc_weight": 0.0, "inter_ctc_layers": [1], "inter_ctc_weight": 0.3}, "CTC head"),
        ({"inter_ctc_layers": [2], "inter_ctc_weight": 0.3}, "has 2 blocks"),
        ({"inter_ctc_weight": 0.3}, "names no block"),
    ],
)
def test_intermediate_ctc_settings_are_checked_when_the_module_is_built(tiny_an4, options, message):
    with pytest.raises(ValueError, match=message):
        _tiny_module(tiny_an4, num_layers=2, **options)


class _GradientNorm(L.Callback):
    """Records the gradient norm each optimizer step used (gradients stay until the next step)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))


@pytest.mark.parametrize("precision", ["32", "bf16-mixed"])
def test_gradient_clipping_with_the_fused_optimizer(tiny_an4, precision):
    module, data = _tiny_module(tiny_an4)
    assert module.configure_optimizers().defaults["fused"], "the default optimizer is fused"
    norms = _GradientNorm()
    _tiny_fit(module, data, steps=2, callbacks=[norms], precision=precision,
              gradient_clip_val=1e-3)  # fmt: skip
    assert norms.norms == pytest.approx([1e-3, 1e-3], rel=1e-3)  # clipped from far above


def test_validating_a_checkpoint_bounds_lengths_as_its_training_did(tiny_an4):
    """Without the training data (asr validate, asr test), greedy validation keeps the length
    bound the checkpoint stored: the WER it reports is the one its name and fit logged."""
    module, _ = _tiny_module(tiny_an4)
    loose = module._length_bound()
    module.on_load_checkpoint({RECOGNIZER_KEY: {"model_config": {}, "tokens_per_second": 2.0}})
    assert module._fastest_speech() == 2.0
    assert module._length_bound() == length_bound(module.hparams.max_len_ratio, 0, 2.0,
                                                  *module.model.encoder_timing())  # fmt: skip
    assert module._length_bound() != loose


def test_a_transcript_fits_its_audio_by_the_encoders_own_frame_count(tiny_an4):
    """The frames a duration gives were taken from a line through a 1 s measurement, a frame
    off near the edges: a 0.1 s "A" (1 encoder frame) was warned of as unalignable."""
    module, _ = _tiny_module(tiny_an4, ctc_weight=0.3)
    rate = module.model.sample_rate
    utterances = [
        dataclasses.replace(u, duration=seconds)
        for u, seconds in zip(read_manifest(tiny_an4["train"]), (0.1, 0.15, 0.5, 1.37, 2.2))
    ]
    frames = [module.model.encoder_frames(round(u.duration * rate)) for u in utterances]
    fitting = [[1, 2] * (n // 2) + [1] * (n % 2) for n in frames]  # no repeats: a frame each
    assert module._alignable(utterances, fitting) == list(range(len(utterances)))
    one_more = [ids + [3 - ids[-1]] for ids in fitting]
    assert module._alignable(utterances, one_more) == []


@pytest.mark.parametrize(  # validating later is slow: the other two check every change
    "grid",
    [
        LOGGED,
        ACCUMULATE_LOGGED,
        pytest.param([*LOGGED, "--trainer.check_val_every_n_epoch", "3"], marks=pytest.mark.slow),
    ],
    ids=["plain", "accumulating", "validating-later"],
)
def test_a_step_limit_skips_no_epoch_resumed_from_an_epoch_end(
    tiny_an4, tmp_path, uninterrupted, grid
):
    """With `--trainer.max_steps` set, Lightning resumed an epoch-end checkpoint as an empty
    epoch: a run resumed for two more epochs trained one, and said max_epochs was reached."""
    full = uninterrupted(grid)
    args = [*_augmented_args(tiny_an4, tmp_path), *grid, "--trainer.max_steps", "1000"]
    main([*args, "--trainer.max_epochs", "1"])
    first = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    main([*args, "--ckpt_path", "last"])  # to the 3 epochs of the uninterrupted run
    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["epoch"] == full["epoch"] == 2
    _assert_same_end(full, resumed)
    assert _epoch_means(tmp_path) == pytest.approx(full["epoch_means"], rel=1e-5)
    rows = csv.DictReader((tmp_path / "logs" / "version_1" / "metrics.csv").open())
    steps = [int(row["step"]) for row in rows if row.get("train/loss_step")]
    assert steps == list(range(first["global_step"], resumed["global_step"])), "none twice"


def test_last_is_the_later_of_the_step_checkpoints_kept_apart(tiny_an4, tmp_path, caplog, capsys):
    """With step checkpoints in a folder of their own, --ckpt_path last (as a stopped run
    says to give) resumed the epoch checkpoints' older last.ckpt, then wrote over the later."""
    steps = tmp_path / "steps"
    args = [*_fit_args(tiny_an4, tmp_path), "--step_checkpoint.every_n_steps", "1",
            "--step_checkpoint.dirpath", str(steps),
            "--trainer.log_every_n_steps", "1"]  # fmt: skip
    main([*args, "--trainer.max_epochs", "2"])
    older = next((tmp_path / "checkpoints").glob("epoch000-*.ckpt"))
    shutil.copy(older, tmp_path / "checkpoints" / "last.ckpt")  # as if stopped after a step save
    later = torch.load(steps / "last.ckpt", weights_only=True)["global_step"]
    assert later > torch.load(older, weights_only=True)["global_step"]
    with caplog.at_level(logging.INFO):  # validate and test read the same last
        main(["validate", *args[1:], "--ckpt_path", "last"])
    assert f"Restoring states from the checkpoint path at {steps / 'last.ckpt'}" in caplog.text
    main([*args, "--trainer.max_epochs", "3", "--ckpt_path", "last"])
    rows = csv.DictReader((tmp_path / "logs" / "version_2" / "metrics.csv").open())
    assert [int(row["step"]) for row in rows if row.get("train/loss_step")][0] == later
    # a new run whose step checkpoints would land among these: its last.ckpt the older
    fresh = [*_fit_args(tiny_an4, tmp_path / "fresh"), *args[len(_fit_args(tiny_an4, tmp_path)) :]]
    said = refused([*fresh, "--trainer.max_epochs", "1"], capsys)
    assert (
        f"{steps} holds an earlier run's checkpoints: --ckpt_path last resumes it; to "
        "start afresh, give another --step_checkpoint.dirpath or remove that folder" in said
    )
