"""`asr explore`: what evaluate keeps for the page, the data the page gets, bad folders.

The page's behaviour in a browser is tested in test_browser.py.
"""

from __future__ import annotations

import base64
import errno
import io
import json
import math
import os
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import page_data
from explore_fixtures import decode
from PIL import Image
from test_transcribe import UTTERANCES, WAV

from asr.cli import main
from asr.explore import build
from asr.explore.build import LEFT_OUT, MAX_EMBEDDED_SECONDS, _Budget, _Media, explore
from asr.explore.page import build_page
from asr.explore.records import read_maps, read_records, write_maps

WAV_FILE = next(WAV.rglob("*.wav"))
HOSTILE = ["<script>window.pwned=1</script>", '"><img src=x onerror="window.pwned=1">']


def arrays(utterance: dict) -> dict[str, np.ndarray]:
    """The arrays of an utterance's blob, as the page reads them."""
    raw = zlib.decompress(base64.b64decode(utterance["blob"]))
    out = {}
    for name, spec in utterance["arrays"].items():
        if spec.get("encoding") == "webp":
            picture = raw[spec["offset"] : spec["offset"] + spec["bytes"]]
            out[name] = np.asarray(Image.open(io.BytesIO(picture)).convert("L"))
            assert list(out[name].shape) == spec["shape"]
            continue
        dtype = np.dtype("<i2") if spec["dtype"] == "int16" else np.uint8
        count = int(np.prod(spec["shape"]))
        out[name] = np.frombuffer(raw, dtype, count, spec["offset"]).reshape(spec["shape"])
    return out


@pytest.fixture(scope="module")
def decoded(tmp_path_factory) -> Path:
    """A decode of the four utterances the overfit recognizer gets exactly right."""
    return decode(tmp_path_factory.mktemp("explore"), UTTERANCES)


def test_evaluate_keeps_what_the_page_needs(decoded):
    records = list(read_records(decoded))
    layout = json.loads((decoded / "explore.json").read_text())
    assert [r["id"] for r in records] == [Path(p).name for p in UTTERANCES], "manifest order"
    with np.load(decoded / "attention.npz") as maps:
        for record in records:
            attention = maps[record["attention"]]
            tokens = len(record["tokens"])
            assert attention.dtype == np.uint8 and attention.shape[:2] == (
                layout["layers"] * layout["heads"], tokens + 1)  # fmt: skip
            assert (attention.max(axis=-1) == 255).all(), "each row scaled to its peak"
            ctc = record["ctc"]
            assert ctc["frames"] == attention.shape[2] and len(ctc["starts"]) == tokens
    for record in records:
        assert record["hyp"] == record["ref"] == " ".join(w["word"] for w in record["words"])
        assert all(0 <= w["start"] <= w["end"] <= record["duration"] for w in record["words"])
        assert record["nbest"][0]["text"] == record["hyp"] and len(record["nbest"]) == 3
        assert record["speaker"] == "fash" and record["finished"] and not record["repaired"]


def test_decode_page_holds_scores_audio_spectrogram_attention_and_ctc(decoded, tmp_path):
    out = explore(decoded, tmp_path / "page.html", progress=False)
    data = page_data(out.read_text())
    assert data["kind"] == "decode" and data["summary"]["wer"] == 0 and data["notes"] == []
    assert len(data["utterances"]) == len(UTTERANCES)
    for utterance in data["utterances"]:
        assert utterance["wer"] == 0 and utterance["errors"] == {"sub": 0, "del": 0, "ins": 0}
        assert [op[0] for op in utterance["ops"]] == ["C"] * len(utterance["ref"].split())
        assert utterance["audio"].startswith("data:audio/ogg;base64,")
        got = arrays(utterance)
        attention = got["attention"]
        assert attention.shape[0] == utterance["layers"] * utterance["heads"]
        assert got["ctc"].shape == (attention.shape[2],) and got["ctc"].max() == len(
            utterance["tokens"]) - 1  # fmt: skip
        mels, frames = got["spectrogram"].shape
        seconds = utterance["arrays"]["spectrogram"]["seconds"]
        assert mels == 80 and frames * seconds == pytest.approx(utterance["duration"], abs=0.05)
        assert (
            got["envelope"].shape[1] == 2 and (got["envelope"][:, 0] <= got["envelope"][:, 1]).all()
        )


