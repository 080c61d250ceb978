"""Arguments that cannot work stop `asr` before a model is loaded: numbers out of their range (at
parsing, naming the option), and options given without the one they need."""

from __future__ import annotations

import json

import pytest

from asr.cli import main

TRANSCRIBE = ["transcribe", "a.wav", "--model", "m.ckpt"]
SERVE = ["serve", "--model", "m.ckpt"]
AT_LEAST_1 = "must be at least 1, got"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([*TRANSCRIBE, "--threads", "0"], f"{AT_LEAST_1} 0"),
        ([*TRANSCRIBE, "--beam-size", "0"], f"{AT_LEAST_1} 0"),
        ([*TRANSCRIBE, "--batch-size", "-2"], f"{AT_LEAST_1} -2"),
        ([*TRANSCRIBE, "--nbest", "0"], f"{AT_LEAST_1} 0"),
        ([*TRANSCRIBE, "--workers", "0"], f"{AT_LEAST_1} 0"),
        ([*TRANSCRIBE, "--ctc-weight", "1.5"], "must lie in [0, 1], got 1.5"),
        ([*TRANSCRIBE, "--words-per-cue", "-1"], "must be at least 0, got -1"),
        ([*TRANSCRIBE, "--threads", "two"], "must be a whole number, got 'two'"),
        ([*TRANSCRIBE, "--max-segment-seconds", "1.5"],
         "must be more than 2 s (twice the overlap of the windows that cut speech without "
         "pauses), got 1.5"),
        ([*TRANSCRIBE, "--ctc-weight", "half"], "must be a number, got 'half'"),
        ([*SERVE, "--threads", "0"], f"{AT_LEAST_1} 0"),
        ([*SERVE, "--max-connections", "0"], f"{AT_LEAST_1} 0"),
        ([*SERVE, "--beam-size", "0"], f"{AT_LEAST_1} 0"),
        ([*SERVE, "--ctc-weight", "-1"], "must lie in [0, 1], got -1"),
        (["evaluate", "--model", "m.ckpt", "--manifest", "x.jsonl", "--beam-size", "0"],
         f"{AT_LEAST_1} 0"),
        (["average", "--last", "last.ckpt", "--best", "0", "--out", "avg.ckpt"],
         f"{AT_LEAST_1} 0"),
        (["cmvn", "--manifest", "x.jsonl", "--out", "c.json", "--n-mels", "0"], f"{AT_LEAST_1} 0"),
        (["connect", "ws://h:1/", "-", "--sample-rate", "0"], f"{AT_LEAST_1} 0"),
        (["evaluate", "--model", "m.ckpt", "--manifest", "x.jsonl", "--out", "o", "--plots", "-2"],
         "must be at least 0, got -2"),
        (["robustness", "--model", "m.ckpt", "--manifest", "x.jsonl", "--out", "o", "--seed", "-5"],
         "must be at least 0, got -5"),
        ([*SERVE, "--port", "99999"], "must be a port, 0 to 65535, got 99999"),
        ([*SERVE, "--port", "-1"], "must be at least 0, got -1"),
        ([*SERVE, "--chunk-ms", "inf"], "must be a finite number, got 'inf'"),
        ([*SERVE, "--max-context-ms", "nan"], "must be a finite number, got 'nan'"),
        ([*SERVE, "--max-context-ms", "-5"], "must be more than 0, got -5"),
        ([*TRANSCRIBE, "--streaming", "--endpoint-silence", "-3"], "must be at least 0, got -3"),
        ([*TRANSCRIBE, "--streaming", "--first-chunk-ms", "0"], "must be more than 0, got 0"),
        ([*TRANSCRIBE, "--lm-weight", "-0.1"], "must lie in [0, 100], got -0.1"),
        ([*TRANSCRIBE, "--lm", "lm.ckpt", "--lm-weight", "150"], "must lie in [0, 100], got 150"),
        ([*SERVE, "--lm", "lm.ckpt", "--lm-weight", "150"], "must lie in [0, 100], got 150"),
        ([*TRANSCRIBE, "--max-len-ratio", "0"], "must be more than 0, got 0"),
        ([*TRANSCRIBE, "--length-bonus", "nan"], "must be a finite number, got 'nan'"),
        (["evaluate", "--model", "m.ckpt", "--manifest", "x.jsonl", "--out", "o", "--chunk-ms",
          "nan"], "must be a finite number, got 'nan'"),
        (["connect", "ws://h:1/", "-", "--timeout", "0"], "must be more than 0, got 0"),
        (["shard", "--manifest", "x.jsonl", "--out", "o", "--shard-hours", "-1"],
         "must be more than 0, got -1"),
        (["export", "--checkpoint", "m.ckpt", "--out", "o", "--repo-id", "not a repo"],
         "must be owner/name as the Hub takes it: 'not a repo' is not owner/name"),
        (["export", "--checkpoint", "m.ckpt", "--out", "o", "--license", ""],
         "must be a licence id such as apache-2.0, got ''"),
        (["export", "--checkpoint", "m.ckpt", "--out", "o", "--license", "[mit"],
         "must be a licence id such as apache-2.0, got '[mit'"),  # it broke the card's YAML
        (["export", "--checkpoint", "m.ckpt", "--out", "o", "--license", "#apache"],
         "must be a licence id such as apache-2.0, got '#apache'"),
    ],
)  # fmt: skip
def test_an_out_of_range_number_stops_at_parsing(argv, said, capsys) -> None:
    option = next(a for a in reversed(argv) if a.startswith("--") and a != "--out")
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    expected = f"asr {argv[0]}: error: argument {option}: {said}"
    assert capsys.readouterr().err.splitlines()[-1] == expected


