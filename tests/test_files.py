"""Files written whole or not at all (asr.files)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from asr.files import partial_path, remove_partials, write_atomically


def test_two_writers_of_one_file_each_rename_a_whole_file_of_their_own(tmp_path: Path) -> None:
    """Two runs writing one page shared one `.partial`: one was told its file was gone, or
    said it wrote while the file held the other's."""
    page, both_writing = tmp_path / "explorer.html", threading.Barrier(2)
    failures: list[BaseException] = []

    def write(text: str) -> None:
        def fill(partial: Path) -> None:
            partial.write_text(text)
            both_writing.wait(timeout=10)  # each has written its partial; neither renamed yet

        try:
            write_atomically(page, fill)
        except OSError as error:
            failures.append(error)

    writers = [threading.Thread(target=write, args=(c * 1000,)) for c in "AB"]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert not failures
    assert page.read_text() in ("A" * 1000, "B" * 1000)
    assert [p.name for p in tmp_path.iterdir()] == ["explorer.html"], "no partial left"


def test_a_failed_write_leaves_no_partial_and_names_the_file(tmp_path: Path) -> None:
    def fail(partial: Path) -> None:
        partial.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left") as error:
        write_atomically(tmp_path / "a.txt", fail)
    assert error.value.filename == str(tmp_path / "a.txt")
    assert not list(tmp_path.iterdir())


def test_partials_of_killed_writers_are_removed_and_nothing_else(tmp_path: Path) -> None:
    """Not a running writer's (an `asr explore` in a folder a transcribe run holds)."""
    (tmp_path / "a").mkdir()
    gone = 2**22 + 1  # past Linux's largest process id
    killed = [tmp_path / "a" / f".go.txt.{gone}-0123abcd.partial",
              tmp_path / f".x.json.{gone}-89abcdef.partial"]  # fmt: skip
    running = partial_path(tmp_path / "a" / "explorer.html")
    kept = [tmp_path / ".notes.partial", tmp_path / "a" / "go.txt", tmp_path / "b.partial", running]
    for path in killed + kept:
        path.write_text("YE")
    remove_partials(tmp_path)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(kept)