def test_linked_audio_is_a_relative_path_and_missing_audio_is_said(decoded, tmp_path):
    folder = tmp_path / "decode"
    shutil.copytree(decoded, folder)
    out = explore(folder, tmp_path / "pages" / "linked.html", link_audio=True, progress=False)
    first = page_data(out.read_text())["utterances"][0]
    assert (out.parent / first["audio"]).resolve().samefile(next(WAV.rglob(f"{first['id']}.wav")))

    records = (folder / "utterances.jsonl").read_text().splitlines()
    moved = [json.loads(r) | {"audio": str(tmp_path / "moved.wav")} for r in records[:2]]
    lines = [*map(json.dumps, moved), *records[2:]]
    (folder / "utterances.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "attention.npz").unlink()
    data = page_data(explore(folder, progress=False).read_text())
    lost = data["utterances"][0]
    assert lost["audio"] is None and "moved.wav" in lost["audio_note"]
    assert "attention" not in lost["arrays"] and "ctc" in lost["arrays"]
    assert any("no attention saved" in n for n in data["notes"])
    assert any("1 audio file(s) missing" in n for n in data["notes"]), "a file, once"
    if hasattr(os, "mkfifo"):  # a pipe named as audio would wait for a writer forever
        os.mkfifo(tmp_path / "moved.wav")
        lost = page_data(explore(folder, progress=False).read_text())["utterances"][0]
        assert lost["audio"] is None and "not a regular file" in lost["audio_note"]


def test_past_its_size_limit_a_page_keeps_the_worst_utterances_maps(decoded, tmp_path, capsys):
    """Pictures, maps and embedded audio go to the worst utterances first, while the page has
    room (the first always): the others keep their text and a link to their audio, flagged, and
    a note says how to keep them all."""
    folder = tmp_path / "decode"
    shutil.copytree(decoded, folder)
    records = [json.loads(line) for line in (folder / "utterances.jsonl").read_text().splitlines()]
    records[2]["hyp"] = "WRONG WORDS"
    (folder / "utterances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    small = tmp_path / "small.html"
    assert main(["explore", str(folder), "--out", str(small), "--max-mb", "1e-6", "--quiet"]) == 0
    data = page_data(small.read_text())
    rows = data["utterances"]
    assert [r["id"] for r in rows] == [r["id"] for r in records], "manifest order"
    assert [LEFT_OUT in r["flags"] for r in rows] == [True, True, False, True]
    assert rows[2]["wer"] > 0 and rows[2]["audio"].startswith("data:audio/ogg")
    assert set(rows[2]["arrays"]) == {"attention", "ctc", "envelope", "spectrogram"}
    for row, record in zip(rows, records):
        if LEFT_OUT in row["flags"]:
            assert row["blob"] is None and row["arrays"] == {} and row["hyp"] == record["hyp"]
            assert (tmp_path / row["audio"]).resolve().samefile(record["audio"])
    assert "3 of 4 utterances without their pictures and maps (flagged 'maps left out'): the " \
        "page keeps them for the worst utterances, up to 1e-06 MB (`asr explore FOLDER " \
        "--max-mb 0`: for all)" in data["notes"]  # fmt: skip
    assert main(["explore", str(folder), "--max-mb", "-1", "--quiet"]) == 2
    assert "--max-mb is megabytes, 0 for no limit: got -1.0" in capsys.readouterr().err
    for max_mb in (0, None, 100):
        rows = page_data(explore(folder, progress=False, max_mb=max_mb).read_text())["utterances"]
        assert all(r["blob"] and LEFT_OUT not in r["flags"] for r in rows), max_mb


def test_a_page_compares_two_decodes_of_the_same_utterances(decoded, tmp_path, capsys):
    """B's hypotheses are scored utterance by utterance against B's references, as B's
    metrics.json is (a model that normalises text otherwise has other references); the page
    says how many have fewer and more errors in B and WER(B) - WER(A) with an interval holding
    it; utterances one decode lacks or references that differ are said; maps go first to the
    utterances either decode gets most wrong; only two decode folders compare."""
    other = tmp_path / "b" / "decode_test"
    shutil.copytree(decoded, other)
    records = [json.loads(line) for line in (other / "utterances.jsonl").read_text().splitlines()]
    second, third = records[1]["ref"].split(), records[2]["ref"].split()
    records[1]["hyp"] = " ".join(second[:-1])  # one deletion
    records[2]["hyp"] = " ".join(["WRONG", *third[1:]])  # one substitution
    records[0]["ref"] = records[0]["ref"].lower()  # B's model writes lower case, and got it
    records[0]["hyp"] = records[0]["ref"]
    lines = [json.dumps(r) for r in records[:-1]]  # B lacks the last utterance
    (other / "utterances.jsonl").write_text("\n".join(lines) + "\n")
    (other / "metrics.json").write_text(json.dumps({"wer": 12.5, "cer": 3.0}))
    out = tmp_path / "compare.html"
    command = ["explore", str(decoded), "--compare", str(other), "--out", str(out), "--quiet"]
    assert main(command) == 0
    data = page_data(out.read_text())
    rows = data["utterances"]
    errors = [r["compare"]["errors"] for r in rows[:3]]
    assert [(e["sub"], e["del"], e["ins"]) for e in errors] == [(0, 0, 0), (0, 1, 0), (1, 0, 0)]
    assert rows[2]["compare"]["hyp"] == records[2]["hyp"] and rows[-1]["compare"] is None
    assert [op[0] for op in rows[1]["compare"]["ops"]] == ["C"] * (len(second) - 1) + ["D"]
    compare = data["compare"]
    assert compare["title"] == "b/decode_test" and compare["summary"] == {"wer": 12.5, "cer": 3.0}
    assert (compare["fewer_errors"], compare["more_errors"], compare["same_errors"]) == (0, 2, 1)
    words = sum(len(r["ref"].split()) for r in rows[:3])
    assert compare["wer_difference"] == pytest.approx(100 * 2 / words, abs=0.01)
    low, high = compare["interval"]
    assert 0 <= low <= compare["wer_difference"] <= high
    assert f"1 of 4 utterances not in {other}" in data["notes"]
    assert f"1 utterances with another reference in {other}, scored by it" in data["notes"]
    assert compare["shared"] == 3  # what B - A is over: the page says so
    small = explore(decoded, tmp_path / "small.html", False, False, 1e-6, other)
    small = page_data(small.read_text())["utterances"]
    worst = max(range(3), key=lambda i: rows[i]["compare"]["wer"])  # A gets all right
    assert worst > 0 and [LEFT_OUT not in u["flags"] for u in small] == [
        i == worst for i in range(4)]  # fmt: skip
    alone = explore(decoded, tmp_path / "alone.html", progress=False)
    assert page_data(alone.read_text())["compare"] is None
    same = explore(decoded, tmp_path / "same.html", progress=False, compare=decoded)
    assert page_data(same.read_text())["compare"]["shared"] is None  # the same utterances
    capsys.readouterr()
    assert main(["explore", str(decoded), "--compare", str(tmp_path), "--quiet"]) == 2
    assert "must both be decode folders" in capsys.readouterr().err
    assert main(["explore", str(decoded), "--compare", str(tmp_path / "none"), "--quiet"]) == 2
    assert f"--compare {tmp_path / 'none'}: no such folder" in capsys.readouterr().err
    (other / "utterances.jsonl").unlink()  # metrics.json alone
    assert main(["explore", str(decoded), "--compare", str(other), "--quiet"]) == 2
    assert f"{other}: no utterances.jsonl" in capsys.readouterr().err


def test_shared_utterances_without_reference_words_give_no_wer_difference(monkeypatch):
    """B - A over references of no words is no rate (an inserted word is not +100 points)."""
    record = {"id": "empty", "hyp": "yes", "ref": ""}
    monkeypatch.setattr(build, "read_records", lambda folder: [record])
    monkeypatch.setattr(build, "_summary", lambda folder: None)
    utterance = {"id": "empty", "ref": ""} | build._scores("", "")
    compare, _ = build._compared([utterance], Path("a"), Path("b"))
    assert compare["wer_difference"] is None and compare["interval"] is None
    assert compare["more_errors"] == 1
    utterance = {"id": "empty", "ref": "no"} | build._scores("no", "no")
    compare, _ = build._compared([utterance], Path("a"), Path("b"))  # B's own reference: ""
    assert compare["wer_difference"] is None


def test_a_stretch_of_a_long_recording_is_linked_where_browsers_play_it(tmp_path):
    """Audio over MAX_EMBEDDED_SECONDS is linked, and so is a segment of a recording that long
    (a page of its segments would embed all of it); in a format no browser plays, a segment is
    embedded, a short stretch."""
    wav = next(WAV.rglob("*.wav"))
    aiff = tmp_path / "same.aiff"
    sf.write(aiff, *sf.read(wav))
    media = _Media(tmp_path, link=False, budget=_Budget(None))
    long = MAX_EMBEDDED_SECONDS + 1
    linked = media.add(str(wav), 0.5, 1.0, recording=long)
    assert (tmp_path / linked.src.split("#")[0]).resolve().samefile(wav)
    assert linked.src.endswith("#t=0.500") and linked.offset == 0.5
    for path, recording in ((wav, None), (wav, 1.0), (aiff, long)):
        audio = media.add(str(path), 0.5, 1.0, recording=recording)
        assert audio.src.startswith("data:audio/ogg;base64,") and audio.offset == 0, path


def test_a_spectrogram_is_kept_as_a_picture_within_a_few_levels(monkeypatch):
    """Spectrograms travel as lossy WebP: on average within two of their 255 levels, in well
    under the bytes deflate makes of them; a picture WebP cannot hold stays raw."""
    wave = sf.read(next(WAV.rglob("*.wav")), dtype="float32")[0]
    with monkeypatch.context() as raw:
        raw.setattr(build, "_picture", lambda image: image)
        levels, extra = _Media(Path("."), False, _Budget(None))._spectrogram(wave)
    picture, same = _Media(Path("."), False, _Budget(None))._spectrogram(wave)
    assert extra == same and isinstance(picture, build._Picture)
    assert picture.shape == levels.shape and levels.shape[0] == 80
    got = np.asarray(Image.open(io.BytesIO(picture.data)).convert("L"), dtype=np.int16)
    assert got.shape == levels.shape and np.abs(got - levels).mean() < 2
    assert len(picture.data) < 0.6 * len(zlib.compress(levels.tobytes(), 6))
    for shape in ((80, 0), (80, build.WEBP_MAX_SIDE + 1)):
        kept = np.zeros(shape, np.uint8)
        assert build._picture(kept) is kept


@pytest.mark.parametrize("rate", [8000, 16000, 44100])
def test_a_spectrogram_spans_its_audio_at_any_sample_rate(rate, monkeypatch):
    """The picture's columns times their seconds are the recording's duration (a 16 kHz hop
    at 8 kHz drew 20 ms columns as 10 ms: the picture covered half the time axis)."""
    monkeypatch.setattr(build, "_picture", lambda image: image)
    media = _Media(Path("."), False, _Budget(None))
    media.sample_rate = rate
    seconds = 3.0
    levels, extra = media._spectrogram(np.zeros(int(seconds * rate), np.float32) + 1e-3)
    assert levels.shape[1] * extra["seconds"] == pytest.approx(seconds, abs=0.03)


def test_no_text_can_leave_the_data_element():
    data = {
        "title": HOSTILE[0],
        "utterances": [
            {"id": HOSTILE[1], "ref": HOSTILE[0], "hyp": "\u05e9\u05dc\u05d5\u05dd {{SCRIPT}}"}
        ],
    }
    html = build_page(data)
    assert html.count("</script>") == html.count("<script"), "no element closed early"
    assert "<img" not in html and "{{SCRIPT}}" in html
    assert page_data(html)["utterances"] == data["utterances"]
    assert "<title>&lt;script&gt;" in html


def test_zero_utterances_transcripts_and_training_runs_build(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "utterances.jsonl").write_text("")
    (empty / "metrics.json").write_text("{}")
    assert page_data(explore(empty, progress=False).read_text())["utterances"] == []

    transcripts = tmp_path / "out"
    transcripts.mkdir()
    wav = next(WAV.rglob("*.wav"))
    words = [{"word": "مرحبا", "start": 0.1, "end": 0.4, "probability": 0.9, "confidence": 0.8}]
    (transcripts / "a.json").write_text(json.dumps(
        {"audio": str(wav), "text": "مرحبا", "duration": 1.0, "words": words,
         "segments": [{"start": 0, "end": 1.0, "text": "مرحبا"}]}))  # fmt: skip
    assert main(["explore", str(transcripts), "--quiet"]) == 0
    assert f"explorer: {transcripts / 'explorer.html'}" in capsys.readouterr().out
    row = page_data((transcripts / "explorer.html").read_text())["utterances"][0]
    assert row["hyp"] == "مرحبا" and row["words"][0]["conf"] == 0.8 and row["audio"]

    run = tmp_path / "run" / "logs" / "version_0"
    (run / "attention").mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "epoch,step,train/loss_epoch,val/loss,val/wer\n0,9,3.0,,\n0,9,,2.5,90\n1,19,2.0,,\n"
        "1,19,,1.5,40\n")  # fmt: skip
    for epoch in (0, 1):
        (run / "attention" / f"epoch{epoch:03d}_utt1.png").write_bytes(b"\x89PNG")
    training = page_data(explore(tmp_path / "run", progress=False).read_text())["training"]
    assert training["curves"] == {"epoch": [0, 1], "series": {
        "train/loss": [3.0, 2.0], "val/loss": [2.5, 1.5], "val/wer": [90.0, 40.0]}}  # fmt: skip
    assert [e["epoch"] for e in training["plots"][0]["epochs"]] == [0, 1]

    for speaker in ("alice", "bob"):  # as transcribe mirrors alice/001.wav and bob/001.wav
        (transcripts / speaker).mkdir()
        shutil.copy(transcripts / "a.json", transcripts / speaker / "001.json")
    rows = page_data(explore(transcripts, progress=False).read_text())["utterances"]
    assert [row["id"] for row in rows] == ["a", "alice/001", "bob/001"]
    # Transcripts of metrics.wav, and of explore.wav in a subfolder: not the files they name.
    shutil.copy(transcripts / "a.json", transcripts / "metrics.json")
    shutil.copy(transcripts / "a.json", transcripts / "alice" / "explore.json")
    rows = page_data(explore(transcripts, progress=False).read_text())["utterances"]
    assert [row["id"] for row in rows] == ["a", "alice/001", "alice/explore", "bob/001", "metrics"]

    assert main(["explore", str(tmp_path / "nothing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    for out in (empty / "utterances.jsonl", empty / "metrics.json", empty):
        assert main(["explore", str(empty), "--out", str(out), "--quiet"]) == 2
        assert f"--out {out} " in capsys.readouterr().err
    assert (empty / "utterances.jsonl").read_text() == ""
    for name, content in (("metrics.json", "{'wer': 1}"), ("attention.npz", "not a zip")):
        (empty / name).write_text(content)
        assert main(["explore", str(empty), "--quiet"]) == 2
        assert f"{empty / name}: not " in capsys.readouterr().err
        (empty / name).unlink()
    assert main(["explore", str(tmp_path / "run" / "logs" / "version_0" / "attention")]) == 2
    assert "not a decode folder" in capsys.readouterr().err


def test_a_transcript_without_segments_has_no_n_best(tmp_path):
    """Silence transcribes to no text and no segment: no one-line n-best of an empty text."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "silence.json").write_text(
        json.dumps({"audio": str(wav), "text": "", "duration": 1.0, "segments": []})
    )
    [row] = page_data(explore(tmp_path, progress=False).read_text())["utterances"]
    assert row["nbest"] == [] and row["flags"] == ["empty"]


def test_transcribe_explorer_needs_an_output_folder(capsys):
    for extra in ([], ["--streaming"]):
        assert main(["transcribe", "a.wav", "--checkpoint", "m.ckpt", "--explorer", *extra]) == 2
        assert "--explorer keeps its maps in --output-dir: give that too" in capsys.readouterr().err


def test_transcribe_explorer_keeps_the_attention_of_every_segment(
    tiny_checkpoint, tmp_path, capsys
):
    """`asr transcribe --explorer`: each decoded segment keeps its cross-attention `(K, L+1, T)`,
    CTC path, pieces and span beside the json (written whatever --format says); the page
    written at the end has a row per transcript in one segment and per segment of the others,
    each on its span's audio with the tokens its attention rows are for."""
    short = WAV / "an4_clstk/fash/an251-fash-b.wav"  # 1 s
    long = WAV / "an4_clstk/fash/an255-fash-b.wav"  # 2.6 s: two segments of at most 2.5 s
    out = tmp_path / "out"
    args = ["transcribe", str(short), str(long), "--model", str(tiny_checkpoint["checkpoint"]),
            "--output-dir", str(out), "--format", "txt", "--explorer",
            "--max-segment-seconds", "2.5", "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert f"explorer: {out / 'explorer.html'}" in capsys.readouterr().err
    layout = json.loads((out / "explore.json").read_text())
    transcript = json.loads((out / "an251-fash-b.json").read_text())
    [one] = read_maps(out / "an251-fash-b.json")
    attention, ctc = one["attention"], one["ctc"]
    maps_per_layer = layout["layers"] * layout["heads"]
    assert attention.dtype == np.uint8 and attention.shape[:2] == (
        maps_per_layer,
        len(transcript["tokens"]) + 1,
    )
    assert ctc.shape == (attention.shape[2],)  # one entry per encoder frame
    assert one["pieces"].tolist() == [t["piece"] for t in transcript["tokens"]]
    assert one["span"] == (0.0, pytest.approx(transcript["duration"], abs=0.01))

    cut = json.loads((out / "an255-fash-b.json").read_text())
    segments = read_maps(out / "an255-fash-b.json")
    assert len(cut["segments"]) == len(segments) == 2
    assert segments[0]["span"][0] == 0 and segments[0]["span"][1] <= segments[1]["span"][0] + 1
    for maps in segments:
        assert maps["attention"].shape[:2] == (maps_per_layer, len(maps["pieces"]) + 1)
        assert maps["times"].shape == (len(maps["pieces"]), 2)

    page = page_data((out / "explorer.html").read_text())
    rows = {u["id"]: u for u in page["utterances"]}
    assert list(rows) == ["an251-fash-b", "an255-fash-b#1", "an255-fash-b#2"]
    assert set(rows["an251-fash-b"]["arrays"]) >= {"attention", "ctc", "envelope"}
    assert rows["an251-fash-b"]["start"] is None  # the whole recording
    assert not any("without attention" in note for note in page["notes"])
    for k, maps in enumerate(segments):
        row = rows[f"an255-fash-b#{k + 1}"]
        start, end = maps["span"]
        assert row["duration"] == pytest.approx(end - start) and row["start"] == round(start, 3)
        assert row["hyp"] == cut["segments"][k]["text"]
        got = arrays(row)
        assert got["attention"].shape == maps["attention"].shape
        assert [t["piece"] for t in row["tokens"]] == maps["pieces"].tolist()
        assert all(0 <= w["start"] <= w["end"] <= row["duration"] + 0.01 for w in row["words"])
        mels, frames = got["spectrogram"].shape  # the span's audio, not the whole file's
        seconds = row["arrays"]["spectrogram"]["seconds"]
        assert frames * seconds == pytest.approx(end - start, abs=0.05)
    assert " ".join(rows[f"an255-fash-b#{k}"]["hyp"] for k in (1, 2)).strip() == cut["text"]

    linked = page_data(explore(out, tmp_path / "linked.html", True, False).read_text())
    second = {u["id"]: u for u in linked["utterances"]}["an255-fash-b#2"]
    assert second["audio"].endswith(f"#t={segments[1]['span'][0]:.3f}")
    assert second["audio_offset"] == pytest.approx(segments[1]["span"][0])
    transcript = out / "an255-fash-b.json"
    transcript.write_text(json.dumps(cut | {"duration": MAX_EMBEDDED_SECONDS + 1}))
    as_long = page_data(explore(out, tmp_path / "as_long.html", progress=False).read_text())
    assert {u["id"]: u for u in as_long["utterances"]}["an255-fash-b#2"]["audio"] == second["audio"]
    transcript.write_text(json.dumps(cut))
    small = page_data(
        explore(out, tmp_path / "small.html", progress=False, max_mb=1e-6).read_text()
    )
    assert [LEFT_OUT in u["flags"] for u in small["utterances"]] == [False, True, True]
    assert small["utterances"][2]["audio"] == second["audio"]  # linked where its span starts
    assert any(n.startswith("2 of 3 transcripts or segments without") for n in small["notes"])

    lines = tmp_path / "lines.jsonl"  # a manifest line: its json names the file and offset
    lines.write_text(json.dumps({"audio_filepath": str(long), "offset": 1.2, "duration": 1.4}))
    clipped = tmp_path / "clipped"
    model = ["--model", str(tiny_checkpoint["checkpoint"])]
    assert main(["transcribe", "--manifest", str(lines), *model, "--output-dir", str(clipped),
                 "--explorer", "--quiet"]) == 0  # fmt: skip
    written = json.loads((clipped / "an255-fash-b.json").read_text())
    assert (written["audio"], written["offset"]) == (str(long), 1.2)
    linked = page_data(explore(clipped, tmp_path / "clip.html", True, False).read_text())
    [row] = linked["utterances"]
    assert row["audio"].endswith("#t=1.200") and row["audio_offset"] == pytest.approx(1.2)
    assert row["start"] is None or row["start"] >= 1.2  # in the file

    (out / "an251-fash-b.explore.npz").write_bytes(b"not an archive")  # the row stays
    (out / "an255-fash-b.explore.npz").unlink()  # as without --explorer: rows, no attention
    page = page_data(explore(out, progress=False).read_text())
    assert [u["id"] for u in page["utterances"]] == list(rows)
    assert "an251-fash-b: its attention is not readable (an251-fash-b.explore.npz is not an " \
        ".npz archive)" in page["notes"]  # fmt: skip
    assert "3 of 3 transcripts or segments without attention: `asr transcribe --explorer` " \
        "keeps it" in page["notes"]  # fmt: skip
    second = {u["id"]: u for u in page["utterances"]}["an255-fash-b#2"]
    low, high = cut["segments"][1]["start"], cut["segments"][1]["end"]
    within = [t for t in cut["tokens"] if low <= (t["start"] + t["end"]) / 2 < high]
    assert [t["piece"] for t in second["tokens"]] == [t["piece"] for t in within]
    assert [t["start"] for t in second["tokens"]] == [round(t["start"] - low, 3) for t in within]
    np.savez(out / "an251-fash-b.explore.npz", attention=np.zeros((1, 2, 3), np.uint8))
    notes = page_data(explore(out, progress=False).read_text())["notes"]
    assert "an251-fash-b: its attention is not readable (an251-fash-b.explore.npz has no " \
        "segment spans: `asr transcribe --explorer` again)" in notes  # fmt: skip


def test_a_new_decode_into_a_folder_removes_the_earlier_page(tmp_path):
    from asr.explore.records import RecordWriter

    (tmp_path / "explorer.html").write_text("the page of an earlier decode")
    RecordWriter(tmp_path, {}).write()
    assert not (tmp_path / "explorer.html").exists()


@pytest.mark.parametrize("extra", [[], ["--streaming"], ["--workers", "2"]])
def test_an_input_whose_transcript_would_replace_the_layout_is_refused(
    tiny_checkpoint, tmp_path, capsys, extra
):
    audio = tmp_path / "explore.wav"
    shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", audio)
    out = tmp_path / "out"
    args = ["transcribe", str(audio), "--model", str(tiny_checkpoint["checkpoint"]),
            "--output-dir", str(out), "--explorer", "--quiet", *extra]  # fmt: skip
    assert main(args) == 2
    assert f"would write its transcript over {out / 'explore.json'}" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_maps_of_a_model_of_another_layout_are_not_joined(tiny_checkpoint, tmp_path, capsys):
    """A second model's --explorer run into a folder rewrote its layout, by which the page
    then read the first model's maps: their CTC paths ran past their audio."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", folder / "a.wav")
    out = tmp_path / "out"
    args = ["transcribe", "--model", str(tiny_checkpoint["checkpoint"]), "--output-dir",
            str(out), "--explorer", "--quiet"]  # fmt: skip
    assert main([*args, str(folder / "a.wav")]) == 0
    shutil.copy(folder / "a.wav", folder / "b.wav")
    assert main([*args, str(folder / "b.wav")]) == 0, "the same model's maps join"
    layout = json.loads((out / "explore.json").read_text())
    (out / "explore.json").write_text(json.dumps(layout | {"frame_seconds": 0.08}))
    shutil.copy(folder / "a.wav", folder / "c.wav")
    assert main([*args, str(folder / "c.wav")]) == 2
    said = capsys.readouterr().err
    assert f"{out} holds explorer maps of another model ({layout['checkpoint']}: " \
        f"frame_seconds 0.08, not {layout['frame_seconds']!r})" in said  # fmt: skip
    assert not (out / "c.json").exists()


def test_a_transcript_written_again_without_explorer_loses_its_earlier_maps(
    tiny_checkpoint, tmp_path
):
    """Maps of an earlier decode beside a new transcript gave its rows another decode's
    attention and token labels; the page of that decode showed the old transcripts."""
    audio = tmp_path / "in" / "a.wav"
    audio.parent.mkdir()
    shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", audio)
    out = tmp_path / "out"
    args = ["transcribe", str(audio.parent), "--model", str(tiny_checkpoint["checkpoint"]),
            "--output-dir", str(out), "--quiet"]  # fmt: skip
    assert main([*args, "--explorer"]) == 0
    assert (out / "a.explore.npz").is_file() and (out / "explorer.html").is_file()
    assert main(args) == 0
    assert not (out / "a.explore.npz").exists() and not (out / "explorer.html").exists()
    notes = page_data(explore(out, progress=False).read_text())["notes"]
    assert "1 of 1 transcripts or segments without attention: `asr transcribe --explorer` " \
        "keeps it" in notes  # fmt: skip


def test_a_page_built_before_goes_when_the_folder_gets_new_transcripts(tiny_checkpoint, tmp_path):
    """`asr explore` of a folder, then a new input transcribed into it without --explorer:
    the page showed the old rows alone, with no word of the new one."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", folder / "a.wav")
    out = tmp_path / "out"
    args = ["transcribe", str(folder), "--model", str(tiny_checkpoint["checkpoint"]),
            "--output-dir", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    explore(out, progress=False)
    shutil.copy(WAV / "an4_clstk/fash/an251-fash-b.wav", folder / "b.wav")
    assert main(args) == 0 and (out / "b.json").is_file()
    assert not (out / "explorer.html").exists()


def test_an_input_without_maps_still_gets_its_maps_file(tmp_path):
    """No file for an input whose segments kept no map (a 10 ms blip) made every re-run of
    `asr transcribe --explorer` transcribe it again."""
    write_maps(tmp_path / "blip", [((0.0, 0.01), {})])
    assert (tmp_path / "blip.explore.npz").is_file()
    assert read_maps(tmp_path / "blip.json") == [{"span": (0.0, 0.01)}]


def test_a_resumed_run_shows_the_epochs_of_every_version(tmp_path):
    """`asr fit --ckpt_path last` logs into a new logs/version_N: the page reads them all in
    order (as `asr curves`), a later version's value or plot of an epoch replacing an earlier."""
    logs = tmp_path / "run" / "logs"
    for version, epochs in ((0, (0, 1)), (1, (1, 2)), (10, (3,))):
        (logs / f"version_{version}" / "attention").mkdir(parents=True)
        rows = [f"{e},{10 * e + 9},{version}.{e}" for e in epochs]
        (logs / f"version_{version}" / "metrics.csv").write_text(
            "epoch,step,val/loss\n" + "\n".join(rows) + "\n"
        )
        for epoch in epochs:
            png = logs / f"version_{version}" / "attention" / f"epoch{epoch:03d}_utt1.png"
            png.write_bytes(f"v{version}".encode())
    training = page_data(explore(tmp_path / "run", progress=False).read_text())["training"]
    assert training["curves"] == {"epoch": [0, 1, 2, 3],
                                  "series": {"val/loss": [0.0, 1.1, 1.2, 10.3]}}  # fmt: skip
    [plots] = training["plots"]
    images = [base64.b64decode(e["image"].split(",")[1]) for e in plots["epochs"]]
    assert [e["epoch"] for e in plots["epochs"]] == [0, 1, 2, 3]
    assert images == [b"v0", b"v1", b"v1", b"v10"]
    alone = page_data(explore(logs / "version_0", progress=False).read_text())["training"]
    assert alone["curves"]["epoch"] == [0, 1], "a version folder: itself"


def test_curves_show_values_that_are_not_finite_as_gaps(tmp_path, capsys, caplog):
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,val/loss,val/wer\n0,10,nan,inf\n1,20,2.5,-inf\n2,30,1.5,40\n"
    )
    assert main(["explore", str(tmp_path), "--quiet"]) == 0
    curves = page_data((tmp_path / "explorer.html").read_text())["training"]["curves"]
    assert curves["series"] == {"val/loss": ["nan", 2.5, 1.5], "val/wer": ["inf", "-inf", 40.0]}
    with (tmp_path / "metrics.csv").open("a") as log:
        log.write("\n3,40,2.9118878841e,\n")  # a log cut off as it was written
    assert main(["explore", str(tmp_path), "--quiet"]) == 2
    said = capsys.readouterr().err
    assert f"{tmp_path / 'metrics.csv'}:6: a value that is not a number" in said
    (tmp_path / "metrics.csv").write_text("epoch,step,val/loss\n0,10,3.0\ninf,20,2.5\n")
    assert main(["explore", str(tmp_path), "--quiet"]) == 2  # no epoch: said, as above
    assert f"{tmp_path / 'metrics.csv'}:3: a value that is not a number" in capsys.readouterr().err
    (tmp_path / "metrics.csv").write_text("epoch,step,val/loss\n0,10,3.0\n1,20,1.2")  # 1.2345
    assert main(["explore", str(tmp_path), "--quiet"]) == 0  # killed as it wrote: as curves
    curves = page_data((tmp_path / "explorer.html").read_text())["training"]["curves"]
    assert curves == {"epoch": [0], "series": {"val/loss": [3.0]}}
    assert f"{tmp_path / 'metrics.csv'}:3: a line cut short, left out" in caplog.text


def test_linked_audio_a_browser_cannot_play_is_embedded(tmp_path):
    """--link-audio links what browsers play; NIST SPHERE or AIFF is embedded as Opus."""
    wav = next(WAV.rglob("*.wav"))
    aiff = tmp_path / "same.aiff"
    sf.write(aiff, *sf.read(wav))
    media = _Media(tmp_path, link=True, budget=_Budget(None))
    assert (tmp_path / media.add(str(wav), 0.0, None).src).resolve().samefile(wav)
    embedded = media.add(str(aiff), 0.0, None)
    assert embedded.src.startswith("data:audio/ogg;base64,") and embedded.note is None


def _transcript(wav: Path, text: str = "YES") -> str:
    return json.dumps({"audio": str(wav), "text": text, "duration": 1.0, "words": [],
                       "segments": [{"start": 0.0, "end": 1.0, "text": text}]})  # fmt: skip


def test_only_transcripts_make_a_transcription_folder(tmp_path, capsys):
    """Any other .json (a run's config, a tokenizer, a decode's metrics, a JSON list) is no
    transcript: a folder of them alone is refused, beside transcripts each is skipped, said."""
    parent = tmp_path / "exp"
    (parent / "run" / "decode_test").mkdir(parents=True)
    (parent / "run" / "config.json").write_text('{"vocab_size": 30}')
    (parent / "run" / "tokenizer.json").write_text('{"model": {"vocab": {"a": 1}}}')
    (parent / "run" / "decode_test" / "metrics.json").write_text('{"wer": 1.0}')
    (parent / "run" / "decode_test" / "explore.json").write_text('{"layers": 2}')
    assert main(["explore", str(parent), "--quiet"]) == 2
    assert f"{parent}: not a decode folder" in capsys.readouterr().err

    out = tmp_path / "out"
    out.mkdir()
    (out / "talk.json").write_text(_transcript(next(WAV.rglob("*.wav"))))
    (out / "speakers.json").write_text("[1, 2]")
    (out / "config.json").write_text('{"text": 3}')
    page = page_data(explore(out, progress=False).read_text())
    assert [u["id"] for u in page["utterances"]] == ["talk"]
    assert "speakers.json: skipped, not a transcript of `asr transcribe` (not a JSON object)" \
        in page["notes"]  # fmt: skip
    assert "config.json: skipped, not a transcript of `asr transcribe` (no text and segments)" \
        in page["notes"]  # fmt: skip


def test_a_transcript_whose_segments_have_no_times_is_skipped_and_said(tmp_path):
    """Of several segments, one with a NaN (read as absent) or missing bound, or one that is
    no object, stopped the build with a traceback where the rows' stretches of audio are cut.
    A transcript of one segment is a row of its own: its bounds are not read."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "good.json").write_text(_transcript(wav))
    fine = {"start": 0.0, "end": 1.0, "text": "YES"}
    bad = {"nan": [fine, {"start": math.nan, "end": 1.0}], "no-end": [{"start": 0.0}, fine],
           "none": [None], "one": [{"start": math.nan}]}  # fmt: skip
    for name, segments in bad.items():
        data = json.loads(_transcript(wav))
        data["segments"] = segments
        (tmp_path / f"{name}.json").write_text(json.dumps(data))  # NaN as JSON's NaN
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert [u["id"] for u in page["utterances"]] == ["good", "one"]
    said = "skipped, not a transcript of `asr transcribe`"
    for name in ("nan", "no-end"):
        k = 2 if name == "nan" else 1
        assert f"{name}.json: {said} (segment {k} has no start and end in seconds)" in page["notes"]
    assert f"none.json: {said} (segment 1 is no object)" in page["notes"]


def test_a_transcript_of_values_the_page_cannot_read_is_skipped_and_said(tmp_path):
    """A `<name>.json` edited or written by another tool, its duration a text or its words no
    list, stopped the build with a traceback: it is skipped, saying which value."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "good.json").write_text(_transcript(wav))
    bad = {"duration": {"duration": "1.0"}, "offset": {"offset": "x"}, "audio": {"audio": 5},
           "words": {"words": "x"},
           "tokens": {"tokens": [{"piece": "Y", "start": "x"}]},
           "alternatives": {"segments": [{"start": 0.0, "end": 1.0, "text": "YES",
                                          "alternatives": ["NO"]}]},
           "one-alternative": {"segments": [{"start": 0.0, "end": 1.0, "text": "YES",
                                             "alternatives": 5}]}}  # fmt: skip
    for name, values in bad.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(json.loads(_transcript(wav)) | values))
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert [u["id"] for u in page["utterances"]] == ["good"]
    said = "skipped, not a transcript of `asr transcribe`"
    for name, why in [
        ("duration", "duration: expected a number"),
        ("audio", "audio: expected a path"),
        ("words", "words: expected a list of objects"),
        ("tokens", "tokens 1: start: expected a number"),
        ("alternatives", "segment 1: its text and alternatives must be texts"),
        ("one-alternative", "segment 1: its text and alternatives must be texts"),
    ]:
        assert f"{name}.json: {said} ({why})" in page["notes"]


def test_a_folder_of_damaged_transcripts_alone_is_refused_naming_one(tmp_path, capsys):
    """With no readable transcript beside them, the refusal said only "not a decode folder":
    it names a damaged transcript and why, and leaves other JSON files unnamed."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "config.json").write_text('{"vocab_size": 30}')
    assert main(["explore", str(tmp_path), "--quiet"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("or a training run (metrics.csv)")
    for name, content in [
        ("talk.json", json.dumps(json.loads(_transcript(wav)) | {"duration": "1.0"})),
        ("cut.json", _transcript(wav)[:40]),
        ("text.json", '{"text": 3, "segments": []}'),
    ]:
        (tmp_path / name).write_text(content)
        assert main(["explore", str(tmp_path), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"; {tmp_path / name}: not " in err and "config.json" not in err
        (tmp_path / name).unlink()


def test_a_page_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """A full disk stopped the write halfway: the earlier page was lost, half of this one
    left, and the error named no file. A link as --out is replaced, not what it leads to."""
    (tmp_path / "talk.json").write_text(_transcript(next(WAV.rglob("*.wav"))))
    page = tmp_path / "explorer.html"
    page.write_text("the earlier page")

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", full)
        with pytest.raises(ValueError, match=rf"^{page}: cannot write the page \(No space left"):
            explore(tmp_path, progress=False)
    assert page.read_text() == "the earlier page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explorer.html", "talk.json"]
    kept = tmp_path / "kept.txt"
    kept.write_text("not a page")
    (tmp_path / "link.html").symlink_to(kept)
    explore(tmp_path, out=tmp_path / "link.html", progress=False)
    assert kept.read_text() == "not a page" and not (tmp_path / "link.html").is_symlink()


def test_a_transcript_named_like_the_layout_is_a_row(tmp_path):
    """explore.json is the transcript of an input explore.wav transcribed without --explorer
    (with it, such an input is refused)."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "explore.json").write_text(_transcript(wav, "EXPLORE"))
    (tmp_path / "talk.json").write_text(_transcript(wav))
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert {u["id"]: u["hyp"] for u in page["utterances"]} == {"explore": "EXPLORE", "talk": "YES"}


@pytest.mark.parametrize(
    "held",
    [
        [(0.8, 0.9), (0.9, 1.0), (1.0, 1.0), (1.0, 1.0), (1.1, 1.2), (1.2, 1.3)],  # N at its end
        [
            (0.8, 0.9),
            (0.9, 0.95),
            (0.95, 1.0),
            (1.0, 1.0),
            (1.0, 1.0),
            (1.1, 1.2),
        ],  # G at its start
    ],
)
def test_rows_without_maps_take_the_tokens_that_spell_their_text(held, tmp_path):
    """Touching segments' tokens held to their bounds: by time, a last token at a segment's
    end fell in the next row (or none), a first at the next one's start in the row before,
    and the space put between two segments' tokens stood at a row's edge."""

    def token(piece: str, start: float, end: float) -> dict:
        return {"id": 0, "piece": piece, "start": start, "end": end, "probability": None}

    segments = [{"start": 0.0, "end": 1.0, "text": "FIN"}, {"start": 1.0, "end": 2.0, "text": "GO"}]
    words = [{"word": "FIN", "start": 0.8, "end": 1.0}, {"word": "GO", "start": 1.0, "end": 1.0}]
    tokens = [token(p, *t) for p, t in zip(["F", "I", "N", "\u2581", "G", "O"], held)]
    record = {"audio": str(next(WAV.rglob("*.wav"))), "text": "FIN GO", "duration": 2.0,
              "words": words, "segments": segments, "tokens": tokens}  # fmt: skip
    (tmp_path / "talk.json").write_text(json.dumps(record))
    page = page_data(explore(tmp_path, progress=False).read_text())
    rows = {
        u["id"]: ("".join(t["piece"] for t in u["tokens"]), [w["w"] for w in u["words"]])
        for u in page["utterances"]
    }
    assert rows == {"talk#1": ("FIN", ["FIN"]), "talk#2": ("GO", ["GO"])}
    # a token of no word (an unknown character) goes by its time, not with the word before
    tokens.insert(4, token("<unk>", 1.05, 1.1))
    (tmp_path / "talk.json").write_text(json.dumps(record))
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert ["".join(t["piece"] for t in u["tokens"]) for u in page["utterances"]] == [
        "FIN",
        "<unk>GO",
    ]


def test_compare_needs_the_records_of_both_decodes(tmp_path, capsys):
    """A, like B, must have kept its records: a decode of metrics.json alone has no rows."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "metrics.json").write_text('{"wer": 10.0}')
    (b / "utterances.jsonl").write_text('{"id": "u1", "ref": "YES", "hyp": "YES"}\n')
    assert main(["explore", str(a), "--compare", str(b), "--quiet"]) == 2
    assert f"{a}: no utterances.jsonl" in capsys.readouterr().err
    assert not (a / "explorer.html").exists()


def test_an_empty_transcript_of_explorer_is_not_said_to_lack_it(tmp_path):
    """Audio too short to decode keeps no maps though --explorer kept its (empty) maps file:
    only transcripts without such a file are said to need `asr transcribe --explorer`."""
    wav = next(WAV.rglob("*.wav"))
    (tmp_path / "blip.json").write_text(_transcript(wav, ""))
    write_maps(tmp_path / "blip", [])
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert not any("without attention" in note for note in page["notes"]), page["notes"]
    (tmp_path / "talk.json").write_text(_transcript(wav))  # transcribed without --explorer
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert "1 of 2 transcripts or segments without attention: `asr transcribe --explorer` " \
        "keeps it" in page["notes"]  # fmt: skip


def test_linked_audio_leads_from_the_page_folder_as_given_through_a_symlink(tmp_path, monkeypatch):
    """A decode folder reached through a symlink (exp -> another disk): its links, with
    --link-audio and past --max-mb, lead from the page opened by the path given, not from
    the symlink's target."""
    recipe = tmp_path / "recipe"
    (recipe / "data").mkdir(parents=True)
    (tmp_path / "disk2" / "dec").mkdir(parents=True)
    (recipe / "exp").symlink_to(tmp_path / "disk2")
    shutil.copy(next(WAV.rglob("*.wav")), recipe / "data" / "x.wav")
    monkeypatch.chdir(recipe)
    page_dir = Path("exp/dec")
    linked = _Media(page_dir, link=True, budget=_Budget(None)).add("data/x.wav", 0.0, None)
    left_out = _Media(page_dir, link=False, budget=_Budget(None)).link_only("data/x.wav", 0.5)
    assert linked.src == "../../data/x.wav" and left_out.src == "../../data/x.wav#t=0.500"


def test_linked_audio_whose_name_is_not_utf8_leads_to_its_bytes(tmp_path):
    """A Latin-1 file name (kept by Python as surrogates) stopped the page with a UnicodeError
    naming no file, with --link-audio and for every row past --max-mb."""
    name = os.fsdecode(b"caf\xe9.wav")
    shutil.copy(next(WAV.rglob("*.wav")), tmp_path / name)
    media = _Media(tmp_path, link=True, budget=_Budget(None))
    assert media.add(str(tmp_path / name), 0.0, None).src == "caf%E9.wav"
    left_out = _Media(tmp_path, link=False, budget=_Budget(None)).link_only(
        str(tmp_path / name), 0.5
    )
    assert left_out.src == "caf%E9.wav#t=0.500"


def test_a_training_page_keeps_evenly_spread_epochs_plots_within_its_size_limit(tmp_path):
    """Past --max-mb a run's page keeps the attention plots of as many epochs as fit, spread
    evenly from the first to the last, and says how many it left out and how to keep them."""
    run = tmp_path / "run"
    (run / "attention").mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,val/loss\n" + "".join(
        f"{e},{e},1.0\n" for e in range(10)))  # fmt: skip
    for epoch in range(10):  # a data URI of 4022 characters each
        (run / "attention" / f"epoch{epoch:03d}_utt1.png").write_bytes(bytes(3000))
    data = page_data(explore(run, progress=False, max_mb=0.0165).read_text())
    [plots] = data["training"]["plots"]
    assert [e["epoch"] for e in plots["epochs"]] == [0, 3, 6, 9]
    assert sum(len(e["image"]) for e in plots["epochs"]) <= 16500
    assert "6 of 10 epochs' attention plots left out: the page keeps those of 4 epochs spread " \
        "evenly from the first to the last, up to 0.0165 MB (`asr explore FOLDER --max-mb 1`, " \
        "or 0: for all)" in data["notes"]  # fmt: skip
    tiny = page_data(explore(run, progress=False, max_mb=1e-6).read_text())["training"]
    assert [e["epoch"] for e in tiny["plots"][0]["epochs"]] == [0, 9], "the first and last"
    for max_mb in (0, 1):
        data = page_data(explore(run, progress=False, max_mb=max_mb).read_text())
        assert len(data["training"]["plots"][0]["epochs"]) == 10 and data["notes"] == []


def test_a_metric_logged_every_other_epoch_has_no_gaps_between(tmp_path):
    """Validation every n epochs (`check_val_every_n_epoch`) leaves the epochs between without
    a value: null, which the page's line passes over; a value that is not finite is a gap."""
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/loss_epoch,val/acc,val/loss\n0,9,3.0,,\n1,19,2.0,,\n1,19,,0.2,nan\n"
        "2,29,1.5,,\n3,39,1.0,,\n3,39,,0.4,-inf\n"
    )
    curves = page_data(explore(tmp_path, progress=False).read_text())["training"]["curves"]
    assert curves == {"epoch": [0, 1, 2, 3], "series": {
        "train/loss": [3.0, 2.0, 1.5, 1.0], "val/acc": [None, 0.2, None, 0.4],
        "val/loss": [None, "nan", None, "-inf"]}}  # fmt: skip


