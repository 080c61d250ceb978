"""`asr serve`'s WebSocket protocol, its batching, and what it does with bad or slow clients:
each gets an error message and a close, and the server goes on serving the others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from streaming_fixtures import (
    WAV,
    from_pcm16,
    pcm16,
    running_server,
    self_signed_certificate,
    streaming_recognizer,
)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from asr.cli import main
from asr.ctc_beam import EndpointOptions
from asr.streaming import StreamOptions, stream_transcript

UID = "an4_clstk/fash/an255-fash-b"
OPTIONS = StreamOptions(chunk_ms=160, endpoint=None)
START = json.dumps({"type": "start", "sample_rate": 16000, "format": "s16le"})
F32_START = json.dumps({"type": "start", "sample_rate": 16000, "format": "f32le"})
END = json.dumps({"type": "end"})


@pytest.fixture(scope="module")
def trained():
    return streaming_recognizer()


@pytest.fixture(scope="module")
def server(trained):
    with running_server(trained[0], OPTIONS, max_connections=6) as (live, port):
        yield live, f"ws://127.0.0.1:{port}/"


def session(
    url: str, data: bytes, packet: int = 3200, pause: float = 0.0, start=START, **connect_args
) -> list[dict]:
    """Send `data` as one recording; every message the server sent, in order."""
    with connect(url, **connect_args) as ws:
        ws.send(start)
        messages = [json.loads(ws.recv(10))]
        for start in range(0, len(data), packet):
            ws.send(data[start : start + packet])
            time.sleep(pause)
        ws.send(END)
        for message in ws:
            messages.append(json.loads(message))
    return messages


def tls_session(url: str, data: bytes, trust: ssl.SSLContext) -> list[dict]:
    """`session` over wss://, with asyncio's client: websockets' threaded client reads a TLS
    socket in one thread while writing it in another, which OpenSSL does not allow."""
    from websockets.asyncio.client import connect as open_socket

    async def run() -> list[dict]:
        async with open_socket(url, ssl=trust) as ws:
            await ws.send(START)
            messages = [json.loads(await ws.recv())]
            await ws.send(data)
            await ws.send(END)
            messages += [json.loads(message) async for message in ws]
        return messages

    return asyncio.run(run())


def refused(url: str, *sends, start: bool | str = True) -> tuple[dict, int]:
    """The error message and close code after `sends` (after `START`, or the start message
    `start` names, unless False)."""
    with connect(url, max_size=None) as ws:
        if start:
            ws.send(START if start is True else start)
            assert json.loads(ws.recv(10))["type"] == "ready"
        for message in sends:
            ws.send(message)
        error = json.loads(ws.recv(10))
        with pytest.raises(ConnectionClosed):  # the server closes
            ws.recv(10)
        return error, ws.protocol.close_code


def test_a_recording_gets_partials_then_the_final_of_the_offline_stream(server, trained) -> None:
    (_, url), (recognizer, waves) = server, trained
    data = pcm16(waves[UID])
    messages = session(url, data)
    assert messages[0] == {
        "type": "ready",
        "sample_rate": 16000,
        "format": "s16le",
        "chunk_ms": 160,
        "first_chunk_ms": 160,
    }
    partials = [m for m in messages if m["type"] == "partial"]
    times = [m["audio_seconds"] for m in partials]
    assert times == sorted(times) and len(partials) >= 10  # one per 160 ms chunk
    offline = stream_transcript(recognizer, from_pcm16(data), OPTIONS)
    [final] = [m for m in messages if m["type"] == "final"]
    assert final["text"] == offline.text == "U M N Y H SIX"
    assert [w["word"] for w in final["words"]] == offline.text.split()
    assert messages[-1] == {"type": "done", "text": offline.text, "duration": 2.6}


def test_a_final_brings_its_cross_attention_where_asked(server, trained) -> None:
    """ "alignment": true in the start message: each final carries the timing heads' mean
    cross-attention of its tokens (8 bits, each row's peak 255), the map the page draws."""
    import base64

    import numpy as np

    from asr.results import Decoded
    from asr.timing import attention_matrix

    (_, url), (recognizer, waves) = server, trained
    asked = json.dumps(json.loads(START) | {"alignment": True})
    [final] = [m for m in session(url, pcm16(waves[UID]), start=asked) if m["type"] == "final"]
    alignment = final["alignment"]
    pieces = recognizer.tokenizer.pieces(recognizer.tokenizer.encode(final["text"]))
    assert alignment["tokens"] == pieces and alignment["frame_seconds"] == recognizer.frame_seconds
    rows, frames = alignment["shape"]
    data = np.frombuffer(base64.b64decode(alignment["data"]), np.uint8).reshape(rows, frames)
    assert rows == len(pieces) and (data.max(axis=1) == 255).all()

    captured: list[Decoded] = []  # the same final, offline, to compare with
    stream = recognizer.stream(OPTIONS)
    stream.on_decoded = lambda span, part, decoded: captured.append(decoded)
    stream.accept(from_pcm16(pcm16(waves[UID])))
    stream.final()
    [decoded] = captured
    expected = attention_matrix(decoded.hypothesis.attention, recognizer.alignment_heads)[:rows]
    expected = (255 * expected / expected.max(dim=1, keepdim=True).values).round().numpy()
    assert np.abs(data.astype(float) - expected).max() <= 1
    [plain] = [m for m in session(url, pcm16(waves[UID])) if m["type"] == "final"]
    assert "alignment" not in plain, "only where asked"


def test_concurrent_streams_are_batched_and_each_gets_its_own(server, trained) -> None:
    (live, url), (recognizer, waves) = server, trained
    datas = [pcm16(w) for w in waves.values()]
    results: list = [None] * len(datas)

    def run(k: int) -> None:
        results[k] = session(url, datas[k], pause=0.01)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(datas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for data, messages in zip(datas, results):
        offline = stream_transcript(recognizer, from_pcm16(data), OPTIONS)
        assert messages[-1]["text"] == offline.text
    assert live.largest_batch > 1


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_that_leaves_mid_stream_is_freed(server, trained) -> None:
    (live, url), (_, waves) = server, trained
    wait_until(lambda: live.active_streams == 0)
    with contextlib.suppress(ConnectionClosed, OSError), connect(url) as ws:
        ws.send(START)
        ws.recv(10)
        ws.send(pcm16(waves[UID])[:16000])
        wait_until(lambda: live.active_streams == 1)
        ws.socket.shutdown(socket.SHUT_RDWR)  # gone without a close frame
        ws.socket.close()
        wait_until(lambda: live.active_streams == 0)
    assert session(url, pcm16(waves[UID]))[-1]["type"] == "done"  # still serving


def test_each_stream_is_logged_with_its_client_and_what_it_sent(server, trained, caplog):
    """An operator's record: who streamed how much audio, and why a stream was refused."""
    (shared, _), (recognizer, waves) = server, trained
    caplog.set_level(logging.INFO, logger="asr.serve.server")
    wait_until(lambda: shared.active_streams == 0)  # the other tests' streams have logged
    caplog.clear()
    limit = 1 << 16
    with running_server(recognizer, OPTIONS, max_message_bytes=limit) as (_, port):
        url = f"ws://127.0.0.1:{port}/"
        session(url, pcm16(waves[UID]))
        refused(url, json.dumps({"type": "start", "sample_rate": 8000}), start=False)
        with connect(url) as ws:  # a second of audio, then gone without "end"
            ws.send(START)
            ws.recv(10)
            ws.send(pcm16(waves[UID])[: 2 * 16000])
        with connect(url, max_size=None) as ws, pytest.raises(ConnectionClosed):
            ws.send(START)  # a message past websockets' own limit: it closes, no error message
            ws.recv(10)
            ws.send(b"\x00" * (8 * limit + 2))
            ws.recv(10)
        with connect(url) as ws:  # the client's own close: not worded as the server's
            ws.send(START)
            ws.recv(10)
            ws.close(4000, "user cancelled")
        peer = r"127\.0\.0\.1:\d+"
        expected = [
            rf"{peer}: stream started",
            rf"{peer}: stream ended: 2\.6 s of audio, 1 final",
            rf"{peer}: closed \(1003\): sample_rate 8000 is not supported: send 16000 Hz mono",
            rf"{peer}: stream ended: 1\.0 s of audio, 0 finals",  # what it sent, not decoded
            rf"{peer}: closed \(1009\): frame exceeds limit of {8 * limit} bytes",
            rf"{peer}: stream ended: 0\.0 s of audio, 0 finals",
            rf"{peer}: the client closed \(4000\): user cancelled",
        ]

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "asr.serve.server"]

        wait_until(lambda: len(logged()) >= len(expected))
    matches = [[m for m in logged() if re.fullmatch(e, m)] for e in expected]
    assert [len(m) for m in matches] == [4, 1, 1, 1, 1, 2, 1] and len(logged()) == 11, logged()


@pytest.mark.parametrize(
    ("sends", "start", "code", "says"),
    [
        ((b"\x00\x01\x02",), True, 1003, "not whole 2-byte samples"),
        (("hello",), True, 1003, "not JSON"),
        # JSON Python's reader refuses otherwise: answered as a server failure (1011)
        (('{"type": "start", "sample_rate": 1' + "0" * 5000 + "}",), False, 1003, "not JSON"),
        (("[" * 100_000 + "]" * 100_000,), False, 1003, "not JSON"),
        ((json.dumps({"type": "pause"}),), True, 1003, "expected audio"),
        ((b"\x00" * (1 << 20 + 1),), True, 1009, "over the 1048576-byte limit"),
        ((json.dumps({"type": "start", "sample_rate": 8000}),), False, 1003, "sample_rate 8000"),
        ((json.dumps({"type": "start", "sample_rate": 16000, "format": "mp3"}),), False, 1003,
         'format "mp3" is not one of'),
        ((json.dumps({"type": "start", "sample_rate": 16000, "format": ["s16le"]}),), False,
         1003, 'format ["s16le"] is not one of'),
        ((json.dumps({"type": "start", "sample_rate": "16000"}),), False, 1003,
         'sample_rate "16000", not a number: send 16000 Hz mono'),
        ((json.dumps({"type": "start"}),), False, 1003, "sample_rate missing"),
        ((json.dumps({"type": "start", "sample_rate": 16000, "channels": 2}),), False, 1003,
         "channels 2 is not supported: send mono"),  # else read as mono of twice the length
        ((json.dumps({"type": "start", "sample_rate": 16000, "alignment": "no"}),), False, 1003,
         'alignment "no": true or false'),  # else taken as true
        ((json.dumps({"type": "start", "sample_rate": 16000, "fromat": "f32le"}),), False, 1003,
         'the start message holds "fromat": its keys are alignment, channels, format'),
        ((b'{"type": "end"}',), True, 1003, "goes in a text frame, not a binary one"),
        ((b'{"type": "start", "sample_rate": 16000}',), False, 1003,
         'expected the start message first, in a text frame'),
        ((b"\x00\x00" * 100,), False, 1008, "start message first"),
        ((np.full(100, np.nan, dtype="<f4").tobytes(),), F32_START, 1003, "NaN or infinite"),
        ((np.full(100, 1e19, dtype="<f4").tobytes(),), F32_START, 1003,
         "f32le samples lie within ±1, got 1e+19"),  # its features would overflow
    ],
)  # fmt: skip
def test_bad_input_gets_an_error_and_a_close(server, trained, sends, start, code, says) -> None:
    (_, url), (_, waves) = server, trained
    error, close_code = refused(url, *sends, start=start)
    assert error["type"] == "error" and says in error["message"]
    assert close_code == code
    assert session(url, pcm16(waves[UID]))[-1]["type"] == "done"  # the others are served


def test_audio_bytes_that_nest_deeper_than_json_reads_are_audio() -> None:
    from asr.serve.server import _control_in_binary

    assert not _control_in_binary(b'{"a": ' + b"[" * 3000)  # it raised RecursionError


def test_audio_that_spells_a_json_object_is_audio(server, trained) -> None:
    """One s16le sample of 32123 is the bytes `{}`: the stream was refused with 1003, as if a
    control message had come in a binary frame."""
    (_, url), (_, waves) = server, trained
    audio = pcm16(waves[UID])
    assert np.frombuffer(b"{}", "<i2")[0] == 32123
    with connect(url) as ws:
        ws.send(START)
        ws.recv(10)
        for message in (audio[:16000], b"{}", audio[16000:], END):
            ws.send(message)
        said = [json.loads(message) for message in ws]
    assert said[-1]["type"] == "done" and ws.protocol.close_code == 1000


@pytest.mark.parametrize("where", ["feed", "step", "take_finals", "final"])
def test_a_stream_whose_recognition_fails_ends_and_the_server_goes_on(
    trained, monkeypatch, caplog, where
):
    """Failing in the model's thread (its audio taken in, a batch of chunks, its results, its
    last final after "end"), a stream is closed with 1011 and the reason, logged once; it is
    not tried again, and the next streams are served."""
    from asr.streaming import Stream, StreamingEngine

    caplog.set_level(logging.INFO, logger="asr.serve.server")

    recognizer, waves = trained
    poison = np.full(160, 0.125, "<f4")
    feed, step = Stream.feed, StreamingEngine.step

    def feed_or_fail(self, samples):
        if len(samples) == len(poison) and np.array_equal(samples, poison):
            if where == "feed":
                raise RuntimeError("feed failed")
            self.poisoned = True
        return feed(self, samples)

    def step_or_fail(self, streams):
        if where == "step" and any(getattr(stream, "poisoned", False) for stream in streams):
            raise RuntimeError("step failed")
        return step(self, streams)

    monkeypatch.setattr(Stream, "feed", feed_or_fail)
    monkeypatch.setattr(StreamingEngine, "step", step_or_fail)
    if where in ("take_finals", "final"):
        original = getattr(Stream, where)

        def fail_if_poisoned(self, *args, **kwargs):
            if getattr(self, "poisoned", False):
                raise RuntimeError(f"{where} failed")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Stream, where, fail_if_poisoned)
    with running_server(recognizer, OPTIONS) as (live, port):
        url = f"ws://127.0.0.1:{port}/"
        audio = waves[UID].numpy().astype("<f4")
        with connect(url) as ws:
            ws.send(F32_START)
            with contextlib.suppress(ConnectionClosed):  # it may close before the rest is sent
                for message in (poison.tobytes(), audio.tobytes(), END):
                    ws.send(message)
            said = []
            with contextlib.suppress(ConnectionClosed):  # 1011: not a normal close
                for message in ws:
                    said.append(json.loads(message))
        assert said[-1] == {"type": "error", "message": f"server error: {where} failed"}
        assert ws.protocol.close_code == 1011
        wait_until(lambda: live.active_streams == 0)
        assert session(url, pcm16(waves[UID]))[-1]["type"] == "done"
    closed = [r.getMessage() for r in caplog.records if "closed (1011)" in r.getMessage()]
    assert len(closed) == 1 and closed[0].endswith(f"server error: {where} failed")


