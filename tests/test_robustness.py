"""`asr robustness`: conditions parse, copies rebuild bit for bit, the table adds up, and a
level-normalising frontend keeps a hypothesis through +-30 dB.

On the AN4 fixture (tests/fixtures/an4): no corpus needed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from test_transcribe import GREEDY, UTTERANCES, WAV, _overfit_recognizer

from asr import perturb
from asr.audio import audio_info, load_audio
from asr.cli import main
from asr.data.manifest import Utterance, read_manifest, write_manifest
from asr.frontends import LevelNormalizer
from asr.perturb import change_gain, rms_dbfs, telephone
from asr.robustness import (
    DEFAULT_CONDITIONS,
    Condition,
    build_condition,
    not_scored,
    robustness,
    robustness_table,
)


def _manifest(path: Path) -> Path:
    files = {WAV / f"{p}.wav": text for p, text in UTTERANCES.items()}
    write_manifest(path, [Utterance(str(f), audio_info(f).duration, text, f.stem)
                          for f, text in files.items()])  # fmt: skip
    return path


def test_every_default_condition_parses_and_names_itself():
    conditions = [Condition.parse(text) for text in DEFAULT_CONDITIONS]
    labels = [c.label for c in conditions]
    assert len(set(labels)) == len(labels) == len({c.slug for c in conditions})
    assert Condition.parse("white:10") == Condition("white", 10.0)
    assert Condition.parse("reverb:0.6").label == "reverb 0.6 s RT60"
    # a "+" in a value is its sign or exponent, not a chain's joint; folder names hold none
    signed = Condition.parse("level:+6+white:1e+1")
    assert signed == Condition("level", 6.0, Condition("white", 10.0))
    assert Condition.parse("pad:1e-1").slug == "pad0.1" and "+" not in Condition("pad", 1e6).slug


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hum:3", "unknown condition"),
        ("white", "write it as white:VALUE"),
        ("telephone:3", "write it as telephone"),
        ("level:loud", "is not a number"),
        ("speed:0", "must be > 0"),
        ("speed:1.005", "speed factor 1.005: give one in \\[0.1, 10\\] with at most two decimals"),
        ("speed:0.006", "speed factor 0.006: give one in"),
        ("white:nan", "must be a finite number"),
        ("clean+white:-inf", "'white:-inf': the value must be a finite number"),
        ("pad:1e6", "'pad:1e6': give at most 60 s"),
        ("white:+inf", "'white:\\+inf': the value must be a finite number"),
        ("level:7000", "'level:7000': give a value in \\[-120, 120\\] dB"),
        ("white:-4000", "'white:-4000': give a value in \\[-60, 120\\] dB"),
        ("reverb:30", "'reverb:30': give a value in \\[0, 10\\] s"),
        ("+white:10", "condition '\\+white:10': a '\\+' joins two conditions"),  # named as given
        ("level:-20++white:10", "'-20\\+' is not a number \\(in 'level:-20\\+\\+white:10'\\)"),
    ],
)
def test_bad_conditions_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        Condition.parse(text)


def test_copies_rebuild_identically_and_keep_lengths(tmp_path):
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))
    for text in ["babble:5", "reverb:0.6", "telephone", "white:10"]:
        condition = Condition.parse(text)
        first = read_manifest(
            build_condition(condition, utterances, tmp_path / "a", progress=False)
        )
        again = read_manifest(
            build_condition(condition, utterances, tmp_path / "b", progress=False)
        )
        for u, copy, twin in zip(utterances, first, again, strict=True):
            assert Path(copy.audio_filepath).read_bytes() == Path(twin.audio_filepath).read_bytes()
            assert (
                audio_info(copy.audio_filepath).num_frames
                == audio_info(u.audio_filepath).num_frames
            )
            assert (copy.text, copy.id) == (u.text, u.id)
    other_seed = build_condition(Condition.parse("white:10"), utterances, tmp_path / "c", seed=1,
                                 progress=False)  # fmt: skip
    a, c = (read_manifest(m)[0].audio_filepath for m in (tmp_path / "a/manifest.jsonl", other_seed))
    assert Path(a).read_bytes() != Path(c).read_bytes()


def test_copies_keep_the_ids_of_a_manifest_that_names_none(tmp_path):
    """NeMo manifests give no ids: a copy keeps its source's derived id (not its own file's),
    so decodes under two conditions compare utterance by utterance."""
    utterances = [replace(u, id=None) for u in read_manifest(_manifest(tmp_path / "m.jsonl"))]
    built = build_condition(Condition.parse("level:-6"), utterances, tmp_path / "c",
                            progress=False)  # fmt: skip
    assert [u.utt_id for u in read_manifest(built)] == [u.utt_id for u in utterances]


def test_copies_that_clip_say_how_much(tmp_path, recwarn):
    """The copies are 16-bit WAV: a level raised past full scale clips, and a row that then
    measures the clipping too says so; a quieter copy says nothing."""
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))
    build_condition(Condition("level", -20.0), utterances, tmp_path / "q", progress=False)
    assert not [w for w in recwarn if "clipped" in str(w.message)]
    with pytest.warns(UserWarning, match=r"^level 40 dB: [\d.]+ % of the copies' samples were "
                      "beyond full scale and clipped"):  # fmt: skip
        build_condition(Condition("level", 40.0), utterances, tmp_path / "l", progress=False)


def test_copies_that_clip_say_so_when_reused_too(tmp_path):
    """A re-run scores the copies built before: their clipping measured in the row again
    was said on the first run alone."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest, out = _manifest(tmp_path / "test.jsonl"), tmp_path / "rob"
    said = r"^level 40 dB: [\d.]+ % of the copies' samples were beyond full scale and clipped"
    for _ in range(2):
        with pytest.warns(UserWarning, match=said):
            robustness(recognizer, manifest, out, [Condition("level", 40.0)], GREEDY,
                       progress=False)  # fmt: skip
    stamp = json.loads((out / "level40" / "built.json").read_text())
    assert stamp["clipped"] > 0.01
    del stamp["clipped"]  # copies an asr that kept no share built: built again, and said
    (out / "level40" / "built.json").write_text(json.dumps(stamp))
    with pytest.warns(UserWarning, match=said):
        robustness(recognizer, manifest, out, [Condition("level", 40.0)], GREEDY, progress=False)


