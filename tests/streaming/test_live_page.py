"""The live page in a real headless Chromium, its microphone a WAV file: the page shows the
final transcript that the audio the server received gets when decoded offline as a stream
(the browser resamples the file to its own rate and the page back to 16 kHz, so that audio is
close to the file, not equal to it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from real_browser import MISSING, NEEDS, chromium, severe_errors
from streaming_fixtures import (
    WAV,
    network_address,
    running_server,
    self_signed_certificate,
    streaming_recognizer,
)

from asr.audio import load_audio
from asr.results import Transcript
from asr.streaming import Stream, StreamOptions, stream_transcript

pytestmark = pytest.mark.skipif(MISSING, reason=NEEDS)
UID = "an4_clstk/fash/an255-fash-b"
OPTIONS = StreamOptions(chunk_ms=320, endpoint=None)
FAKE_MICROPHONE = (
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    f"--use-file-for-fake-audio-capture={WAV / UID}.wav%noloop",
)


def _shows_the_offline_final(driver, url: str, live, recognizer, received: list) -> Transcript:
    """The page at `url` streams 3.2 s of the fake microphone; it shows as final what the audio
    the server received gives decoded offline as a stream (returned)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}?autostart=1&seconds=3.2")
    WebDriverWait(driver, 30, 0.05).until(lambda d: d.execute_script(
        "return document.body.dataset.done !== undefined"
    ))  # fmt: skip
    heard = torch.from_numpy(np.concatenate(received))
    assert 3.1 < heard.numel() / 16000 < 3.4  # what the page was told to send
    wave = load_audio(WAV / f"{UID}.wav", 16000)
    assert heard.abs().max() > 0.5 * wave.abs().max()  # the file's speech, not silence
    transcript = stream_transcript(recognizer, heard, OPTIONS)
    expected = transcript.text
    assert driver.execute_script("return document.body.dataset.done") == expected
    finals = driver.find_elements(By.CSS_SELECTOR, "#finals .final")
    words = [[w.text.strip() for w in f.find_elements(By.CSS_SELECTOR, ".word")] for f in finals]
    assert words == [expected.split()]
    # Folded under the final, its cross-attention as the server made it from that audio.
    canvas = finals[0].find_element(By.CSS_SELECTOR, "details.alignment canvas")
    assert _alignment_sum(recognizer, heard) == int(canvas.get_attribute("data-checksum")) > 0
    assert live.chunks_run >= 8  # it came chunk by chunk
    assert not severe_errors(driver)
    return transcript


def _alignment_sum(recognizer, wave: torch.Tensor) -> int:
    """The sum of the 8-bit cross-attention `asr serve` sends with the final of `wave`."""
    import base64

    from asr.serve.server import kept_alignments

    stream = recognizer.stream(OPTIONS)
    maps = kept_alignments(stream, recognizer)
    stream.accept(wave)
    stream.final()
    [alignment] = maps
    return sum(base64.b64decode(alignment["data"]))


def _downloaded(file) -> bool:
    """Whether Chromium has written `file`: it holds the name with an empty file while the
    bytes go to `.crdownload` beside it. (The pages' saved files are never empty.)"""
    partial = file.with_name(file.name + ".crdownload")
    return file.exists() and file.stat().st_size > 0 and not partial.exists()


