"""The explorer's build time and size for decode folders, and how soon a large page is ready.

    python -m bench.explorer exp/an4/transformer_quick/decode_test [MORE_DECODE_DIRS...]
        [--synthetic 3000] [--out bench/results/explorer]
    python -m bench.explorer DECODE_DIR [DECODE_DIR_B] --training RUN_DIR --screenshots docs/

    python -m bench.explorer exp/an4/transformer_quick/decode_test --synthetic 0 \
        --recording data/an4/train.jsonl data/an4/test.jsonl \
        --checkpoint exp/an4/transformer_quick/avg.ckpt

For each decode folder: seconds to build its explorer (audio embedded) and the page's size,
after an untimed build of the first folder (the process's one-off imports and first calls).
With --synthetic N, a decode folder of N utterances made by repeating the first folder's
records (attention included) is built with --link-audio, and, where Chromium is installed,
opened headless: seconds from navigation until the overview is rendered (best of 3), and
until a row's utterance is (the mean over 8 rows). With --recording, the manifests'
utterances joined into one FLAC recording, a second of silence after each, are transcribed
with `asr transcribe --explorer` by --checkpoint, and that folder's page is built and opened.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import time
from pathlib import Path

import numpy as np

from asr.explore.build import explore
from asr.explore.records import ATTENTION, LAYOUT, read_attention, read_records

ROOT = Path(__file__).resolve().parents[1]  # defaults hold from any working folder


def build(folder: Path, out: Path, link_audio: bool = False) -> dict:
    start = time.perf_counter()
    page = explore(folder, out, link_audio=link_audio, progress=False)
    seconds = time.perf_counter() - start
    return {"folder": str(folder), "seconds": round(seconds, 2),
            "megabytes": round(page.stat().st_size / 1e6, 2), "page": str(page)}  # fmt: skip


def synthetic(source: Path, count: int, out: Path) -> Path:
    """A decode folder of `count` utterances cycling through `source`'s records."""
    records, maps = list(read_records(source)), read_attention(source) or {}
    folder = out / f"synthetic_{count}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    lines, arrays = [], {}
    for i in range(count):
        record = dict(records[i % len(records)])
        record["id"] = f"{record['id']}-{i:05d}"
        record["speaker"] = f"spk{i % 40:02d}"
        key = record.pop("attention", None)
        if key in maps:
            arrays[str(i)] = maps[key]
            record["attention"] = str(i)
        lines.append(json.dumps(record))
    (folder / "utterances.jsonl").write_text("\n".join(lines) + "\n")
    np.savez_compressed(folder / ATTENTION, **arrays)
    shutil.copy(source / LAYOUT, folder / LAYOUT)
    shutil.copy(source / "metrics.json", folder / "metrics.json")
    return folder


def chromium(width: int = 1400, height: int = 900, *flags: str):
    """A headless Chromium WebDriver (with more command-line `flags`), or None where Chromium
    or selenium is missing."""
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if driver_path is None or shutil.which("chromium") is None:
        return None
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        f"--window-size={width},{height}",
        *flags,
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def screenshots(
    decode_page: Path, training_page: Path | None, out: Path, compare_page: Path | None = None
) -> list[Path]:
    """PNGs of the overview sorted by WER, the worst utterance with its attention, the
    training view, and two decodes compared, sorted by the difference, for the docs."""
    from selenium.webdriver.common.by import By

    driver = chromium()
    if driver is None:
        raise SystemExit("screenshots need Chromium and chromedriver (make browser)")
    wait = _waiter(driver)
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    try:
        driver.get(decode_page.resolve().as_uri())
        wait("return document.body.dataset.ready === '1'")
        driver.find_element(By.CSS_SELECTOR, 'th[data-key="wer"]').click()
        shots.append(out / "explorer_overview.png")
        driver.save_screenshot(str(shots[-1]))
        driver.find_element(By.CSS_SELECTOR, "#utterances tbody tr").click()
        wait("return document.querySelector('#utterance').dataset.ready === '1'")
        driver.execute_script("document.querySelector('#utterance').scrollIntoView()")
        shots.append(out / "explorer_utterance.png")
        driver.save_screenshot(str(shots[-1]))
        if training_page is not None:
            driver.get(training_page.resolve().as_uri())
            wait("return document.body.dataset.ready === '1'")
            slider = driver.find_element(By.CSS_SELECTOR, "input.epoch-slider")
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", slider)
            shots.append(out / "explorer_training.png")
            driver.save_screenshot(str(shots[-1]))
        if compare_page is not None:
            driver.get(compare_page.resolve().as_uri())
            wait("return document.body.dataset.ready === '1'")
            driver.find_element(By.CSS_SELECTOR, 'th[data-key="delta"]').click()
            shots.append(out / "explorer_compare.png")
            driver.save_screenshot(str(shots[-1]))
    finally:
        driver.quit()
    return shots