def test_copies_round_to_16_bits_and_the_quietest_are_silence(tmp_path):
    """libsndfile floors floats written as WAV's 16 bits: each copy held a -0.5 LSB offset,
    and one at -120 dB a sign's worth of the speech, which decoded to words."""
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))[:1]
    clean = load_audio(utterances[0].audio_filepath)
    for db, out in ((-120.0, "s"), (-6.0, "l")):
        built = read_manifest(build_condition(Condition("level", db), utterances,
                                              tmp_path / out, progress=False))  # fmt: skip
        copy, _ = soundfile.read(built[0].audio_filepath, dtype="int16")
        exact = clean.numpy() * 10 ** (db / 20) * 32768
        assert np.abs(copy - exact).max() <= 0.5 + 1e-3, "to the nearest step"
        assert copy.any() == (db > -100), "digital silence far below the quietest step"


def test_level_and_noise_copies_measure_what_they_say(tmp_path):
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))
    quiet = read_manifest(build_condition(Condition("level", -20.0), utterances, tmp_path / "q",
                                          progress=False))  # fmt: skip
    noisy = read_manifest(build_condition(Condition("white", 10.0), utterances, tmp_path / "n",
                                          progress=False))  # fmt: skip
    for u, q, n in zip(utterances, quiet, noisy, strict=True):
        clean = load_audio(u.audio_filepath)
        assert rms_dbfs(load_audio(q.audio_filepath)) == pytest.approx(
            rms_dbfs(clean) - 20, abs=0.1
        )
        noise = load_audio(n.audio_filepath) - clean
        assert rms_dbfs(clean) - rms_dbfs(noise) == pytest.approx(10.0, abs=0.2)


