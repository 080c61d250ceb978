"""`asr evaluate`: scores equal jiwer's on the files it writes, the reports, the plots.

On the AN4 fixture (tests/fixtures/an4): no corpus needed.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile
import torch
from test_transcribe import JOINT, UTTERANCES, WAV, _overfit_recognizer, fit_tiny_checkpoint

from asr.audio import audio_info
from asr.checkpoint import submodule_weights, weights_digest
from asr.cli import main
from asr.data.manifest import Utterance, write_manifest
from asr.evaluate import ScoredUtterance, error_report, evaluate
from asr.frontends import LevelNormalizer
from asr.package import results_row
from asr.streaming import mask_chunks

TEST_UTTERANCES = {  # the fixture's AN4 test utterances, written as a user might
    "an4test_clstk/fcaw/an406-fcaw-b": "Rubout G M E F three nine.",
    "an4test_clstk/fcaw/an407-fcaw-b": "erase C Q Q F seven",
}


def _manifest(path: Path, utterances: dict[str, str]) -> Path:
    files = {WAV / f"{p}.wav": text for p, text in utterances.items()}
    write_manifest(path, [Utterance(str(f), audio_info(f).duration, text, f.stem)
                          for f, text in files.items()])  # fmt: skip
    return path


def _read_kaldi(path: Path) -> tuple[list[str], list[str]]:
    rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
    return [r[0] for r in rows], [r[1] if len(r) > 1 else "" for r in rows]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return fit_tiny_checkpoint(tmp_path_factory.getbasetemp() / "tiny_fit")


def test_cli_chunk_ms_decodes_under_the_chunk_mask(checkpoint, tmp_path, monkeypatch):
    import asr.evaluate

    seen = []

    def spy(recognizer, *args, **kwargs):
        seen.append(recognizer.model.encoder.chunk)
        return evaluate(recognizer, *args, **kwargs)

    monkeypatch.setattr(asr.evaluate, "evaluate", spy)
    manifest = _manifest(tmp_path / "test.jsonl", UTTERANCES)
    out = tmp_path / "eval"
    code = main([
        "evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest), "--out",
        str(out), "--beam-size", "2", "--plots", "0", "--quiet", "--no-explorer",
        "--chunk-ms", "160",
    ])  # fmt: skip
    assert code == 0 and len(seen) == 1 and seen[0] >= 1
    assert json.loads((out / "metrics.json").read_text())["chunk_ms"] == 160.0
    code = main(["evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
                 "--out", str(out), "--plots", "0", "--quiet", "--no-explorer",
                 "--chunk-ms", "0"])  # fmt: skip
    assert code == 0 and seen[-1] is None, "0: full context, as the live commands take it"
    assert json.loads((out / "metrics.json").read_text())["chunk_ms"] is None


def test_chunk_masks_refuse_a_model_that_cannot_stream():
    """Its level normaliser needs the whole recording: no live decode gives such a WER."""
    recognizer = copy.deepcopy(_overfit_recognizer(str(WAV))[0])
    recognizer.model.frontend.level = LevelNormalizer()
    with pytest.raises(ValueError, match="normalises each utterance's level") as refused:
        mask_chunks(recognizer, 160)
    assert "score it at full context (--chunk-ms 0)" in str(refused.value)  # which works
    mask_chunks(recognizer, 0)  # full context, as `asr evaluate --chunk-ms 0` asks
    for bad in (-1, float("nan"), float("inf")):  # named, before anything about the model
        with pytest.raises(ValueError, match=f"chunk_ms must be positive .*, got {bad}"):
            mask_chunks(recognizer, bad)


def test_cli_scores_equal_jiwer_on_the_written_files(checkpoint, tmp_path, capsys):
    manifest = _manifest(tmp_path / "test.jsonl", {**UTTERANCES, **TEST_UTTERANCES})
    out = tmp_path / "eval"
    code = main([
        "evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
        "--out", str(out), "--beam-size", "2", "--plots", "2", "--quiet", "--precision", "bf16",
    ])  # fmt: skip
    assert code == 0
    assert "WER" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    ids, hyps = _read_kaldi(out / "hyp.txt")
    ref_ids, refs = _read_kaldi(out / "ref.txt")
    assert ids == ref_ids == [Path(p).name for p in {**UTTERANCES, **TEST_UTTERANCES}]
    assert refs[-2:] == ["RUBOUT G M E F THREE NINE", "ERASE C Q Q F SEVEN"], "normalised"
    assert metrics["wer"] == 100 * jiwer.wer(refs, hyps)
    assert metrics["cer"] == 100 * jiwer.cer(refs, hyps)
    words = jiwer.process_words(refs, hyps)
    assert (metrics["substitutions"], metrics["deletions"], metrics["insertions"]) == (
        words.substitutions, words.deletions, words.insertions,
    )  # fmt: skip
    assert metrics["reference_words"] == sum(len(r.split()) for r in refs)
    seconds = sum(audio_info(u).duration for u in _wavs({**UTTERANCES, **TEST_UTTERANCES}))
    assert metrics["utterances"] == 6
    assert metrics["audio_hours"] == pytest.approx(seconds / 3600)
    assert metrics["real_time_factor"] == pytest.approx(metrics["decode_seconds"] / seconds)
    assert metrics["search"]["beam_size"] == 2 and metrics["search"]["ctc_weight"] == 0.3
    assert metrics["checkpoint"] == str(checkpoint) and metrics["precision"] == "bf16"
    assert metrics["backend"] == "torch"
    state = torch.load(checkpoint, weights_only=True)
    assert metrics["weights"] == weights_digest(submodule_weights(state, "model."))
    plots = sorted(p.name for p in (out / "alignments").iterdir())
    assert plots == ["an251-fash-b.png", "an251-fash-b_heads.png",
                     "an253-fash-b.png", "an253-fash-b_heads.png"]  # fmt: skip
    report = (out / "errors.txt").read_text()
    for utt_id in ids:
        assert f"\n{utt_id}  C=" in report
    assert report.count("\nREF: ") == report.count("\nHYP: ") == 6
    confidence = metrics["confidence"]  # every hypothesis word has a confidence
    assert confidence["words"] == sum(len(h.split()) for h in hyps)
    assert sum(b["words"] for b in confidence["bins"]) == confidence["words"]
    right = sum(b["accuracy"] * b["words"] for b in confidence["bins"] if b["words"])
    assert right == pytest.approx(words.hits)  # a word is right where aligned to an equal one
    assert (out / "reliability.png").stat().st_size > 0


def test_a_manifest_without_reference_words_is_not_scored(checkpoint, tmp_path, capsys):
    """Insertions over no reference words showed as WER 0.00 %."""
    manifest = _manifest(tmp_path / "m.jsonl", dict.fromkeys(UTTERANCES, "..."))
    argv = ["evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
            "--out", str(tmp_path / "eval"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    assert "no reference has words to score against" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists(), "refused before decoding"
    (tmp_path / "file").write_text("")  # an --out that is a file: said so, not "File exists"
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    assert main([*argv[:-2], str(tmp_path / "file"), "--quiet"]) == 2
    said = f"asr evaluate: error: --out {tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a"
    assert said in capsys.readouterr().err
    with pytest.raises(ValueError, match="decode_x: no reference words scored"):
        results_row(
            "decode_x",
            {
                "utterances": 2,
                "reference_words": 0,
                "substitutions": 0,
                "deletions": 0,
                "insertions": 3,
                "sentence_errors": 2,
            },
            "word",
        )


def test_a_manifest_among_the_reports_is_refused_not_overwritten(checkpoint, tmp_path, capsys):
    """A manifest kept as OUT/utterances.jsonl was replaced by the explorer's records, exit 0."""
    (tmp_path / "own").mkdir()
    manifest = _manifest(tmp_path / "own" / "utterances.jsonl", UTTERANCES)
    kept = manifest.read_bytes()
    argv = ["evaluate", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
            "--out", str(tmp_path / "own"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    said = f"--manifest {manifest} is {manifest}, which the reports replace: give another --out"
    assert said in capsys.readouterr().err
    assert manifest.read_bytes() == kept


def test_a_length_bucket_without_reference_words_has_no_wer():
    """Inserted words over no reference words made a WER of Infinity, which strict JSON
    readers refuse; an empty bucket read as 0 %."""
    from asr.evaluate import ScoredUtterance, _length_report

    report = _length_report([ScoredUtterance("a", "YES", "YES NO", [], 3.0),
                             ScoredUtterance("b", "", "NO", [], 9.0)])  # fmt: skip
    assert [(b["utterances"], b["wer"]) for b in report] == [(1, 100.0), (1, None), (0, None)]
    assert [b["deletion_rate"] for b in report] == [0.0, None, None]
    json.dumps(report, allow_nan=False)


def _wavs(utterances: dict[str, str]) -> list[Path]:
    return [WAV / f"{p}.wav" for p in utterances]


def test_recognised_utterances_give_zero_error_and_boundary_differences(tmp_path):
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "train.jsonl", UTTERANCES)
    chosen = "an255-fash-b"
    metrics = evaluate(
        recognizer, manifest, tmp_path / "eval", options=JOINT, batch_size=3, plot_ids=[chosen],
        progress=False,
    )  # fmt: skip
    assert metrics["wer"] == metrics["cer"] == 0.0
    assert metrics["boundary_error_utterances"] == 4, "every exact hypothesis is compared"
    assert 0 < metrics["boundary_error_ms"] < 1000
    assert sorted(p.name for p in (tmp_path / "eval" / "alignments").iterdir()) == [
        f"{chosen}.png",
        f"{chosen}_heads.png",
    ]
    other = "an253-fash-b"  # decoding into the same folder again: only this run's plots
    evaluate(recognizer, manifest, tmp_path / "eval", plot_ids=[other], progress=False)
    assert sorted(p.name for p in (tmp_path / "eval" / "alignments").iterdir()) == [
        f"{other}.png",
        f"{other}_heads.png",
    ]
    assert "C=6 S=0 D=0 I=0" in (tmp_path / "eval" / "errors.txt").read_text()
    kept = ["explore.json", "utterances.jsonl"]  # with attention.npz: as `asr explore` reads
    assert set(kept) <= {p.name for p in (tmp_path / "eval").iterdir()}
    evaluate(recognizer, manifest, tmp_path / "eval", plots=0, progress=False, records=False)
    assert not {*kept, "attention.npz"} & {p.name for p in (tmp_path / "eval").iterdir()}
    with pytest.raises(ValueError, match=r"train.jsonl: no utterances with ids \['nope'\]"):
        evaluate(recognizer, manifest, tmp_path / "x", plot_ids=["nope"], progress=False)

    tiny = tmp_path / "tiny.wav"
    soundfile.write(tiny, np.zeros(80, dtype=np.float32), 16000)  # 5 ms: too short to encode
    lines = manifest.read_text().splitlines()
    bad = json.loads(lines[1]) | {"audio_filepath": str(tiny), "duration": 0.005}
    manifest.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match=rf"{tiny} \(an253-fash-b\): .*too short"):
        evaluate(recognizer, manifest, tmp_path / "y", plots=0, progress=False)


