"""`python -m asr` runs the `asr` command; `asr --version` says which asr it is."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

from conftest import REPO

from asr.cli import _version


def test_python_m_asr_prints_the_version():
    out = subprocess.run(
        [sys.executable, "-m", "asr", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == f"asr {importlib.metadata.version('asr')}\n"


def test_a_source_tree_that_is_not_installed_says_so(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert _version().startswith("unknown (not installed")