def test_padded_noisy_copies_hold_the_speech_and_set_noise_by_it(tmp_path):
    """ "pad:3+white:10": the utterance, unchanged, somewhere inside up to 3 s of silence, and
    white noise over all of it 10 dB below the speech (not below the speech and silence)."""
    grew = []
    for k, u in enumerate(read_manifest(_manifest(tmp_path / "test.jsonl"))):
        clean = load_audio(u.audio_filepath)
        silent, noisy = (
            Condition.parse(text).apply(clean, 16000, np.random.default_rng(k), None)
            for text in ("pad:3", "pad:3+white:10")
        )
        assert 0 <= silent.numel() - clean.numel() <= 3 * 16000 and noisy.shape == silent.shape
        start = int(torch.nonzero(silent).min())  # where the speech begins
        assert torch.equal(silent[start : start + clean.numel()], clean)
        assert not silent[:start].any() and not silent[start + clean.numel() :].any()
        assert rms_dbfs(clean) - rms_dbfs(noisy - silent) == pytest.approx(10.0, abs=0.2)
        grew.append(silent.numel() - clean.numel())
        quiet, noisy = (  # a level change after the padding: the noise follows the speech
            Condition.parse(text).apply(clean, 16000, np.random.default_rng(k), None)
            for text in ("pad:3+level:-20", "pad:3+level:-20+white:10")
        )
        assert rms_dbfs(clean) - 20 - rms_dbfs(noisy - quiet) == pytest.approx(10.0, abs=0.2)
        once, twice = (  # a second noise is set by the speech too, not by speech and noise
            Condition.parse(text).apply(clean, 16000, np.random.default_rng(k), None)
            for text in ("pad:3+white:5", "pad:3+white:5+white:10")
        )
        assert rms_dbfs(clean) - rms_dbfs(twice - once) == pytest.approx(10.0, abs=0.2)
        once, twice = (  # a filter between: it takes more of the brown noise than the speech
            Condition.parse(text).apply(clean, 16000, np.random.default_rng(k), None)
            for text in ("pad:3+brown:0+telephone", "pad:3+brown:0+telephone+white:10")
        )
        banded = telephone(clean, 16000)
        assert rms_dbfs(banded) - rms_dbfs(twice - once) == pytest.approx(10.0, abs=0.2)
    assert max(grew) > 8000  # silence was added (the draws are random, not all near 0)


def test_noise_after_a_room_is_set_by_the_speech_as_the_room_left_it(tmp_path):
    """Reverberation keeps the mixture's level, not the speech's: the speech inside the
    reverberant mixture is what a later noise is set by (3 dB off, before)."""
    [u, *_] = read_manifest(_manifest(tmp_path / "test.jsonl"))
    clean = load_audio(u.audio_filepath)
    noisy, room, then = (
        Condition.parse(text).apply(clean, 16000, np.random.default_rng(0), None)
        for text in ("brown:0", "brown:0+reverb:0.8", "brown:0+reverb:0.8+white:10")
    )
    rng = np.random.default_rng(0)  # the same draws: the noise's, then the room's
    perturb.colored_noise(clean.numel(), "brown", rng)
    rir = perturb.synthetic_rir(0.8, 16000, rng)
    gain = perturb.level_gain(noisy, perturb.reverberate(noisy, rir, keep_level=False))
    speech = perturb.reverberate(clean, rir, keep_level=False) * gain
    assert rms_dbfs(speech) - rms_dbfs(then - room) == pytest.approx(10.0, abs=0.05)
    for chain in ("pad:1+white:10", "pad:1+speed:1.1+white:10", "pad:1+reverb:0.5+brown:5"):
        empty = Condition.parse(chain).apply(torch.zeros(0), 16000, rng, None)
        assert torch.isfinite(empty).all() and not empty.any(), chain  # silence, no NaN


def test_speed_copies_change_duration_in_the_manifest(tmp_path):
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))
    faster = read_manifest(build_condition(Condition("speed", 1.1), utterances, tmp_path / "s",
                                           progress=False))  # fmt: skip
    for u, f in zip(utterances, faster, strict=True):
        assert f.duration == pytest.approx(audio_info(f.audio_filepath).duration)
        assert f.duration == pytest.approx(u.duration / 1.1, abs=1e-3)


def test_babble_never_contains_the_utterance_itself(tmp_path, monkeypatch):
    utterances = read_manifest(_manifest(tmp_path / "test.jsonl"))
    seen: list[tuple[int, list[int]]] = []
    real_babble = Condition.apply

    def spy(self, wave, sample_rate, rng, talkers):
        waves = talkers()
        ids = [next(i for i, u in enumerate(utterances)
                    if torch.equal(load_audio(u.audio_filepath), w)) for w in waves]  # fmt: skip
        seen.append((len(seen), ids))
        return real_babble(self, wave, sample_rate, rng, lambda: waves)

    monkeypatch.setattr(Condition, "apply", spy)
    build_condition(Condition("babble", 10.0), utterances, tmp_path / "b", progress=False)
    assert [index for index, _ in seen] == list(range(len(utterances)))
    for index, talkers in seen:
        assert index not in talkers and len(talkers) == len(set(talkers)) == len(utterances) - 1


