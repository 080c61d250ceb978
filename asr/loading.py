"""Loading trained networks: a recognizer's from a checkpoint, package or hf:// name, and an LM."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from asr.checkpoint import (
    LM_KEY,
    CheckpointError,
    build_from_payload,
    payload_tokenizer,
    read_payload,
    refuse_non_finite,
    submodule_weights,
)
from asr.models.lm import build_lm
from asr.models.seq2seq import Seq2Seq, build_seq2seq
from asr.package import HF_PREFIX, ONNX_DIR, is_package, read_recognizer, resolve_package
from asr.text import Tokenizer

BACKENDS = ("torch", "onnx", "onnx-int8")


def load_seq2seq(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    backend: str = "torch",
    precision: str = "fp32",
) -> tuple[Seq2Seq, Tokenizer, dict[str, Any]]:
    """The network (eval mode, on `device`), tokenizer and payload of a recognizer `path`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    weights, payload = read_recognizer(path)
    tokenizer = trained_tokenizer(payload, path)
    model = build_from_payload(build_seq2seq, payload, path)
    _load_weights(model, weights, path)
    model = model.to(device).eval()
    if backend != "torch":
        model = _onnx_model(model, path, backend, device, precision)
    return model, tokenizer, payload


def _load_weights(model: nn.Module, weights: dict, path: str | os.PathLike) -> None:
    """`model.load_state_dict(weights)`; CheckpointError names `path` where they differ."""
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # torch lists every key: the first difference tells
        first = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), "")
        first = first if len(first) <= 200 else first[:200] + "..."
        raise CheckpointError(f"{path}: its weights do not fit its config ({first})") from None


def trained_tokenizer(payload: dict[str, Any], path: str | os.PathLike) -> Tokenizer:
    """The payload's tokenizer; CheckpointError where its size is not the model's (a
    tokenizer folder of a package replaced by another)."""
    tokenizer = payload_tokenizer(payload)
    size = payload["model_config"].get("vocab_size")
    if size is not None and size != tokenizer.vocab_size:
        raise CheckpointError(
            f"{path}: its tokenizer has {tokenizer.vocab_size} ids, its model {size!r}: not the "
            "tokenizer it was trained with"
        )
    return tokenizer


def _onnx_model(model: Seq2Seq, path, backend: str, device, precision: str) -> Seq2Seq:
    from asr.onnx_runtime import onnx_model

    if torch.device(device).type != "cpu" or precision != "fp32":
        raise ValueError(f"backend {backend!r} runs on the CPU in fp32 (its int8: onnx-int8)")
    if not is_package(path):
        raise ValueError(
            f"{path}: backend {backend!r} needs a package (asr export --format onnx), "
            "not a checkpoint"
        )
    folder = resolve_package(path)  # hf://: the snapshot read_package found
    if not (folder / ONNX_DIR).is_dir():  # a plain package: its author alone can export graphs
        export = (
            "ask its author for an asr export --format onnx package"
            if str(path).startswith(HF_PREFIX)
            else "export its checkpoint with asr export --format onnx"
        )
        raise ValueError(
            f"{path}: a package without ONNX graphs ({ONNX_DIR}/): decode it with --backend "
            f"torch, or {export}"
        )
    # As many threads as PyTorch's (`--threads`), where ONNX Runtime would take every core.
    return onnx_model(model, folder, int8=backend == "onnx-int8", threads=torch.get_num_threads())


def load_lm(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer]:
    """Rebuild the language model of an `asr fit` LM checkpoint (or an `asr average` output).

    Args:
        path: the LM checkpoint.
        device: where the LM runs.

    Returns:
        The LM (the plain module, in eval mode, on `device`), which follows the search
        interface `asr.search.LanguageModel`, and its tokenizer.

    Raises:
        CheckpointError: the file holds no LM written by `asr fit`, or refuses to load
            safely; the message names it.
    """
    path = os.path.expanduser(path)  # as a shell would, and load_model does
    state, payload = read_payload(path, LM_KEY)
    tokenizer = trained_tokenizer(payload, path)
    weights = submodule_weights(state, "lm.")
    refuse_non_finite(weights, path)
    lm = build_from_payload(build_lm, payload, path)
    _load_weights(lm, weights, path)
    # what a recognizer's search checks it against (asr.search.check_language_model)
    lm.vocabulary = tuple(tokenizer.pieces(range(tokenizer.vocab_size)))
    return lm.to(device).eval(), tokenizer
