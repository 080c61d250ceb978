"""LightningCLI for `asr fit|validate|test`: YAML configs under conf/ pick every part by
`class_path`; the vocabulary size flows from the data module to the model."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from asr.lightning import ASRDataModule, ASRModule

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


class ASRCLI(LightningCLI):
    """Adds argument links, a best-k-by-WER + last checkpoint callback, and (unless the config
    names loggers) TensorBoard and CSV logs under `trainer.default_root_dir`."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.tokenizer", "model.tokenizer")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(CHECKPOINT_DEFAULTS)
        # The bucketing sampler shards batches across ranks itself.
        parser.set_defaults({"trainer.use_distributed_sampler": False})

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        root = config.trainer.default_root_dir or "."
        if config.checkpoint.dirpath is None:
            # One checkpoint folder per experiment, so `--ckpt_path last` resumes a rerun.
            config.checkpoint.dirpath = str(Path(root) / "checkpoints")
        if config.trainer.logger in (None, True):
            version = _next_version(Path(root) / "logs")  # one run directory for both loggers
            config.trainer.logger = [
                Namespace(
                    class_path=cls,
                    init_args=Namespace(save_dir=root, name="logs", version=version),
                )
                for cls in DEFAULT_LOGGERS
            ]

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        config = self.config[self.subcommand] if self.subcommand else self.config
        model_config = config.model.as_dict()
        for training_only in ("optimizer", "lr_scheduler"):
            model_config.pop(training_only, None)
        model_config["vocab_size"] = self.datamodule.vocab_size
        # Plain JSON types only, so checkpoints load with weights_only=True.
        self.model.model_config = json.loads(json.dumps(model_config))


def _next_version(logs: Path) -> int:
    versions = [int(p.name.split("_")[1]) for p in logs.glob("version_*") if p.name[8:].isdigit()]
    return max(versions, default=-1) + 1


def run_lightning_cli(argv: Sequence[str]) -> ASRCLI:
    """Run `asr fit|validate|test ...` (argv without the program name)."""
    torch.set_float32_matmul_precision("high")
    return ASRCLI(
        ASRModule,
        ASRDataModule,
        args=None if list(argv) == sys.argv[1:] else list(argv),
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"plugins": [{"class_path": "asr.checkpoint.AtomicCheckpointIO"}]},
    )
