"""`asr connect` against a running `asr serve` of the tiny streaming recognizer: how far
ahead of the server it sends, and how it stops."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
import soundfile
from streaming_fixtures import RATE, running_server, streaming_recognizer
from websockets.asyncio.server import serve

import asr.cli.connect
from asr.cli import main
from asr.streaming import StreamOptions


@pytest.mark.usefixtures("ctrl_c")
def test_a_file_is_sent_little_ahead_of_the_decoding_so_ctrl_c_ends_it_there(
    tmp_path, monkeypatch, capsys
):
    """A file goes as fast as the server decodes, AHEAD_SECONDS ahead at most: before, the
    socket's buffers took all of it at once, and a Ctrl-C still had every minute decoded."""
    recognizer, waves = streaming_recognizer()
    audio = np.concatenate([w.numpy() for w in waves.values()] * 4)  # 35 s
    path = tmp_path / "long.wav"
    soundfile.write(path, audio, RATE)
    monkeypatch.setattr(asr.cli.connect, "AHEAD_SECONDS", 2.0)
    partials = []

    def ctrl_c_at_the_seventh(self, text: str) -> None:  # 160 ms chunks: after 1.1 s
        partials.append(text)
        if len(partials) == 7:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(asr.cli.connect.Lines, "partial", ctrl_c_at_the_seventh)
    with running_server(recognizer, StreamOptions(chunk_ms=160)) as (_, port):
        assert main(["connect", f"ws://127.0.0.1:{port}/", str(path), "--jsonl"]) == 130
    finals = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert finals, "what was sent gets its finals"
    assert finals[-1]["end"] <= 1.2 + 2.0 + 1.0, "sent past AHEAD_SECONDS (and a piece)"


@contextlib.contextmanager
def fake_server(handler):
    """A WebSocket server of `handler` on a thread of its own; yields its URL. The clients'
    sockets close with this process: it waits for no closing handshake of theirs."""
    loop, ready, stop, port = asyncio.new_event_loop(), threading.Event(), asyncio.Event(), []

    async def run() -> None:
        async with serve(handler, "127.0.0.1", 0, close_timeout=0.1) as server:
            port.append(server.sockets[0].getsockname()[1])
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),))
    thread.start()
    ready.wait(10)
    try:
        yield f"ws://127.0.0.1:{port[0]}/"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def test_a_file_waits_for_the_server_before_it_says_it_is_ready(tmp_path):
    """Its partials pace a file; before its "ready" none has come, and a server slow to say
    it took the whole file then, as one that decodes at full context does."""
    path = tmp_path / "a.wav"
    soundfile.write(path, np.zeros(RATE * 60, dtype=np.float32), RATE)
    received = []

    async def slow(ws):  # ready late, then no partial: the file waits for them
        await ws.recv()
        await asyncio.sleep(0.3)
        await ws.send(json.dumps({"type": "ready", "chunk_ms": 160}))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                async for message in ws:
                    received.append(len(message) if isinstance(message, bytes) else 0)
        await ws.close()

    with fake_server(slow) as url:
        main(["connect", url, str(path)])
    seconds = sum(received) / 4 / RATE  # float samples
    assert 0 < seconds <= asr.cli.connect.AHEAD_SECONDS + 0.5, seconds


def test_a_first_chunk_longer_than_the_lead_is_sent_whole(tmp_path):
    """A server's first partial comes only after its first chunk: one longer than
    AHEAD_SECONDS is sent whole (a chunk further), or the client would wait for good."""
    path = tmp_path / "a.wav"
    soundfile.write(path, np.zeros(RATE * 8, dtype=np.float32), RATE)
    received = []

    async def long_first_chunk(ws):
        await ws.recv()
        await ws.send(json.dumps({"type": "ready", "chunk_ms": 160, "first_chunk_ms": 6000}))
        got, partial = 0, False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                async for message in ws:
                    if not isinstance(message, bytes):  # "end"
                        await ws.send(json.dumps({"type": "done", "text": "", "duration": 8}))
                        break
                    got += len(message)
                    if got >= 6 * RATE * 4 and not partial:
                        partial = True
                        said = {"type": "partial", "text": "", "utterance": 0, "audio_seconds": 6}
                        await ws.send(json.dumps(said))
        received.append(got / 4 / RATE)
        await ws.close()

    with fake_server(long_first_chunk) as url:
        assert main(["connect", url, str(path)]) == 0
    assert received == [8.0]