def test_numbers_that_are_not_finite_in_a_decode_are_shown_as_absent(tmp_path):
    """NaN or infinity in metrics.json or utterances.jsonl (JSON that Python writes) is no
    number the page can hold: it reads as absent."""
    (tmp_path / "metrics.json").write_text('{"wer": 1e999, "cer": NaN, "utterances": 1}')
    (tmp_path / "utterances.jsonl").write_text(
        '{"id": "u1", "ref": "YES", "hyp": "YES", "duration": -2e400, "words": [{"word": '
        '"YES", "start": 0.1, "end": NaN, "confidence": -Infinity}], "offset": 1'
        + "0" * 5000
        + "}\n"
    )
    data = page_data(explore(tmp_path, progress=False).read_text())
    assert data["summary"] == {"wer": None, "cer": None, "utterances": 1}
    [row] = data["utterances"]
    assert row["duration"] is None and row["words"] == [
        {"w": "YES", "start": 0.1, "end": None, "conf": None}]  # fmt: skip
    (tmp_path / "explore.json").write_text('{"sample_rate": 1e999}')
    with pytest.raises(ValueError, match=r"explore.json: sample_rate None is not a sample rate"):
        explore(tmp_path, progress=False)


def test_decodes_with_references_of_other_lengths_differ_by_their_own_wers(tmp_path):
    """B's model writes numbers as digits: each WER is over its own references' words."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, first in ((a, ("TWENTY ONE FORTY TWO", "TWENTY ONE FORTY TOO")),
                          (b, ("2142", "2142"))):  # fmt: skip
        folder.mkdir()
        lines = [{"id": "u1", "ref": first[0], "hyp": first[1]},
                 {"id": "u2", "ref": "GO ON", "hyp": "GO ON"}]  # fmt: skip
        (folder / "utterances.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = page_data(explore(a, progress=False, compare=b).read_text())
    compare = data["compare"]
    assert compare["wer_difference"] == pytest.approx(-100 / 6, abs=0.01)  # 0 % - 1 of 6 words
    assert compare["interval"][0] <= compare["wer_difference"] <= compare["interval"][1] <= 0
    assert compare["shared"] is None, "both hold every utterance"
    assert f"1 utterances with another reference in {b}, scored by it" in data["notes"]


def test_a_folder_whose_name_is_not_utf8_gets_its_page(tmp_path):
    folder = tmp_path / os.fsdecode(b"decode_caf\xe9")
    folder.mkdir()
    (folder / "utterances.jsonl").write_text('{"id": "u1", "ref": "YES", "hyp": "YES"}\n')
    data = page_data(explore(folder, progress=False).read_text())
    assert data["title"].endswith(folder.name) and data["utterances"][0]["wer"] == 0


def test_words_said_against_an_empty_reference_have_no_wer_and_get_maps_first(tmp_path):
    """No reference words: no rate (as `asr evaluate`'s buckets), not 100 % per word said."""
    (tmp_path / "utterances.jsonl").write_text(
        '{"id": "said", "ref": "", "hyp": "YES NO YES"}\n'
        '{"id": "silent", "ref": "", "hyp": ""}\n{"id": "half", "ref": "GO ON", "hyp": "GO"}\n'
    )
    page = explore(tmp_path, progress=False)
    rows = {u["id"]: u for u in page_data(page.read_text())["utterances"]}
    assert rows["said"]["wer"] is None and rows["said"]["errors"] == {"sub": 0, "del": 0, "ins": 3}
    assert rows["silent"]["wer"] == 0 and rows["half"]["wer"] == 50
    assert build._worst_wer(rows["said"]) > build._worst_wer(rows["half"]) > 0


def test_a_file_or_an_out_that_cannot_be_written_is_refused_before_the_page_is_built(
    tmp_path, capsys, monkeypatch
):
    """A file given as the folder is said to be a file; an --out whose folder cannot be made
    or written in is refused, naming it and why, before any work."""
    manifest = tmp_path / "test.jsonl"
    manifest.write_text("")
    assert main(["explore", str(manifest), "--quiet"]) == 2
    assert f"{manifest} is a file, not a folder: give a decode folder" in capsys.readouterr().err
    folder = tmp_path / "decode"
    folder.mkdir()
    (folder / "utterances.jsonl").write_text("")
    monkeypatch.setattr(build, "decode_data", lambda *_: pytest.fail("built the page"))
    out = manifest / "page.html"
    assert main(["explore", str(folder), "--out", str(out), "--quiet"]) == 2
    assert f"--out {out}: {manifest} is a file, not a folder" in capsys.readouterr().err
    if Path("/sys/kernel").is_dir():  # sysfs: no one can make a file there, root neither
        assert main(["explore", str(folder), "--out", "/sys/x.html", "--quiet"]) == 2
        assert "--out /sys/x.html: cannot write in /sys (" in capsys.readouterr().err
    # a page already there is written over in place: its folder need take no new file
    monkeypatch.undo()
    monkeypatch.setattr(build, "decode_data", lambda *_: pytest.fail("built the page"))
    monkeypatch.setattr(build.tempfile, "NamedTemporaryFile", lambda **_: open("/sys/x", "w"))
    assert main(["explore", str(folder), "--quiet"]) == 2  # the folder's own page: not --out
    said = capsys.readouterr().err
    assert f"error: {folder / 'explorer.html'}: cannot write in {folder} (" in said
    assert said.rstrip().endswith(": give --out elsewhere"), said
    monkeypatch.undo()
    (folder / "explorer.html").write_text("an earlier page")
    monkeypatch.setattr(build.tempfile, "NamedTemporaryFile", lambda **_: open("/sys/x", "w"))
    assert main(["explore", str(folder), "--quiet"]) == 0
    assert (folder / "explorer.html").read_text() != "an earlier page"


def test_a_transcript_of_standard_input_is_said_to_have_no_audio_kept(tmp_path):
    """`asr transcribe -` keeps no audio ("audio": "-"): the page says so, not that a file
    named - is missing."""
    (tmp_path / "stdin.json").write_text(_transcript(Path("-")))
    data = page_data(explore(tmp_path, progress=False).read_text())
    [row] = data["utterances"]
    assert row["audio"] is None and row["audio_note"] == "audio from standard input: not kept"
    assert not any("missing" in note for note in data["notes"]), data["notes"]
    assert "1 of 1 transcripts or segments transcribed from standard input (`-`): its audio " \
        "was not kept" in data["notes"]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("[1, 2, 3]", "not a JSON object"),
        ('"hello"', "not a JSON object"),
        ('{"id": "u", "tokens": [{"start": 0.1}]}', "tokens: expected a list of objects with "
         "a 'piece'"),
        ('{"id": "u", "words": ["YES"]}', "words: expected a list of objects"),
        ('{"id": "u", "ctc": {"starts": [1, 2], "ends": [3], "frames": 9}}', "ctc: expected "
         "'starts' and 'ends' of one length, frame numbers within a number of 'frames'"),
        # each went on to a traceback (or a 182 TiB array) as the page's frames were made
        ('{"id": "u", "ctc": {"starts": [1.5], "ends": [3], "frames": 20}}', "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": [null], "ends": [3], "frames": 20}}', "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": ["a"], "ends": [3], "frames": 20}}', "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": [0], "ends": [1], "frames": true}}', "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": [0], "ends": [3], "frames": -5}}', "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": [0], "ends": [3], "frames": 100000000000000}}',
         "ctc: expected"),
        ('{"id": "u", "ctc": {"starts": [0], "ends": [30], "frames": 20}}', "ctc: expected"),
        ('{"id": "u", "ref": "A", "hyp": null}', "hyp: expected a text"),
        ("{not json}", "not JSON"),
        (json.dumps({"id": "u", "audio": str(WAV_FILE), "duration": "4.1"}), "duration: "
         "expected a number"),
        (json.dumps({"id": "u", "audio": str(WAV_FILE), "offset": "0"}), "offset: expected a "
         "number"),
        ('{"id": "u", "audio": 5}', "audio: expected a path"),
        ('{"id": "u", "ref": 5, "hyp": "YES"}', "ref: expected a text"),
        ('{"id": "u", "ref": "YES", "hyp": 5}', "hyp: expected a text"),
        ('{"id": "u", "hyp": "A", "words": [{"word": "A", "confidence": "x"}]}', "words 1: "
         "confidence: expected a number"),
    ],
)  # fmt: skip
def test_a_record_the_page_cannot_read_is_named_with_its_line(tmp_path, line, said):
    (tmp_path / "utterances.jsonl").write_text('{"id": "fine", "hyp": "YES"}\n' + line + "\n")
    with pytest.raises(ValueError) as refused:
        explore(tmp_path, progress=False)
    assert str(refused.value).startswith(f"{tmp_path / 'utterances.jsonl'}:2: {said}")


