"""Shared fixtures: where the corpora are, and skipping tests that need them or a GPU."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
import torch

import asr
from asr.checkpoint import checkpoint_payload, instantiate
from asr.models.seq2seq import build_seq2seq
from asr.text import CharTokenizer

# Tests use one intra-op thread: on a 2-core machine, competing thread pools slow every test.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
CORPORA = Path(os.environ.get("ASR_CORPORA", REPO.parent / "shared" / "corpora"))


def corpus_path(*parts: str) -> Path:
    """Path under ../shared/corpora; skips the calling test with a clear message if absent."""
    path = CORPORA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"corpus not found at {path} (set ASR_CORPORA or place ../shared/corpora)")
    return path


@pytest.fixture
def an4_dir() -> Path:
    return corpus_path("an4")


@pytest.fixture
def yesno_dir() -> Path:
    return corpus_path("yesno", "waves_yesno")


@pytest.fixture
def librispeech_dir() -> Path:
    return corpus_path("librispeech_sample", "LibriSpeech")


@pytest.fixture
def mini_an4_tar() -> Path:
    return corpus_path("mini_an4", "an4_sphere_mini.tar.gz")


# Six AN4 utterances in the AN4 layout, kept in the repository with their licence
# (tests/fixtures/an4/README.md): tests that need real speech but no corpus use these.
AN4_FIXTURE = REPO / "tests" / "fixtures" / "an4"


@pytest.fixture
def an4_fixture() -> Path:
    return AN4_FIXTURE


@pytest.fixture
def ctrl_c():
    """SIGINT as at a terminal (a background job, such as a test run started with `&`, starts
    with it ignored), and as it was after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


# Modules whose tests run recipes or training processes, tens of seconds each.
LONG_MODULES = ("test_ddp.py", "test_recipes.py", "test_lightning.py", "test_overfit.py")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker more than the CPUs, as many tests wait on a subprocess, a socket or
    a browser while a worker could compute (`--maxprocesses` still caps it)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) + 1


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the halves are of what runs
def pytest_collection_modifyitems(config, items):
    _spread_long_tests(items)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


TINY_MODEL_CONFIG = {  # the init args `asr fit` stores in a checkpoint; vocab_size is added
    "frontend": {
        "class_path": "asr.frontends.Frontend",
        "init_args": {
            "features": {
                "class_path": "asr.frontends.LogMelFilterbank",
                "init_args": {"n_mels": 40},
            }
        },
    },
    "encoder": {
        "class_path": "asr.models.transformer.TransformerEncoder",
        "init_args": {"d_model": 16, "num_heads": 2, "ffn_dim": 32, "num_layers": 1},
    },
    "decoder": {
        "class_path": "asr.models.transformer.TransformerDecoder",
        "init_args": {"d_model": 16, "num_heads": 2, "ffn_dim": 32, "num_layers": 1},
    },
    "ctc_weight": 0.3,
}
TINY_RNN = {  # TINY_MODEL_CONFIG's encoder and decoder as RNN-attention (location-aware)
    "encoder": {
        "class_path": "asr.models.rnn.RNNEncoder",
        "init_args": {"hidden_size": 16, "projection_dim": 16, "num_layers": 2,
                      "subsample": "2_2"},
    },
    "decoder": {"class_path": "asr.models.rnn.RNNAttentionDecoder",
                "init_args": {"hidden_size": 8}},
}  # fmt: skip


def page_data(html: str) -> dict:
    """The data embedded in an explorer page, each blob read from the element it names."""
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', html,
                      re.S)  # fmt: skip
    assert match, "the page embeds its data"
    data = json.loads(match.group(1))
    blobs = dict(re.findall(r'<script type="text/plain" id="([\w-]+)">([A-Za-z0-9+/=]*)</script>',
                            html))  # fmt: skip
    for utterance in data.get("utterances", []):
        if (utterance.get("blob") or "").startswith("#"):
            utterance["blob"] = blobs[utterance["blob"][1:]]
    return data


