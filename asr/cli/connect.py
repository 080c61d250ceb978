"""`asr connect`: a client of `asr serve` that prints results as `asr transcribe --streaming`
does. Streaming stdin, it imports no torch, so a microphone piped into it is read at once."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import sys
import time
from typing import IO

from asr.cli.console import PCM_BLOCK_SECONDS, Lines, StdinPcm, ctrl_c_ends_the_input, pieces

SILENT_SERVER = 60.0  # seconds without a message from a server that decodes in chunks
# Audio a file is sent ahead of what a server decoding in chunks has decoded: a Ctrl-C ends
# the input where it is, not after all that the socket's buffers took. A server's first chunk
# (or every chunk) that is longer is sent whole, or no partial would ever come.
AHEAD_SECONDS = 5.0


class _Heard:
    """How far the server has decoded the audio sent: its partials' and finals' times."""

    def __init__(self) -> None:
        # paced until "ready" says the server decodes at full context (it sends no partials)
        self.seconds, self.chunked, self.ended = 0.0, True, False
        self.ahead = AHEAD_SECONDS
        self.sent, self.all_sent = 0.0, False  # seconds of audio sent; and the end
        self.done: float | None = None  # the audio the server's "done" says it heard (s)
        self.news = asyncio.Event()

    def ready(self, message: dict) -> None:
        """The server's "ready": whether it decodes in chunks, and how long they are."""
        chunks = [message.get(k) for k in ("chunk_ms", "first_chunk_ms")]
        self.chunked = bool(chunks[0])
        longest = max((c for c in chunks if isinstance(c, (int, float))), default=0) / 1000
        self.ahead = max(AHEAD_SECONDS, 2 * longest)  # a whole chunk, and the next on its way

    def owed(self) -> bool:
        """Whether the server owes an answer: the end was sent, or more audio than the chunk
        it may be holding until the rest of it comes (a source that pauses sends none)."""
        return self.all_sent or self.sent - self.seconds > self.ahead / 2

    def hear(self, seconds: float) -> None:
        self.seconds = max(self.seconds, seconds)
        self.news.set()

    async def wait_until_within(self, sent: float, interrupted: list) -> None:
        """Until `sent` seconds are within `ahead` of the decoded, where that is known."""
        while self.chunked and not (self.ended or interrupted):
            if sent - self.seconds <= self.ahead:
                return
            self.news.clear()
            with contextlib.suppress(TimeoutError):  # a Ctrl-C wakes no event: looked at often
                await asyncio.wait_for(self.news.wait(), 0.1)