def test_records_and_curves_not_utf8_are_named_by_file_and_line(tmp_path):
    """Said as a codec's error alone, naming no file of the decode's, B's or the run's."""
    records = tmp_path / "decode" / "utterances.jsonl"
    records.parent.mkdir()
    records.write_bytes(b'{"id": "u1", "hyp": "A"}\n{"id": "u2", "ref": "caf\xe9", "hyp": "A"}\n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(records))}:2: not valid UTF-8 "
                       r"\(byte 0xe9 at column 25\)"):  # fmt: skip
        explore(tmp_path / "decode", progress=False)
    metrics = tmp_path / "run" / "logs" / "version_0" / "metrics.csv"
    metrics.parent.mkdir(parents=True)
    metrics.write_bytes(b"epoch,step,val/loss\n0,10,1.5\n1,20,1.2\xff\n")
    with pytest.raises(ValueError, match=f"^{re.escape(str(metrics))}:3: not valid UTF-8"):
        explore(tmp_path / "run", progress=False)


def test_a_segment_between_two_maps_over_it_alike_gets_the_one_that_fits_it():
    """Windows overlap: a segment inside the end of both, as much of each, takes the short map
    of its own window, not the first map's tokens and audio again."""
    segments = [
        {"start": 13.6, "end": 15.4, "text": "E W L O D"},
        {"start": 15.49, "end": 15.98, "text": ""},
    ]
    maps = [
        {"span": (13.5, 15.98), "pieces": list("EWLOD"), "times": [(14, 14.1)] * 5},
        {"span": (15.0, 15.98), "pieces": ["\u2581"], "times": [(15.5, 15.6)]},
    ]
    rows = build._transcript_rows("long", {"segments": segments, "duration": 16.0}, maps)
    assert [(row.offset, len(row.tokens)) for row in rows] == [(13.5, 5), (15.0, 1)]


