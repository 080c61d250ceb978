"""`asr serve`: live recognition over WebSocket, and a page that streams the microphone to it.

Protocol (one recording per connection; docs/streaming.md):

- client: a text message `{"type": "start", "sample_rate": 16000, "format": "s16le"}` (format
  `s16le`, little-endian 16-bit PCM, or `f32le`; `"alignment": true` asks for each final's
  cross-attention), then binary messages of mono PCM, then `{"type": "end"}`;
- server: `{"type": "ready", ...}`, then `{"type": "partial", "text", "utterance",
  "audio_seconds"}` after every chunk, `{"type": "final", "text",
  "start", "end", "words", "utterance"}` at each endpoint (and `"alignment": {"tokens",
  "frame_seconds", "shape", "data"}` where asked: `shape` `(tokens, frames)` of the timing
  heads' mean attention, each row scaled to its peak, as base64 bytes; null for a model
  without), and after "end" the last final and
  `{"type": "done", "text", "duration"}`; `{"type": "error", "message"}` and a close on bad input.
  A server told to stop sends each open stream the finals of the audio it has, its "done", and
  a close with 1001 (going away).

A browser's handshake (one with an Origin header) is refused with 403 unless it comes from the
server's own page, or from an origin `ServeOptions.allow_origins` names.

One worker thread runs the model: the chunks of all connected streams that are ready go through
the encoder as one batch.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import os
import re
import socket
import ssl
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.protocol import State

from asr.audio import LOUDEST_SAMPLE
from asr.explore.page import embedded_json
from asr.explore.records import quantized_attention
from asr.streaming import Stream, StreamingEngine, StreamOptions
from asr.text import json_line
from asr.timing import attention_matrix

if TYPE_CHECKING:
    from websockets.asyncio.server import Server, ServerConnection
    from websockets.http11 import Request, Response

    from asr.recognizer import Recognizer
    from asr.results import Decoded, Transcript
    from asr.search import LanguageModel

log = logging.getLogger(__name__)

FORMATS = {"s16le": (np.int16, 32768.0), "f32le": (np.float32, 1.0)}
START_KEYS = {"type", "sample_rate", "format", "channels", "alignment"}
# By the last part of the path, so that the page works under any prefix a reverse proxy
# gives it (its own URLs are relative, and its socket is the page's address).
PAGES = {
    "": ("live.html", "text/html"),
    "live.js": ("live.js", "text/javascript"),
    "worklet.js": ("worklet.js", "text/javascript"),
}
MODEL = "{{MODEL}}"  # where live.html holds what the page needs to know of the model, as JSON

# Close codes (RFC 6455): going away, unsupported data, policy, too big, try again later.
GOING_AWAY, UNSUPPORTED, POLICY, TOO_BIG = 1001, 1003, 1008, 1009
SERVER_ERROR, TRY_LATER = 1011, 1013
STOPPING = "the server is stopping"


@dataclass(frozen=True)
class ServeOptions:
    """Where and how `asr serve` listens."""

    host: str = "127.0.0.1"  # only this machine by default; 0.0.0.0 serves the network
    port: int = 8765
    max_connections: int = 32  # more are refused with an error message
    # connections one client address may hold; None: any up to max_connections (behind a
    # reverse proxy every connection comes from the proxy's address)
    max_per_address: int | None = None
    max_message_bytes: int = 1 << 20  # a larger audio message is refused
    max_queued_messages: int = 1024  # results a client has not taken: more, and it is dropped
    send_timeout: float = 5.0  # seconds one result may wait for the client to read
    start_timeout: float = 10.0  # seconds a new connection has to send its start message
    write_limit_bytes: int = 1 << 15  # unsent bytes a connection buffers before it waits
    send_buffer_bytes: int | None = None  # the sockets' kernel send buffer; None: the system's
    batch_wait_ms: float = 5.0  # wait this long for other streams' chunks before a batch
    # audio a stream may hold undecoded: past it, its socket is not read until the model catches
    # up; at full context, where nothing is decoded before the end, a longer recording is refused
    max_backlog_seconds: float = 30.0
    idle_timeout: float = 30.0  # seconds a started stream may send nothing: then it is closed
    allow_origins: tuple[str, ...] = ()  # other pages' origins (https://host[:port]) let in
    certfile: str | None = None  # a PEM certificate (chain): https and wss instead of http and ws
    keyfile: str | None = None  # its private key, when not in certfile

    def __post_init__(self) -> None:
        """Checks `host` and `allow_origins`, each origin kept as a browser sends it."""
        if not self.host.strip():  # every address, to the system: a socket each, a port each
            raise ValueError(
                f"host {self.host!r}: give an address to listen on (127.0.0.1: this machine "
                "only; 0.0.0.0: the network)"
            )
        object.__setattr__(self, "allow_origins", tuple(map(allowed_origin, self.allow_origins)))


def allowed_origin(origin: str) -> str:
    """`origin` as a browser sends it (`http(s)://HOST[:PORT]`: lower case, an address in its
    short form, no default port), or a ValueError; a host name beyond ASCII is asked for in the
    punycode (`xn--`) a browser sends, which only browsers' IDNA rules give reliably.

    >>> allowed_origin("HTTPS://Asr.Example:443"), allowed_origin("http://[0:0::1]:8765")
    ('https://asr.example', 'http://[::1]:8765')
    """
    form = "http(s)://HOST[:PORT], as a browser sends it"
    scheme, _, rest = origin.partition("://")
    scheme = scheme.lower()
    try:
        parts = urlsplit(f"{scheme}://{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if scheme not in ("http", "https") or not host or port == 0 or re.search(r"[/?#@]", rest):
        raise ValueError(f"{origin!r} is not an origin: {form}")
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        if not host.isascii():
            said = f"{origin!r}: give the host in its xn-- form, as a browser sends it"
            raise ValueError(said) from None
        numeric = re.fullmatch(r"[0-9.]+", host)  # 127.1: a browser sends 127.0.0.1
        if numeric or not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*\.?", host):
            raise ValueError(f"{origin!r} is not an origin: {form}") from None
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def tls_context(certfile: str, keyfile: str | None = None) -> ssl.SSLContext:
    """The server's TLS from a PEM certificate chain and its private key (in `certfile` when
    `keyfile` is None); errors name the file that does not load."""
    for path in (certfile, keyfile):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as err:
        files = certfile if keyfile is None else f"{certfile} and {keyfile}"
        raise ValueError(
            f"{files}: not a PEM certificate and its private key ({err.reason or err})"
        ) from None
    return context


class CannotListen(OSError):
    """The server's address is taken, or not one of this machine's."""


class ClientError(Exception):
    """Bad input from a client: sent to it as an error message before the close `code`."""

    def __init__(self, message: str, code: int = POLICY) -> None:
        super().__init__(message)
        self.code = code


class _Client:
    """One connection's stream, its audio inbox and its outbox."""

    def __init__(
        self, ws: ServerConnection, stream: Stream, dtype: type, scale: float, limit: int
    ) -> None:
        self.ws, self.stream, self.dtype, self.scale = ws, stream, dtype, scale
        # audio not yet fed: the event loop appends, the model's thread pops (both atomic, so no
        # piece can land in a list the other thread has already taken)
        self.inbox: deque[np.ndarray] = deque()
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.limit = limit
        self.utterances = 0
        self.received = 0  # samples of audio the client sent
        self.ending = False
        self.too_slow = False
        self.stopped = False  # ended by the server's stop, not by the client's "end"
        self.idle: str | None = None  # ended as silent this long: said after its finals
        self.failed: str | None = None  # why recognising its stream failed in the model's thread
        self.alignments: deque[dict[str, Any] | None] | None = None  # the finals', if asked
        self.room = asyncio.Event()  # cleared while its backlog is full: its socket is not read
        self.room.set()

    @property
    def backlog(self) -> int:
        """Samples received and not yet read by a decoded chunk."""
        return self.received - self.stream.decoded_samples

    def put(self, messages: list[dict[str, Any]]) -> None:
        """Queue one batch's results; a client still holding more than `limit` unsent results
        from earlier batches is too slow (a batch may itself be long: a backlog's chunks)."""
        if self.outbox.qsize() > self.limit:
            self.too_slow = True
            return
        for message in messages:
            self.outbox.put_nowait(message)