def _saved(driver, folder) -> list[str]:
    """What the page's Save buttons write: transcript.txt and transcript.srt."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_cdp_cmd(
        "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)}
    )
    texts = []
    for fmt in ("txt", "srt"):
        file = folder / f"transcript.{fmt}"
        file.unlink(missing_ok=True)
        driver.find_element(By.ID, f"save-{fmt}").click()
        WebDriverWait(driver, 10, 0.05).until(lambda d, f=file: _downloaded(f))
        texts.append(file.read_text())
    return texts


@pytest.fixture
def received(monkeypatch) -> list:
    """The audio every stream is fed, in order."""
    heard = []
    feed = Stream.feed
    monkeypatch.setattr(Stream, "feed", lambda self, s: heard.append(s) or feed(self, s))
    return heard


def test_the_page_streams_the_microphone_and_shows_the_final(
    received, monkeypatch, tmp_path
) -> None:
    """Here under a path prefix, as a reverse proxy would serve the page: everything it asks
    for (its scripts, its socket) is below its own address, so a proxy that strips the prefix
    works too. The next test serves it at the root. Save writes the finals as `asr transcribe`
    writes txt and srt files. Then the server stops mid-recording."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from asr.serve.server import LiveServer
    from asr.writers import render, subtitle_cues, to_srt

    asked = []
    page = LiveServer._page
    monkeypatch.setattr(
        LiveServer,
        "_page",
        lambda self, c, request: asked.append(request.path) or page(self, c, request),
    )
    recognizer, _ = streaming_recognizer()
    with running_server(recognizer, OPTIONS) as (live, port):
        driver = chromium(*FAKE_MICROPHONE)
        try:
            transcript = _shows_the_offline_final(
                driver, f"http://127.0.0.1:{port}/asr/live/", live, recognizer, received
            )
            paths = {path.split("?")[0] for path in asked}
            assert paths == {"/asr/live/", "/asr/live/live.js", "/asr/live/worklet.js"}, paths
            assert _saved(driver, tmp_path) == [render(transcript, f) for f in ("txt", "srt")]
            # A second recording's times continue the first's, on the page and in the files.
            received.clear()
            driver.execute_script("delete document.body.dataset.done")
            driver.find_element(By.ID, "toggle").click()
            WebDriverWait(driver, 30, 0.05).until(lambda d: d.execute_script(
                "return document.body.dataset.done !== undefined"
            ))  # fmt: skip
            second = stream_transcript(recognizer, torch.from_numpy(np.concatenate(received)),
                                       OPTIONS)  # fmt: skip
            late = [(a + transcript.duration, b + transcript.duration, text)
                    for a, b, text in subtitle_cues(second)]  # fmt: skip
            both = f"{transcript.text} {second.text}\n", to_srt(subtitle_cues(transcript) + late)
            assert _saved(driver, tmp_path) == list(both)
            times = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#finals .time")]
            assert times[1].startswith(f"0:0{transcript.duration:.1f}–"), times
            # The server stopped mid-recording: the page shows the final it sends, and why
            received.clear()
            driver.get(f"http://127.0.0.1:{port}/asr/live/?autostart=1")
            WebDriverWait(driver, 30, 0.05).until(lambda d: len(received) >= 5)  # 0.5 s
            asyncio.run_coroutine_threadsafe(live.stop(10), live.server.get_loop()).result(20)
            status = driver.find_element(By.ID, "status")
            WebDriverWait(driver, 10, 0.05).until(lambda d: "server stopped" in status.text)
            heard = torch.from_numpy(np.concatenate(received))
            expected = stream_transcript(recognizer, heard, OPTIONS).text
            assert driver.execute_script("return document.body.dataset.done") == expected
        finally:
            driver.quit()


def test_from_another_machine_the_page_needs_https_and_says_so(received, tmp_path) -> None:
    """Browsers give the microphone only to secure pages (https, or localhost): over http at
    the machine's network address the page says what to do; over https it streams."""
    from selenium.webdriver.common.by import By

    address = network_address()
    if address is None:
        pytest.skip("needs a network address besides loopback")
    cert, key = self_signed_certificate(tmp_path, address)
    recognizer, _ = streaming_recognizer()
    tls = {"certfile": str(cert), "keyfile": str(key)}
    with (
        running_server(recognizer, OPTIONS, host=address) as (_, plain),
        running_server(recognizer, OPTIONS, host=address, **tls) as (live, port),
    ):
        driver = chromium(*FAKE_MICROPHONE, "--ignore-certificate-errors")  # self-signed
        try:
            driver.get(f"http://{address}:{plain}/?autostart=1")
            status = driver.find_element(By.ID, "status")
            assert "only to https pages and to localhost" in status.text
            assert f"ssh -L {plain}:localhost:{plain}" in status.text
            assert not driver.find_element(By.ID, "toggle").is_enabled()
            assert not severe_errors(driver) and not received
            _shows_the_offline_final(
                driver, f"https://{address}:{port}/", live, recognizer, received
            )
        finally:
            driver.quit()


