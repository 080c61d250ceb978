"""The live page in a real headless Chromium, its microphone a WAV file: the page shows the
final transcript that the audio the server received gets when decoded offline as a stream
(the browser resamples the file to its own rate and the page back to 16 kHz, so that audio is
close to the file, not equal to it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from real_browser import MISSING, NEEDS, chromium, severe_errors
from streaming_fixtures import WAV, running_server, streaming_recognizer

from asr.audio import load_audio
from asr.streaming import Stream, StreamOptions, stream_transcript

pytestmark = pytest.mark.skipif(MISSING, reason=NEEDS)
UID = "an4_clstk/fash/an255-fash-b"


def test_the_page_streams_the_microphone_and_shows_the_final(monkeypatch) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    recognizer, _ = streaming_recognizer()
    options = StreamOptions(chunk_ms=320, endpoint=None)
    wav = WAV / f"{UID}.wav"
    received = []
    feed = Stream.feed
    monkeypatch.setattr(Stream, "feed", lambda self, s: received.append(s) or feed(self, s))
    with running_server(recognizer, options) as (live, port):
        driver = chromium(
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop",
        )
        try:
            driver.get(f"http://127.0.0.1:{port}/?autostart=1&seconds=3.2")
            WebDriverWait(driver, 30, 0.05).until(lambda d: d.execute_script(
                "return document.body.dataset.done !== undefined"
            ))  # fmt: skip
            heard = torch.from_numpy(np.concatenate(received))
            assert 3.1 < heard.numel() / 16000 < 3.4  # what the page was told to send
            wave = load_audio(wav, 16000)
            assert heard.abs().max() > 0.5 * wave.abs().max()  # the file's speech, not silence
            expected = stream_transcript(recognizer, heard, options).text
            assert driver.execute_script("return document.body.dataset.done") == expected
            finals = driver.find_elements(By.CSS_SELECTOR, "#finals .final")
            words = [
                [w.text.strip() for w in f.find_elements(By.CSS_SELECTOR, ".word")] for f in finals
            ]
            assert words == [expected.split()]
            assert live.chunks_run >= 8  # it came chunk by chunk
            assert not severe_errors(driver)
        finally:
            driver.quit()