def test_a_sender_whose_client_left_ends_without_an_error(trained) -> None:
    """Its exception would go unretrieved (the receiving side ends the connection), and
    asyncio would log an error for a client that merely left."""
    from asr.serve.server import LiveServer, ServeOptions, _Client

    class Gone:
        async def send(self, data) -> None:
            raise ConnectionClosed(None, None)

    async def run() -> None:
        live = LiveServer(trained[0], OPTIONS, ServeOptions(port=0))  # not started: no worker
        client = _Client(Gone(), live.engine.stream(), np.int16, 32768.0, 8)
        client.outbox.put_nowait({"type": "partial", "text": ""})
        try:
            await live._send(Gone(), client)
        finally:
            live._executor.shutdown()

    asyncio.run(run())


def test_connections_over_the_maximum_are_refused(trained) -> None:
    recognizer, waves = trained
    with running_server(recognizer, OPTIONS, max_connections=1) as (live, port):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url) as first:
            first.send(START)
            first.recv(10)
            error, code = refused(url, start=False)
            assert error["message"] == "the server is full (1 stream): try later" and code == 1013
        wait_until(lambda: live.active_streams == 0)
        assert session(url, pcm16(waves[UID]))[-1]["type"] == "done"


def test_one_address_may_hold_at_most_its_share_of_the_places(trained) -> None:
    recognizer, waves = trained
    with running_server(recognizer, OPTIONS, max_connections=4, max_per_address=1) as (live, port):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url) as first:
            first.send(START)
            first.recv(10)
            error, code = refused(url, start=False)
            assert (error["message"], code) == (
                "this address holds 1 stream already: try later",
                1013,
            )
            # another address is let in meanwhile
            sock = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
            data = pcm16(waves[UID])[:16000]
            assert session(url, data, sock=sock)[-1]["type"] == "done"
        wait_until(lambda: not live.connections)
        assert session(url, data)[-1]["type"] == "done"  # the place is the address's again


