"""End-to-end training through the `asr fit` LightningCLI: one process, and DDP with two."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO, corpus_path

from asr.cli import main
from asr.data.manifest import read_manifest, write_manifest
from asr.data.prepare import prepare_corpus
from asr.frontends import LogMelFilterbank, compute_cmvn_stats
from asr.inference import load_model
from asr.text import train_tokenizer

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


def _fit_args(data: dict[str, str], root: Path) -> list[str]:
    return [
        "fit",
        "--config", data["config"],
        "--data.train_manifest", data["train"],
        "--data.val_manifest", data["dev"],
        "--data.tokenizer", data["tokenizer"],
        "--trainer.default_root_dir", str(root),
    ]  # fmt: skip


def test_fit_writes_config_checkpoints_logs_and_plots(tiny_an4, tmp_path):
    main(_fit_args(tiny_an4, tmp_path))
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


DDP_SCRIPT = """
import json, sys, torch
from asr.train import run_lightning_cli

cli = run_lightning_cli(sys.argv[1:])
trainer = cli.trainer
checksum = float(sum(p.double().sum() for p in cli.model.parameters()))
report = {"rank": trainer.global_rank, "world": trainer.world_size, "checksum": checksum,
          "batches": trainer.num_training_batches, "steps": trainer.global_step}
with open(f"{trainer.default_root_dir}/rank{trainer.global_rank}.json", "w") as f:
    json.dump(report, f)
"""


@pytest.mark.timeout(600)
def test_ddp_two_cpu_processes_agree(tiny_an4, tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    args = _fit_args(tiny_an4, tmp_path) + [
        "--trainer.strategy", "ddp", "--trainer.devices", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in reports] == [2, 2]
    assert reports[0]["batches"] == reports[1]["batches"] > 0, "equal batch counts per rank"
    assert reports[0]["steps"] == reports[1]["steps"]
    assert reports[0]["checksum"] == reports[1]["checksum"], "ranks hold the same weights"


def test_resume_from_last_and_average(tiny_an4, tmp_path):
    """A rerun with `--ckpt_path last` continues the same experiment; `asr average` writes a
    checkpoint whose weights are the mean of the best ones."""
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "1"])
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 0
    main(_fit_args(tiny_an4, tmp_path) + ["--trainer.max_epochs", "2", "--ckpt_path", "last"])
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 1 and resumed["global_step"] > 0
    assert (tmp_path / "logs" / "version_1").is_dir(), "the resumed run logs to a new version"

    out = tmp_path / "avg.ckpt"
    assert main(["average", "--last", str(last), "--best", "2", "--out", str(out)]) == 0
    averaged = torch.load(out, weights_only=True)
    sources = [torch.load(p, weights_only=True) for p in averaged["averaged_from"]]
    assert len(sources) == 2
    name = "model.decoder.output.bias"
    expected = (sources[0]["state_dict"][name] + sources[1]["state_dict"][name]) / 2
    torch.testing.assert_close(averaged["state_dict"][name], expected)

    test_args = _fit_args(tiny_an4, tmp_path)[1:] + ["--data.test_manifest", tiny_an4["dev"]]
    main(["test", *test_args, "--ckpt_path", str(out)])  # the averaged model scores the test set
    latest = max((tmp_path / "logs").glob("version_*"), key=lambda p: int(p.name[8:]))
    rows = list(csv.DictReader((latest / "metrics.csv").open()))
    assert [r for r in rows if r.get("test/wer")], "asr test reports the test WER"


def test_bad_manifest_fails_up_front_or_is_skipped(tiny_an4, tmp_path):
    lines = Path(tiny_an4["train"]).read_text().splitlines()
    missing = json.loads(lines[1]) | {"audio_filepath": str(tmp_path / "gone.wav")}
    lines[1] = json.dumps(missing)
    bad = tmp_path / "train_bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    args = _fit_args(tiny_an4 | {"train": str(bad)}, tmp_path) + ["--trainer.max_epochs", "1"]
    with pytest.raises(ValueError, match=r"train_bad.jsonl:2: .*gone.wav"):
        main(args)
    main(args + ["--data.skip_bad", "true"])
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


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