def test_a_ratio_over_other_utterances_than_clean_is_marked():
    """Speed-up leaving a short utterance out scored 2 of clean's 3: 50.0 against 66.7 read as
    a WER cut by a quarter."""
    row = dict(substitutions=1, deletions=0, insertions=0, cer=10.0)
    rows = [row | {"condition": "clean", "utterances": 3, "reference_words": 3, "wer": 66.7},
            row | {"condition": "speed 1.1x", "utterances": 2, "reference_words": 2, "wer": 50.0},
            row | {"condition": "level -30 dB", "utterances": 3, "reference_words": 3,
                   "wer": 66.7}]  # fmt: skip
    table = robustness_table(rows).splitlines()
    assert table[3].split(" | ")[-2] == "0.75 *" and table[4].split(" | ")[-2] == "1.00"
    assert table[-1].startswith("\\* over other utterances than clean")
    # as many scored, but another one left out: not the same speech either
    rows = [rows[0] | {"left_out": ["a.wav (u1)"]}, rows[2] | {"left_out": ["a.wav (u2)"]}]
    assert robustness_table(rows).splitlines()[3].split(" | ")[-2] == "1.00 *"


def test_robustness_table_reuses_copies_and_rebuilds_for_a_new_seed(tmp_path):
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "test.jsonl")
    out = tmp_path / "rob"
    conditions = [Condition("clean"), Condition("level", -30.0), Condition("white", 30.0)]
    rows = robustness(recognizer, manifest, out, conditions, GREEDY, progress=False)
    assert [r["condition"] for r in rows] == ["clean", "level -30 dB", "white 30 dB SNR"]
    assert rows[0]["wer"] == 0.0 and rows[0]["manifest"] == str(manifest)
    assert json.loads((out / "robustness.json").read_text()) == rows
    table = (out / "robustness.md").read_text()
    assert table == robustness_table(rows) and table.count("\n") == 2 + len(conditions)
    wav = out / "white30" / "wav" / "000000.wav"
    built = wav.stat().st_mtime_ns
    robustness(recognizer, manifest, out, conditions[2:], GREEDY, progress=False)
    assert wav.stat().st_mtime_ns == built, "same manifest and seed: the copy is reused"
    robustness(recognizer, manifest, out, conditions[2:], GREEDY, seed=3, progress=False)
    assert wav.stat().st_mtime_ns != built, "a new seed rebuilds the copy"
    other = out / "white30" / "wav" / "000001.wav"
    for spoil in (lambda: wav.unlink(), lambda: other.write_bytes(b"garbage")):
        spoil()  # a copy that lost a file, or had one changed, is built again, not scored
        [row] = robustness(recognizer, manifest, out, conditions[2:], GREEDY, seed=3,
                           progress=False)  # fmt: skip
        assert row["utterances"] == 4 and not row["failures"] and other.stat().st_size > 7
    stamp = json.loads((out / "white30" / "built.json").read_text())
    del stamp["files"]  # a copy of a stamp that recorded no sizes: built again too
    (out / "white30" / "built.json").write_text(json.dumps(stamp))
    wav.unlink()
    [row] = robustness(recognizer, manifest, out, conditions[2:], GREEDY, seed=3, progress=False)
    assert row["utterances"] == 4 and not row["failures"]
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join(lines[:2]) + "\n")  # other utterances, the same file
    [row] = robustness(recognizer, manifest, out, conditions[2:], GREEDY, seed=3, progress=False)
    assert row["utterances"] == 2 and len(read_manifest(out / "white30/manifest.jsonl")) == 2
    # a rebuild that stops halfway (a bad file, Ctrl-C) leaves no copies passing for built
    gone = tmp_path / "gone.jsonl"
    gone.write_text(lines[0] + "\n" + json.dumps({"audio_filepath": str(tmp_path / "x.wav"),
                                                 "duration": 1.0, "text": "X"}) + "\n")  # fmt: skip
    with pytest.raises(Exception, match="x.wav"):
        robustness(recognizer, gone, out, conditions[2:], GREEDY, seed=3, progress=False)
    assert not (out / "white30" / "built.json").exists()