class LiveServer:
    """The WebSocket server: connections, the batching worker, the page."""

    def __init__(
        self,
        recognizer: Recognizer,
        stream_options: StreamOptions | None = None,
        options: ServeOptions | None = None,
        lm: LanguageModel | None = None,
    ) -> None:
        self.options = options or ServeOptions()
        self.tls = (
            tls_context(self.options.certfile, self.options.keyfile)
            if self.options.certfile
            else None
        )
        self.engine = StreamingEngine(recognizer, stream_options, lm)
        self.sample_rate = recognizer.sample_rate
        self.clients: set[_Client] = set()
        self.connections: set[ServerConnection] = set()  # started or not
        self.stopping = False
        self._work = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="asr-serve-model")
        self.chunks_run = 0  # chunks decoded, all streams
        self.largest_batch = 0  # most streams' chunks decoded together
        self.dropped_slow = 0  # clients cut off for not reading their results

    @property
    def active_streams(self) -> int:
        return len(self.clients)

    @property
    def port(self) -> int:
        """The port listened on: for port 0, the one the system chose."""
        return next(iter(self.server.sockets)).getsockname()[1]

    async def start(self) -> Server:
        """Listen (returns once bound; `Server.serve_forever()`, `stop()` or `close()` after)."""
        from websockets.asyncio.server import serve

        self._worker = asyncio.create_task(self._run_batches())
        try:
            self.server = await serve(
                self._connection,
                self.options.host,
                self.options.port,
                process_request=self._page,
                max_size=8 * self.options.max_message_bytes,  # beyond our own, clearer limit
                max_queue=8,  # frames buffered while a stream's backlog is full: then TCP waits
                # a stream held back is not read, nor are its pongs: dead peers are found by
                # --idle-timeout and by the closing of their sockets instead
                ping_interval=None,
                write_limit=self.options.write_limit_bytes,
                ssl=self.tls,
            )
        except OSError as err:
            self._worker.cancel()
            if isinstance(err, socket.gaierror):  # a host name: its errno is getaddrinfo's
                why = err.strerror or str(err)
            else:
                why = os.strerror(err.errno) if err.errno else str(err)
            where = f"{self.options.host}:{self.options.port}"
            raise CannotListen(err.errno, f"cannot listen on {where}: {why}") from None
        return self.server

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully: no new connections, and each open stream ends as if its client had
        sent "end" (the finals of the audio received, its "done"), then closes with 1001. Streams
        not done within `timeout` seconds, and connections not yet started, are closed."""
        self.stopping = True
        self.server.close(close_connections=False)  # stop listening
        for client in self.clients:
            if not client.ending:
                client.ending = client.stopped = True
        self._work.set()
        started = {client.ws for client in self.clients}
        await _close_all([ws for ws in self.connections if ws not in started])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.clients and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await _close_all(list(self.connections))
        await self.server.wait_closed()

    def abort(self) -> None:
        """Cut every connection at once, with no closing handshake (a second Ctrl-C)."""
        for ws in list(self.connections):
            ws.transport.abort()

    def _page(self, connection: ServerConnection, request: Request) -> Response | None:
        """Plain HTTP requests get the live page, or /health; WebSocket upgrades go through,
        unless a browser opens them from another site's page. HEAD gets GET's headers alone,
        other methods a refusal."""
        method = getattr(request, "method", "GET")  # websockets before 17 took GET alone
        if method not in ("GET", "HEAD"):
            response = connection.respond(405, f"{method} is not served here: GET the page\n")
            response.headers["Allow"] = "GET, HEAD"
            return response
        response = self._answer(connection, request)
        if response is not None and method == "HEAD":
            response = replace(response, body=b"")  # its Content-Length still GET's
        return response

    def _answer(self, connection: ServerConnection, request: Request) -> Response | None:
        upgrades = request.headers.get_all("Upgrade")
        if len(upgrades) > 1:  # which one the client meant is not ours to guess
            return connection.respond(400, "several Upgrade headers\n")
        if upgrades and upgrades[0].lower() == "websocket":
            origin = self._foreign_origin(request)
            if origin is None:
                return None
            why = f"origin {origin} is not this server's page (asr serve --allow-origin)"
            log.info("%s: refused (403): %s", _peer(connection), why)
            return connection.respond(403, why + "\n")
        name = request.path.split("?")[0].rsplit("/", 1)[-1]
        if name == "favicon.ico":
            return connection.respond(204, "")
        if name == "health":  # for load balancers and monitoring
            health = {
                "status": "ok",
                "sample_rate": self.sample_rate,  # what a page loaded earlier checks it against
                "streams": len(self.clients),
                "connections": len(self.connections),
                "max_connections": self.options.max_connections,
                "chunks_run": self.chunks_run,
            }
            return _respond(connection, json.dumps(health) + "\n", "application/json")
        page = PAGES.get(name)
        if page is None:
            return connection.respond(404, "not found\n")
        file, kind = page
        body = resources.files("asr.serve").joinpath("static", file).read_text(encoding="utf-8")
        if file == "live.html":  # the page sends the microphone's audio at the model's rate
            body = body.replace(MODEL, embedded_json({"sample_rate": self.sample_rate}))
        return _respond(connection, body, f"{kind}; charset=utf-8")

    def _foreign_origin(self, request: Request) -> str | None:
        """The Origin of a handshake from a page neither this server's nor allowed; None where
        it is one of those, or where there is none (a client that is not a browser)."""
        origins = request.headers.get_all("Origin")
        if not origins:
            return None
        origin = origins[0].lower()
        if len(origins) > 1:
            return ", ".join(origins)
        if origin in self.options.allow_origins:
            return None
        hosts = request.headers.get_all("Host")
        scheme, _, host = origin.partition("://")
        same = len(hosts) == 1 and host == hosts[0].lower() and scheme in ("http", "https")
        # a name could be a DNS rebinding of another site to this address: only addresses and
        # localhost are this server's own without being named in allow_origins
        return None if same and _is_address(host) else origin

    async def _connection(self, ws: ServerConnection) -> None:
        client, peer = None, _peer(ws)  # once closed, a TLS connection has no address
        if self.options.send_buffer_bytes is not None:
            sock = ws.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.options.send_buffer_bytes)
        if self.stopping:
            await _refuse(ws, STOPPING, GOING_AWAY)
            return
        most = self.options.max_connections
        if len(self.connections) >= most:
            full = f"the server is full ({most} stream{'' if most == 1 else 's'}): try later"
            await _refuse(ws, full, TRY_LATER)
            return
        limit = self.options.max_per_address
        if limit is not None and _host(ws) is not None:
            if sum(_host(other) == _host(ws) for other in self.connections) >= limit:
                held = f"{limit} stream{'' if limit == 1 else 's'}"
                await _refuse(ws, f"this address holds {held} already: try later", TRY_LATER, peer)
                return
        self.connections.add(ws)
        try:
            try:
                client = await asyncio.wait_for(self._start(ws), self.options.start_timeout)
            except TimeoutError:
                raise ClientError("no start message came", POLICY) from None
            self.clients.add(client)
            log.info("%s: stream started", peer)
            sender = asyncio.create_task(self._send(ws, client))
            try:
                await self._receive(ws, client)
                await sender
            finally:
                sender.cancel()
        except ClientError as err:
            await _refuse(ws, str(err), err.code, peer)
        except ConnectionClosed as closed:
            failed = client is not None and client.failed is not None  # its sender logged it
            said = (1000, GOING_AWAY, *((SERVER_ERROR,) if failed else ()))
            if closed.rcvd_then_sent:  # the client's close, which the server echoed
                if closed.rcvd.code not in (1000, GOING_AWAY):
                    log.info(
                        "%s: the client closed (%d): %s",
                        peer,
                        closed.rcvd.code,
                        closed.rcvd.reason,
                    )
            elif closed.sent is not None and closed.sent.code not in said:
                # websockets' own close, e.g. 1009 for a message past its limit (8x ours)
                log.info("%s: closed (%d): %s", peer, closed.sent.code, closed.sent.reason)
            return
        except Exception as err:  # noqa: BLE001 - the connection closes; the server goes on
            log.exception("%s: stream failed", peer)
            await _refuse(ws, f"server error: {err}", SERVER_ERROR, peer)
        finally:
            self.connections.discard(ws)
            if client is not None:  # its line first: once no stream is open, all are logged
                log.info(
                    "%s: stream ended: %.1f s of audio, %d final%s",
                    peer,
                    client.received / self.sample_rate,
                    client.utterances,
                    "" if client.utterances == 1 else "s",
                )
                self.clients.discard(client)

    async def _start(self, ws: ServerConnection) -> _Client:
        message = await ws.recv()
        start = _json(message, "expected the start message first")
        if start.get("type") != "start":
            raise ClientError('expected {"type": "start", "sample_rate": ...} first')
        if self.stopping:
            raise ClientError(STOPPING, GOING_AWAY)
        unknown = sorted(set(start) - START_KEYS)
        if unknown:  # a misspelt "format" would decode f32le audio as s16le noise
            raise ClientError(
                f"the start message holds {', '.join(map(json.dumps, unknown))}: its keys are "
                f"{', '.join(sorted(START_KEYS))}",
                UNSUPPORTED,
            )
        rate, kind = start.get("sample_rate"), start.get("format", "s16le")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            what = "missing" if rate is None else f"{json.dumps(rate)}, not a number"
            raise ClientError(f"sample_rate {what}: send {self.sample_rate} Hz mono", UNSUPPORTED)
        if rate != self.sample_rate:
            raise ClientError(
                f"sample_rate {rate} is not supported: send {self.sample_rate} Hz mono",
                UNSUPPORTED,
            )
        if not isinstance(kind, str) or kind not in FORMATS:
            raise ClientError(
                f"format {json.dumps(kind)} is not one of {sorted(FORMATS)}", UNSUPPORTED
            )
        channels = start.get("channels", 1)
        if channels != 1 or isinstance(channels, bool):
            raise ClientError(
                f"channels {json.dumps(channels)} is not supported: send mono (one channel, "
                "e.g. the mean of the channels)",
                UNSUPPORTED,
            )
        alignment = start.get("alignment", False)
        if not isinstance(alignment, bool):  # "no" would be true
            raise ClientError(f"alignment {json.dumps(alignment)}: true or false", UNSUPPORTED)
        dtype, scale = FORMATS[kind]
        client = _Client(ws, self.engine.stream(), dtype, scale, self.options.max_queued_messages)
        if alignment:
            client.alignments = kept_alignments(client.stream, self.engine.recognizer)
        chunk, first = self.engine.chunk_seconds, self.engine.first_chunk_seconds
        await ws.send(
            json.dumps(
                {
                    "type": "ready",
                    "sample_rate": self.sample_rate,
                    "format": kind,
                    "chunk_ms": None if chunk is None else round(chunk * 1000),
                    "first_chunk_ms": None if first is None else round(first * 1000),
                }
            )
        )
        return client

    async def _receive(self, ws: ServerConnection, client: _Client) -> None:
        while True:
            try:
                message = await asyncio.wait_for(ws.recv(), self.options.idle_timeout)
            except TimeoutError:
                if client.stopped:  # the server ends it
                    continue
                idle = f"no audio for {self.options.idle_timeout:g} s: the stream is closed"
                if not client.received or client.failed is not None:
                    raise ClientError(idle, POLICY) from None
                # what it sent is recognised to its end first, as when the server stops
                client.ending, client.idle = True, f"{idle} after the finals of what came"
                self._work.set()
                return
            except ConnectionClosedOK:
                break
            if isinstance(message, str):
                if _json(message, "a text message must be JSON").get("type") != "end":
                    raise ClientError('expected audio, or {"type": "end"}', UNSUPPORTED)
                client.ending = True
                self._work.set()
                return
            if client.stopped or client.failed is not None:  # ending or failed: never decoded
                continue
            samples = self._samples(message, client)
            client.received += len(samples)
            client.inbox.append(samples)
            self._work.set()
            if client.too_slow:
                raise ClientError("the client reads its results too slowly", POLICY)
            await self._wait_for_room(client)
        client.outbox.put_nowait(None)  # the client left without "end": nothing more to send

    async def _wait_for_room(self, client: _Client) -> None:
        """Back-pressure: while the client's backlog is over the limit, its socket is not read
        (its sends wait), until the model has decoded enough of it."""
        limit = self.options.max_backlog_seconds
        if client.backlog <= limit * self.sample_rate:
            return
        if self.engine.chunk is None and self.engine.longest is None:  # nothing would drain
            raise ClientError(
                f"over {limit:g} s of audio: at full context without endpoints a recording is "
                "decoded at its end, and one longer is refused (asr serve --max-backlog)",
                TOO_BIG,
            )
        if client.failed is not None:  # its sender says why and closes
            return
        client.room.clear()
        room, closed = (
            asyncio.ensure_future(client.room.wait()),
            asyncio.ensure_future(client.ws.wait_closed()),
        )
        try:  # a client gone while held back is forgotten at once, as one gone otherwise
            await asyncio.wait({room, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()
            closed.cancel()
        if client.ws.state is State.CLOSED:
            client.inbox.clear()
            raise client.ws.protocol.close_exc  # with the client's close, which is logged

    def _samples(self, message: bytes, client: _Client) -> np.ndarray:
        if len(message) > self.options.max_message_bytes:
            raise ClientError(
                f"an audio message of {len(message)} bytes is over the "
                f"{self.options.max_message_bytes}-byte limit",
                TOO_BIG,
            )
        if _control_in_binary(message):  # else read as samples, and the stream never ended
            raise ClientError(
                'a JSON message such as {"type": "end"} goes in a text frame, not a binary one',
                UNSUPPORTED,
            )
        width = np.dtype(client.dtype).itemsize
        if len(message) % width:
            raise ClientError(
                f"an audio message of {len(message)} bytes is not whole {width}-byte samples",
                UNSUPPORTED,
            )
        samples = np.frombuffer(message, dtype=client.dtype).astype(np.float32) / client.scale
        if not np.isfinite(samples).all():  # f32le: said to its client, not to the model's thread
            raise ClientError("audio contains NaN or infinite samples", UNSUPPORTED)
        if samples.size and np.abs(samples).max() > LOUDEST_SAMPLE:
            raise ClientError(
                f"f32le samples lie within ±1, got {np.abs(samples).max():g} (16-bit values as "
                "floats: divide them by 32768)",
                UNSUPPORTED,
            )
        return samples

    async def _send(self, ws: ServerConnection, client: _Client) -> None:
        while True:
            message = await client.outbox.get()
            if message is None or client.too_slow:
                return
            if message["type"] == "done":  # its place is free before its client hears so
                self.connections.discard(ws)
            if message["type"] == "done" and client.idle is not None:
                await _refuse(ws, client.idle, POLICY, _peer(ws))  # in place of "done"
                return
            try:
                await asyncio.wait_for(ws.send(json.dumps(message)), self.options.send_timeout)
            except ConnectionClosed:  # the client left: its receiving side says so
                return
            except TimeoutError:
                client.too_slow = True
                self.dropped_slow += 1
                await _refuse(ws, "the client reads its results too slowly", POLICY)
                return
            if message["type"] == "done":
                await (ws.close(GOING_AWAY, STOPPING) if client.stopped else ws.close())
                return
            if message["type"] == "error":  # recognising its stream failed
                log.info("%s: closed (%d): %s", _peer(ws), SERVER_ERROR, message["message"])
                await ws.close(SERVER_ERROR, message["message"][:120])
                return

    async def _run_batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            self._work.clear()
            if self.options.batch_wait_ms > 0:
                await asyncio.sleep(self.options.batch_wait_ms / 1000)
            clients = [client for client in self.clients if client.failed is None]
            try:
                messages, more = await loop.run_in_executor(self._executor, self._decode, clients)
            except Exception:  # noqa: BLE001 - one failed batch must not stop the server
                log.exception("a batch failed")
                continue
            if more:  # chunks still ready: the next batch at once
                self._work.set()
            limit = self.options.max_backlog_seconds * self.sample_rate
            for client in self.clients - set(clients):  # failed earlier: never held back
                client.room.set()
            for client in clients:
                # its socket is read again once under the limit, or when the model can decode no
                # more of it (its stream failed or ended, or a limit below a chunk's audio)
                idle = client not in more and not client.inbox
                if client.failed is not None or client.backlog <= limit or idle:
                    client.room.set()
                if client.failed is not None:  # its sender says why and closes; others go on
                    client.outbox.put_nowait({"type": "error", "message": client.failed})
                    continue
                mine = [m for c, m in messages if c is client]
                if not mine or client.too_slow:
                    continue
                client.put(mine)
                if client.too_slow:  # it neither reads nor may fall further behind
                    self.dropped_slow += 1
                    asyncio.create_task(
                        _refuse(client.ws, "the client reads its results too slowly", POLICY)
                    )

    def _decode(
        self, clients: list[_Client]
    ) -> tuple[list[tuple[_Client, dict[str, Any]]], set[_Client]]:
        """In the model's thread: feed the inboxes, run one batch of the ready chunks (one chunk
        a stream, so results go out between batches), finish the streams that ended; what each
        client should be sent, and the clients with chunks still ready."""
        out: list[tuple[_Client, dict[str, Any]]] = []
        # "end" is marked after the last audio is queued: read it first, then take the audio
        ending = {client for client in clients if client.ending}
        for client in clients:
            with _failing(client):
                while client.inbox:
                    client.stream.feed(client.inbox.popleft())
        ready = [c for c in clients if c.failed is None and c.stream.ready]
        if ready:
            try:
                self.engine.step([c.stream for c in ready])
            except Exception as error:  # noqa: BLE001 - which stream broke it is not known
                log.exception("a batch of %d streams failed: they end", len(ready))
                for client in ready:
                    client.failed = f"server error: {error}"
                ready = []
            self.chunks_run += len(ready)
            self.largest_batch = max(self.largest_batch, len(ready))
            for client in ready:
                with _failing(client):
                    out += self._results(client)
        for client in ending:
            if client.failed is None and not client.stream.closed and not client.stream.ready:
                with _failing(client):
                    whole = client.stream.final()
                    seconds = round(whole.duration, 3)
                    done = {"type": "done", "text": whole.text, "duration": seconds}
                    out += [*self._results(client, chunk=False), (client, done)]
        return out, {c for c in clients if c.failed is None and c.stream.ready}

    def _results(self, client: _Client, chunk: bool = True) -> list[tuple[_Client, dict[str, Any]]]:
        """The finals a chunk closed, then the partial after it (one per chunk, even when the
        text did not change, so a client can time every chunk)."""
        out = [
            (client, final_message(t, client.utterances + i, client.alignments))
            for i, t in enumerate(client.stream.take_finals())
        ]
        client.utterances += len(out)
        if chunk and not client.stream.closed:
            out.append(
                (
                    client,
                    {
                        "type": "partial",
                        "text": client.stream.partial,
                        "utterance": client.utterances,
                        "audio_seconds": round(client.stream.decoded_seconds, 3),
                    },
                )
            )
        return out

    def close(self) -> None:
        self._worker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


def final_message(
    transcript: Transcript, utterance: int, alignments: deque[dict[str, Any] | None] | None = None
) -> dict[str, Any]:
    """A final's message (docs/streaming.md), `utterance` its number in the stream; with its
    alignment, the next of `alignments` (made in order)."""
    message = {
        "type": "final",
        "utterance": utterance,
        "text": transcript.text,
        "start": round(transcript.segments[0].start, 3),
        "end": round(transcript.segments[-1].end, 3),
        "words": [
            {
                "word": w.text,
                "start": round(w.start, 3),
                "end": round(w.end, 3),
                **({} if w.confidence is None else {"confidence": round(w.confidence, 4)}),
                **({} if w.probability is None else {"probability": round(w.probability, 4)}),
            }
            for w in transcript.words
        ],
    }
    return message if alignments is None else message | {"alignment": alignments.popleft()}


def kept_alignments(stream: Stream, recognizer: Recognizer) -> deque[dict[str, Any] | None]:
    """The queue `stream` now adds each final's `_alignment` to, in the finals' order."""
    alignments: deque[dict[str, Any] | None] = deque()
    stream.on_decoded = lambda span, part, decoded: alignments.append(
        _alignment(part, decoded, recognizer.alignment_heads, recognizer.frame_seconds)
    )
    return alignments


def _alignment(
    transcript: Transcript, decoded: Decoded, heads: list[int] | None, frame_seconds: float
) -> dict[str, Any] | None:
    """A final's cross-attention for the page: the mean of the timing heads' maps, a row per
    token (eos left out), each scaled to its peak in 8 bits; None without attention."""
    attention = decoded.hypothesis.attention
    if attention is None or not attention.numel() or not transcript.tokens:
        return None
    matrix = attention_matrix(attention, heads)[: len(transcript.tokens)]
    data = quantized_attention(matrix.numpy()[None])[0]
    return {
        "tokens": transcript.pieces,
        "frame_seconds": frame_seconds,
        "shape": list(data.shape),
        "data": base64.b64encode(data.tobytes()).decode("ascii"),
    }


def _json(message: str | bytes, problem: str) -> dict[str, Any]:
    if isinstance(message, bytes):
        if _control_in_binary(message):
            raise ClientError(f"{problem}, in a text frame, not a binary one", UNSUPPORTED)
        raise ClientError(f"{problem}, not audio: send the start message first", POLICY)
    try:
        value = json_line(message)
    except ValueError:  # a number past 4300 digits and deep nesting too
        raise ClientError(f"{problem}: not JSON this server reads", UNSUPPORTED) from None
    if not isinstance(value, dict):
        raise ClientError(f"{problem}: a JSON object", UNSUPPORTED)
    return value


def _control_in_binary(message: bytes) -> bool:
    """Whether a binary message is a JSON object with a type (a control message sent as
    bytes, as `ws.send(json.dumps(m).encode())` does), not audio: a few samples may spell
    `{}` (32123 in s16le)."""
    if not message.startswith(b"{") or len(message) > 4096:
        return False
    try:
        value = json_line(message.decode())
        return isinstance(value, dict) and "type" in value
    except ValueError:  # not JSON (or not UTF-8): audio
        return False


def _respond(connection: ServerConnection, body: str, kind: str) -> Response:
    response = connection.respond(200, body)
    del response.headers["Content-Type"]  # respond() says text/plain
    response.headers["Content-Type"] = kind
    return response


async def _close_all(connections: list[ServerConnection]) -> None:
    """Close with 1001; a client that does not answer within 2 s is cut off."""
    await asyncio.gather(*(_within(ws, ws.close(GOING_AWAY, STOPPING)) for ws in connections))


@contextlib.contextmanager
def _failing(client: _Client) -> Iterator[None]:
    """In the model's thread: an error of one stream ends that stream alone."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - its connection closes; the others go on
        log.exception("a stream failed")
        client.failed = f"server error: {error}"


