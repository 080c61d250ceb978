"""The explorer page in a real headless Chromium: what a person sees and clicks.

Pages are built from synthetic data with `build_page`; one browser serves the whole module.
"""

from __future__ import annotations

import base64
import difflib
import io
import struct
import time
import zlib

import numpy as np
import pytest
import soundfile as sf
from real_browser import MISSING, NEEDS, chromium, severe_errors

from asr.explore.page import build_page

pytest.importorskip("selenium", reason=NEEDS)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(MISSING, reason=NEEDS)

EVIL_ID = "<script>window.pwned=1</script>"
EVIL_TEXT = '"><img src=x onerror="window.pwned=1">'


# ---- synthetic data ----
def _ops(ref: list[str], hyp: list[str]) -> list[list]:
    """Word alignment in the page's form: [op, ref word, hyp index]."""
    ops: list[list] = []
    matcher = difflib.SequenceMatcher(a=ref, b=hyp, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs = list(zip(range(i1, i2), range(j1, j2)))
        kind = "C" if tag == "equal" else "S"
        ops += [[kind, ref[i], j] for i, j in pairs]
        ops += [["D", ref[i], None] for i in range(i1 + len(pairs), i2)]
        ops += [["I", None, j] for j in range(j1 + len(pairs), j2)]
    return ops


def _opus_uri(seconds: float, freq: float, sr: int = 16000) -> tuple[str, np.ndarray]:
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(int(freq))
    audio = (0.3 * np.sin(2 * np.pi * freq * t) + 0.02 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="OGG", subtype="OPUS")
    return "data:audio/ogg;base64," + base64.b64encode(buf.getvalue()).decode(), audio


def utterance(
    uid: str,
    hyp: str,
    ref: str | None = None,
    *,
    speaker: str | None = "spk1",
    seconds: float = 2.0,
    layers: int = 2,
    heads: int = 2,
    timing_heads: list[int] | None = None,
    freq: float = 220.0,
) -> dict:
    """One utterance with audio, envelope, spectrogram, a diagonal attention per head (head k
    wider than head k-1, so each head's map differs), a CTC path, timed words and ops."""
    words = hyp.split()
    n = len(words)
    step = (seconds - 0.4) / max(n, 1)
    times = [(round(0.2 + i * step, 3), round(0.2 + i * step + 0.8 * step, 3)) for i in range(n)]
    uri, audio = _opus_uri(seconds, freq)

    columns = 400
    chunks = audio[: audio.size // columns * columns].reshape(columns, -1)
    envelope = np.stack([chunks.min(1), chunks.max(1)], 1)
    envelope = np.clip(np.round((envelope + 1) * 127.5), 0, 255).astype(np.uint8)
    rng = np.random.default_rng(0)
    spectrogram = rng.integers(0, 120, size=(40, int(seconds / 0.01)), dtype=np.uint8)
    spectrogram[8:12] = 230  # the tone's band

    frame = 0.04
    frames = int(seconds / frame)
    centres = [int((s + e) / 2 / frame) for s, e in times] + [frames - 1]  # eos last
    t = np.arange(frames)
    attention = np.stack(
        [
            np.stack([np.exp(-(((t - c) / (1 + k)) ** 2)) for c in centres])
            for k in range(layers * heads)
        ]
    )  # (K, L+1, T_enc)
    attention = np.round(255 * attention / attention.max(-1, keepdims=True)).astype(np.uint8)
    ctc = np.full(frames, -1, dtype="<i2")
    ctc[centres[:-1]] = np.arange(n)

    blob, arrays = b"", {}
    for name, array, extra in (
        ("envelope", envelope, {}),
        ("spectrogram", spectrogram, {"seconds": 0.01}),
        ("attention", attention, {"seconds": frame}),
        ("ctc", ctc, {"seconds": frame}),
    ):
        dtype = "int16" if array.dtype.kind == "i" else "uint8"
        arrays[name] = {"offset": len(blob), "shape": list(array.shape), "dtype": dtype, **extra}
        blob += array.tobytes()

    ref_words = ref.split() if ref is not None else []
    ops = _ops(ref_words, words) if ref is not None else []
    counts = {k: sum(op[0] == k for op in ops) for k in "SDI"}
    return {
        "id": uid,
        "speaker": speaker,
        "duration": seconds,
        "ref": ref,
        "hyp": hyp,
        "wer": 100 * sum(counts.values()) / len(ref_words) if ref_words else None,
        "errors": {"sub": counts["S"], "del": counts["D"], "ins": counts["I"]}
        if ref is not None
        else None,
        "confidence": 0.8,
        "flags": [],
        "words": [
            {"w": w, "start": s, "end": e, "conf": 0.5 + 0.1 * (i % 5)}
            for i, (w, (s, e)) in enumerate(zip(words, times))
        ],
        "ops": ops,
        "ref_words": [{"w": w, "start": None, "end": None} for w in ref_words]
        if ref is not None
        else None,
        "nbest": [{"text": hyp, "score": -1.5}, {"text": hyp + " uh", "score": -3.25}],
        "tokens": [{"piece": "▁" + w, "start": s, "end": e} for w, (s, e) in zip(words, times)],
        "timing_heads": timing_heads,
        "layers": layers,
        "heads": heads,
        "audio": uri,
        "audio_note": None,
        "blob": base64.b64encode(zlib.compress(blob)).decode(),
        "arrays": arrays,
    }


def bare_utterance(uid: str, **keys) -> dict:
    """An utterance with nothing saved but its id and text."""
    return {
        "id": uid,
        "speaker": None,
        "duration": None,
        "ref": None,
        "hyp": "",
        "wer": None,
        "errors": None,
        "confidence": None,
        "flags": [],
        "words": [],
        "ops": [],
        "ref_words": None,
        "nbest": [],
        "tokens": [],
        "timing_heads": None,
        "layers": None,
        "heads": None,
        "audio": None,
        "audio_note": None,
        "blob": None,
        "arrays": {},
        **keys,
    }


def page_data(utterances: list[dict], **keys) -> dict:
    return {
        "title": "test run",
        "kind": "decode",
        "notes": [],
        "summary": None,
        "utterances": utterances,
        "training": None,
        **keys,
    }


def png(rgb: tuple[int, int, int]) -> str:
    """A 1x1 PNG as a data: URI."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00" + bytes(rgb)))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(data).decode()


# ---- the browser ----
@pytest.fixture(scope="module")
def driver():
    browser = chromium()
    yield browser
    browser.quit()


@pytest.fixture(autouse=True)
def no_console_errors(driver):
    driver.get_log("browser")  # drop what earlier tests left
    yield
    severe = severe_errors(driver)
    assert not severe, severe


def wait(driver, condition, seconds: float = 5):
    return WebDriverWait(driver, seconds, poll_frequency=0.02).until(lambda d: condition(d))


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def open_page(driver, tmp_path, data: dict) -> float:
    """Loads the page built from `data`; returns the seconds until the overview was ready."""
    path = tmp_path / "x.html"
    path.write_text(build_page(data), encoding="utf-8")
    start = time.perf_counter()
    driver.get(path.as_uri())
    wait(driver, lambda d: js(d, "return document.body.dataset.ready") == "1")
    return time.perf_counter() - start


def row_ids(driver) -> list[str]:
    return js(
        driver,
        "return [...document.querySelectorAll('#utterances tbody tr')].map(r => r.dataset.id)",
    )


def open_utterance(driver, uid: str) -> None:
    row = js(
        driver,
        "return [...document.querySelectorAll('#utterances tbody tr')]"
        ".find(r => r.dataset.id === arguments[0])",
        uid,
    )
    row.click()
    wait(
        driver, lambda d: js(d, "return document.querySelector('#utterance').dataset.ready") == "1"
    )


@pytest.fixture
def three(driver, tmp_path) -> dict:
    """A page of three utterances; "bad" has the highest WER and timing heads 1 and 3."""
    utts = [
        utterance("good", "the cat sat on the mat", "the cat sat on the mat", freq=220),
        utterance(
            "bad",
            "a cat sat in hat now",
            "the cat sat on the mat",
            speaker="spk2",
            timing_heads=[1, 3],
            freq=330,
        ),
        utterance("fair", "the cat sat on a mat", "the cat sat on the mat", freq=440),
    ]
    summary = {
        "wer": 33.3,
        "cer": 20.0,
        "substitutions": 5,
        "deletions": 0,
        "insertions": 1,
        "reference_words": 18,
        "utterances": 3,
        "sentence_errors": 2,
    }
    open_page(driver, tmp_path, page_data(utts, summary=summary, notes=["no LM used"]))
    return {u["id"]: u for u in utts}


# ---- overview ----
def test_overview_sorts_and_filters(driver, three):
    assert row_ids(driver) == ["good", "bad", "fair"]
    wer = driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=wer]")
    wer.click()
    assert row_ids(driver) == ["bad", "fair", "good"]  # worst first
    wer.click()
    assert row_ids(driver) == ["good", "fair", "bad"]
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=id]").click()
    assert row_ids(driver) == ["bad", "fair", "good"]
    driver.find_element(By.CSS_SELECTOR, "#filter").send_keys("spk2")
    assert row_ids(driver) == ["bad"]
    assert [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#notes li")] == ["no LM used"]
    speakers = [
        r.text.split()[:2] for r in driver.find_elements(By.CSS_SELECTOR, "#speakers tbody tr")
    ]
    assert speakers == [["spk1", "2"], ["spk2", "1"]]


def test_words_said_against_no_reference_words_sort_as_the_worst(driver, tmp_path):
    """No rate (the page data's WER is null), but worse than any: shown and sorted as such,
    in the table, the utterance's details and B's hypothesis alike."""
    utts = [utterance("half", "go", "go on"), utterance("said", "yes no yes", "", speaker="spk9"),
            utterance("ok", "go", "go")]  # fmt: skip
    utts[1]["compare"] = {"hyp": "yes", "wer": None, "errors": {"sub": 0, "del": 0, "ins": 1},
                          "ops": _ops([], ["yes"])}  # fmt: skip
    compare = {"title": "b/decode", "title_a": "a/decode", "summary": {"wer": 50.0}}
    open_page(driver, tmp_path, page_data(utts, compare=compare))
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=wer]").click()
    assert row_ids(driver) == ["said", "half", "ok"]  # worst first
    assert "∞" in driver.find_element(By.CSS_SELECTOR, '#utterances tr[data-id="said"]').text
    speakers = [r.text.split() for r in driver.find_elements(By.CSS_SELECTOR, "#speakers tbody tr")]
    assert speakers[-1][-1] == "∞", speakers  # the speaker of "said" alone, none else
    open_utterance(driver, "said")
    assert "WER\n∞" in driver.find_element(By.ID, "utt-meta").text
    assert driver.find_element(By.ID, "hyp-b-title").text == "Hypothesis B (b/decode): WER ∞"


def test_previous_and_next_follow_the_table_as_it_is_now(driver, three):
    """◀ and ▶ step through the rows as sorted and filtered now, not as when the row opened."""

    def steps() -> tuple[bool, bool]:
        return tuple(driver.find_element(By.ID, b).is_enabled() for b in ("prev", "next"))

    open_utterance(driver, "fair")  # last of good, bad, fair
    assert steps() == (True, False)
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=wer]").click()
    assert row_ids(driver) == ["bad", "fair", "good"] and steps() == (True, True)
    driver.find_element(By.CSS_SELECTOR, "#filter").send_keys("spk2")  # bad alone
    assert row_ids(driver) == ["bad"] and steps() == (False, False)
    driver.find_element(By.CSS_SELECTOR, "#filter").send_keys(Keys.ESCAPE)
    assert steps() == (True, True)
    driver.find_element(By.ID, "next").click()
    wait(driver, lambda d: d.find_element(By.ID, "utt-title").text == "good")
    assert steps() == (True, False)


# ---- the utterance view ----
def test_worst_row_opens_its_attention(driver, three):
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=wer]").click()
    assert js(driver, "return document.querySelector('#utterance').hidden")
    driver.find_element(By.CSS_SELECTOR, "#utterances tbody tr").click()
    wait(
        driver, lambda d: js(d, "return document.querySelector('#utterance').dataset.ready") == "1"
    )
    assert driver.find_element(By.ID, "utt-title").text == "bad"
    canvas = driver.find_element(By.ID, "attention-canvas")
    assert int(canvas.get_attribute("data-checksum")) > 0
    assert canvas.get_attribute("data-head") == "avg"  # timing heads given: their average first
    strip = js(
        driver, "return [...document.querySelectorAll('#ctc-strip span')].map(s => s.textContent)"
    )
    assert strip == ["▁" + w for w in three["bad"]["hyp"].split()]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#nbest li")) == 2
    kinds = js(
        driver, "return [...document.querySelectorAll('#alignment .pair')].map(p => p.className)"
    )
    assert kinds.count("pair op-s") == 4 and kinds.count("pair op-c") == 2

    label = driver.find_elements(By.CSS_SELECTOR, "#token-labels div")[2]
    ActionChains(driver).move_to_element(label).perform()
    assert not js(driver, "return document.querySelector('#span-highlight').hidden")
    ActionChains(driver).move_to_element(canvas).perform()
    assert "frame" in driver.find_element(By.ID, "attention-hover").text


def test_playback_time_highlights_its_word(driver, three):
    open_utterance(driver, "good")
    wait(driver, lambda d: js(d, "return document.querySelector('#player').readyState") >= 1)
    for word in three["good"]["words"][:4]:
        t = (word["start"] + word["end"]) / 2
        js(driver, "document.querySelector('#player').currentTime = arguments[0]", t)
        wait(
            driver,
            lambda d, w=word["w"]: (
                [e.text for e in d.find_elements(By.CSS_SELECTOR, "#hyp .word.current")] == [w]
            ),
        )
        current = driver.find_element(By.CSS_SELECTOR, "#hyp .word.current")
        assert (
            float(current.get_attribute("data-start"))
            <= t
            < float(current.get_attribute("data-end"))
        )
    gap = three["good"]["words"][0]["end"] + 0.01  # between two words: none is current
    js(driver, "document.querySelector('#player').currentTime = arguments[0]", gap)
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#hyp .word.current"))


def test_clicking_a_word_seeks_there(driver, three):
    open_utterance(driver, "fair")
    wait(driver, lambda d: js(d, "return document.querySelector('#player').readyState") >= 1)
    js(
        driver,
        "window.seeks = []; const p = document.querySelector('#player');"
        "p.addEventListener('seeked', () => window.seeks.push(p.currentTime))",
    )
    for selector in ("#hyp .word", "#ref .word"):
        word = driver.find_elements(By.CSS_SELECTOR, selector)[3]
        start = float(word.get_attribute("data-start"))
        word.click()
        seek = wait(driver, lambda d: js(d, "return window.seeks.shift()"))
        assert abs(seek - start) < 0.05
    js(driver, "document.querySelector('#player').pause()")


def test_a_segment_linked_mid_file_plays_on_its_own_clock(driver, tmp_path):
    """A linked file's player counts from the file's start: a segment 2 s in seeks to 2 s plus
    its word's time, and the player at 2 s plus a time lights the word spoken then."""
    _, audio = _opus_uri(4.0, 220.0)
    sf.write(tmp_path / "long.wav", audio, 16000)
    segment = utterance("long#2", "one two three", seconds=1.5)
    segment |= {"audio": "long.wav#t=2.000", "audio_offset": 2.0, "start": 2.0}
    open_page(driver, tmp_path, page_data([segment]))
    open_utterance(driver, "long#2")
    assert "from\n0:02.0" in driver.find_element(By.ID, "utt-meta").text  # where in the recording
    late = segment | {"id": "long#3", "start": 119.96}  # rounded whole: 2:00.0, not 1:60.0
    open_page(driver, tmp_path, page_data([segment, late]))
    open_utterance(driver, "long#3")
    assert "from\n2:00.0" in driver.find_element(By.ID, "utt-meta").text
    open_utterance(driver, "long#2")
    wait(driver, lambda d: js(d, "return document.querySelector('#player').readyState") >= 1)
    # the #t=2.000 fragment's own seek is over before the click's is awaited
    wait(driver, lambda d: js(d, "const p = document.querySelector('#player');"
                                 "return !p.seeking && p.currentTime >= 2"))  # fmt: skip
    js(
        driver,
        "window.seeks = []; const p = document.querySelector('#player');"
        "p.addEventListener('seeked', () => window.seeks.push(p.currentTime))",
    )
    word = driver.find_elements(By.CSS_SELECTOR, "#hyp .word")[1]
    word.click()
    seek = wait(driver, lambda d: js(d, "return window.seeks.shift()"))
    assert abs(seek - (2.0 + float(word.get_attribute("data-start")))) < 0.05
    js(driver, "document.querySelector('#player').pause()")
    third = segment["words"][2]
    at = 2.0 + (third["start"] + third["end"]) / 2
    js(driver, "document.querySelector('#player').currentTime = arguments[0]", at)
    wait(
        driver,
        lambda d: (
            [e.text for e in d.find_elements(By.CSS_SELECTOR, "#hyp .word.current")] == ["three"]
        ),
    )


def test_a_segment_of_a_linked_file_stops_at_its_end_the_first_too(driver, tmp_path):
    """A long recording's segments link its one file: each plays to its own end and pauses,
    the first (which starts at the file's start) as well as the later ones."""
    _, audio = _opus_uri(4.0, 220.0)
    sf.write(tmp_path / "long.wav", audio, 16000)
    first = utterance("long#1", "one two three", seconds=1.5)
    first |= {"audio": "long.wav", "audio_offset": 0.0, "start": 0.0}
    later = first | {"id": "long#2", "audio": "long.wav#t=2.000", "audio_offset": 2.0}
    open_page(driver, tmp_path, page_data([first, later]))
    for uid, offset in (("long#1", 0.0), ("long#2", 2.0)):
        open_utterance(driver, uid)
        wait(driver, lambda d: js(d, "return document.querySelector('#player').readyState") >= 1)
        driver.find_elements(By.CSS_SELECTOR, "#hyp .word")[-1].click()
        wait(driver, lambda d: js(d, "return document.querySelector('#player').paused"))
        stopped = js(driver, "return document.querySelector('#player').currentTime")
        assert offset + 1.5 <= stopped < offset + 1.8, (uid, stopped)


def test_switching_head_changes_the_heatmap(driver, three):
    open_utterance(driver, "bad")
    canvas = driver.find_element(By.ID, "attention-canvas")
    heads = Select(driver.find_element(By.ID, "head"))
    assert [o.text for o in heads.options] == ["average of timing heads *", "0", "1 *"]
    seen = {canvas.get_attribute("data-checksum")}
    for head in ("1", "0"):
        heads.select_by_value(head)
        wait(driver, lambda d, head=head: canvas.get_attribute("data-head") == head)
        seen.add(canvas.get_attribute("data-checksum"))
    Select(driver.find_element(By.ID, "layer")).select_by_value("1")
    wait(driver, lambda d: canvas.get_attribute("data-layer") == "1")
    seen.add(canvas.get_attribute("data-checksum"))
    assert len(seen) == 4


# ---- awkward data ----
def test_data_renders_as_text(driver, tmp_path):
    evil = utterance(EVIL_ID, f"hello {EVIL_TEXT}", EVIL_TEXT, speaker=EVIL_TEXT)
    evil["flags"] = [EVIL_ID]
    evil["nbest"] = [{"text": EVIL_ID, "score": None}]
    evil["tokens"][0]["piece"] = EVIL_TEXT
    notes = [EVIL_TEXT, "{{SCRIPT}} {{DATA}}"]  # a placeholder's text must not take its place
    open_page(driver, tmp_path, page_data([evil], title=EVIL_ID, notes=notes))
    assert driver.title == EVIL_ID
    assert driver.find_element(By.ID, "title").text == EVIL_ID
    assert [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#notes li")] == notes
    assert driver.find_element(By.CSS_SELECTOR, "#utterances tbody td").text == EVIL_ID
    open_utterance(driver, EVIL_ID)
    assert driver.find_element(By.ID, "ref").text == EVIL_TEXT
    assert driver.find_element(By.CSS_SELECTOR, "#nbest li").text.startswith(EVIL_ID)
    assert js(driver, "return window.pwned") is None
    code = "script:not([type='text/plain'])"  # the arrays' elements hold base64 only
    assert (
        js(driver, f'return document.images.length + document.querySelectorAll("{code}").length')
        == 2
    )


def test_missing_parts_are_said_not_thrown(driver, tmp_path):
    short = {"offset": 0, "shape": [1, 2, 100], "dtype": "uint8"}  # more than the blob holds
    picture = {"offset": 0, "shape": [2, 3], "dtype": "uint8"}
    data = {
        "utterances": [
            bare_utterance("nothing", audio_note="file not found: a/b.wav"),
            {"id": "only-id"},
            {},
            bare_utterance(
                "short",
                blob=base64.b64encode(zlib.compress(bytes(10))).decode(),
                arrays={"attention": short},
            ),
            bare_utterance("garbled", blob="bm90IHpsaWI=", arrays={"attention": short}),
            bare_utterance(
                "bad-picture",
                blob=base64.b64encode(zlib.compress(b"RIFF not a picture")).decode(),
                arrays={"spectrogram": picture | {"encoding": "webp", "bytes": 18}},
            ),
            bare_utterance(
                "unknown-encoding",
                blob=base64.b64encode(zlib.compress(bytes(10))).decode(),
                arrays={"spectrogram": picture | {"encoding": "jxl"}},
            ),
            bare_utterance("empty-ref", ref=""),
        ]
    }
    open_page(driver, tmp_path, data)
    uids = [
        "nothing",
        "only-id",
        "short",
        "garbled",
        "bad-picture",
        "unknown-encoding",
        "empty-ref",
    ]
    assert row_ids(driver) == [*uids[:2], "", *uids[2:]]
    for uid in uids:
        open_utterance(driver, uid)
        assert not driver.find_elements(By.CSS_SELECTOR, "#nbest li")
        missing = driver.find_element(By.CSS_SELECTOR, "#attention-plot .missing")
        assert missing.text == "no attention saved"
        notes = driver.find_element(By.ID, "utt-notes").text
        assert ("does not fit" in notes) == (uid == "short")
        alignment = driver.find_element(By.ID, "alignment").text
        assert alignment == (
            "nothing to align: the reference and the hypothesis are empty"
            if uid == "empty-ref"
            else "no alignment (no reference)"
        )
        assert ("could not be inflated" in notes) == (uid == "garbled")
        assert ('"spectrogram" could not be decoded' in notes) == (uid == "bad-picture")
        assert ("kept as jxl, which this page cannot read" in notes) == (uid == "unknown-encoding")
    open_utterance(driver, "nothing")
    assert driver.find_element(By.ID, "audio-note").text == "file not found: a/b.wav"


def test_a_huge_duration_draws_a_few_ticks_not_a_frozen_tab(driver, tmp_path):
    """A record's duration of 1e300 s looped the time axis's ticks for ever: a step added to
    such a time changes nothing."""
    open_page(driver, tmp_path, page_data([bare_utterance("huge", duration=1e300)]))
    open_utterance(driver, "huge")
    assert 1 <= len(driver.find_elements(By.CSS_SELECTOR, "#axis span")) <= 11


def test_a_hypothesis_saved_without_word_times_is_aligned_by_its_text(driver, tmp_path):
    ref, hyp = ["U", "M", "SIX"], ["B", "U", "M", "SEVEN"]
    untimed = bare_utterance("untimed", ref=" ".join(ref), hyp=" ".join(hyp), ops=_ops(ref, hyp))
    open_page(driver, tmp_path, page_data([untimed]))
    open_utterance(driver, "untimed")
    pairs = driver.find_elements(By.CSS_SELECTOR, "#alignment .pair .h")
    assert [p.text for p in pairs] == hyp
    kinds = [w.get_attribute("class") for w in driver.find_elements(By.CSS_SELECTOR, "#hyp .word")]
    assert kinds == ["word op-i", "word op-c", "word op-c", "word op-s"]


def test_a_compared_decode_adds_its_wer_columns_and_hypothesis(driver, tmp_path):
    """With B beside A: B's WER and the difference per utterance, sortable; the summary's
    cards for B; in an utterance, B's words coloured by their alignment, its deletions struck
    through; an utterance B lacks says so."""
    utts = [
        utterance("same", "the cat sat", "the cat sat"),
        utterance("worse", "the cat sat", "the cat sat"),
        utterance("absent", "the cat sat", "the cat sat"),
    ]
    for u, hyp, wer in ((utts[0], "the cat sat", 0.0), (utts[1], "a cat", 66.7)):
        u["compare"] = {"hyp": hyp, "wer": wer, "ops": _ops("the cat sat".split(), hyp.split())}
    compare = {"title": "b/decode", "title_a": "a/decode", "summary": {"wer": 33.3},
               "fewer_errors": 0, "more_errors": 1, "same_errors": 1, "wer_difference": 33.3,
               "interval": [0.0, 66.7]}  # fmt: skip
    open_page(driver, tmp_path, page_data(utts, compare=compare))
    headers = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#utterances th")]
    assert headers[3:5] == ["WER %", "WER B %"] and headers[5].startswith("B − A")
    driver.find_element(By.CSS_SELECTOR, 'th[data-key="delta"]').click()
    assert row_ids(driver) == ["worse", "same", "absent"]  # no B: last
    assert "+33.30 [0.00, +66.70]" in driver.find_element(By.ID, "summary-b").text
    open_utterance(driver, "worse")
    assert driver.find_element(By.ID, "hyp-b-title").text == "Hypothesis B (b/decode): WER 66.7 %"
    words = driver.find_elements(By.CSS_SELECTOR, "#hyp-b .word")
    assert [(w.text, w.get_attribute("class")) for w in words] == [
        ("a", "word op-s"), ("cat", "word op-c"), ("sat", "word op-d")]  # fmt: skip
    open_utterance(driver, "absent")
    assert driver.find_element(By.ID, "hyp-b").text == "not in decode B"

    apart = {**compare, "wer_difference": None, "interval": None, "shared": 0,
             "fewer_errors": 0, "more_errors": 0, "same_errors": 0}  # fmt: skip
    open_page(driver, tmp_path, page_data(utts[2:], compare=apart))  # B shares no utterance
    cards = driver.find_element(By.ID, "summary-b").text
    assert "WER B\n33.3" in cards and "WER B − A over the 0 shared (95 %)\n–" in cards

    open_page(driver, tmp_path, page_data(utts[:1]))  # no B: as before
    assert "WER B %" not in driver.find_element(By.CSS_SELECTOR, "#utterances thead").text
    open_utterance(driver, "same")
    assert not driver.find_element(By.ID, "hyp-b-box").is_displayed()


@pytest.mark.parametrize("width", [800, 1280])
def test_a_compared_tables_last_column_can_be_seen_in_any_window(driver, tmp_path, width):
    """B's columns widen the table past what a narrow window, or one shared with the speakers
    table, holds: the speakers go below it, and a narrower window scrolls it sideways."""
    utts = [utterance(f"u{i}", "the cat sat", "the cat sat", speaker=f"s{i}") for i in range(3)]
    for u in utts:
        u["compare"] = {
            "hyp": "a cat",
            "wer": 66.7,
            "ops": _ops(["the", "cat", "sat"], ["a", "cat"]),
        }
    u["flags"] = ["empty"]
    compare = {"title": "b", "title_a": "a", "summary": {"wer": 66.7}, "fewer_errors": 0,
               "more_errors": 3, "same_errors": 0, "wer_difference": 66.7,
               "interval": [0, 0]}  # fmt: skip
    driver.set_window_size(width, 1000)
    try:
        open_page(driver, tmp_path, page_data(utts, compare=compare))
        js(driver, "document.querySelector('.table-scroll').scrollLeft = 10000")
        box, cell = js(
            driver,
            "const r = [...document.querySelectorAll('#utterances tbody tr')].at(-1);"
            "return [document.querySelector('.table-scroll').getBoundingClientRect().right,"
            "        r.lastElementChild.getBoundingClientRect().right]",
        )
        assert cell <= box + 1, (width, cell, box)
    finally:
        driver.set_window_size(1280, 1000)


def test_a_row_past_the_size_limit_says_why_it_has_no_maps(driver, tmp_path):
    left_out = bare_utterance("far", hyp="a b", flags=["maps left out"], duration=2.0)
    open_page(driver, tmp_path, page_data([left_out, bare_utterance("near", duration=2.0)]))
    said = "[...document.querySelectorAll('#utterance .missing:not([hidden]), #ctc-strip')]"
    for uid, expected in (("far", "left out to keep the page small"), ("near", "no ")):
        open_utterance(driver, uid)
        messages = js(driver, f"return {said}.map(e => e.textContent)")
        assert len(messages) >= 4 and all(m.startswith(expected) for m in messages), messages


def test_a_spectrogram_kept_as_a_picture_is_read_from_its_grey_levels(driver, tmp_path):
    """The page draws a spectrogram the builder keeps as WebP from the grey levels the browser
    decodes, Pillow's decode of the same file within a level, through an image element where the
    browser has no createImageBitmap; a raw one from its own bytes."""
    from PIL import Image

    from asr.explore.build import _pack, _picture

    rng = np.random.default_rng(1)
    ramp = np.add.outer(np.linspace(10, 200, 80), 30 * np.sin(np.arange(300) / 9))
    levels = np.clip(ramp + rng.normal(0, 8, ramp.shape), 0, 255).astype(np.uint8)
    picture = _picture(levels)
    decoded = np.asarray(Image.open(io.BytesIO(picture.data)).convert("L"), dtype=np.int64)
    rows = {
        "raw": (levels, int(levels.sum()), 0),
        "picture": (picture, int(decoded.sum()), levels.size),
    }
    utts = [
        utterance(uid, "a b", seconds=3.0) | _pack({"spectrogram": (stored, {"seconds": 0.01})})
        for uid, (stored, _, _) in rows.items()
    ]
    script = "window.createImageBitmap = undefined;"  # run before the page's own scripts
    for without_bitmaps in (False, True):
        added = (
            driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})
            if without_bitmaps
            else None
        )
        try:
            open_page(driver, tmp_path, page_data(utts))
            assert js(driver, "return typeof createImageBitmap") == (
                "undefined" if without_bitmaps else "function")  # fmt: skip
            for uid, (_, expected, tolerance) in rows.items():
                open_utterance(driver, uid)
                canvas = driver.find_element(By.ID, "spectrogram")
                got = int(canvas.get_attribute("data-checksum"))
                assert abs(got - expected) <= tolerance, (uid, without_bitmaps)
                assert not driver.find_element(By.ID, "utt-notes").text
        finally:
            if added is not None:
                driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", added)


def test_no_utterances(driver, tmp_path):
    open_page(driver, tmp_path, page_data([]))
    assert driver.find_element(By.ID, "empty").text == "no utterances"
    assert not driver.find_elements(By.CSS_SELECTOR, "#utterances tbody tr")


def test_right_to_left_text(driver, tmp_path):
    arabic, hebrew = "مرحبا بالعالم", "שלום עולם"
    utt = utterance("عربي", arabic, hebrew, speaker="דובר")
    open_page(driver, tmp_path, page_data([utt]))
    open_utterance(driver, "عربي")
    assert [w.text for w in driver.find_elements(By.CSS_SELECTOR, "#hyp .word")] == arabic.split()
    assert [w.text for w in driver.find_elements(By.CSS_SELECTOR, "#ref .word")] == hebrew.split()
    assert js(driver, "return getComputedStyle(document.querySelector('#hyp')).direction") == "rtl"


def test_three_thousand_utterances(driver, tmp_path):
    utts = []
    for i in range(3000):
        words = ["word", f"w{i % 7}", "more"]
        utts.append(
            bare_utterance(
                f"utt{i:04d}",
                speaker=f"spk{i % 20}",
                duration=1 + i % 9,
                ref="word w0 more",
                hyp=" ".join(words),
                wer=(i * 37) % 1000 / 10,
                confidence=(i % 100) / 100,
                errors={"sub": i % 3, "del": 0, "ins": 0},
                flags=["repaired"] if i % 50 == 0 else [],
                words=[
                    {"w": w, "start": j * 0.3, "end": j * 0.3 + 0.25, "conf": 0.9}
                    for j, w in enumerate(words)
                ],
                ops=[["C", "word", 0], ["S", "w0", 1], ["C", "more", 2]],
            )
        )
    utts[1234]["wer"] = 150.0
    assert open_page(driver, tmp_path, page_data(utts)) < 3
    assert len(row_ids(driver)) == 3000
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=wer]").click()
    assert row_ids(driver)[0] == "utt1234"
    driver.find_element(By.CSS_SELECTOR, "#utterances th[data-key=confidence]").click()
    confidences = js(
        driver,
        "return [...document.querySelectorAll('#utterances tbody tr td:nth-child(6)')]"
        ".map(td => Number(td.textContent))",
    )
    assert confidences == sorted(confidences)
    driver.find_element(By.ID, "filter").send_keys("utt12")
    assert len(row_ids(driver)) == 100
    assert len(driver.find_elements(By.CSS_SELECTOR, "#speakers tbody tr")) == 20


# ---- training ----
def test_training_slider_swaps_the_image(driver, tmp_path):
    images = [png((255, 0, 0)), png((0, 255, 0)), png((0, 0, 255))]
    training = {
        "curves": {
            "epoch": [1, 2, 3],
            "series": {
                "train/loss": [3.0, 2.0, 1.5],
                "val/loss": [3.2, None, 1.8],
                "val/acc": [0.2, 0.4, 0.6],
                "val/wer": [None, None, None],
            },
        },
        "plots": [
            {
                "utterance": "an4/u1",
                "epochs": [{"epoch": e + 1, "image": im} for e, im in enumerate(images)],
            }
        ],
    }
    open_page(driver, tmp_path, page_data([], kind="training", training=training))
    assert driver.find_element(By.ID, "training").is_displayed()
    assert [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#curves figcaption")] == [
        "loss",
        "acc",
    ]
    image = driver.find_element(By.CSS_SELECTOR, "#training img.epoch-image")
    slider = driver.find_element(By.CSS_SELECTOR, "#training input[type=range].epoch-slider")
    assert image.get_attribute("src") == images[2]
    slider.send_keys(Keys.ARROW_LEFT)
    assert image.get_attribute("src") == images[1]
    slider.send_keys(Keys.HOME)
    assert image.get_attribute("src") == images[0]


def test_a_curve_passes_over_epochs_not_logged_and_breaks_where_not_finite(driver, tmp_path):
    """Validation every other epoch leaves nulls between its values: one line through them;
    a value that is not finite ("nan") lifts the pen, a gap."""
    training = {
        "curves": {
            "epoch": [0, 1, 2, 3, 4],
            "series": {"val/acc": [None, 0.2, None, 0.4, 0.5], "val/loss": [2, "nan", 1.5, 1, 0.5]},
        },
        "plots": [],
    }
    open_page(driver, tmp_path, page_data([], kind="training", training=training))
    paths = js(driver, "return [...document.querySelectorAll('#curves figure')].map((f) => "
               "[f.querySelector('figcaption').textContent, f.querySelector('path').getAttribute("
               "'d')])")  # fmt: skip
    moves = {title: (d.count("M"), d.count("L")) for title, d in paths}
    assert moves == {"acc": (1, 2), "loss": (2, 2)}


def test_the_page_of_a_real_decode(driver, tmp_path):
    """`asr evaluate` on the AN4 fixture (two test utterances the overfit model gets partly
    wrong), then `explore`: the worst utterance sorts first and shows its attention; playback
    lights the word being spoken; another head draws another map."""
    from explore_fixtures import TEST_UTTERANCES, decode
    from test_transcribe import UTTERANCES

    from asr.explore.build import explore

    folder = decode(tmp_path, UTTERANCES | TEST_UTTERANCES)
    page = explore(folder, progress=False)
    driver.get(page.as_uri())
    wait(driver, lambda d: js(d, "return document.body.dataset.ready") == "1")
    wers = js(driver, "return [...document.querySelectorAll('#utterances tbody tr')].length")
    assert wers == 6
    driver.find_element(By.CSS_SELECTOR, 'th[data-key="wer"]').click()
    worst = row_ids(driver)[0]
    assert worst in {"an406-fcaw-b", "an407-fcaw-b"}
    open_utterance(driver, worst)
    canvas = driver.find_element(By.ID, "attention-canvas")
    assert float(canvas.get_attribute("data-checksum")) > 0
    before = canvas.get_attribute("data-checksum")
    Select(driver.find_element(By.ID, "head")).select_by_index(1)
    wait(driver, lambda d: canvas.get_attribute("data-checksum") != before)

    wait(driver, lambda d: js(d, "return document.querySelector('#player').readyState") >= 1)
    word = driver.find_elements(By.CSS_SELECTOR, "#hyp .word")[0]
    start, end = (float(word.get_attribute(f"data-{k}")) for k in ("start", "end"))
    js(driver, "document.querySelector('#player').currentTime = arguments[0]", (start + end) / 2)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#hyp .word.current"))
    assert driver.find_element(By.CSS_SELECTOR, "#hyp .word.current").text == word.text


def test_the_page_of_an_rnn_decode(driver, tmp_path):
    """An RNN-attention decode: its one location-aware map is drawn and named, with no layer
    or head to choose."""
    from explore_fixtures import TEST_UTTERANCES, decode, rnn_recognizer

    from asr.explore.build import explore

    folder = decode(tmp_path, TEST_UTTERANCES, rnn_recognizer(TEST_UTTERANCES.values()))
    driver.get(explore(folder, progress=False).as_uri())
    wait(driver, lambda d: js(d, "return document.body.dataset.ready") == "1")
    open_utterance(driver, row_ids(driver)[0])
    canvas = driver.find_element(By.ID, "attention-canvas")
    wait(driver, lambda d: float(canvas.get_attribute("data-checksum") or 0) > 0)
    assert driver.find_element(By.ID, "attention-kind").text == "location-aware attention"
    assert not driver.find_element(By.ID, "head").is_displayed()
    assert not driver.find_element(By.ID, "layer").is_displayed()