@pytest.mark.usefixtures("ctrl_c")
def test_a_second_ctrl_c_stops_at_once_when_the_server_answers_nothing(tmp_path):
    """The first ends the input and waits for the last finals; the second leaves without the
    closing handshake, which a server that reads nothing more would keep for 10 s."""
    path = tmp_path / "a.wav"
    soundfile.write(path, np.zeros(RATE * 20, dtype=np.float32), RATE)
    started = threading.Event()

    async def deaf(ws):  # reads the start, says it is ready, then nothing
        await ws.recv()
        await ws.send(json.dumps({"type": "ready", "chunk_ms": 160}))
        started.set()
        await ws.wait_closed()

    def press_twice() -> None:
        started.wait(10)
        for _ in range(2):
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

    with fake_server(deaf) as url:
        presser = threading.Thread(target=press_twice)
        presser.start()
        begun = time.monotonic()
        try:
            assert main(["connect", url, str(path)]) == 130
            took = time.monotonic() - begun
        finally:
            presser.join()
    assert took < 5.0


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ('{"hello": 1}', "the server's message '{\"hello\": 1}' is not one of asr serve's"),
        ("hello", "the server's message 'hello' is not one of asr serve's"),
        (
            '{"type": "final", "text": "Y"}',
            'the server\'s message \'{"type": "final", "text": "Y"}\' is not',
        ),
        (None, "the server closed before it said it was done (its last finals may be missing)"),
    ],
    ids=["no type", "not JSON", "a final without times", "closed without done"],
)
def test_a_server_that_is_not_asr_serve_is_named_as_such(reply, said, tmp_path, capsys):
    """Its messages stopped the client with a traceback (KeyError) or a bare JSON error; a
    normal close with no "done" passed for a stream transcribed whole (status 0)."""
    path = tmp_path / "a.wav"
    soundfile.write(path, np.zeros(RATE, dtype=np.float32), RATE)

    async def other(ws):
        await ws.recv()
        if reply is not None:
            await ws.send(reply)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                async for message in ws:
                    if not isinstance(message, bytes):  # "end"
                        break
        await ws.close()

    with fake_server(other) as url:
        assert main(["connect", url, str(path)]) == 1
    err = capsys.readouterr().err
    assert f"asr connect: error: {path}: {said}" in err and "Traceback" not in err


@pytest.mark.parametrize("heard", ["all", "some", "all but the last pieces"])
def test_a_server_stopping_after_the_streams_done_leaves_nothing_missing(heard, tmp_path, capsys):
    """asr serve stopped by SIGTERM ends each stream with its finals and "done", then closes
    with 1001 (going away): a stream sent whole and heard whole was given all of it, not a
    failure; one cut before the end of the file, or whose last pieces were on their way as
    the server stopped (it drops them), got "done" only of what was heard."""
    path = tmp_path / "a.wav"
    soundfile.write(path, np.zeros(RATE * (60 if heard == "some" else 1), np.float32), RATE)
    said = 0.7 if heard == "all but the last pieces" else 1.0

    async def stopping(ws):
        await ws.recv()
        await ws.send(json.dumps({"type": "ready", "chunk_ms": 0}))  # no partials to wait for
        async for message in ws:
            if not isinstance(message, bytes) or heard == "some":  # "end", or a first piece
                break
        await ws.send(json.dumps({"type": "done", "text": "", "duration": said}))
        await ws.close(1001, "the server is stopping")

    with fake_server(stopping) as url:
        assert main(["connect", url, str(path)]) == (0 if heard == "all" else 1)
    err = capsys.readouterr().err
    if heard == "all":
        assert "error" not in err
    else:
        assert f"{path}: the connection closed (1001 the server is stopping)" in err


def test_a_server_stopping_while_stdin_streams_is_said(monkeypatch, capsys):
    """A microphone's stream cut by the server's stop: its "done" is of what it heard, and
    the input that ended with the server's close was taken for one sent whole (status 0)."""
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read, "rb"))
    speaking = threading.Event()
    speaking.set()

    def microphone():  # a tenth of a second at a time, until told to stop
        while speaking.is_set():
            os.write(write, bytes(3200))
            time.sleep(0.05)
        os.close(write)

    async def stopping(ws):
        await ws.recv()
        await ws.send(json.dumps({"type": "ready", "chunk_ms": 0}))
        for _ in range(3):
            await ws.recv()
        await ws.send(json.dumps({"type": "done", "text": "", "duration": 0.3}))
        await ws.close(1001, "the server is stopping")

    threading.Thread(target=microphone, daemon=True).start()
    try:
        with fake_server(stopping) as url:
            assert main(["connect", url, "-"]) == 1
    finally:
        speaking.clear()
    assert "-: the connection closed (1001 the server is stopping)" in capsys.readouterr().err
