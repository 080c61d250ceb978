"""Training curves: reading Lightning CSV logs of a run and plotting them (`asr curves`);
attention plots."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import matplotlib
import pytest
import torch

from asr.cli import main
from asr.metrics import word_calibration
from asr.plotting import (
    csv_logs,
    plot_attention,
    plot_reliability,
    plot_training_curves,
    read_training_log,
)

HEADER = "epoch,step,train/loss_step,val/loss,val/ctc_loss\n"


def write_log(run: Path, version: int, rows: list[str]) -> None:
    folder = run / "logs" / f"version_{version}"
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(HEADER + "".join(row + "\n" for row in rows))


def test_a_metrics_csv_saved_with_a_byte_order_mark_keeps_its_column_names(tmp_path) -> None:
    write_log(tmp_path, 0, ["0,10,,3.0,2.0"])
    log = tmp_path / "logs/version_0/metrics.csv"
    log.write_bytes(b"\xef\xbb\xbf" + log.read_bytes().replace(b"\n", b"\r\n"))
    assert read_training_log(tmp_path)["val/loss"] == [(10, 3.0)]
    assert "\ufeffepoch" not in read_training_log(tmp_path)


def test_versions_are_read_in_numeric_order_and_empty_cells_skipped(tmp_path: Path) -> None:
    write_log(tmp_path, 10, ["3,40,,1.0,0.5"])  # version_10 after version_2, not before
    write_log(tmp_path, 2, ["2,30,,2.0,1.0"])
    write_log(tmp_path, 0, ["0,9,4.0,,", "0,10,,3.0,2.0"])
    curves = read_training_log(tmp_path)
    assert curves["val/loss"] == [(10, 3.0), (30, 2.0), (40, 1.0)]
    assert curves["train/loss_step"] == [(9, 4.0)]
    assert read_training_log(tmp_path / "logs/version_2/metrics.csv")["val/ctc_loss"] == [(30, 1.0)]


def test_versions_are_ordered_by_their_own_folder_name(tmp_path: Path) -> None:
    run = tmp_path / "version_3" / "run"  # a folder above named like a version
    for version in range(12):
        write_log(run, version, [f"{version},100,,{version}.0,"])
    assert read_training_log(run)["val/loss"] == [(100, 11.0)], "the last version's value"


def test_a_last_line_cut_short_is_left_out_and_said(tmp_path: Path, caplog) -> None:
    """A run killed as its logger wrote a row: `0.42` of `0.4243` was plotted as the value."""
    write_log(tmp_path, 0, ["0,10,,3.0,2.0"])
    log = tmp_path / "logs/version_0/metrics.csv"
    log.write_text(log.read_text() + "0,20,,0.4")  # no newline: cut as it was written
    assert read_training_log(tmp_path)["val/loss"] == [(10, 3.0)]
    assert f"{log}:3: a line cut short, left out" in caplog.text


def test_missing_log_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        read_training_log(tmp_path)


def test_one_panel_per_metric_one_line_per_run_that_logged_it() -> None:
    runs = {
        "a": {"val/loss": [(1, 2.0), (2, 1.0)], "val/ctc_loss": [(1, 3.0)]},
        "b": {"val/loss": [(1, 2.5)]},
    }
    fig = plot_training_curves(runs, ["val/loss", "val/ctc_loss"])
    loss, ctc = fig.axes
    assert [line.get_label() for line in loss.lines] == ["a", "b"]
    assert [line.get_label() for line in ctc.lines] == ["a"]
    assert list(loss.lines[0].get_xdata()) == [1, 2]


def test_a_value_without_a_finite_neighbour_is_drawn_as_a_dot() -> None:
    """One validation, or a recovery after NaN, would draw no line segment: nothing at all."""
    nan = float("nan")
    recovering = [(9, 3.0), (19, 2.8), (29, nan), (39, nan), (49, 2.0)]
    runs = {"once": {"val/loss": [(29, 3.0)]}, "nan": {"val/loss": recovering}}
    once, recovered = plot_training_curves(runs, ["val/loss"]).axes[0].lines
    assert once.get_marker() == "o" and once.get_markevery() == [0]
    assert recovered.get_markevery() == [4]


def test_values_that_are_not_finite_are_named_not_dropped_unsaid(tmp_path: Path, caplog) -> None:
    """A run that diverged to NaN looked like one that logged less; one whose metric was never
    finite left its panel empty without a word."""
    rows = ["0,10,,3.0,nan", "1,20,,nan,nan", "2,30,,inf,nan", "3,40,,nan,nan", "4,50,,nan,nan"]
    write_log(tmp_path / "diverged", 0, rows)
    write_log(tmp_path / "fine", 0, ["0,10,,3.5,2.5", "1,20,,3.0,2.0"])
    runs = [str(tmp_path / "diverged"), str(tmp_path / "fine")]
    with caplog.at_level(logging.WARNING, logger="asr.plotting"):
        assert main(["curves", *runs, "--out", str(tmp_path / "c.png")]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "diverged: val/loss: 4 of its 5 values are not finite (nan at step 20, inf at step 30, "
        "nan at step 40 and 1 more): gaps in its line",
        "diverged: val/ctc_loss: none of its 5 values is finite (nan at step 10, nan at step 20, "
        "nan at step 30 and 2 more): nothing drawn",
    ]


def test_a_run_keeps_its_colour_in_panels_where_an_earlier_run_logged_nothing() -> None:
    runs = {"a": {"val/loss": [(1, 2.0)]}, "b": {"val/loss": [(1, 2.5)], "val/wer": [(1, 9.0)]}}
    loss, wer = plot_training_curves(runs, ["val/loss", "val/wer"]).axes
    assert [line.get_label() for line in wer.lines] == ["b"]
    assert wer.lines[0].get_color() == loss.lines[1].get_color() != loss.lines[0].get_color()
    legend = loss.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ["a", "b"]
    assert [h.get_color() for h in legend.legend_handles] == [x.get_color() for x in loss.lines]


def test_cli_writes_the_png_and_rejects_unlogged_metrics(tmp_path: Path, capsys) -> None:
    write_log(tmp_path / "run1", 0, ["0,10,,3.0,2.0", "1,20,,2.0,1.5"])
    write_log(tmp_path / "run2", 0, ["0,10,,3.5,2.5"])
    out = tmp_path / "curves.png"
    runs = [str(tmp_path / "run1"), str(tmp_path / "run2")]
    assert main(["curves", *runs, "--out", str(out), "--metrics", "val/loss"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["curves", *runs, "--out", str(out), "--metrics", "val/wer"]) == 2
    assert "no run logged ['val/wer']" in capsys.readouterr().err
    assert main(["curves", *runs, "--out", str(out), "--labels", "only-one"]) == 2
    assert main(["curves", *runs, "--out", str(out), "--labels", "same", "same"]) == 2
    assert main(["curves", runs[0], runs[0], "--out", str(out)]) == 2
    assert "runs named twice" in capsys.readouterr().err
    bare = tmp_path / "bare"  # no suffix: matplotlib adds .png, and the command names that file
    assert main(["curves", *runs, "--out", str(bare), "--metrics", "val/loss"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"curves: {bare}.png"
    assert (tmp_path / "bare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # refused as the command line is read, before any work, naming --out
    (tmp_path / "bare.png").unlink()
    (tmp_path / "bare.png").mkdir()  # where `--out bare` would write
    for bad, said in ((tmp_path / "c.xyz", "c.xyz: asr writes no .xyz plots (.avif, "),
                      (tmp_path / "c.pgf", "c.pgf: asr writes no .pgf plots"),  # LaTeX's
                      (tmp_path / "run1", "run1: a folder; name the picture file to write"),
                      (tmp_path / "bare", "bare.png: a folder; name the picture file"),
                      (out / "c.png", f"c.png: {out} is a file, not a folder")):  # fmt: skip
        with pytest.raises(SystemExit):
            main(["curves", *runs, "--out", str(bad)])
        err = capsys.readouterr().err
        assert f"asr curves: error: argument --out: {bad.parent}" in err and said in err, err


def test_defaults_plot_what_was_logged_named_by_run(tmp_path: Path, capsys, monkeypatch) -> None:
    """No --metrics: the default curves the runs logged (no val/wer here); logs/ and metrics.csv
    paths are named by their run folder; --out's folder is made."""
    write_log(tmp_path / "a", 0, ["0,10,,3.0,2.0"])
    write_log(tmp_path / "b", 0, ["0,10,,3.5,2.5"])
    seen = {}
    monkeypatch.setattr("asr.plotting.plot_training_curves",
                        lambda runs, metrics: seen.update(runs=list(runs), metrics=metrics)
                        or plot_training_curves(runs, metrics))  # fmt: skip
    runs = [str(tmp_path / "a" / "logs"), str(tmp_path / "b/logs/version_0/metrics.csv")]
    assert main(["curves", *runs, "--out", str(tmp_path / "new" / "c.png")]) == 0
    assert seen == {"runs": ["a", "b"], "metrics": ["val/loss", "val/ctc_loss"]}
    assert (tmp_path / "new" / "c.png").is_file()


