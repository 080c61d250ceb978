"""A tiny chunk-streaming recognizer that has learnt four AN4 fixture utterances, trained once
per machine and code (`conftest.trained_once`; each caller gets its own copy)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import ipaddress
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import torch
from conftest import AN4_FIXTURE, trained_once

from asr.audio import load_audio
from asr.data.dataset import collate
from asr.frontends import Frontend, GlobalCMVN, LogMelFilterbank
from asr.models.conformer import ConformerEncoder
from asr.models.ctc import CTCHead
from asr.models.seq2seq import Seq2Seq
from asr.models.transformer import TransformerDecoder
from asr.recognizer import Recognizer
from asr.text import CharTokenizer

WAV = AN4_FIXTURE / "wav"
UTTERANCES = {  # the fixture's AN4 training utterances (under WAV)
    "an4_clstk/fash/an251-fash-b": "YES",
    "an4_clstk/fash/an253-fash-b": "GO",
    "an4_clstk/fash/an254-fash-b": "YES",
    "an4_clstk/fash/an255-fash-b": "U M N Y H SIX",
}
RATE = 16000


def streaming_recognizer() -> tuple[Recognizer, dict[str, torch.Tensor]]:
    """The trained tiny streaming recognizer and its utterances' waves, by transcript id."""
    return copy.deepcopy(_trained())


@functools.cache
def _trained() -> tuple[Recognizer, dict[str, torch.Tensor]]:
    return trained_once("streaming-fixture", [Path(__file__)], _train)


def _train(weights: dict | None) -> tuple[Recognizer, dict[str, torch.Tensor]]:
    tokenizer = CharTokenizer.train(UTTERANCES.values())
    waves = {p: load_audio(WAV / f"{p}.wav", RATE) for p in UTTERANCES}
    items = [
        {"id": p, "wave": waves[p], "text": text, "tokens": torch.tensor(tokenizer.encode(text))}
        for p, text in UTTERANCES.items()
    ]
    batch = collate(items, pad_id=tokenizer.pad_id)
    torch.manual_seed(0)
    features = LogMelFilterbank(n_mels=40)
    feats, lens = features(batch.waves, batch.wave_lens)
    valid = torch.cat([feats[b, : int(n)] for b, n in enumerate(lens)])
    frontend = Frontend(features, GlobalCMVN(mean=valid.mean(0), std=valid.std(0)))
    encoder = ConformerEncoder(
        40, d_model=64, num_heads=4, ffn_dim=128, num_layers=2, kernel_size=5, dropout=0.0,
        subsampling_channels=16, block_norm=False, causal=True, dynamic_chunk=8,
    )  # fmt: skip
    decoder = TransformerDecoder(
        tokenizer.vocab_size, 64, d_model=64, num_heads=4, ffn_dim=128, num_layers=1, dropout=0
    )
    model = Seq2Seq(frontend, encoder, decoder, CTCHead(tokenizer.vocab_size, 64))
    if weights is not None:
        model.load_state_dict(weights)
        return Recognizer(model.eval(), tokenizer, RATE, "<in memory>"), waves
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    args = (batch.waves, batch.wave_lens, batch.tokens, batch.token_lens)
    for _ in range(300):
        model.train()
        loss = model.loss(*args, ctc_weight=0.5).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return Recognizer(model, tokenizer, RATE, "<in memory>"), waves


@contextlib.contextmanager
def running_server(recognizer: Recognizer, stream_options=None, **serve_options):
    """A `LiveServer` on an ephemeral port (or `port=`), its event loop in a thread: yields
    (server, port)."""
    from asr.serve.server import LiveServer, ServeOptions

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    live = LiveServer(recognizer, stream_options, ServeOptions(**{"port": 0} | serve_options))

    async def start():
        return await live.start()

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    port = live.port  # the one port 0 was given
    try:
        yield live, port
    finally:

        async def stop():
            server.close()
            await server.wait_closed()
            live.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def pcm16(wave: torch.Tensor) -> bytes:
    """A waveform as the s16le bytes a client sends."""
    return (wave.clamp(-1, 1) * 32767).round().to(torch.int16).numpy().astype("<i2").tobytes()


def from_pcm16(data: bytes) -> torch.Tensor:
    """What the server hears of `pcm16` bytes."""
    import numpy as np

    return torch.from_numpy(np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0)


def self_signed_certificate(folder: Path, *addresses: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and `addresses`, and its key: cert.pem, key.pem in `folder`."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    names = ",".join(f"IP:{a}" for a in ("127.0.0.1", *addresses))
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=asr test", "-addext", f"subjectAltName={names}",
         "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def network_address() -> str | None:
    """This machine's address on its network (not loopback), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:  # a UDP connect sends nothing: it only picks the interface a route would use
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address