def test_head_gets_the_pages_headers_alone_and_other_methods_are_refused(server) -> None:
    import dataclasses
    import http.client

    from websockets.http11 import Request

    if "method" not in {field.name for field in dataclasses.fields(Request)}:
        pytest.skip("websockets before 17 answers only GET, closing on other methods itself")

    port = int(server[1].rsplit(":", 1)[1].strip("/"))
    answers = {}
    for method in ("GET", "HEAD", "POST", "PUT"):
        link = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        link.request(method, "/health")  # a body websockets refuses itself
        response = link.getresponse()
        answers[method] = (response.status, response.getheader("Content-Length"), response.read())
        allowed = response.getheader("Allow")
        link.close()
    assert answers["GET"][0] == 200 and json.loads(answers["GET"][2])["status"] == "ok"
    assert answers["HEAD"] == (200, answers["GET"][1], b"")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # http.client skips
        raw.sendall(b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # a body sent
        said = b"".join(iter(lambda: raw.recv(4096), b""))
    assert said.startswith(b"HTTP/1.1 200 ") and said.endswith(b"\r\n\r\n"), said
    assert answers["POST"][:1] == answers["PUT"][:1] == (405,) and allowed == "GET, HEAD"
    assert answers["PUT"][2] == b"PUT is not served here: GET the page\n"


def test_a_browser_may_open_the_socket_only_from_the_servers_own_page(trained) -> None:
    """Otherwise any page a browser shows could stream to the server on this machine. Clients
    that are not browsers send no Origin and are let in; so are pages `allow_origins` names."""
    from websockets.exceptions import InvalidStatus

    from asr.serve.server import ServeOptions

    recognizer, waves = trained
    allowed = ("https://ASR.example.org:443", "http://[0:0::1]:8765")  # as browsers send:
    with running_server(recognizer, OPTIONS, allow_origins=allowed) as (_, port):
        url, data = f"ws://127.0.0.1:{port}/", pcm16(waves[UID])[:16000]
        for origin in (None, f"http://127.0.0.1:{port}", "https://asr.example.org",
                       "http://[::1]:8765"):  # fmt: skip
            assert session(url, data, origin=origin)[-1]["type"] == "done", origin
        for origin in ("https://evil.example", f"http://127.0.0.1:{port + 1}", "null"):
            with pytest.raises(InvalidStatus) as refusal:
                connect(url, origin=origin)
            assert refusal.value.response.status_code == 403, origin
            assert b"is not this server's page" in refusal.value.response.body
        # DNS rebinding: another site's name made to resolve here, so Host and Origin agree
        rebound = f"evil.example:{port}"
        with pytest.raises(InvalidStatus):
            sock = socket.create_connection(("127.0.0.1", port))
            connect(f"ws://{rebound}/", sock=sock, origin=f"http://{rebound}")
        with socket.create_connection(("127.0.0.1", port)) as sock:  # no 500 and traceback
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                         b"Upgrade: h2c\r\nConnection: Upgrade\r\n\r\n")  # fmt: skip
            assert sock.recv(4096).startswith(b"HTTP/1.1 400 ")
    for value in ("asr.example.org", "https://user@asr.example.org", "https://a.example/",
                  "http://127.1", "http://*.example"):  # fmt: skip
        with pytest.raises(ValueError, match=f"{re.escape(repr(value))} is not an origin"):
            ServeOptions(allow_origins=(value,))
    with pytest.raises(ValueError, match="give the host in its xn-- form"):
        ServeOptions(allow_origins=("https://bücher.example",))