def test_a_file_that_is_no_training_log_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text('{"audio_filepath": "a.wav", "duration": 1.0}\n{}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2: not a training log"):
        read_training_log(tmp_path / "m.jsonl")


def test_the_alignment_plot_draws_the_maps_that_time_the_words(monkeypatch, tmp_path) -> None:
    """The word boundaries on the plot come from the recognizer's timing maps: the heat map
    under them is those maps' mean, not every map's; the per-map grid keeps them all."""
    from dataclasses import replace

    from test_transcribe import WAV, _overfit_recognizer

    import asr.plotting

    recognizer, waves = _overfit_recognizer(str(WAV))
    alignment = recognizer.align_tokens(waves[0], recognizer.tokenizer.encode("GO"))
    drawn = []
    original = asr.plotting.plot_attention
    monkeypatch.setattr(asr.plotting, "plot_attention",
                        lambda attention, *a, **k: drawn.append((attention, k["title"]))
                        or original(attention, *a, **k))  # fmt: skip
    for heads in (None, [1]):
        chosen = replace(recognizer, alignment_heads=heads)
        asr.plotting.save_alignment_plots(chosen, alignment, tmp_path / "plot.png", "utt")
    (every, title), (timing, timing_title) = drawn
    assert torch.equal(every, alignment.attention) and title == "utt"
    assert torch.equal(timing, alignment.attention[[1]]) and timing_title == "utt\nmaps [1]"


def test_validate_and_test_runs_logged_beside_training_are_not_curves(tmp_path: Path) -> None:
    """`asr validate`/`asr test --ckpt_path` of a run's checkpoint log a version of their own
    at step 0: not the start of training."""
    write_log(tmp_path, 0, ["0,9,4.0,,", "0,10,,3.0,2.0", "1,20,,1.0,0.5"])
    write_log(tmp_path, 1, ["0,0,,1.0,0.5"])  # the best checkpoint, validated after
    curves = read_training_log(tmp_path)
    assert curves["val/loss"] == [(10, 3.0), (20, 1.0)]
    assert read_training_log(tmp_path / "logs/version_1")["val/loss"] == [(0, 1.0)]  # asked for


def test_a_run_started_again_in_its_folder_starts_the_curves_afresh(tmp_path, caplog) -> None:
    """`asr fit` again in a run's folder (its checkpoints removed) logs a new version from step
    0: joined with the earlier run's, its curve ran on through the old run's points. A resumed
    run's version goes on from its run's (the explorer's training page reads the same)."""
    write_log(tmp_path, 0, ["0,0,5.0,,", "0,3,,5.4,", "1,8,,4.3,", "2,17,,3.7,"])
    write_log(tmp_path, 1, ["3,20,,3.5,"])  # resumed
    write_log(tmp_path, 2, ["0,0,5.1,,", "0,3,,5.3,"])  # started again
    write_log(tmp_path, 3, ["0,3,,5.2,", "1,6,,4.9,"])  # resumed from its step 3
    assert read_training_log(tmp_path)["val/loss"] == [(3, 5.2), (6, 4.9)]
    started = tmp_path / "logs/version_2/metrics.csv"
    said = "a new run, from step 0: the curves leave out the earlier run's version_0, version_1"
    assert f"{started}: {said}" in caplog.text
    assert csv_logs(tmp_path) == [started, tmp_path / "logs/version_3/metrics.csv"]
    caplog.clear()
    assert len(csv_logs(tmp_path, quiet=True)) == 2 and not caplog.text  # said once, not twice


def test_a_versions_config_says_whether_it_resumed_its_run(tmp_path, caplog) -> None:
    """The first steps alone misread runs that log at other steps: a fresh run (no ckpt_path)
    whose first row came later was joined, a resume from a named file whose first row was at
    its run's first step was split off. `--ckpt_path last` may start afresh: read by steps."""
    write_log(tmp_path, 0, ["0,2,,5.9,"])
    write_log(tmp_path, 1, ["0,8,,4.3,"])  # fresh, though past version_0's first step
    write_log(tmp_path, 2, ["0,8,,4.2,"])  # resumed from a file, at its run's first step
    write_log(tmp_path, 3, ["0,3,,5.0,"])  # `last` where there was none: before the run's first
    for version, ckpt_path in [(1, "null"), (2, "/run/steps/last.ckpt"), (3, "last")]:
        (tmp_path / f"logs/version_{version}/config.yaml").write_text(f"ckpt_path: {ckpt_path}\n")
    assert read_training_log(tmp_path)["val/loss"] == [(3, 5.0)]
    (tmp_path / "logs/version_3").rename(tmp_path / "version_3")  # gone: versions 1 and 2
    assert read_training_log(tmp_path)["val/loss"] == [(8, 4.2)]
    assert "version_1/metrics.csv: a new run, from step 8: the curves leave out the earlier " \
        "run's version_0" in caplog.text  # fmt: skip


def test_the_file_a_version_resumed_tells_a_resume_from_last_by_steps_misread(
    tmp_path, caplog
) -> None:
    """A resume from a step checkpoint older than its run's first logged row logs that row
    again: by its steps a new run, said to leave out the earlier version. The run's record of
    the file `last` named tells."""
    write_log(tmp_path, 0, ["0,5,,5.9,"])  # stopped at step 7, its step checkpoint at 3
    write_log(tmp_path, 1, ["0,5,,5.8,", "0,10,,5.1,"])
    (tmp_path / "logs/version_1/config.yaml").write_text("ckpt_path: last\n")
    runs = csv_logs(tmp_path)
    assert runs == [tmp_path / "logs/version_1/metrics.csv"] and "a new run" in caplog.text
    caplog.clear()
    (tmp_path / "logs/version_1/resumed_from.txt").write_text("/run/steps/last.ckpt\n")
    assert len(csv_logs(tmp_path)) == 2 and not caplog.text
    assert read_training_log(tmp_path)["val/loss"] == [(5, 5.8), (10, 5.1)]  # steps redone
    (tmp_path / "logs/version_1/resumed_from.txt").write_text("\n")  # `last` where none was
    assert csv_logs(tmp_path) == [tmp_path / "logs/version_1/metrics.csv"]


def test_text_with_dollars_is_drawn_as_written_not_as_maths() -> None:
    """A reference such as `PAY $^$ NOW` made matplotlib's maths parser stop `asr evaluate`
    after decoding; `$5 AND $10` came out as italic maths."""
    fig = plot_attention(torch.rand(3, 20), ["$", "^", "$"], title="u1 | ref: PAY $^$ NOW")
    fig.savefig(io.BytesIO(), format="png")  # where the parse error was raised
    texts = [fig.get_suptitle(), *(t.get_text() for t in fig.axes[0].get_yticklabels())]
    assert texts == ["u1 | ref: PAY $^$ NOW", "$", "^", "$"]
    runs = {"$x$": {"val/loss": [(1, 2.0)]}}
    plot_training_curves(runs, ["val/loss"]).savefig(io.BytesIO(), format="png")
    assert matplotlib.rcParams["text.parse_math"], "left as it was"


def test_the_reliability_plots_counts_are_numbers_not_maths_source() -> None:
    """Its words axis is symlog, whose ticks matplotlib writes as maths: drawn with maths
    parsing off (for titles with `$`), they read `$\\mathdefault{10^{1}}$`."""
    calibration = word_calibration(
        [0.1, 0.5, 0.55, 0.9, 0.95] * 20, [False, True, False, True, True] * 20
    )
    fig = plot_reliability(calibration)
    fig.savefig(io.BytesIO(), format="png")
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert ticks and all(text.replace(".", "").isdigit() for text in ticks), ticks
