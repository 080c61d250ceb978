"""Self-contained checkpoints and `load_model`.

A checkpoint written by `asr fit` carries, besides the weights, everything needed to rebuild
the recognizer without the training files: the model's resolved config (class paths and
arguments), the tokenizer files, and the files the config points at (CMVN statistics). All
are plain strings, so loading stays `weights_only=True`.
"""

from __future__ import annotations

import base64
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asr.checkpoint import CheckpointError, load_checkpoint
from asr.models.seq2seq import Seq2Seq
from asr.text import Tokenizer

ASSET_KEYS = ("stats_path",)  # config arguments naming files that are embedded in checkpoints


def _read_files(folder: Path) -> dict[str, str]:
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in folder.iterdir()}


def _write_files(files: dict[str, str], folder: Path) -> None:
    for name, data in files.items():
        (folder / Path(name).name).write_bytes(base64.b64decode(data))


def _find_assets(config: Any, found: dict[str, str]) -> dict[str, str]:
    """Collect files named by ASSET_KEYS anywhere in a nested config."""
    if isinstance(config, dict):
        for key, value in config.items():
            if key in ASSET_KEYS and isinstance(value, str) and value:
                found[value] = base64.b64encode(Path(value).read_bytes()).decode()
            else:
                _find_assets(value, found)
    elif isinstance(config, list):
        for value in config:
            _find_assets(value, found)
    return found


def _replace_assets(config: Any, paths: dict[str, str]) -> Any:
    if isinstance(config, dict):
        return {
            k: paths.get(v, v) if k in ASSET_KEYS else _replace_assets(v, paths)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [_replace_assets(v, paths) for v in config]
    return config


def checkpoint_payload(model_config: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    """What `ASRModule` adds to every checkpoint under the key `"asr"`."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        files = _read_files(Path(tmp))
    return {
        "model_config": model_config,
        "tokenizer": files,
        "assets": _find_assets(model_config, {}),
    }


@dataclass
class Recognizer:
    """A trained recognizer ready for inference."""

    model: Seq2Seq  # the plain module, in eval mode
    tokenizer: Tokenizer
    sample_rate: int  # audio rate the frontend expects
    checkpoint: str  # where it was loaded from

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> Recognizer:
    """Rebuild the recognizer of an `asr fit` checkpoint (or an `asr average` output).

    Raises:
        CheckpointError: the file is not a checkpoint written by `asr fit`, or refuses to load
            safely; the message names it.
    """
    state = load_checkpoint(path)
    payload = state.get("asr")
    if not isinstance(payload, dict) or "model_config" not in payload:
        raise CheckpointError(f"{path}: no recognizer config inside (not written by `asr fit`?)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "tokenizer").mkdir()
        _write_files(payload["tokenizer"], tmp / "tokenizer")
        assets = {}
        for i, (original, data) in enumerate(payload["assets"].items()):
            assets[original] = str(tmp / f"asset{i}_{Path(original).name}")
            Path(assets[original]).write_bytes(base64.b64decode(data))
        config = _replace_assets(payload["model_config"], assets)
        config["tokenizer"] = str(tmp / "tokenizer")
        module = _instantiate(config)
    weights = {k[len("model.") :]: v for k, v in state["state_dict"].items()}
    module.model.load_state_dict(weights)
    model = module.model.to(device).eval()
    return Recognizer(model, module.tokenizer, _sample_rate(model), str(path))


def _instantiate(config: dict[str, Any]) -> nn.Module:
    from jsonargparse import ArgumentParser

    from asr.lightning import ASRModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ASRModule, "model", fail_untyped=False)
    parsed = parser.parse_object({"model": config})
    return parser.instantiate_classes(parsed).model


def _sample_rate(model: Seq2Seq) -> int:
    features = getattr(model.frontend, "features", model.frontend)
    return int(getattr(features, "sample_rate", 16000))