def test_left_out_lines_leave_no_words_to_score_or_ids_to_plot(tmp_path, caplog):
    """With --skip-bad, the only references with words may be left out (a WER of Infinity
    was written), and --plot-ids may name a line left out (it stopped the run, where an
    utterance that fails to decode is left out of the plots)."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    tiny = tmp_path / "tiny.wav"
    soundfile.write(tiny, np.zeros(80, dtype=np.float32), 16000)  # 5 ms: too short to encode
    first = next(iter(UTTERANCES))
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, [Utterance(str(WAV / f"{first}.wav"), 1.0, "", "silent"),
                              Utterance(str(tiny), 0.005, "A", "tiny")])  # fmt: skip
    with pytest.raises(ValueError, match=r"no utterance decoded has reference words(.|\n)*tiny"):
        evaluate(recognizer, manifest, tmp_path / "a", progress=False, skip_bad=True)
    assert not (tmp_path / "a" / "metrics.json").exists()

    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    lines = manifest.read_text().splitlines()
    gone = json.loads(lines[1]) | {"audio_filepath": str(tmp_path / "gone.wav"), "id": "gone"}
    manifest.write_text("\n".join([lines[0], json.dumps(gone), *lines[2:]]) + "\n")
    chosen = json.loads(lines[0])["id"]
    metrics = evaluate(recognizer, manifest, tmp_path / "b", plot_ids=["gone", chosen],
                       progress=False, skip_bad=True)  # fmt: skip
    assert metrics["utterances"] == len(UTTERANCES) - 1
    assert sorted(p.name for p in (tmp_path / "b" / "alignments").iterdir()) == [
        f"{chosen}.png",
        f"{chosen}_heads.png",
    ]
    assert "not plotting ids ['gone']" in caplog.text


@pytest.mark.parametrize("taken", ["alignments", "metrics.json", "hyp.txt"])
def test_a_report_path_taken_by_the_other_kind_is_named_before_decoding(tmp_path, taken):
    """A file where the plots' folder goes (or a folder where a report goes) stopped the run
    after decoding with a bare errno, the new hyp.txt beside the old metrics.json."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    out = tmp_path / "eval"
    out.mkdir()
    if taken == "alignments":
        (out / taken).write_text("x")
    else:
        (out / taken).mkdir()
    kind = NotADirectoryError if taken == "alignments" else IsADirectoryError
    with pytest.raises(kind, match=rf"^{out / taken}: a (file|folder) where"):
        evaluate(recognizer, manifest, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == [taken], "nothing written"
    if taken == "alignments":  # no plots: nothing goes there
        assert evaluate(recognizer, manifest, out, plots=0, progress=False)["wer"] == 0.0


def test_a_run_that_fails_after_decoding_leaves_no_earlier_metrics(tmp_path, monkeypatch):
    """A full disk, or a number JSON cannot write: the earlier metrics.json stayed beside this
    run's hyp.txt and errors.txt, two runs mixed with no sign of it."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "m.jsonl", UTTERANCES)
    out = tmp_path / "eval"
    evaluate(recognizer, manifest, out, plots=0, progress=False)

    def failed(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("asr.evaluate._confidence_report", failed)
    with pytest.raises(OSError, match="No space left"):
        evaluate(recognizer, manifest, out, plots=0, progress=False)
    left = {p.name for p in out.iterdir()}
    assert "hyp.txt" in left and not left & {"metrics.json", "utterances.jsonl", "explore.json"}


def test_a_decode_without_hypothesis_words_leaves_no_earlier_reliability_plot(tmp_path):
    """Every hypothesis empty: no calibration, and the plot of an earlier decode into the
    folder must not stay beside this one's metrics."""
    from asr.evaluate import _confidence_report

    (tmp_path / "reliability.png").write_bytes(b"an earlier decode's")
    assert _confidence_report([], tmp_path, None) is None
    assert not (tmp_path / "reliability.png").exists()


def test_error_report_alignments_and_frequent_errors():
    results = [
        ScoredUtterance("u1", "A B C", "A X C D", []),
        ScoredUtterance("u2", "", "E", []),
        ScoredUtterance("u3", "F G", "", []),
        ScoredUtterance("u4", "B B", "X B", []),
    ]
    report = error_report(results)
    assert "u1  C=2 S=1 D=0 I=1\nREF: A B C *\nHYP: A X C D\n       S   I\n" in report
    assert "u2  C=0 S=0 D=0 I=1\nREF: *\nHYP: E\n     I\n" in report
    assert "u3  C=0 S=0 D=2 I=0\nREF: F G\nHYP: * *\n     D D\n" in report
    frequent = report[report.index("# Most frequent substitutions") :].splitlines()
    assert frequent[1].split() == ["2", "B", "->", "X"]
    deletions = frequent[frequent.index("# Most frequent deletions: count") + 1 :][:2]
    assert sorted(line.split()[1] for line in deletions) == ["F", "G"]
    counts = re.findall(r"^u\d  C=(\d+) S=(\d+) D=(\d+) I=(\d+)$", report, re.MULTILINE)
    sums = [sum(int(c[k]) for c in counts) for k in range(4)]
    totals = jiwer.process_words(["A B C", "F G", "B B"], ["A X C D", "", "X B"])
    extra = 1  # u2's insertion: jiwer refuses its empty reference
    assert sums == [totals.hits, totals.substitutions, totals.deletions, totals.insertions + extra]