def test_a_line_left_out_then_readable_rebuilds_the_copies(tmp_path, monkeypatch):
    """A copy built without a line whose audio was missing is not reused once it is there:
    the conditions would compare other utterances than the clean decode. It is, where only
    the manifest's path is spelt otherwise."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "test.jsonl")
    first = read_manifest(manifest)[0]
    moved = tmp_path / "moved.wav"
    lines = manifest.read_text().splitlines()
    lines[0] = json.dumps(json.loads(lines[0]) | {"audio_filepath": str(moved)})
    manifest.write_text("\n".join(lines) + "\n")
    conditions = [Condition("clean"), Condition("level", -6.0)]
    rows = robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY, progress=False,
                      skip_bad=True)  # fmt: skip
    assert [r["utterances"] for r in rows] == [3, 3] and all(len(r["failures"]) == 1 for r in rows)
    wav = tmp_path / "rob" / "level-6" / "wav" / "000000.wav"
    built = wav.stat().st_mtime_ns
    monkeypatch.chdir(tmp_path)
    robustness(recognizer, "test.jsonl", tmp_path / "rob", conditions, GREEDY, progress=False,
               skip_bad=True)  # fmt: skip
    assert wav.stat().st_mtime_ns == built, "the same lines left out: the copy is reused"
    moved.symlink_to(first.audio_filepath)
    rows = robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY, progress=False,
                      skip_bad=True)  # fmt: skip
    assert [r["utterances"] for r in rows] == [4, 4] and not any(r["failures"] for r in rows)


def test_audio_that_cannot_be_read_is_left_out_under_every_condition(tmp_path):
    """A file whose header passes but whose samples are NaN: the copies leave it out as the
    clean decode does, babble is made of the others, and it is listed once, also when the
    copies are reused; without skip_bad it stops the run, naming it."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "test.jsonl")
    nan = tmp_path / "nan.wav"
    wave = np.zeros(16000, dtype=np.float32)
    wave[100] = np.nan
    soundfile.write(nan, wave, 16000, subtype="FLOAT")
    lines = manifest.read_text().splitlines()
    lines[1] = json.dumps(json.loads(lines[1]) | {"audio_filepath": str(nan), "duration": 1.0})
    manifest.write_text("\n".join(lines) + "\n")
    conditions = [Condition("clean"), Condition.parse("babble:20"), Condition.parse("speed:0.9")]
    for _ in range(2):  # built, then reused
        rows = robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY,
                          progress=False, skip_bad=True)  # fmt: skip
        assert [r["utterances"] for r in rows] == [3, 3, 3]
        assert all(len(r["failures"]) == 1 and "NaN" in r["failures"][0] for r in rows)
        assert all(r["left_out"] == [f"{nan} ({read_manifest(manifest)[1].utt_id})"] for r in rows)
        assert not_scored(rows) == [rows[0]["failures"][0]]
    with pytest.raises(ValueError, match="nan.wav"):
        robustness(recognizer, manifest, tmp_path / "strict", conditions[1:], GREEDY,
                   progress=False)  # fmt: skip
    soundfile.write(nan, np.zeros(16000, dtype=np.float32), 16000, subtype="FLOAT")  # mended
    rows = robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY,
                      progress=False, skip_bad=True)  # fmt: skip
    assert [r["utterances"] for r in rows] == [4, 4, 4], "copies built without it, built anew"


