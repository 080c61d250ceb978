"""The terminal lines of the live commands (`asr transcribe --streaming`, `asr connect`)."""

from __future__ import annotations

import io
import os
import sys

import numpy as np

from asr.cli.console import Lines, StdinPcm, pieces


def test_a_partial_wider_than_the_terminal_shows_its_end_on_one_row(monkeypatch):
    """A wrapped partial leaves its upper rows on the screen when rewritten: one row each."""
    monkeypatch.setenv("COLUMNS", "20")
    out = io.StringIO()
    lines = Lines(out, live=True)
    words = " ".join(f"WORD{k}" for k in range(12))
    lines.partial(words)
    lines.partial("SHORT")
    assert out.getvalue() == "\r\x1b[K" + words[-19:] + "\r\x1b[KSHORT"
    wide = io.StringIO()  # East Asian wide characters take two columns each
    Lines(wide, live=True).partial("漢字" * 10)
    assert wide.getvalue() == "\r\x1b[K" + "字" + "漢字" * 4
    quiet = io.StringIO()
    Lines(quiet, live=False).partial(words)  # not a terminal: finals alone
    assert quiet.getvalue() == ""


def test_audio_is_cut_into_pieces_of_a_sample_at_least(monkeypatch):
    """A rate under 10 Hz (a typo'd `asr connect --sample-rate`) has pieces of 0.1 s below one
    sample; it is sent a sample at a time, for the server to refuse its rate, not a crash."""
    assert [len(p) for p in pieces(np.zeros(25), 16000)] == [25]
    assert [len(p) for p in pieces(np.zeros(3), 5)] == [1, 1, 1]
    read, write = os.pipe()
    os.write(write, np.arange(3, dtype="<i2").tobytes())
    os.close(write)
    with os.fdopen(read, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        sent = list(StdinPcm().pieces(5, []))
    assert sent == [np.int16(k).astype("<i2").tobytes() for k in range(3)]