def test_clicks_that_race_the_start_and_a_server_that_vanishes(received) -> None:
    """Start and Stop in one moment leave no stream behind (a start stopped halfway releases
    what it got, and opens no socket or closes it on opening); a server that goes away
    without a word (1006) is said, the unfinished partial cleared; Start then works again.
    The server takes one connection, so a stream left behind would refuse the next."""
    import json
    import urllib.request

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def health() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            return json.loads(answer.read())

    recognizer, _ = streaming_recognizer()
    with running_server(recognizer, OPTIONS, max_connections=1) as (live, port):
        driver = chromium(*FAKE_MICROPHONE)
        try:
            driver.get(f"http://127.0.0.1:{port}/")
            status, toggle = (
                driver.find_element(By.ID, "status"),
                driver.find_element(By.ID, "toggle"),
            )
            wait = WebDriverWait(driver, 20, 0.05)
            for pause in (0, 0, 50, 200):  # ms between Start and Stop
                driver.execute_script(
                    "const t = document.getElementById('toggle'); t.click();"
                    "setTimeout(() => t.click(), arguments[0]);", pause)  # fmt: skip
                wait.until(lambda d: toggle.text == "Start")
                wait.until(lambda d: health()["connections"] == 0)
            toggle.click()
            wait.until(lambda d: "Listening" in status.text and len(received) >= 5)
            assert health()["streams"] == 1
            for ws in list(live.connections):  # gone, no close frame: the page sees 1006
                live.server.get_loop().call_soon_threadsafe(ws.transport.abort)
            wait.until(lambda d: "Connection to the server lost (1006)" in status.text)
            assert toggle.text == "Start" and driver.find_element(By.ID, "partial").text == ""
            toggle.click()  # the server still serves
            wait.until(lambda d: "Listening" in status.text)
            toggle.click()
            wait.until(
                lambda d: d.execute_script("return document.body.dataset.done !== undefined")
            )
            assert not severe_errors(driver)
        finally:
            driver.quit()


# Each socket the page opens, in window.sockets, with the types of the messages it got.
SOCKETS = """
window.sockets = [];
window.WebSocket = class extends WebSocket {
  constructor(...args) {
    super(...args);
    this.heard = [];
    this.addEventListener("message", (event) => this.heard.push(JSON.parse(event.data).type));
    window.sockets.push(this);
  }
};
"""


