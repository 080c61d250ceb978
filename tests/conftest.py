"""Shared fixtures: where the corpora are, and skipping tests that need them or a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Tests use one intra-op thread: on a 2-core machine, competing thread pools slow every test.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CORPORA = Path(os.environ.get("ASR_CORPORA", REPO.parent / "shared" / "corpora"))


def corpus_path(*parts: str) -> Path:
    """Path under ../shared/corpora; skips the calling test with a clear message if absent."""
    path = CORPORA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"corpus not found at {path} (set ASR_CORPORA or place ../shared/corpora)")
    return path


@pytest.fixture
def an4_dir() -> Path:
    return corpus_path("an4")


@pytest.fixture
def yesno_dir() -> Path:
    return corpus_path("yesno", "waves_yesno")


@pytest.fixture
def librispeech_dir() -> Path:
    return corpus_path("librispeech_sample", "LibriSpeech")


@pytest.fixture
def mini_an4_tar() -> Path:
    return corpus_path("mini_an4", "an4_sphere_mini.tar.gz")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