def connect(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    """`asr connect`: stream each input to a running `asr serve` and print its results as
    `asr transcribe --streaming` prints its own. Files go as float samples (the server hears
    them exactly), stdin as the 16-bit PCM it is."""
    out = out or sys.stdout
    lines = Lines(out, out.isatty() and not args.quiet and not args.jsonl)
    stdin = StdinPcm() if "-" in args.audio else None
    with ctrl_c_ends_the_input(stdin) as interrupted:
        return asyncio.run(_connect(args, lines, out, stdin, interrupted))


async def _connect(
    args: argparse.Namespace, lines: Lines, out: IO[str], stdin: StdinPcm | None, interrupted
) -> int:
    # asyncio, not websockets' threaded client: that one reads a TLS socket in one thread while
    # writing it in another, which OpenSSL does not allow (a wss:// handshake could stall)
    from websockets.asyncio.client import connect as open_socket
    from websockets.exceptions import (
        ConnectionClosed,
        InvalidHandshake,
        InvalidMessage,
        InvalidURI,
    )
    from websockets.uri import parse_uri

    from asr.audio import AudioError, load_audio

    rate = args.sample_rate
    secure = args.url.lower().startswith("wss:")  # a scheme is case-blind: WSS:// too
    if args.cafile and not secure:
        raise ValueError(f"--cafile {args.cafile}: trusts a wss:// server's certificate; "
                         f"{args.url} is not wss://")  # fmt: skip
    try:
        tls = ssl.create_default_context(cafile=args.cafile) if secure else None
    except (OSError, ssl.SSLError) as err:
        raise ValueError(f"--cafile {args.cafile}: {err.strerror or err}") from None
    try:  # said once, before any file is read; websockets' port errors name no URL
        parse_uri(args.url)
    except (InvalidURI, ValueError) as err:
        raise ValueError(f"cannot connect to {args.url}: {err}") from None
    failed = 0
    first: dict[str, str] = {}  # each once, as `asr transcribe` reads them (spelt two ways too)
    for name in args.audio:
        first.setdefault(name if name == "-" else os.path.abspath(name), name)
    names = list(first.values())
    for name in names:
        if len(names) > 1 and not args.jsonl:
            print(name, file=out)
        heard = _Heard()
        if name == "-":  # stdin comes at its own pace, until the server closes too
            start, waits = {"format": "s16le"}, True
            sent = stdin.pieces(rate, interrupted, lambda heard=heard: heard.ended)
        else:
            try:
                wave = load_audio(name, rate).numpy().astype("<f4")
            except AudioError as err:  # the other inputs go on
                print(f"asr connect: error: {err}", file=sys.stderr)
                failed += 1
                continue
            start, sent = {"format": "f32le"}, (p.tobytes() for p in pieces(wave, rate))
            if waits := args.realtime:
                sent = _in_real_time(sent)
        try:
            # no keepalive pings: a server holding a fast sender back reads no pongs either
            ws = await open_socket(args.url, ssl=tls, open_timeout=args.timeout, ping_interval=None)
        except (OSError, InvalidURI, InvalidHandshake) as err:
            untrusted = isinstance(err, ssl.SSLCertVerificationError) and not args.cafile
            hint = " (--cafile trusts it)" if untrusted else ""
            if isinstance(err, InvalidMessage) and not tls:  # no HTTP: a TLS handshake's end
                hint = f" (is it serving TLS? then wss{args.url[2:]})"
            if not str(err) and isinstance(err, ConnectionResetError):  # it says nothing itself
                err = "the server reset the connection" + (" (is it serving TLS?)" if tls else "")
            raise ValueError(f"cannot connect to {args.url}: {err}{hint}") from None
        async with ws:
            reader = asyncio.create_task(_print_results(ws, lines, name, args.jsonl, heard))
            bytes_per_second = rate * (2 if start["format"] == "s16le" else 4)
            try:
                try:  # a full server refuses before the start: the reader prints why
                    await ws.send(json.dumps({"type": "start", "sample_rate": rate, **start}))
                    sent_seconds = 0.0
                    while (piece := await _next(sent, waits)) is not None:
                        await heard.wait_until_within(sent_seconds, interrupted)
                        await ws.send(piece)
                        sent_seconds += len(piece) / bytes_per_second
                        heard.sent = sent_seconds
                        if interrupted and name != "-":  # stdin's pieces end with what was heard
                            break
                    # stdin's pieces end too where the server closed: then not all was sent
                    heard.all_sent = not heard.ended
                    await ws.send(json.dumps({"type": "end"}))
                except ConnectionClosed:  # the server said why: the reader prints it
                    pass
                said_why = await reader
            except (asyncio.CancelledError, KeyboardInterrupt):  # a second Ctrl-C: no handshake
                ws.transport.abort()
                raise
        # a server stopping (1001) with a "done" of all that was sent has given all of it; one
        # that stopped partway (pieces on their way are dropped) said "done" of what it heard
        whole = heard.all_sent and heard.done is not None and heard.done >= heard.sent - 0.002
        if ws.close_code != 1000 and not (whole and ws.close_code == 1001):
            failed += 1
            if not said_why:
                why = f"{ws.close_code} {ws.close_reason}".strip() if ws.close_code else "cut"
                print(f"asr connect: error: {name}: the connection closed ({why})", file=sys.stderr)
        elif heard.done is None and not interrupted:  # closed as if all were said: some missing?
            failed += 1
            print(f"asr connect: error: {name}: the server closed before it said it was done "
                  "(its last finals may be missing)", file=sys.stderr)  # fmt: skip
        if interrupted:
            return 130
    return 1 if failed else 0


async def _next(sent, waits: bool):
    """The next piece, or None at the end; a source that `waits` (stdin, real time) is read
    in a thread, so that results keep printing meanwhile."""
    if waits:
        return await asyncio.to_thread(next, sent, None)
    await asyncio.sleep(0)  # results are read between pieces, as the server expects
    return next(sent, None)


def _in_real_time(sent):
    """Each piece of `PCM_BLOCK_SECONDS` when a microphone would have given it."""
    start = time.monotonic()
    for i, piece in enumerate(sent):
        time.sleep(max(0.0, start + (i + 1) * PCM_BLOCK_SECONDS - time.monotonic()))
        yield piece


# What `asr connect` reads of each message asr serve sends (docs/streaming.md): a server that
# sends anything else is not one, and its words would be printed wrong or stop the client.
FIELDS = {"ready": {}, "partial": {"text": str, "audio_seconds": float},
          "final": {"text": str, "start": float, "end": float}, "error": {"message": str},
          "done": {"duration": float}}  # fmt: skip


def _reply(message: str | bytes) -> dict | None:
    """A message of asr serve's, parsed; None where it is none."""
    try:
        result = json.loads(message)
    except (TypeError, ValueError):  # binary, not UTF-8, not JSON
        return None
    if not isinstance(result, dict) or result.get("type") not in FIELDS:
        return None
    for key, kind in FIELDS[result["type"]].items():
        value = result.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number if kind is float else isinstance(value, kind)):
            return None
    return result


