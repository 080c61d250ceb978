"""The terminal lines of the live commands (`asr transcribe --streaming`, `asr connect`)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np

from asr.cli.console import Lines, StdinPcm, pieces, warnings_said_by


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


def test_the_packages_warnings_are_said_as_the_commands(capsys):
    """Said as `asr transcribe` and `asr align` say theirs: not as a UserWarning with the line
    of source that raised it; another package's warning is shown as Python shows it."""
    import warnings

    import asr

    ours = str(Path(asr.__file__).parent / "robustness.py")
    with warnings.catch_warnings(record=True) as shown:  # as Python shows them: recorded
        warnings.simplefilter("always")
        with warnings_said_by("robustness"):
            warnings.warn_explicit("level 40 dB: 48 % clipped", UserWarning, ours, 230)
            warnings.warn_explicit("theirs", UserWarning, "/elsewhere/lib.py", 7)
            warnings.warn_explicit("divide by zero", RuntimeWarning, ours, 9)  # numpy's
        warnings.warn_explicit("after", UserWarning, ours, 230)  # as it was after
    assert capsys.readouterr().err == "asr robustness: warning: level 40 dB: 48 % clipped\n"
    assert [str(w.message) for w in shown] == ["theirs", "divide by zero", "after"]