def test_an_empty_host_is_refused() -> None:
    """`--host ""` listened on every address, a socket (and with --port 0 a port) each, and
    the server said it was at http://:PORT/."""
    from asr.serve.server import ServeOptions

    for host in ("", " "):
        with pytest.raises(ValueError, match=f"host {host!r}: give an address to listen on"):
            ServeOptions(host=host)


def test_a_stream_that_sends_nothing_is_closed_and_frees_its_place(trained) -> None:
    recognizer, waves = trained
    with running_server(recognizer, OPTIONS, max_connections=1, idle_timeout=0.5) as (_, port):
        url = f"ws://127.0.0.1:{port}/"
        error, code = refused(url)  # started, then nothing
        assert (error["message"], code) == ("no audio for 0.5 s: the stream is closed", 1008)
        with connect(url, max_size=None) as ws:  # audio, then nothing: its finals, then closed
            ws.send(START)
            assert json.loads(ws.recv(10))["type"] == "ready"
            ws.send(pcm16(waves[UID]))
            said = []
            with pytest.raises(ConnectionClosed):
                while True:
                    said.append(json.loads(ws.recv(10)))
            assert ws.protocol.close_code == 1008
        # its place is free as soon as it is closed (a full server would say so; it did for a
        # moment); not a whole session, which a loaded machine may leave silent for 0.5 s
        assert refused(url)[0]["message"] == "no audio for 0.5 s: the stream is closed"
        whole = stream_transcript(recognizer, from_pcm16(pcm16(waves[UID])), OPTIONS).text
        assert [m["text"] for m in said if m["type"] == "final"] == [whole]
        assert said[-1] == {"type": "error", "message": "no audio for 0.5 s: the stream is "
                            "closed after the finals of what came"}  # fmt: skip


class NonReadingClient:
    """A WebSocket client that, after the handshake, only writes: its socket's buffers fill."""

    def __init__(self, port: int) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"))
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        self.sock.connect(("127.0.0.1", port))
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.protocol.handshake_exc is None and not self.protocol.events_received():
            self.protocol.receive_data(self.sock.recv(1024))
            if self.protocol.state.name == "OPEN":
                break

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)

    def send(self, message: str | bytes) -> None:
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        else:
            self.protocol.send_binary(message)
        self._flush()


def test_a_client_too_slow_to_read_is_dropped(trained) -> None:
    recognizer, waves = trained
    tight = dict(send_timeout=0.5, write_limit_bytes=256, send_buffer_bytes=4096)
    with running_server(recognizer, StreamOptions(chunk_ms=40, endpoint=None), **tight) as (
        live,
        port,
    ):
        client = NonReadingClient(port)
        client.send(START)
        wait_until(lambda: live.active_streams == 1)  # started, or a slow server reads 0 below
        data = pcm16(torch.cat([waves[UID]] * 8))  # 20 s: 500 chunks, a partial each
        try:
            for start in range(0, len(data), 3200):
                client.send(data[start : start + 3200])
        except OSError:  # the server cut us off: what this test wants
            pass
        wait_until(lambda: live.active_streams == 0, 10)  # its state is freed
        assert live.dropped_slow == 1
        client.sock.close()
        assert session(f"ws://127.0.0.1:{port}/", pcm16(waves[UID]))[-1]["type"] == "done"


def test_a_client_sending_faster_than_the_model_decodes_waits_and_loses_nothing(
    trained, monkeypatch, capsys
) -> None:
    """Past `max_backlog_seconds` of undecoded audio a stream's socket is not read until the
    model catches up: a flood does not pile up in the server, and a fast sender (`asr connect`
    sends files so) waits instead of being cut off, and gets every final."""
    from asr.streaming import Stream

    recognizer, waves = trained
    held = []  # a stream's audio not yet decoded, as each piece reaches the model's thread
    feed = Stream.feed
    monkeypatch.setattr(
        Stream,
        "feed",
        lambda self, s: feed(self, s) or held.append(self.samples - self.decoded_samples),
    )
    data = pcm16(torch.cat([waves[UID]] * 4))  # 10.4 s, sent at once in messages of 0.1 s
    with running_server(recognizer, OPTIONS, max_backlog_seconds=0.5) as (_, port):
        url = f"ws://127.0.0.1:{port}/"
        messages = session(url, data)
        assert main(["connect", url, str(WAV / f"{UID}.wav")]) == 0
    assert max(held) <= (0.5 + 0.2) * 16000, max(held)  # the limit, and a message or two
    offline = stream_transcript(recognizer, from_pcm16(data), OPTIONS)
    assert messages[-1] == {"type": "done", "text": offline.text, "duration": 10.4}
    assert printed_texts(capsys.readouterr().out) == ["U M N Y H SIX"]


