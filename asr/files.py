"""Files written whole or not at all: what readers, and a re-run that skips written files,
find is never half of one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomically(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """`write(partial)` to a hidden `.<name>.<pid>-<random>.partial` beside `path` (its own to
    each writer: `partial_path`), then rename it onto `path`.

    A process killed while writing leaves at most the partial file, never half of `path`; a
    failed or interrupted write (Ctrl-C, SIGTERM) leaves neither, and its OSError names
    `path`, not the partial.

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
    except BaseException as error:  # a folder in the file's place, a full disk, Ctrl-C
        partial.unlink(missing_ok=True)  # no partial left behind
        if not isinstance(error, OSError) or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error  # named as asked for


_PARTIAL = re.compile(r"\..+\.(\d+)-[0-9a-f]{8}\.partial")  # partial_path's names


def remove_partials(folder: Path) -> None:
    """Remove the partial files under `folder` that writers killed while writing left: those
    whose process is gone (another at work, here or in a folder below, keeps its own). One
    that cannot be removed (a read-only folder) is left."""
    for partial in folder.rglob(".*.partial"):
        found = _PARTIAL.fullmatch(partial.name)
        if found and not _running(int(found.group(1))):
            with contextlib.suppress(OSError):
                partial.unlink()


def _running(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's
        return True
    except (ProcessLookupError, OverflowError):  # gone; no process id at all
        return False
    return True


def partial_path(path: Path) -> Path:
    """The hidden `.<name>.<pid>-<random>.partial` a file is written to before it is renamed,
    its own to each writer (the process id tells whether its writer still runs); for a name
    near the file system's 255 bytes, one made from its digest (else a name that fits would
    fail to be written)."""
    own = f"{os.getpid()}-{secrets.token_hex(4)}"
    name = f".{path.name}.{own}.partial"
    if len(os.fsencode(name)) > 255:  # a name's bytes as the file system has them
        digest = hashlib.blake2b(os.fsencode(path.name), digest_size=16).hexdigest()
        name = f".{digest}.{own}.partial"
    return path.with_name(name)