def test_babble_on_one_utterance_is_refused_before_any_copy(tmp_path):
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "test.jsonl")
    manifest.write_text(manifest.read_text().splitlines()[0] + "\n")
    conditions = [Condition("clean"), Condition.parse("level:-6"), Condition.parse("babble:20")]
    with pytest.raises(ValueError, match="at least two readable utterances, it has 1"):
        robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY, progress=False)
    assert not (tmp_path / "rob").exists(), "refused before the other conditions ran"
    nan = tmp_path / "nan.wav"  # two lines, one of audio that cannot be read
    soundfile.write(nan, np.full(16000, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    line = json.dumps({"audio_filepath": str(nan), "duration": 1.0, "text": "X", "id": "nan"})
    manifest.write_text(manifest.read_text() + line + "\n")
    with pytest.raises(ValueError, match="at least two readable utterances, it has 1"):
        robustness(recognizer, manifest, tmp_path / "rob", conditions, GREEDY, progress=False,
                   skip_bad=True)  # fmt: skip
    assert not (tmp_path / "rob").exists()


def test_copies_under_a_relative_folder_and_clean_chains(tmp_path, monkeypatch):
    """`--out rb/rel` (as the AN4 recipe gives it): the copy's manifest names its audio
    relative to itself, so it reads from anywhere; "clean+level:-30" is built, not the
    manifest as given."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    manifest = _manifest(tmp_path / "test.jsonl")
    monkeypatch.chdir(tmp_path)
    conditions = [Condition.parse(c) for c in ("clean", "clean+level:-30", "level:-30")]
    rows = robustness(recognizer, manifest, Path("rb/rel"), conditions, GREEDY, progress=False)
    assert [r["condition"] for r in rows] == ["clean", "clean + level -30 dB", "level -30 dB"]
    assert rows[1]["manifest"] != str(manifest)
    chained, alone = (read_manifest(f"rb/rel/{c.slug}/manifest.jsonl") for c in conditions[1:])
    assert [u.audio_filepath for u in chained] == [
        str(tmp_path / "rb/rel" / conditions[1].slug / "wav" / f"{i:06d}.wav")
        for i in range(len(UTTERANCES))]  # fmt: skip
    assert [load_audio(a.audio_filepath) for a in chained][0].equal(
        load_audio(alone[0].audio_filepath))  # fmt: skip


@pytest.mark.parametrize("gain_db", [-30.0, 30.0])
def test_a_level_normalising_frontend_keeps_the_hypothesis(gain_db):
    recognizer, waves = _overfit_recognizer(str(WAV))
    normalised = replace(recognizer, model=_with_level(recognizer.model))
    clean = [normalised.transcribe(w, options=GREEDY).text for w in waves]
    assert clean == list(UTTERANCES.values())
    louder = [normalised.transcribe(change_gain(w, gain_db), options=GREEDY).text for w in waves]
    assert louder == clean


def _with_level(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    model = copy.deepcopy(model)
    model.frontend.level = LevelNormalizer().eval()  # as the rest of the model
    return model


def test_cli_prints_the_table(tmp_path, capsys):
    pytest.importorskip("lightning")
    from test_transcribe import fit_tiny_checkpoint

    checkpoint = fit_tiny_checkpoint(tmp_path / "fit")
    manifest = _manifest(tmp_path / "test.jsonl")
    code = main(["robustness", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
                 "--out", str(tmp_path / "rob"), "--conditions", "clean", "telephone",
                 "--beam-size", "1", "--quiet"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "| clean | 4 |" in out and "| telephone | 4 |" in out
    assert sorted(p.name for p in (tmp_path / "rob").iterdir()) == [
        "clean", "robustness.json", "robustness.md", "telephone"
    ]  # fmt: skip
    metrics = json.loads((tmp_path / "rob" / "clean" / "decode" / "metrics.json").read_text())
    assert "lm" in metrics and metrics["lm"] is None, "the LM fused, named as evaluate names it"
    # one utterance it cannot score is left out and listed, as `asr evaluate` does
    short = tmp_path / "short.wav"  # 62.5 ms: too short to encode, in frames that the speeds
    soundfile.write(short, np.zeros(1000, dtype=np.float32), 16000)  # count otherwise
    lines = manifest.read_text().splitlines()
    lines[1] = json.dumps(json.loads(lines[1]) | {"audio_filepath": str(short), "duration": 0.0625})
    manifest.write_text("\n".join(lines) + "\n")
    code = main(["robustness", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
                 "--out", str(tmp_path / "rob"), "--conditions", "clean", "level:-6",
                 "speed:0.9", "speed:0.8", "--beam-size", "1", "--quiet"])  # fmt: skip
    said = capsys.readouterr()
    assert code == 1 and "| clean | 3 |" in said.out and "| level -6 dB | 3 |" in said.out
    assert "1 manifest line(s) or utterance(s) not scored" in said.err  # under each condition
    assert f"{short} (" in said.err and "wav/000001.wav" not in said.err, "the source is named"
    code = main(["robustness", "--checkpoint", str(checkpoint), "--manifest", str(manifest),
                 "--out", str(tmp_path / "rob"), "--conditions", "hum"])  # fmt: skip
    assert code == 2 and "unknown condition 'hum'" in capsys.readouterr().err


def test_cmvn_cli_measures_level_normalised_features(tmp_path):
    from asr.data.cmvn import compute_cmvn_stats
    from asr.frontends import CMVNStats, Frontend, LogMelFilterbank

    manifest = _manifest(tmp_path / "train.jsonl")
    quiet = tmp_path / "quiet.jsonl"
    rows = read_manifest(manifest)
    for u in rows:
        wave = change_gain(load_audio(u.audio_filepath), -25.0).numpy()
        soundfile.write(tmp_path / f"{u.id}.wav", wave, 16000, subtype="FLOAT")
    write_manifest(quiet, [replace(u, audio_filepath=str(tmp_path / f"{u.id}.wav")) for u in rows])
    for path, name in [(manifest, "loud.json"), (quiet, "quiet.json")]:
        args = ["cmvn", "--manifest", str(path), "--out", str(tmp_path / name), "--n-mels", "40"]
        assert main([*args, "--target-dbfs", "-26"]) == 0
    loud, soft = (CMVNStats.load(tmp_path / n) for n in ("loud.json", "quiet.json"))
    torch.testing.assert_close(loud.mean, soft.mean, atol=1e-3, rtol=0)
    level = Frontend(LogMelFilterbank(n_mels=40), level=LevelNormalizer(-26.0))
    direct = compute_cmvn_stats(manifest, level, tmp_path / "direct.json")
    torch.testing.assert_close(direct.mean, loud.mean)
    plain = compute_cmvn_stats(quiet, LogMelFilterbank(n_mels=40), tmp_path / "plain.json")
    assert float((plain.mean - loud.mean).abs().min()) > 1.0, "without it the level shows"


def test_an_output_that_is_a_file_is_named(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(NotADirectoryError, match=r"out: a file; the output is a folder"):
        robustness(None, tmp_path / "m.jsonl", tmp_path / "out", [Condition("white", 20.0)])


def test_a_condition_that_leaves_nothing_to_score_is_a_row_of_its_own(tmp_path):
    """A clip scored clean but too short at twice the speed: its row says so, naming the
    source file, and the other conditions' rows are kept; before, the run stopped with no
    table, naming the copy."""
    recognizer, _ = _overfit_recognizer(str(WAV))
    wave, rate = soundfile.read(WAV / f"{next(iter(UTTERANCES))}.wav")
    clip = tmp_path / "short.wav"
    conditions = [Condition("clean"), Condition.parse("speed:2")]
    for seconds in (len(wave) / rate, 0.1):  # an earlier run's reports, then none to score
        soundfile.write(clip, wave[: round(seconds * rate)], rate)
        write_manifest(tmp_path / "m.jsonl", [Utterance(str(clip), seconds, "YES", "short")])
        rows = robustness(recognizer, tmp_path / "m.jsonl", tmp_path / "rob", conditions, GREEDY,
                          progress=False, skip_bad=True)  # fmt: skip
    assert not (tmp_path / "rob" / "speed2" / "decode").exists(), "no stale reports"
    assert [(r["utterances"], r["wer"] is None) for r in rows] == [(1, False), (0, True)]
    assert rows[1]["failures"][0].startswith(f"{clip} (short): ")
    assert "| speed 2x | 0 | 0 | 0 | 0 | 0 | - | - | - | 0 |" in robustness_table(rows)
    assert (tmp_path / "rob" / "robustness.md").is_file()
    # beside it one with no words: decoded, but nothing to score under speed 2x either
    full = tmp_path / "full.wav"
    soundfile.write(full, wave, rate)
    both = [
        Utterance(str(clip), 0.1, "YES", "short"),
        Utterance(str(full), len(wave) / rate, "", "e"),
    ]
    write_manifest(tmp_path / "m.jsonl", both)
    rows = robustness(recognizer, tmp_path / "m.jsonl", tmp_path / "rob", conditions, GREEDY,
                      progress=False, skip_bad=True)  # fmt: skip
    assert [r["wer"] is None for r in rows] == [False, True]
    assert rows[1]["failures"][0].startswith(f"{clip} (short): ")