@contextlib.contextmanager
def recording(port: int):
    """Chromium on the live page at `port`, recording from its start (the fake microphone),
    each socket it opens in window.sockets; and a wait on it."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(*FAKE_MICROPHONE)
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": SOCKETS})
        driver.get(f"http://127.0.0.1:{port}/?autostart=1")
        yield driver, WebDriverWait(driver, 30, 0.05)
    finally:
        driver.quit()


def test_a_new_recording_shows_nothing_of_the_last_ones_partial(received) -> None:
    """Stop, then Start at once: the new recording starts with an empty partial line, and a
    partial the stopped recording's socket still brings is not shown, then or once the new one
    has stopped too."""
    late = (
        "window.sockets[0].dispatchEvent(new MessageEvent('message', {data: JSON.stringify("
        "{type: 'partial', text: 'LATE', utterance: 0, audio_seconds: 9})}));"
        "return document.getElementById('partial').textContent;"
    )
    recognizer, _ = streaming_recognizer()
    with running_server(recognizer, OPTIONS) as (_, port), recording(port) as (driver, wait):
        before, after = wait.until(lambda d: d.execute_script(
            "const partial = document.getElementById('partial').textContent;"
            "if (!partial) return null;"
            "const toggle = document.getElementById('toggle');"
            "toggle.click(); toggle.click();"  # Stop, Start
            "return [partial, document.getElementById('partial').textContent];"
        ))  # fmt: skip
        assert before and after == ""
        assert driver.execute_script(late) != "LATE"
        wait.until(lambda d: d.execute_script(
            "return window.sockets.length === 2 && window.sockets[1].heard.includes('ready')"
        ))  # fmt: skip
        driver.execute_script("document.getElementById('toggle').click()")  # Stop
        assert driver.execute_script(late) != "LATE"
        wait.until(lambda d: d.execute_script("return window.sockets[1].heard.includes('done')"))
        assert driver.execute_script("return document.body.dataset.done !== undefined")
        assert not severe_errors(driver)


def test_an_error_clears_the_unfinished_partial(received) -> None:
    """A stream the server failed ends without a final: its partial is no longer pending."""
    recognizer, _ = streaming_recognizer()
    with running_server(recognizer, OPTIONS) as (_, port), recording(port) as (driver, wait):
        wait.until(lambda d: d.execute_script(
            "return document.getElementById('partial').textContent !== ''"
        ))  # fmt: skip
        partial, status = driver.execute_script(
            "window.sockets[0].dispatchEvent(new MessageEvent('message', {data: "
            "JSON.stringify({type: 'error', message: 'server error: boom'})}));"
            "return ['partial', 'status'].map((id) => document.getElementById(id).textContent);"
        )
        assert partial == "" and status == "Error: server error: boom"


FIRST_PACKETS = """
window.firstPackets = {posted: null, sent: null};  // the first samples of the first not silent
const sound = (packet) => {
  const samples = Array.from(new Int16Array(packet).slice(0, 64));
  return samples.some((x) => x !== 0) ? samples : null;
};
const Worklet = window.AudioWorkletNode;
window.AudioWorkletNode = class extends Worklet {
  constructor(...args) {
    super(...args);
    this.port.addEventListener("message", (event) => {
      firstPackets.posted ??= sound(event.data);
    });
  }
};
const send = WebSocket.prototype.send;
WebSocket.prototype.send = function (data) {
  if (typeof data !== "string") firstPackets.sent ??= sound(data);
  return send.call(this, data);
};
"""


def test_what_the_microphone_gives_while_the_socket_opens_is_sent(
    received, monkeypatch, tmp_path
) -> None:
    """The button says Stop at the click, so speech starts then: over a slow link the server's
    ready comes late, and the audio captured meanwhile is sent after it, in order, not dropped:
    the first sound the page sends is the first its worklet gave (of a noise, each differs)."""
    import time

    import soundfile
    from selenium.webdriver.support.ui import WebDriverWait

    import asr.serve.server

    noise = 0.3 * np.random.default_rng(0).standard_normal(3 * 16000).astype(np.float32)
    soundfile.write(tmp_path / "noise.wav", noise, 16000)
    kept = asr.serve.server.kept_alignments  # the page asks for alignments: its start waits
    monkeypatch.setattr(asr.serve.server, "kept_alignments", lambda *a: time.sleep(1.0) or kept(*a))
    recognizer, _ = streaming_recognizer()
    with running_server(recognizer, OPTIONS) as (_, port):
        driver = chromium(
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={tmp_path / 'noise.wav'}%noloop",
        )
        try:
            driver.execute_cdp_cmd(
                "Page.addScriptToEvaluateOnNewDocument", {"source": FIRST_PACKETS}
            )
            driver.get(f"http://127.0.0.1:{port}/?autostart=1&seconds=1.5")
            WebDriverWait(driver, 30, 0.05).until(lambda d: d.execute_script(
                "return document.body.dataset.done !== undefined"
            ))  # fmt: skip
            first = driver.execute_script("return window.firstPackets")
            assert not severe_errors(driver)
        finally:
            driver.quit()
    assert first["posted"] is not None and first["sent"] == first["posted"]
    assert 1.4 < np.concatenate(received).size / 16000 < 1.6  # what the page was told to send


def test_the_page_sends_the_audio_at_the_models_rate(received) -> None:
    """For a model at 8 kHz the server writes its rate into the page, and the page resamples the
    microphone to it: the server takes the stream and the page shows its "done"."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    recognizer, _ = streaming_recognizer()
    recognizer.sample_rate = 8000  # as an 8 kHz model (conf/yesno trains one) is
    with running_server(recognizer, OPTIONS) as (live, port):
        driver = chromium(*FAKE_MICROPHONE)
        try:
            driver.get(f"http://127.0.0.1:{port}/?autostart=1&seconds=1.6")
            status = driver.find_element(By.ID, "status")
            WebDriverWait(driver, 30, 0.05).until(
                lambda d: "Done" in status.text or "rror" in status.text
            )
            assert status.text == "Done: 0:01.6 of audio.", status.text
            model = driver.execute_script("return document.getElementById('model').textContent")
            assert json.loads(model) == {"sample_rate": 8000}
            heard = np.concatenate(received)
            wave = load_audio(WAV / f"{UID}.wav", 8000)
            assert 1.5 < heard.size / 8000 < 1.7 and np.abs(heard).max() > 0.5 * wave.abs().max()
            assert live.chunks_run >= 2 and not severe_errors(driver)  # chunk by chunk
        finally:
            driver.quit()


