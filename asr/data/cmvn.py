"""Global CMVN statistics of a manifest's features (`asr cmvn`)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from asr.audio import AudioError, load_audio
from asr.checkpoint import build_error, instantiate
from asr.config_check import frontend_settings, refused_as_built, where_built
from asr.data.manifest import read_manifest
from asr.frontends import (
    CMVNStats,
    Frontend,
    LevelNormalizer,
    accumulate_cmvn_stats,
    features_of,
)
from asr.frontends.normalize import features_signature


def _load_batch(
    utterances: list, sample_rate: int, device: torch.device, manifest: str | Path
) -> tuple[Tensor, Tensor]:
    """Manifest entries -> `(B, T)` zero-padded waves and `(B,)` lengths on `device`; audio
    that cannot be read is named with its manifest and utterance."""
    waves = []
    for u in utterances:
        try:
            waves.append(load_audio(u.audio_filepath, sample_rate, u.offset, u.duration))
        except AudioError as err:
            raise ValueError(f"{manifest} ({u.utt_id}): audio {err}") from None
    lens = torch.tensor([w.numel() for w in waves], dtype=torch.int64)
    return nn.utils.rnn.pad_sequence(waves, batch_first=True).to(device), lens.to(device)


def _module_device(module: nn.Module) -> torch.device:
    tensor = next(module.parameters(), None)
    tensor = next(module.buffers(), None) if tensor is None else tensor
    return torch.device("cpu") if tensor is None else tensor.device


def compute_cmvn_stats(
    manifest_path: str | Path,
    frontend: nn.Module,
    out_path: str | Path,
    sample_rate: int = 16000,
    max_utterances: int | None = None,
    batch_size: int = 16,
) -> CMVNStats:
    """Global CMVN statistics of `frontend` features (eval mode) over a manifest, saved as JSON."""
    if Path(out_path).is_dir():  # found before the features are computed, not after
        raise IsADirectoryError(f"{out_path}: is a directory, not a file to write statistics to")
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)  # as the other commands' --out
    utterances = read_manifest(manifest_path)[:max_utterances]
    device, was_training = _module_device(frontend), frontend.training
    stats = None
    frontend.eval()
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(utterances), batch_size), desc="cmvn stats"):
                batch = utterances[start : start + batch_size]
                wave, wave_lens = _load_batch(batch, sample_rate, device, manifest_path)
                feats, feat_lens = frontend(wave, wave_lens)
                batch_stats = accumulate_cmvn_stats(feats, feat_lens)
                if not bool(torch.isfinite(batch_stats.sum_sq).all()):
                    ids = ", ".join(u.utt_id for u in batch)
                    raise ValueError(f"{manifest_path}: non-finite features in one of: {ids}")
                stats = batch_stats if stats is None else stats + batch_stats
    finally:
        frontend.train(was_training)
    if stats is None or stats.count == 0:
        raise ValueError(f"{manifest_path}: no feature frames to compute CMVN statistics from")
    level = frontend.level if isinstance(frontend, Frontend) else None
    target = level.target_dbfs if isinstance(level, LevelNormalizer) else None
    features = features_of(frontend)
    signature = features_signature(features, sample_rate)
    stats = replace(stats, level_dbfs=target, sample_rate=sample_rate, signature=signature)
    stats.save(out_path)
    return stats


def config_frontend(config: str | Path) -> Frontend:
    """A training config's frontend without CMVN and augmentation: what CMVN statistics need."""
    try:
        return instantiate(Frontend, frontend_settings(config))
    except (argparse.ArgumentError, TypeError, ValueError) as err:
        refused = refused_as_built(err)  # a value refused, placed where the config sets it
        if refused is not None and (found := where_built([config], refused[1], str(refused[0]))):
            raise ValueError(f"{found[0]}: {refused[0]}") from None
        raise ValueError(f"{config}: its frontend does not build: {build_error(err)}") from None