def _waiter(driver):
    def wait(script: str, seconds: float = 30.0) -> None:
        start = time.perf_counter()
        while not driver.execute_script(script):
            if time.perf_counter() - start > seconds:
                raise TimeoutError(script)
            time.sleep(0.02)

    return wait


def ready_seconds(page: Path, tries: int = 3, rows: int = 8) -> dict:
    """Seconds from navigation until the page marks its overview rendered (the best of
    `tries`), and from a click on a row until its utterance is (the mean over `rows` rows
    spread over the table); none where Chromium is missing."""
    driver = chromium()
    if driver is None:
        return {}
    try:
        best = None
        wait = _waiter(driver)
        for _ in range(tries):
            start = time.perf_counter()
            driver.get(page.resolve().as_uri())
            wait("return document.body.dataset.ready === '1'", 60.0)
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
        count = driver.execute_script(
            "return document.querySelectorAll('#utterances tbody tr').length"
        )
        opened = []
        for k in range(0, count, max(1, count // rows))[:rows]:
            start = time.perf_counter()
            driver.execute_script(
                "document.querySelectorAll('#utterances tbody tr')[arguments[0]].click()", k
            )
            wait("return document.querySelector('#utterance').dataset.ready === '1'")
            opened.append(time.perf_counter() - start)
        row = round(sum(opened) / len(opened), 3) if opened else None
        return {"ready_seconds": round(best, 2), "row_seconds": row}
    finally:
        driver.quit()


def recording(manifests: list[Path], out: Path) -> Path:
    """The manifests' utterances joined into one FLAC file, a second of silence after each."""
    import soundfile as sf

    from asr.audio import load_audio
    from asr.data.manifest import read_manifest

    rate = 16000
    path = out / "recording.flac"
    with sf.SoundFile(path, "w", rate, 1, format="FLAC") as flac:
        for manifest in manifests:
            for item in read_manifest(manifest):
                wave = load_audio(item.audio_filepath, rate, item.offset, item.duration)
                flac.write(wave.numpy())
                flac.write(np.zeros(rate, dtype=np.float32))
    return path


def transcribed(audio: Path, checkpoint: Path, out: Path) -> Path:
    """`asr transcribe AUDIO --explorer`'s output folder."""
    from asr.cli import main as asr

    folder = out / "transcribed"
    shutil.rmtree(folder, ignore_errors=True)
    command = ["transcribe", str(audio), "--model", str(checkpoint), "--output-dir", str(folder),
               "--explorer", "--quiet"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # each input's transcript
        status = asr(command)
    if status != 0:
        raise SystemExit(f"asr {' '.join(command)} failed")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.explorer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folders", nargs="+", type=Path, help="decode folders of asr evaluate")
    parser.add_argument("--synthetic", type=int, default=3000, help="0: none")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/explorer")
    parser.add_argument(
        "--screenshots",
        type=Path,
        help="also save screenshots of the first folder's page (and of --training) here",
    )
    parser.add_argument("--training", type=Path, help="a training run folder, for a screenshot")
    parser.add_argument(
        "--recording", type=Path, nargs="+", help="manifests to join into one long recording"
    )
    parser.add_argument("--checkpoint", type=Path, help="the model that transcribes --recording")
    args = parser.parse_args()
    if args.recording and not args.checkpoint:
        parser.error("--recording needs --checkpoint")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.screenshots:
        training = None
        if args.training:
            training = explore(args.training, args.out / "training.html", progress=False)
        page = explore(args.folders[0], args.out / "page0.html", progress=False)
        compare = None
        if len(args.folders) > 1:  # the first two compared
            compare = explore(args.folders[0], args.out / "compare.html", progress=False,
                              compare=args.folders[1])  # fmt: skip
        for shot in screenshots(page, training, args.screenshots, compare):
            print(f"screenshot: {shot}")
        return
    build(args.folders[0], args.out / "warmup.html")  # untimed: imports and first calls
    rows = []
    for i, folder in enumerate(args.folders):
        rows.append(build(folder, args.out / f"page{i}.html"))
        print(json.dumps(rows[-1]))
    if args.synthetic:
        folder = synthetic(args.folders[0], args.synthetic, args.out)
        row = build(folder, folder / "explorer.html", link_audio=True)
        rows.append(row | ready_seconds(Path(row["page"])))
        print(json.dumps(rows[-1]))
    if args.recording:
        audio = recording(args.recording, args.out)
        folder = transcribed(audio, args.checkpoint, args.out)
        row = build(folder, folder / "explorer.html")
        rows.append(row | ready_seconds(Path(row["page"])) | _segments(folder))
        print(json.dumps(rows[-1]))
    (args.out / "explorer.json").write_text(json.dumps(rows, indent=1) + "\n")


def _segments(folder: Path) -> dict:
    record = json.loads((folder / "recording.json").read_text())
    return {"minutes": round(record["duration"] / 60, 1), "segments": len(record["segments"])}


if __name__ == "__main__":
    main()