@pytest.mark.parametrize("offset", [0.2, 0.0])
def test_a_stretch_of_a_long_recording_in_a_decode_is_linked(tmp_path, monkeypatch, offset):
    """A manifest line on part of a recording over MAX_EMBEDDED_SECONDS (its first stretch
    too): its row's audio is linked, as a transcription folder's segments are, not embedded."""
    wav = next(WAV.rglob("*.wav"))
    seconds = sf.info(wav).duration
    monkeypatch.setattr(build, "MAX_EMBEDDED_SECONDS", seconds - 0.5)
    record = {"id": "part", "hyp": "", "audio": str(wav), "offset": offset, "duration": 0.5}
    (tmp_path / "utterances.jsonl").write_text(json.dumps(record) + "\n")
    [row] = page_data(explore(tmp_path, progress=False).read_text())["utterances"]
    assert row["audio"].split("#")[0].endswith(".wav") and row["audio_offset"] == offset


def test_manifest_lines_evaluate_could_not_score_are_noted(tmp_path):
    failures = [f"clip{i}.wav (c{i}): too short" for i in range(4)]
    (tmp_path / "metrics.json").write_text(json.dumps({"wer": 0.0, "failures": failures}))
    (tmp_path / "utterances.jsonl").write_text('{"id": "fine", "ref": "YES", "hyp": "YES"}\n')
    notes = page_data(explore(tmp_path, progress=False).read_text())["notes"]
    shown = "; ".join(failures[:3])
    assert f"4 manifest line(s) not scored (metrics.json): {shown}; ..." in notes


