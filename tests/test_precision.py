"""oneDNN's kernel cache setting."""

from __future__ import annotations

import os

import pytest

from asr.precision import KERNEL_CACHE_VARIABLE, keep_compiled_kernels


def test_keep_compiled_kernels_sets_the_capacity_only_where_unset(monkeypatch):
    monkeypatch.setenv(KERNEL_CACHE_VARIABLE, "")
    monkeypatch.delenv(KERNEL_CACHE_VARIABLE)
    assert keep_compiled_kernels(2048) is True
    assert os.environ[KERNEL_CACHE_VARIABLE] == "2048"
    assert keep_compiled_kernels(4096) is False, "a value already set is the user's"
    assert os.environ[KERNEL_CACHE_VARIABLE] == "2048"


@pytest.mark.parametrize("capacity", [-1, 0])
def test_keep_compiled_kernels_rejects_capacities_below_one(capacity):
    with pytest.raises(ValueError, match="capacity"):
        keep_compiled_kernels(capacity)