def test_a_page_without_its_server_says_what_to_do(received) -> None:
    """Opened as a file, the page says to open it at the server's address; served by a server
    that has since stopped, Start says the server does not answer (not the browser's words
    about a script that did not load)."""

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    import asr.serve

    recognizer, _ = streaming_recognizer()
    driver = chromium(*FAKE_MICROPHONE)
    try:
        driver.get((Path(asr.serve.__file__).parent / "static" / "live.html").as_uri())
        status, toggle = driver.find_element(By.ID, "status"), driver.find_element(By.ID, "toggle")
        assert "at asr serve's address" in status.text and "not as a file" in status.text
        assert not toggle.is_enabled() and status.get_attribute("role") == "status"
        with running_server(recognizer, OPTIONS) as (_, port):
            driver.get(f"http://127.0.0.1:{port}/")
        driver.find_element(By.ID, "toggle").click()
        WebDriverWait(driver, 10, 0.05).until(
            lambda d: "does not answer" in d.find_element(By.ID, "status").text
        )
        status = driver.find_element(By.ID, "status").text
        assert status == "Cannot start: the server does not answer: is asr serve running?"
        assert driver.find_element(By.ID, "toggle").text == "Start" and not received
        # started again with an 8 kHz model: the page loaded for 16 kHz says to reload it
        recognizer.sample_rate = 8000
        with running_server(recognizer, OPTIONS, port=port):
            driver.find_element(By.ID, "toggle").click()
            WebDriverWait(driver, 10, 0.05).until(
                lambda d: "reload" in d.find_element(By.ID, "status").text
            )
        status = driver.find_element(By.ID, "status").text
        assert status == "The server's model takes 8000 Hz since this page loaded: reload the page."
    finally:
        driver.quit()


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's script")
def test_the_page_saves_cues_as_the_writers_do():
    """The page's SubRip file of a recording's finals against `asr.writers`' on random cue
    lists: instants and half milliseconds (which Python's round() gives to the even number),
    and timing arrows in the text, among them."""
    import asr.serve
    from asr.writers import _lasting, to_srt

    script = (Path(asr.serve.__file__).parent / "static" / "live.js").read_text()
    functions = (
        script[script.index("  function millis") : script.index("  function save")]
        + script[
            script.index("  const LONE_CUE_SECONDS") : script.index("  saveTxt.addEventListener")
        ]
    )
    rng = random.Random(0)
    cases = []
    for _ in range(1000):
        cues, t = [], 0.0
        for k in range(rng.randint(1, 5)):
            start = round(t + rng.choice([0, 0.04, 0.5, 0.0005, 0.0015]), 4)
            end = round(start + rng.choice([0, 0, 0.0005, 0.04, 0.3, 0.0025, -0.04]), 4)
            text = rng.choice(["w", "a --> b", "-->", "x --->", "<-->", "- ->", "->"])
            cues.append((start, end, f"{text}{k}"))
            t = max(start, end)
        cases.append((cues, round(t + rng.choice([0, 0.2, 1.0]), 3)))
    run = (
        functions
        + """
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
console.log(JSON.stringify(cases.map(([cues, to]) => srt(lasting(
  cues.map(([start, end, text]) => ({ start, end, text })), 0, to
)))));
"""
    )
    out = subprocess.run(["node", "-e", run], input=json.dumps(cases), capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    for (cues, to), page in zip(cases, json.loads(out), strict=True):
        assert to_srt(_lasting(cues, to)) == page, cues


# The worklet's script under Node, its AudioWorklet globals stubbed: each case's signal goes in
# 128-sample blocks, as a browser gives them, and what it posts comes out.
WORKLET = """
const [script, cases] = JSON.parse(require("fs").readFileSync(0, "utf8"));
console.log(JSON.stringify(cases.map(({ rate, target, tone, step }) => {
  const posted = [];
  let Processor;
  globalThis.sampleRate = rate;
  globalThis.registerProcessor = (name, processor) => { Processor = processor; };
  globalThis.AudioWorkletProcessor = class {
    constructor() { this.port = { postMessage: (data) => posted.push(...new Int16Array(data)) }; }
  };
  new Function(script)();
  const node = new Processor({ processorOptions: { targetRate: target, packetMs: 100 } });
  const block = new Float32Array(128);
  for (let start = 0; start < 1.05 * rate; start += block.length) {
    for (let i = 0; i < block.length; i++) {
      const t = (start + i) / rate;
      block[i] = tone ? 0.3 * Math.sin(2 * Math.PI * tone * t) : t >= step ? 0.5 : 0;
    }
    node.process([[block]]);
  }
  return posted;
})));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the page's script")
@pytest.mark.parametrize("rate, target", [(48000, 16000), (44100, 16000), (48000, 8000)])
def test_the_page_resamples_without_folding_high_tones_back(rate, target) -> None:
    """The microphone's rate down to the model's: a tone below the target's Nyquist frequency
    passes within 1 dB (3 kHz for 16 kHz), one above it is filtered out at least 30 dB rather
    than folded back (12 kHz, which would come out as 4 kHz), and a step comes within 5 ms."""
    import asr.serve

    script = (Path(asr.serve.__file__).parent / "static" / "worklet.js").read_text()
    scale = target / 16000
    cases = [
        {"rate": rate, "target": target, "tone": 3000 * scale},
        {"rate": rate, "target": target, "tone": 12000 * scale},
        {"rate": rate, "target": target, "step": 0.1},
    ]
    out = subprocess.run(["node", "-e", WORKLET], input=json.dumps([script, cases]),
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    passed, folded, step = (np.array(samples) / 32767 for samples in json.loads(out))
    assert len(passed) == len(folded) == len(step) == target  # 1 s in whole 100 ms packets

    def level(wave: np.ndarray) -> float:  # in dB against the tone put in, after 0.1 s
        rms = np.sqrt(np.mean(wave[target // 10 :] ** 2))
        return 20 * np.log10(max(rms, 1e-9) / (0.3 / np.sqrt(2)))  # 16-bit zeros: -inf

    assert abs(level(passed)) < 1 and level(folded) < -30, (level(passed), level(folded))
    assert 0.099 < np.argmax(step >= 0.25) / target < 0.105
