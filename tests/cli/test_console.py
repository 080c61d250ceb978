"""The terminal lines of the live commands (`asr transcribe --streaming`, `asr connect`)."""

from __future__ import annotations

import io

from asr.cli.console import Lines


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