def _flood(url: str, seconds: int, leave: bool) -> None:
    """Send `seconds` of audio in messages of 10 s, as fast as the socket takes them, then
    leave without a close frame (`leave`) or wait for the server to close."""
    with contextlib.suppress(ConnectionClosed, OSError), connect(url) as ws:
        ws.send(START)
        ws.recv(10)
        for _ in range(seconds // 10):
            ws.send(bytes(2 * 16000 * 10))
        if leave:
            ws.socket.shutdown(socket.SHUT_RDWR)
            ws.socket.close()
        else:
            for _ in ws:
                pass


def test_a_client_held_back_that_leaves_or_fails_is_forgotten(trained, monkeypatch, caplog) -> None:
    """A stream waiting for the model to catch up must still end when its client goes (its
    queued audio is not decoded for nobody) or its recognition fails (nothing else would wake
    it: the server could then not stop either). A close of its own is logged as one."""
    from asr.streaming import Stream

    caplog.set_level(logging.INFO, logger="asr.serve.server")

    recognizer, _ = trained
    decoded, feed = [], Stream.feed

    def slow_feed(self, samples):
        if getattr(self, "fail", False):
            raise RuntimeError("feed failed")
        time.sleep(0.05)  # a model slower than the sender
        decoded.append(len(samples))
        return feed(self, samples)

    monkeypatch.setattr(Stream, "feed", slow_feed)
    with running_server(recognizer, OPTIONS, max_backlog_seconds=0.5) as (live, port):
        url = f"ws://127.0.0.1:{port}/"
        _flood(url, 60, leave=True)
        wait_until(lambda: live.active_streams == 0)
        assert sum(decoded) < 30 * 16000, "the audio of a client gone was decoded"
        with connect(url) as ws:
            ws.send(START)
            ws.recv(10)
            ws.send(bytes(2 * 16000 * 10))
            wait_until(lambda: any(not client.room.is_set() for client in live.clients))
            ws.close(4000, "user cancelled")
        wait_until(lambda: live.active_streams == 0)
        said = [record.getMessage() for record in caplog.records]
        assert any(line.endswith("the client closed (4000): user cancelled") for line in said)
        monkeypatch.setattr(Stream, "fail", True, raising=False)
        _flood(url, 60, leave=False)
        wait_until(lambda: live.active_streams == 0)


def test_at_full_context_without_endpoints_a_recording_over_the_backlog_is_refused(trained) -> None:
    """Nothing is decoded before the end there (without endpoints): the limit is the longest
    recording."""
    recognizer, waves = trained
    full = StreamOptions(chunk_ms=None, endpoint=None)
    with running_server(recognizer, full, max_backlog_seconds=2.0) as (_, port):
        url = f"ws://127.0.0.1:{port}/"
        data = pcm16(waves[UID])  # 2.6 s
        error, code = refused(url, data[: 2 * 16000], data[2 * 16000 :])
        assert code == 1009 and error["message"].startswith("over 2 s of audio: at full context")
        assert session(url, data[: 2 * 16000])[-1]["type"] == "done"
    # with endpoints an utterance is decoded at its longest: the backlog drains
    cut = StreamOptions(chunk_ms=None, endpoint=EndpointOptions(max_utterance=1.0))
    with running_server(recognizer, cut, max_backlog_seconds=2.0) as (_, port):
        messages = session(f"ws://127.0.0.1:{port}/", pcm16(torch.cat([waves[UID]] * 3)))
        assert messages[-1]["type"] == "done", messages[-1]


def test_asr_serve_serves_the_page_and_the_socket(tiny_checkpoint, an4_fixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "asr", "serve", "--model", str(tiny_checkpoint["checkpoint"]),
               "--port", str(port), "--chunk-ms", "320"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []  # log lines may come first
        while not any(f"http://127.0.0.1:{port}/" in line for line in lines):
            lines.append(process.stdout.readline())
            assert lines[-1], lines  # the server ended
        assert "1 model thread;" in lines[-1]  # the default: the other core serves the network
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "<title>asr live</title>" in page
        worklet = urllib.request.urlopen(f"http://127.0.0.1:{port}/worklet.js", timeout=10).read()
        assert b"registerProcessor" in worklet
        from asr.audio import load_audio

        wave = load_audio(an4_fixture / "wav/an4_clstk/fash/an255-fash-b.wav", 16000)
        messages = session(f"ws://127.0.0.1:{port}/", pcm16(wave))
        assert messages[0]["chunk_ms"] == 320 and messages[-1]["type"] == "done"
        # SIGTERM, as a service manager stops it: the open stream still gets its "done"
        with connect(f"ws://127.0.0.1:{port}/") as ws:
            ws.send(START)
            ws.recv(10)
            ws.send(pcm16(wave)[:16000])
            assert json.loads(ws.recv(10))["type"] == "partial"
            process.terminate()
            messages = [json.loads(m) for m in ws]
        assert messages[-1]["type"] == "done" and ws.close_code == 1001
        assert process.wait(10) == 0
        assert "asr serve: stopped" in process.stdout.read()
    finally:
        process.kill()
        process.wait(10)


def test_a_second_ctrl_c_stops_the_server_at_once_while_a_peer_answers_nothing(
    tiny_checkpoint,
) -> None:
    """A peer that dropped off the network answers no close: the first Ctrl-C waits for it,
    the second cuts it off rather than wait out the closing handshake."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "asr", "serve", "--model", str(tiny_checkpoint["checkpoint"]),
               "--port", str(port), "--chunk-ms", "320"]  # fmt: skip
    at_a_terminal = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731 - not `&`
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=at_a_terminal)  # fmt: skip
    try:
        while f"http://127.0.0.1:{port}/" not in (line := process.stdout.readline()):
            assert line, "the server ended"
        with socket.create_connection(("127.0.0.1", port)) as deaf:
            deaf.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                         b"Sec-WebSocket-Version: 13\r\n\r\n")  # fmt: skip
            assert deaf.recv(4096).startswith(b"HTTP/1.1 101 ")
            start = START.encode()
            deaf.sendall(bytes([0x81, 0x80 | len(start)]) + bytes(4) + start)  # masked by 0s
            assert b'"ready"' in deaf.recv(4096)
            process.send_signal(signal.SIGINT)
            while "stopping" not in (line := process.stdout.readline()):
                assert line, "the server ended"
            begun = time.monotonic()
            process.send_signal(signal.SIGINT)
            assert process.wait(10) == 130
            assert time.monotonic() - begun < 5
        assert "asr serve: interrupted" in process.stdout.read()
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def test_with_a_certificate_the_page_is_https_and_the_socket_wss(
    trained, certificate, capsys, caplog, tmp_path
) -> None:
    (recognizer, waves), (cert, key) = trained, certificate
    caplog.set_level(logging.INFO, logger="asr.serve.server")
    trust = ssl.create_default_context(cafile=cert)
    data = pcm16(waves[UID])
    wav = str(WAV / f"{UID}.wav")
    with running_server(recognizer, OPTIONS, certfile=str(cert), keyfile=str(key)) as (_, port):
        page = urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=trust, timeout=10)
        assert b"<title>asr live</title>" in page.read()
        messages = tls_session(f"wss://127.0.0.1:{port}/", data, trust)
        url = f"wss://127.0.0.1:{port}/"
        assert main(["connect", url, wav, "--cafile", str(cert)]) == 0
        assert printed_texts(capsys.readouterr().out) == ["U M N Y H SIX"]
        assert main(["connect", url, wav]) == 2  # self-signed: not trusted unless told
        assert "certificate verify failed" in (err := capsys.readouterr().err)
        assert err.rstrip().endswith("(--cafile trusts it)")
        assert main(["connect", url.upper(), wav, "--cafile", str(cert)]) == 0  # WSS:// alike
        assert printed_texts(capsys.readouterr().out) == ["U M N Y H SIX"]
        for cafile, said in ((str(tmp_path / "none.pem"), "No such file or directory"),
                             (str(key), "")):  # fmt: skip
            assert main(["connect", url, wav, "--cafile", cafile]) == 2
            assert f"asr connect: error: --cafile {cafile}: {said}" in capsys.readouterr().err
        plain = url.replace("wss:", "ws:")
        assert main(["connect", plain, wav, "--cafile", str(cert)]) == 2
        assert "trusts a wss:// server's certificate" in capsys.readouterr().err
        assert main(["connect", plain, wav]) == 2  # ws:// to a server serving TLS
        err = capsys.readouterr().err.rstrip()
        assert err.endswith(f"(is it serving TLS? then {url})"), err
    offline = stream_transcript(recognizer, from_pcm16(data), OPTIONS)
    assert messages[-1] == {"type": "done", "text": offline.text, "duration": 2.6}
    ended = [r.getMessage() for r in caplog.records if "stream ended" in r.getMessage()]
    assert ended and all(m.startswith("127.0.0.1:") for m in ended), ended  # after the close


def test_connect_uses_each_tls_session_from_one_thread(
    trained, certificate, monkeypatch, capsys
) -> None:
    """OpenSSL forbids using one session from two threads at once: a client that reads in one
    thread while writing in another can lose its handshake (seen as a wss:// open timeout)."""
    (recognizer, _), (cert, key) = trained, certificate
    threads: dict[object, set[int]] = {}  # held, so that no id is reused

    def recorded(cls, name):
        method = getattr(cls, name)

        def call(self, *args, **kwargs):
            threads.setdefault(self, set()).add(threading.get_ident())
            return method(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, call)

    for cls, names in [
        (ssl.SSLObject, ["read", "write", "do_handshake"]),
        (ssl.SSLSocket, ["recv", "recv_into", "send", "sendall", "read", "write"]),
    ]:
        for name in names:
            recorded(cls, name)
    with running_server(recognizer, OPTIONS, certfile=str(cert), keyfile=str(key)) as (_, port):
        url = f"wss://127.0.0.1:{port}/"
        assert main(["connect", url, str(WAV / f"{UID}.wav"), "--cafile", str(cert)]) == 0
    assert printed_texts(capsys.readouterr().out) == ["U M N Y H SIX"]
    assert len(threads) >= 2 and all(len(used) == 1 for used in threads.values())


def test_options_that_do_not_hold_are_named_before_the_model_loads(
    certificate, tmp_path, capsys
) -> None:
    (cert, key), not_pem = certificate, tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    serve = ["serve", "--model", str(tmp_path / "absent.ckpt")]
    for options, says in [
        (["--certfile", str(tmp_path / "gone.pem")], f"{tmp_path / 'gone.pem'}: no such file"),
        (["--certfile", str(not_pem)], f"{not_pem}: not a PEM certificate and its private key"),
        (["--certfile", str(cert)], f"{cert}: not a PEM certificate and its private key"),
        (["--certfile", str(cert), "--keyfile", str(not_pem)], f"{cert} and {not_pem}: not a"),
        (["--keyfile", str(key)], "--keyfile needs --certfile"),
        (["--lm-weight", "0.3"], "--lm-weight needs --lm"),
        (["--certfile", str(cert), "--keyfile", str(key)], "absent.ckpt"),  # loaded: the model next
    ]:
        assert main([*serve, *options]) == 2, options
        assert says in capsys.readouterr().err, options


def test_a_taken_port_is_named(tiny_checkpoint, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = ["serve", "--model", str(tiny_checkpoint["checkpoint"]), "--port", str(port)]
        assert main(serve) == 2
    said = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use (--host, --port)" in said
    serve = ["serve", "--model", str(tiny_checkpoint["checkpoint"]), "--host", "nohost.invalid"]
    assert main(serve) == 2
    said = capsys.readouterr().err  # getaddrinfo's reason, not "Unknown error -2"
    assert "cannot listen on nohost.invalid:8765: " in said and "Unknown error" not in said


@pytest.mark.parametrize(
    "options, url, hint",
    [
        ([], "http://127.0.0.1:8765/", False),
        (["--host", "::1"], "http://[::1]:8765/", False),
        (["--host", "0.0.0.0"], "http://0.0.0.0:8765/", True),
        (["--host", "0.0.0.0", "--certfile", "c.pem"], "https://0.0.0.0:8765/", False),
        (["--port", "0"], "http://127.0.0.1:43210/", False),
    ],
)
def test_serve_says_where_it_listens_and_how_other_machines_get_the_microphone(
    trained, monkeypatch, capsys, options, url, hint
) -> None:
    import asr.serve.server
    from asr.cli import _parser
    from asr.cli.live import serve

    served = []

    async def ready_at_once(recognizer, stream_options, serve_options, lm, ready, stop) -> None:
        served.append(serve_options)
        bound = serve_options.port or 43210  # port 0: the one the system chose
        ready(SimpleNamespace(engine=SimpleNamespace(chunk_seconds=0.64), port=bound))

    monkeypatch.setattr(asr.serve.server, "serve_forever", ready_at_once)
    assert serve(_parser("serve").parse_args(["serve", "--model", "M", *options]), trained[0]) == 0
    said = capsys.readouterr().out
    socket_url = url.replace("http", "ws")
    assert f"asr serve: {url} (the microphone page); WebSocket on {socket_url}," in said
    assert ("give --certfile (and --keyfile), or open it there through `ssh -L" in said) == hint
    assert served[0].certfile == ("c.pem" if "--certfile" in options else None)


def test_a_stopping_server_ends_each_open_stream_with_the_finals_of_its_audio(trained) -> None:
    """Stopped mid-recording: the stream gets the finals of all the audio it sent (the last
    part chunk included), its "done" and a close with 1001; connections not started are closed
    at once; no new ones are taken. (Before, /health counts them.)"""
    recognizer, waves = trained
    sent = pcm16(waves[UID])[: 2 * 16000 * 13 // 10]  # 1.3 s: eight 160 ms chunks and a part
    with running_server(recognizer, OPTIONS) as (live, port):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url) as idle, connect(url) as ws:
            ws.send(START)
            ws.recv(10)
            ws.send(sent)  # one message: once a partial comes, the server has all of it
            assert json.loads(ws.recv(10))["type"] == "partial"
            health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10)
            assert health.headers["Content-Type"] == "application/json"
            counts = json.loads(health.read())
            assert 0 < counts.pop("chunks_run") <= live.chunks_run  # the model may run on
            assert counts == {"status": "ok", "sample_rate": live.sample_rate, "streams": 1,
                              "connections": 2, "max_connections": 32}  # fmt: skip
            stopping = asyncio.run_coroutine_threadsafe(live.stop(10), live.server.get_loop())
            messages = [json.loads(m) for m in ws]
            stopping.result(10)
            with pytest.raises(ConnectionClosed):
                idle.recv(1)
        assert (ws.close_code, ws.close_reason) == (1001, "the server is stopping")
        assert idle.close_code == 1001
        with pytest.raises(OSError):
            connect(url, open_timeout=5)
    offline = stream_transcript(recognizer, from_pcm16(sent), OPTIONS)
    assert [m["text"] for m in messages if m["type"] == "final"] == [offline.text]
    assert messages[-1] == {"type": "done", "text": offline.text, "duration": 1.3}
    assert live.active_streams == 0 and not live.connections


def printed_texts(out: str) -> list[str]:
    """The text of each `[start --> end] text` line."""
    return [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[")]


def test_connect_prints_what_the_server_finds_in_each_file(server, trained, tmp_path, capsys):
    """`asr connect URL FILES`: each file a stream of its own, its finals printed as lines
    (the server hears the file's samples exactly); a bad file is named and the rest go on.
    Each is sent once, as `asr transcribe` reads it (`- -` streamed stdin twice), however spelt."""
    (_, url), (recognizer, waves) = server, trained
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(64))
    files = [WAV / "an4_clstk/fash/an255-fash-b.wav", bad, WAV / "an4_clstk/fash/an253-fash-b.wav"]
    again = f"{files[0].parent}/./{files[0].name}"
    assert main(["connect", url, *map(str, files), str(files[0]), again]) == 1
    out, err = capsys.readouterr()
    expected = [
        stream_transcript(recognizer, waves[uid], OPTIONS).text
        for uid in ("an4_clstk/fash/an255-fash-b", "an4_clstk/fash/an253-fash-b")
    ]
    assert printed_texts(out) == expected and expected[0] == "U M N Y H SIX"
    assert [line for line in out.splitlines() if not line.startswith("[")] == list(map(str, files))
    assert f"asr connect: error: {bad}:" in err


def test_jsonl_prints_each_final_as_the_server_sends_it(server, trained, capsys) -> None:
    """`--jsonl` of `asr connect` and of `asr transcribe --streaming`: each final as the message
    the server sends for it, with the input's name added."""
    import io

    from asr.cli import _parser
    from asr.cli.live import transcribe_streaming

    (_, url), (recognizer, waves) = server, trained
    wav = str(WAV / f"{UID}.wav")
    sent = session(url, waves[UID].numpy().astype("<f4").tobytes(), start=F32_START)
    expected = [m | {"audio": wav} for m in sent if m["type"] == "final"]
    assert [m["text"] for m in expected] == ["U M N Y H SIX"]
    assert main(["connect", url, wav, "--jsonl"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == expected
    live = ["--chunk-ms", "160", "--endpoint-silence", "0", "--final-search", "rescore"]
    args = ["transcribe", "--streaming", "--jsonl", "--model", "in-memory", *live, wav]
    out = io.StringIO()
    assert transcribe_streaming(_parser("transcribe").parse_args(args), recognizer, out=out) == 0
    assert [json.loads(line) for line in out.getvalue().splitlines()] == expected


def test_connect_in_real_time_sends_at_the_pace_of_speech(server, trained, monkeypatch, capsys):
    import asr.cli.connect

    (_, url), (recognizer, waves) = server, trained
    clock = SimpleNamespace(now=0.0)
    fake = SimpleNamespace(monotonic=lambda: clock.now)
    fake.sleep = lambda seconds: setattr(clock, "now", clock.now + seconds)
    monkeypatch.setattr(asr.cli.connect, "time", fake)
    assert main(["connect", url, str(WAV / f"{UID}.wav"), "--realtime"]) == 0
    assert clock.now == pytest.approx(2.6)  # the recording's length: its last piece at its end
    offline = stream_transcript(recognizer, waves[UID], OPTIONS)
    assert printed_texts(capsys.readouterr().out) == [offline.text]


@pytest.mark.usefixtures("ctrl_c")
def test_connect_streams_stdin_until_ctrl_c(server, trained, monkeypatch, capsys):
    """`arecord | asr connect URL -` stopped with Ctrl-C: what was read by then, sent or not
    yet, gets its final."""
    import asr.cli.connect

    (_, url), (recognizer, waves) = server, trained
    heard = pcm16(waves[UID])[:19200]

    def microphone(rate: int, interrupted: list, gone=None):
        os.kill(os.getpid(), signal.SIGINT)  # 0.6 s read while the connection opened
        for start in range(0, len(heard), 3200):
            yield heard[start : start + 3200]
        assert interrupted, "the Ctrl-C was not heard"  # StdinPcm's pieces end here then

    stdin = SimpleNamespace(pieces=microphone, cut=lambda: None)  # `StdinPcm`'s stand-in
    monkeypatch.setattr(asr.cli.connect, "StdinPcm", lambda: stdin)
    assert main(["connect", url, "-"]) == 130
    offline = stream_transcript(recognizer, from_pcm16(heard), OPTIONS)
    assert printed_texts(capsys.readouterr().out) == [offline.text]


def test_connect_streams_a_pipe_without_loading_torch(server, trained) -> None:
    """`arecord | asr connect URL -` in a process of its own: the pipe is streamed to its end,
    and the client never imports torch (its start-up would keep the microphone waiting)."""
    (_, url), (recognizer, waves) = server, trained
    data = pcm16(waves[UID])
    client = (
        "import sys; from asr.cli import main; status = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'the client imported torch'; sys.exit(status)"
    )
    run = subprocess.run(
        [sys.executable, "-c", client, "connect", url, "-"],
        input=data,
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr.decode()
    offline = stream_transcript(recognizer, from_pcm16(data), OPTIONS)
    assert printed_texts(run.stdout.decode()) == [offline.text]


def test_connect_says_why_the_server_refused_or_cannot_be_reached(server, capsys) -> None:
    (_, url) = server
    wav = str(WAV / "an4_clstk/fash/an253-fash-b.wav")
    assert main(["connect", url, wav, "--sample-rate", "8000"]) == 1
    said = capsys.readouterr().err
    assert f"asr connect: error: {wav}: sample_rate 8000 is not supported: send 16000 Hz" in said
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"ws://127.0.0.1:{probe.getsockname()[1]}/"
    assert main(["connect", closed, wav]) == 2
    assert f"asr connect: error: cannot connect to {closed}:" in capsys.readouterr().err
    for bad in ("ws://127.0.0.1:99999/", "127.0.0.1:8765"):  # said before any file is read
        assert main(["connect", bad, "missing.wav"]) == 2
        assert f"asr connect: error: cannot connect to {bad}: " in capsys.readouterr().err


def test_connect_gives_up_on_a_server_that_falls_silent(monkeypatch, capsys) -> None:
    """It sends no pings (a server holding it back would read no pongs): a server decoding in
    chunks sends a partial for each, so one silent that long is stuck."""
    from websockets.sync.server import serve

    import asr.cli.connect

    def stuck(ws):
        ws.recv()
        ws.send(json.dumps({"type": "ready", "chunk_ms": 320, "sample_rate": 16000}))
        time.sleep(3)  # then it closes: the client must have given up before

    monkeypatch.setattr(asr.cli.connect, "SILENT_SERVER", 0.5)
    with serve(stuck, "127.0.0.1", 0, close_timeout=0.1) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}/"
        assert main(["connect", url, str(WAV / f"{UID}.wav")]) == 1
        server.shutdown()
    assert "the server sent nothing for 0.5 s" in capsys.readouterr().err


def test_connect_waits_on_a_source_that_pauses_where_the_server_is_not(monkeypatch, capsys):
    """A microphone quiet for longer than the wait, every second of its audio answered: the
    server owes nothing, and the stream goes on."""
    from websockets.sync.server import serve

    import asr.cli.connect

    def keeping_up(ws):
        ws.recv()
        ws.send(json.dumps({"type": "ready", "chunk_ms": 320, "sample_rate": 16000}))
        heard = 0.0
        while isinstance(message := ws.recv(), bytes):
            heard += len(message) / 32000
            ws.send(json.dumps({"type": "partial", "text": "", "audio_seconds": heard}))
        final = {"type": "final", "text": "YES", "start": 0.0, "end": heard, "words": []}
        ws.send(json.dumps(final))
        ws.send(json.dumps({"type": "done", "text": "YES", "duration": heard}))
        ws.close()

    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read, "rb"))
    monkeypatch.setattr(asr.cli.connect, "SILENT_SERVER", 0.5)

    def microphone():
        os.write(write, bytes(16000))  # half a second, a pause of three waits, half a second
        time.sleep(1.5)
        os.write(write, bytes(16000))
        os.close(write)

    with serve(keeping_up, "127.0.0.1", 0, close_timeout=0.1) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        threading.Thread(target=microphone, daemon=True).start()
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}/"
        assert main(["connect", url, "-"]) == 0, capsys.readouterr().err
        server.shutdown()
    assert "YES" in capsys.readouterr().out


def test_connect_says_why_a_full_server_refused_it(trained, monkeypatch, capsys) -> None:
    """The server refuses as the connection opens, often before the client's start message:
    that start's failure is not the news, the server's reason is."""
    import websockets.asyncio.client

    opened = websockets.asyncio.client.connect

    async def slow_to_start(*args, **kwargs):
        ws = await opened(*args, **kwargs)
        await asyncio.sleep(0.5)  # the refusal and close arrive first
        return ws

    monkeypatch.setattr(websockets.asyncio.client, "connect", slow_to_start)
    wav = str(WAV / "an4_clstk/fash/an253-fash-b.wav")
    with running_server(trained[0], OPTIONS, max_connections=1) as (_, port):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url) as first:
            first.send(START)
            first.recv(10)
            assert main(["connect", url, wav]) == 1
    said = capsys.readouterr().err
    assert said == f"asr connect: error: {wav}: the server is full (1 stream): try later\n"


def test_connect_leaves_a_paused_stdin_once_the_server_has_closed(trained, monkeypatch, capsys):
    """A source that pauses (or sends nothing) does not hold the client past the close."""
    recognizer, waves = trained
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read, "rb"))
    os.write(write, pcm16(waves[UID])[:16000])  # half a second, then nothing
    closing = threading.Timer(10, os.close, [write])  # where the client waits for the pipe
    closing.start()
    with running_server(recognizer, OPTIONS, idle_timeout=1.0) as (_, port):
        begun = time.monotonic()
        assert main(["connect", f"ws://127.0.0.1:{port}/", "-"]) == 1
        assert time.monotonic() - begun < 5
    closing.cancel()
    os.close(write)
    assert "no audio for 1 s: the stream is closed" in capsys.readouterr().err


def test_audio_queued_while_the_model_takes_the_inbox_is_not_lost(trained) -> None:
    """The event loop binds a client's inbox, converts the message, then appends; the model's
    thread may drain the inbox in between. The piece must still reach the stream."""
    from asr.serve.server import LiveServer, _Client

    recognizer, _ = trained
    live = LiveServer(recognizer, OPTIONS)
    client = _Client(None, live.engine.stream(), "int16", 32768.0, limit=8)
    client.inbox.append(torch.zeros(800).numpy())
    held = client.inbox  # what `client.inbox.append(...)` has bound before its argument is ready
    live._decode([client])  # the model's thread takes the queued audio meanwhile
    held.append(torch.zeros(800).numpy())
    live._decode([client])
    assert client.stream.samples == 1600