async def _refuse(ws: ServerConnection, message: str, code: int, peer: str | None = None) -> None:
    """Send the error and close; a client that does not take them within 2 s is cut off."""

    async def say_and_close() -> None:
        await ws.send(json.dumps({"type": "error", "message": message}))
        await ws.close(code, message[:120])

    log.info("%s: closed (%d): %s", peer or _peer(ws), code, message)
    await _within(ws, say_and_close())


def _is_address(host: str) -> bool:
    """Whether a Host header (`name[:port]`) names an IP address or localhost."""
    name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
    if name == "localhost" or name.endswith(".localhost"):  # browsers resolve these themselves
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _host(ws: ServerConnection) -> str | None:
    """The client's IP address (None once a TLS connection has closed)."""
    address = ws.remote_address
    return address[0] if address else None


def _peer(ws: ServerConnection) -> str:
    """The client's address, as `host:port` (`[host]:port` for IPv6)."""
    address = ws.remote_address
    if not address:
        return "a client"
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _within(ws: ServerConnection, goodbye, seconds: float = 2.0) -> None:
    """Await `goodbye` (a send or close on `ws`); a client that does not take it within
    `seconds` is cut off."""
    try:
        await asyncio.wait_for(goodbye, seconds)
    except Exception:  # noqa: BLE001 - the client is gone or not reading
        ws.transport.abort()


async def serve_forever(
    recognizer: Recognizer,
    stream_options: StreamOptions | None,
    options: ServeOptions,
    lm: LanguageModel | None = None,
    ready: Any = None,
    stop: asyncio.Event | None = None,
    drain_seconds: float = 10.0,
) -> None:
    """Run the server until cancelled, or until `stop` is set: then it stops gracefully
    (`LiveServer.stop`). `ready(server)` is called once it listens."""
    live = LiveServer(recognizer, stream_options, options, lm)
    server = await live.start()
    if ready is not None:
        ready(live)
    try:
        if stop is None:
            await server.serve_forever()
        else:
            await stop.wait()
            await live.stop(drain_seconds)
    finally:
        live.close()
