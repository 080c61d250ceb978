"""Files written whole or not at all: what readers, and a re-run that skips written files,
find is never half of one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomically(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """`write(partial)` to a hidden `.<name>.partial` beside `path`, then rename it onto `path`.

    A process killed while writing leaves at most the partial file, never half of `path`; a
    failed write leaves neither, and its OSError names `path`, not the partial.

    Args:
        path: the file to write; its folder must exist.
        write: writes the whole file to the path it is given.
    """
    path = Path(path)
    if not path.parent.is_dir():  # said of the file asked for, not of its hidden partial
        raise FileNotFoundError(f"{path}: no folder {path.parent} to write it in")
    partial = partial_path(path)
    try:
        write(partial)
        os.replace(partial, path)
    except OSError as error:  # a folder in the file's place, a full disk: no partial left behind
        partial.unlink(missing_ok=True)
        if error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error  # named as asked for


def partial_path(path: Path) -> Path:
    """The hidden `.<name>.partial` a file is written to before it is renamed; for a name
    within 9 bytes of the file system's 255, one made from its digest (else a name that fits
    would fail to be written)."""
    name = f".{path.name}.partial"
    if len(os.fsencode(name)) > 255:  # a name's bytes as the file system has them
        name = f".{hashlib.blake2b(os.fsencode(path.name), digest_size=16).hexdigest()}.partial"
    return path.with_name(name)