def run_forked(
    code: str,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> subprocess.CompletedProcess:
    """`python -c code *args` as a child forked from this process: the imports done here
    (Lightning's take seconds) it need not repeat, and what it changes stays its own. Its
    stdout and stderr are captured; it never returns into pytest. Killed past `timeout`
    seconds (subprocess.TimeoutExpired), as a hung run must fail the test, not hang it."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
                os.environ.update(env or {})
                sys.argv = ["-c", *args]
                exec(compile(code, "<forked>", "exec"), {"__name__": "__main__"})
                status = 0
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        deadline = time.monotonic() + timeout
        while not (ended := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ended[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        text = [f.read().decode("utf-8", "replace") for f in (out, err)]
    if not ended[0]:
        raise subprocess.TimeoutExpired(["-c", *args], timeout, *text)
    return subprocess.CompletedProcess(["-c", *args], os.waitstatus_to_exitcode(ended[1]), *text)


Trained = TypeVar("Trained", bound=tuple)


def trained_once(name: str, sources: Iterable[Path], train: Callable[[dict | None], Trained]):
    """`train(weights)`'s `(recognizer, ...)`, trained once per machine and code: the test
    workers share the weights through a file named by a hash of `sources` (the test code that
    trains), the asr package and torch's version; the first worker trains, the others wait and
    call `train` with the weights, to load them."""
    files = [*sources, *Path(asr.__file__).parent.rglob("*.py")]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(set(files))))
    key.update(torch.__version__.encode())
    path = Path(tempfile.gettempdir()) / f"asr-{name}-{key.hexdigest()[:16]}.pt"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        trained = train(torch.load(path, weights_only=True) if path.exists() else None)
        if not path.exists():
            torch.save(trained[0].model.state_dict(), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").rename(path)
    return trained


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> dict[str, Path]:
    """A randomly initialised tiny recognizer saved as `asr fit` saves one, and its tokenizer:
    for tests of input handling and formats, not of what it recognises."""
    root = tmp_path_factory.mktemp("tiny_model")
    tokenizer = CharTokenizer.train(["YES NO GO"])
    tokenizer.save(root / "tokenizer")
    config = TINY_MODEL_CONFIG | {"vocab_size": tokenizer.vocab_size}
    torch.manual_seed(0)
    model = instantiate(build_seq2seq, config)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    payload = checkpoint_payload(config, tokenizer)
    torch.save({"state_dict": state, "asr": payload}, root / "tiny.ckpt")
    return {"checkpoint": root / "tiny.ckpt", "tokenizer": root / "tokenizer"}


def without_sample_count(path: Path) -> bytes:
    """A WAV or FLAC file's bytes with a header that gives no sample count: a WAV's sizes of 0
    (a recorder stopped before writing them), a FLAC's total of 0 ("unknown": written to a
    pipe)."""
    data = bytearray(path.read_bytes())
    if data[:4] == b"fLaC":  # STREAMINFO's 36-bit total ends the 8 bytes at offset 18
        (field,) = struct.unpack(">Q", data[18:26])
        data[18:26] = struct.pack(">Q", field & ~(2**36 - 1))
    else:
        at = data.index(b"data")
        data[4:8] = data[at + 4 : at + 8] = bytes(4)
    return bytes(data)


def encode_audio(
    path: Path, wave: np.ndarray, rate: int, codec: str = "aac", video: bool = False
) -> Path:
    """Write a mono float waveform `(S,)` with PyAV (FFmpeg) in the container `path`'s suffix
    names, encoded with `codec`; `video` adds a small black MPEG-4 picture stream (a film)."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        film = container.add_stream("mpeg4", rate=10) if video else None
        if film is not None:  # every stream is added before the first packet is written
            film.width, film.height, film.pix_fmt = 16, 16, "yuv420p"
            for i in range(math.ceil(len(wave) / rate * 10)):
                picture = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), "rgb24")
                picture.pts = i
                container.mux(film.encode(picture))
            container.mux(film.encode(None))
        supported = [f.name for f in stream.codec_context.codec.audio_formats]
        fmt = next(f for f in ("fltp", "flt", "s16") if f in supported)
        samples = (wave * 32767).astype(np.int16) if fmt == "s16" else wave.astype(np.float32)
        frame = av.AudioFrame.from_ndarray(samples[None, :], format=fmt, layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def _spread_long_tests(items: list[pytest.Item]) -> None:
    """Order the tests so that each half of the list starts with long modules, alternately:
    `pytest -n 2 --dist worksteal` gives each worker a half, so both begin with long tests and
    the short ones fill the gaps, rather than one worker ending the run alone (with a third
    worker, as `-n auto` starts on 2 CPUs, the last third is short tests: it steals). A module stays
    whole, so its module-scoped fixtures are built on one worker only."""
    halves: tuple[list, list] = ([], [])
    for k, module in enumerate(LONG_MODULES):
        halves[k % 2].extend(item for item in items if item.path.name == module)
    rest = [item for item in items if item.path.name not in LONG_MODULES]
    first = max(0, len(items) // 2 - len(halves[0]))
    items[:] = halves[0] + rest[:first] + halves[1] + rest[first:]