async def _print_results(
    ws, lines: Lines, name: str, jsonl: bool = False, heard: _Heard | None = None
) -> bool:
    """A connection's messages as they come: finals as lines (`jsonl`: as the server sent
    them), the partial rewritten below; how far they say the audio was decoded goes to
    `heard`. True if the server said why it closed (an error)."""
    from websockets.exceptions import ConnectionClosed

    from asr.writers import timed_line

    heard, said_why = heard or _Heard(), False
    try:
        with contextlib.suppress(ConnectionClosed):  # the close is reported by `_connect`
            while True:
                try:  # a server decoding in chunks sends a partial for each: silence: stuck
                    wait = SILENT_SERVER if heard.chunked else None
                    message = await asyncio.wait_for(ws.recv(), wait)
                except TimeoutError:
                    if not heard.owed():  # all it heard is answered: the source paused
                        continue
                    print(f"asr connect: error: {name}: the server sent nothing for "
                          f"{SILENT_SERVER:g} s", file=sys.stderr)  # fmt: skip
                    ws.transport.abort()  # a stuck server answers no close: the sends end too
                    return True
                result = _reply(message)
                if result is None:  # a server that is not asr serve, or of another protocol
                    shown = message if len(message) <= 80 else f"{message[:80]}..."
                    print(f"asr connect: error: {name}: the server's message {shown!r} is not "
                          "one of asr serve's (docs/streaming.md)", file=sys.stderr)  # fmt: skip
                    ws.transport.abort()
                    return True
                kind = result["type"]
                if kind == "ready":
                    heard.ready(result)
                elif kind == "partial":
                    heard.hear(result["audio_seconds"])
                    lines.partial(result["text"])
                elif kind == "final":
                    heard.hear(result["end"])
                if kind == "final" and jsonl:
                    lines.final(json.dumps(result | {"audio": name}) + "\n")
                elif kind == "final" and result["text"]:
                    lines.final(timed_line(result["start"], result["end"], result["text"]))
                elif kind == "error":
                    said_why = True
                    print(f"asr connect: error: {name}: {result['message']}", file=sys.stderr)
                if kind == "done":
                    heard.done = result["duration"]
    finally:
        heard.ended = True  # the sender waits no more
    lines.clear()
    return said_why