def _damage(path: Path) -> None:
    """Flip 100 bytes in the middle of `path`: an archive's deflated data, its zip directory
    intact."""
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 100] = bytes(b ^ 0xFF for b in raw[middle : middle + 100])
    path.write_bytes(raw)


def _cut(path: Path) -> None:
    """Cut 100 bytes out of the middle of `path`: its zip directory's offsets lead before the
    file's start."""
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2] + raw[len(raw) // 2 + 100 :])


def _empty(path: Path) -> None:
    path.write_bytes(b"")  # as a full disk leaves it


def _maps(path: Path, **arrays: np.ndarray) -> None:
    """An .npz of `arrays` and a map of noise, deflated, that `_damage` can hit."""
    noise = (np.random.default_rng(0).random((2, 5, 400)) * 9).astype(np.uint8)
    np.savez_compressed(path, **arrays, attention_0=noise)


@pytest.mark.parametrize("damage", [_damage, _cut, _empty])
def test_a_damaged_maps_file_leaves_its_transcript_without_maps_and_said(tmp_path, damage):
    """One transcript's damaged maps: a note, its rows without maps, the page built."""
    (tmp_path / "talk.json").write_text(_transcript(WAV_FILE))
    (tmp_path / "other.json").write_text(_transcript(WAV_FILE))
    _maps(tmp_path / "talk.explore.npz", spans=np.array([[0.0, 1.0]]))
    damage(tmp_path / "talk.explore.npz")
    page = page_data(explore(tmp_path, progress=False).read_text())
    assert [u["id"] for u in page["utterances"]] == ["other", "talk"]
    assert "attention" not in page["utterances"][1]["arrays"]
    assert "talk: its attention is not readable (talk.explore.npz is not an .npz archive)" in \
        page["notes"]  # fmt: skip


@pytest.mark.parametrize("damage", [_damage, _cut, _empty])
def test_a_damaged_attention_archive_of_a_decode_is_refused_by_name(tmp_path, capsys, damage):
    """As an archive that is no zip: the error names it, not a traceback from zlib."""
    (tmp_path / "utterances.jsonl").write_text('{"id": "u", "hyp": "YES", "attention": "0"}\n')
    _maps(tmp_path / "attention.npz")
    damage(tmp_path / "attention.npz")
    assert main(["explore", str(tmp_path), "--quiet"]) == 2
    assert f"error: {tmp_path / 'attention.npz'}: not an .npz archive" in capsys.readouterr().err


def test_a_file_given_to_compare_is_said_to_be_a_file(tmp_path, capsys):
    (tmp_path / "utterances.jsonl").write_text('{"id": "u", "hyp": "YES"}\n')
    other = tmp_path / "metrics.json"
    other.write_text('{"wer": 0.0}')
    assert main(["explore", str(tmp_path), "--compare", str(other), "--quiet"]) == 2
    said = capsys.readouterr().err
    assert f"--compare {other} is a file, not a folder: give a decode folder of " in said, said


def test_a_stretch_past_the_end_of_its_file_is_not_said_to_be_a_missing_file(tmp_path):
    """A record on a stretch that starts past its file's end (a recording replaced by a shorter
    one): the page's note names the stretch and why, apart from files missing."""
    seconds = sf.info(WAV_FILE).duration
    records = [{"id": "late", "hyp": "", "audio": str(WAV_FILE), "offset": 100.0},
               {"id": "gone", "hyp": "", "audio": str(tmp_path / "gone.wav")}]  # fmt: skip
    (tmp_path / "utterances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = page_data(explore(tmp_path, progress=False).read_text())
    late = f"{WAV_FILE} (offset 100.000 s is at or beyond the end ({seconds:.3f} s))"
    assert page["notes"][1:] == [  # after "no attention saved"
        f"1 audio file(s) missing or unreadable: {tmp_path / 'gone.wav'}",
        f"1 audio stretch(es) could not be read: {late}",
    ]
    assert page["utterances"][0]["audio_note"] == f"audio stretch not readable: {late}"