def test_a_quoted_tilde_in_an_output_is_the_home_folder(tmp_path, monkeypatch) -> None:
    """As in --checkpoint: a folder named `~` in the working folder was written, which the
    next command, given the same `~/...`, looked for at home."""
    from asr.cli import _picture_file

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    line = {"audio_filepath": "/a.wav", "duration": 1.0, "text": "YES", "id": "a"}
    (home / "m.jsonl").write_text(json.dumps(line) + "\n")
    # --manifest is a list of inputs: each one read from home too
    assert main(["tokenizer", "--manifest", "~/m.jsonl", "--out", "~/tok"]) == 0
    assert (home / "tok" / "tokenizer.json").is_file()
    assert not (tmp_path / "~").exists()
    assert _picture_file("~/plot.png") == str(home / "plot.png"), "checked where it is written"


def test_a_vocabulary_size_for_characters_is_refused(tmp_path, capsys) -> None:
    argv = ["tokenizer", "--manifest", "x.jsonl", "--kind", "char", "--vocab-size", "50",
            "--out", str(tmp_path / "tok")]  # fmt: skip
    assert main(argv) == 2
    assert "--vocab-size sizes bpe and unigram vocabularies" in capsys.readouterr().err


def test_jsonl_is_for_live_streams(capsys) -> None:
    assert main([*TRANSCRIBE, "--jsonl"]) == 2
    said = "asr transcribe: error: --jsonl prints a live stream's finals: give --streaming too"
    assert capsys.readouterr().err.splitlines()[-1] == said


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--nbest", "3"], "--nbest: the alternatives are kept in the json files alone"),
        (["--nbest", "3", "--output-dir", "o", "--format", "txt", "srt"], "--nbest: the"),
        (["--vad", "silero", "--silence-threshold-db", "-20"],
         "--silence-threshold-db: a level for --vad energy"),
    ],
)  # fmt: skip
def test_options_that_would_change_nothing_are_refused(options, said, capsys) -> None:
    assert main([*TRANSCRIBE, *options]) == 2
    assert said in capsys.readouterr().err


def test_nbest_with_the_explorer_passes_its_check(monkeypatch) -> None:
    """The explorer writes json (its page shows the alternatives) whatever --format says."""

    def loaded(args):
        raise SystemExit("past the argument checks")

    monkeypatch.setattr("asr.cli._load_model", loaded)
    argv = [*TRANSCRIBE, "--nbest", "3", "--explorer", "--output-dir", "o", "--format", "srt"]
    with pytest.raises(SystemExit, match="past the argument checks"):
        main(argv)


def test_live_options_are_refused_without_streaming(capsys) -> None:
    """An offline decode would ignore them: a chunk size given would seem measured."""
    assert main([*TRANSCRIBE, "--chunk-ms", "320", "--final-search", "rescore"]) == 2
    said = "asr transcribe: error: --chunk-ms, --final-search: options of --streaming; give it too"
    assert capsys.readouterr().err.splitlines()[-1] == said


@pytest.mark.parametrize(("given", "repair"), [([], False), (["--repair"], True),
                                               (["--no-repair"], False)])  # fmt: skip
def test_repair_given_on_the_command_line_overrides_the_stored_setting(given, repair):
    """A finalized model may store repair=False; --repair turns it back on."""
    from types import SimpleNamespace

    from asr.cli import _parser, _search_options
    from asr.search import SearchOptions

    args = _parser("evaluate").parse_args(["evaluate", "--model", "m.ckpt", "--manifest", "x.jsonl",
                                 "--out", "o", *given])  # fmt: skip
    stored = SimpleNamespace(default_options=SearchOptions(repair=False))
    assert _search_options(args, stored).repair is repair


def test_the_calibration_report_writes_a_negative_bias_as_a_difference():
    from types import SimpleNamespace

    from asr.cli import _calibration_report
    from asr.confidence import PlattScaling

    curve = SimpleNamespace(auc=0.4, ece=0.1, words=500, accuracy=0.04)
    for scaling, formula in [
        (PlattScaling(0.5, -3.25), "sigmoid(0.5000 * log(probability) - 3.2500)"),
        (PlattScaling(0.5, 1.0, 0.25),
         "sigmoid(0.5000 * log(probability) + 0.2500 * log(ctc_probability) + 1.0000)"),
    ]:  # fmt: skip
        report = _calibration_report(SimpleNamespace(scaling=scaling, before=curve, after=curve))
        assert report.startswith(f"confidence = {formula}\n"), report
    unranked = SimpleNamespace(scaling=PlattScaling(0.0, -3.2), before=curve, after=curve)
    assert "every word gets the share right" in _calibration_report(unranked)
