"""The terminal side of the live commands (`asr transcribe --streaming`, `asr connect`): 16-bit
PCM from stdin, a Ctrl-C that ends the input, finals as lines under a rewritten partial. It
imports no torch, so `asr connect` is reading its microphone before a model could load."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import unicodedata
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

PCM_BLOCK_SECONDS = 0.1  # stdin is read, and files fed, in pieces of this much audio
# How audio files begin: raw PCM on stdin that begins so is a file piped in by mistake.
CONTAINERS = ((b"fLaC", "FLAC"), (b"OggS", "Ogg"), (b"ID3", "MP3"), (b"FORM", "AIFF"),
              (b"caff", "CAF"), (b".snd", "AU"), (b"NIST_1A", "SPHERE"), (b"RF64", "RF64 WAV"),
              (b"RIFX", "big-endian WAV"), (b"riff", "Wave64"),
              (b"\x1aE\xdf\xa3", "Matroska or WebM"))  # fmt: skip
HEAD_BYTES = 1 << 20  # a WAV header longer than this is none (metadata chunks run to kB)
WAV_SIZE_UNKNOWN = 0x7FFF0000  # a WAV data size from here up says: until the stream ends
READ_BYTES = 1 << 16  # one read of stdin at most: what a pipe holds
BUFFER_BYTES = 1 << 20  # 33 s of 16 kHz PCM may wait to be decoded; then the source waits


class StdinPcm:
    """Raw s16le PCM from stdin, read in a thread from the moment this is made: a microphone's
    pipe (`arecord`, `ffmpeg`) is not left full while the model loads or a final is searched,
    which would make the source drop audio (arecord's "overrun!!!"). A source faster than the
    decoding (a file piped through ffmpeg) is held back once `BUFFER_BYTES` wait."""

    def __init__(self) -> None:
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # closed (`<&-`), or not a file
            raise ValueError("- is audio on stdin, and this process has no stdin") from None
        if os.isatty(fd):  # keystrokes are not audio: the pipe was forgotten
            raise ValueError(
                "- is raw 16-bit mono PCM on stdin, which is a terminal here: pipe audio in, "
                "e.g. `arecord -f S16_LE -r 16000 -c 1 | asr ... -`"
            )
        self._waiting: list[bytes] = []
        self._size = 0
        self._ended = False
        self._cut = False  # Ctrl-C: what is read from then on was not heard before it
        self._change = threading.Condition()
        threading.Thread(target=self._read, args=(fd,), name="asr-stdin", daemon=True).start()

    def cut(self) -> None:
        """End the input here: what comes later is not read. Safe in a signal handler (it
        takes no lock the interrupted thread may hold)."""
        self._cut = True

    def _read(self, fd: int) -> None:
        try:
            while (data := os.read(fd, READ_BYTES)) and not self._cut:
                with self._change:
                    self._change.wait_for(lambda: self._size < BUFFER_BYTES)
                    self._waiting.append(data)
                    self._size += len(data)
                    self._change.notify_all()
        except OSError as err:  # a terminal hung up: the input ends there
            print(f"asr: stdin: {err.strerror}", file=sys.stderr)
        finally:
            with self._change:
                self._ended = True
                self._change.notify_all()

    def _take(self, timeout: float) -> bytes | None:
        """All that waits; b"" if nothing came within `timeout`; None once stdin has ended and
        everything is taken."""
        with self._change:
            self._change.wait_for(lambda: self._waiting or self._ended, timeout)
            if not self._waiting:
                return None if self._ended else b""
            data = b"".join(self._waiting)
            self._waiting.clear()
            self._size = 0
            self._change.notify_all()
            return data

    def pieces(self, rate: int, interrupted: list[int], gone: Callable[[], bool] = lambda: False):
        """What came, in whole samples and pieces of at most `PCM_BLOCK_SECONDS`, until stdin
        ends, `interrupted` is not empty or `gone()` (the reader went away) is true. Once
        interrupted, what was read by then still comes (it was heard before the Ctrl-C, while
        the model loaded or a final was searched), then no more: a source that outlives
        Ctrl-C, or sends nothing, does not hold the command."""
        block = _block_samples(rate) * 2
        carry = b""
        head: bytes | None = b""  # the first bytes, until they show what leads them; then None
        left = None  # the bytes of samples a WAV header gives, where it gives them
        while True:
            last = bool(interrupted)  # what waits now was heard before it
            data = self._take(0 if last else PCM_BLOCK_SECONDS)
            if gone():
                return
            if head is not None:
                head += data or b""
                skip = _header_length(head, rate, complete=data is None or last)
                if skip is None:
                    continue
                left = _stated_data_bytes(head, skip)
                data, head = head[skip:], None
            elif data is None:
                return
            if left is not None:  # what follows a WAV's samples (LIST, id3 chunks) is no audio
                data, left = data[:left], left - len(data[:left])
            data = carry + data
            whole = len(data) - len(data) % 2
            carry = data[whole:]
            for start in range(0, whole, block):
                yield data[start : min(start + block, whole)]
            if last or left == 0:
                return


def _stated_data_bytes(head: bytes, skip: int) -> int | None:
    """The size of the samples of a WAV header `head[:skip]`; None without one, or where it is
    0 or a placeholder for "until the stream ends" (as arecord and ffmpeg write to a pipe)."""
    size = int.from_bytes(head[skip - 4 : skip], "little") if skip else 0
    return size if 0 < size < WAV_SIZE_UNKNOWN else None


def _header_length(head: bytes, rate: int, complete: bool) -> int | None:
    """How many of stdin's first bytes `head` are a header to skip: a WAV header (`arecord`
    writes one unless given `-t raw`) of 16-bit mono PCM at `rate`, else 0; None while more
    bytes are needed to tell (`complete`: no more will come). Stdin that begins as another
    audio file does, or a WAV file of other samples, is refused: read as PCM it is noise."""
    if not head.startswith(b"RIFF"):
        if len(head) < 12 and not complete:
            return None
        kind = next((name for magic, name in CONTAINERS if head.startswith(magic)), None)
        if kind is None and head[4:8] == b"ftyp":
            kind = "MP4"
        if kind is not None:
            raise ValueError(
                f"- is raw 16-bit mono PCM, and stdin begins as a {kind} file does: give the "
                "file's path, or decode it to PCM first (ffmpeg -i FILE -f s16le -ac 1 -ar "
                f"{rate} -)"
            )
        return 0
    if len(head) >= 12 and head[8:12] != b"WAVE":
        raise ValueError(_NOT_WAV)
    at, found = 12, None
    while at + 8 <= len(head):
        chunk, size = head[at : at + 4], int.from_bytes(head[at + 4 : at + 8], "little")
        # what no WAV header holds is refused now, not after a megabyte of a live source
        if not all(32 <= c < 127 for c in chunk):
            raise ValueError(_NOT_WAV)
        if chunk == b"data":
            if found is None:  # samples of no format
                raise ValueError(_NOT_WAV)
            return at + 8
        if at + 8 + size > HEAD_BYTES:
            raise ValueError(_NOT_WAV)
        if chunk == b"fmt ":
            if at + 8 + 16 > len(head):
                break
            body = head[at + 8 : at + 24]
            tag, channels, hz, bits = (int.from_bytes(body[a:b], "little")
                                       for a, b in ((0, 2), (2, 4), (4, 8), (14, 16)))  # fmt: skip
            if tag not in (1, 0xFFFE) or (channels, hz, bits) != (1, rate, 16):
                raise ValueError(
                    f"- is 16-bit mono PCM at {rate} Hz, and stdin is a WAV stream of {bits}-bit "
                    f"samples, {channels} channel(s) at {hz} Hz: record it so (arecord -f S16_LE "
                    f"-r {rate} -c 1), or decode it (ffmpeg -i - -f s16le -ac 1 -ar {rate} -)"
                )
            found = tag, channels, hz, bits
        at += 8 + size + size % 2
    if not complete:
        return None
    raise ValueError(_NOT_WAV)


_NOT_WAV = (
    "- is raw 16-bit mono PCM, and stdin begins as a RIFF file does, whose header could not be "
    "read as WAV: give the file's path"
)


@contextlib.contextmanager
def ctrl_c_ends_the_input(stdin: StdinPcm | None = None):
    """A first Ctrl-C ends the input where it is, so what was heard still gets its final (as
    `arecord | asr transcribe --streaming -` is stopped), and `stdin` reads no more; a second
    one stops at once. Yields a list that is non-empty once interrupted."""
    interrupted: list[int] = []
    previous = signal.getsignal(signal.SIGINT)
    # Signals reach only the main thread; a process started with Ctrl-C ignored (nohup, a
    # background job) keeps it so.
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield interrupted
        return

    def first(signum, frame) -> None:
        if stdin is not None:
            stdin.cut()
        interrupted.append(signum)
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, first)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


def pieces(wave: np.ndarray, rate: int):
    """`wave` in pieces of `PCM_BLOCK_SECONDS`, as a microphone gives it."""
    step = _block_samples(rate)
    for start in range(0, len(wave), step):
        yield wave[start : start + step]


def samples(data):
    """s16le mono PCM bytes (`StdinPcm.pieces`) as float samples."""
    for block in data:
        yield np.frombuffer(block, dtype="<i2").astype(np.float32) / 32768.0


def _last_columns(text: str, width: int) -> str:
    """The end of `text` that takes at most `width` terminal columns: East Asian wide and
    full-width characters take two, combining marks none.

    >>> _last_columns("ab漢字", 5), _last_columns("ab漢字", 4)
    ('b漢字', '漢字')
    """
    used, start = 0, len(text)
    while start > 0:
        char = text[start - 1]
        wide = unicodedata.east_asian_width(char) in ("W", "F")
        size = 0 if unicodedata.combining(char) else 1 + wide
        if used + size > width:
            break
        used, start = used + size, start - 1
    return text[start:]


class Lines:
    """Finals as lines on `out`; on a terminal (`live`), the partial rewritten below them."""

    def __init__(self, out: IO[str], live: bool) -> None:
        self.out, self.live = out, live

    def partial(self, text: str) -> None:
        """The partial's end on one row: a longer one wraps, and erasing its row leaves the
        rows above it on the screen."""
        if self.live:
            width = shutil.get_terminal_size().columns - 1  # the cursor's column kept free
            self.out.write("\r\x1b[K" + _last_columns(text, width))
            self.out.flush()

    def final(self, text: str) -> None:
        self.out.write(("\r\x1b[K" if self.live else "") + text)
        self.out.flush()

    def clear(self) -> None:
        if self.live:
            self.out.write("\r\x1b[K")
            self.out.flush()


def _block_samples(rate: int) -> int:
    """Samples in a piece of `PCM_BLOCK_SECONDS`: one at least, at a rate under 10 Hz too."""
    return max(1, int(PCM_BLOCK_SECONDS * rate))


@contextlib.contextmanager
def warnings_said_by(command: str) -> Iterator[None]:
    """This package's warnings (plain UserWarnings raised for one of its lines) said as the
    command's own (`asr robustness: warning: ...`), not with the source line that raised them;
    others (numpy's RuntimeWarnings included) as Python shows them."""
    shown = warnings.showwarning
    package = Path(__file__).resolve().parents[1]  # asr

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if category is UserWarning and Path(filename).resolve().is_relative_to(package):
            print(f"asr {command}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
