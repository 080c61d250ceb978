"""`asr.data.cmvn`: global CMVN statistics over a manifest, and the level they were taken at."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import soundfile as sf
import torch

from asr.data.cmvn import compute_cmvn_stats, config_frontend
from asr.frontends import (
    CMVNStats,
    Frontend,
    GlobalCMVN,
    KaldiFbank,
    LevelNormalizer,
    LinearSpectrogram,
    LogMelFilterbank,
    accumulate_cmvn_stats,
    num_frames,
)
from tests.test_frontends import waves


def write_corpus(tmp_path: Path, lengths: list[int]) -> Path:
    """WAV files of noisy sines and a JSON Lines manifest over them."""
    wave, _ = waves(lengths, extra=0)
    lines = []
    for i, n in enumerate(lengths):
        sf.write(tmp_path / f"u{i}.wav", wave[i, :n].numpy(), 16000, subtype="FLOAT")
        lines.append({"audio_filepath": f"u{i}.wav", "duration": n / 16000, "text": "x"})
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def test_compute_cmvn_stats_over_a_manifest(tmp_path):
    lengths = [16000, 4000, 12345, 8000, 399]
    manifest = write_corpus(tmp_path, lengths)
    frontend = LogMelFilterbank(n_mels=20)
    stats = compute_cmvn_stats(manifest, frontend, tmp_path / "cmvn.json", batch_size=2)
    wave, lens = waves(lengths, extra=0)
    expected = accumulate_cmvn_stats(*frontend(wave, lens))
    assert stats.count == expected.count == sum(num_frames(n, 400, 160) for n in lengths)
    torch.testing.assert_close(stats.mean, expected.mean)
    torch.testing.assert_close(stats.std, expected.std)
    assert torch.equal(CMVNStats.load(tmp_path / "cmvn.json").sum, stats.sum)
    assert CMVNStats.load(tmp_path / "cmvn.json").sample_rate == 16000, "the rate is recorded"
    first = compute_cmvn_stats(manifest, frontend, tmp_path / "new/two.json", max_utterances=2)
    assert first.count == num_frames(16000, 400, 160) + num_frames(4000, 400, 160)
    assert (tmp_path / "new/two.json").is_file(), "its folder made, as other commands' --out"


def test_statistics_of_other_features_of_the_same_count_are_refused(tmp_path):
    """Kaldi fbank on log-mel statistics (80 and 80) normalised to a mean near 5: the file
    records its features' means on a test signal. Another hop leaves them the same."""
    manifest = write_corpus(tmp_path, [16000, 8000])
    compute_cmvn_stats(manifest, LogMelFilterbank(n_mels=80), tmp_path / "cmvn.json")
    stats = str(tmp_path / "cmvn.json")
    Frontend(LogMelFilterbank(n_mels=80), GlobalCMVN(stats))
    Frontend(LogMelFilterbank(n_mels=80, hop_length=320), GlobalCMVN(stats))
    for other in (KaldiFbank(num_mel_bins=80), LogMelFilterbank(n_mels=80, power=1.0)):
        with pytest.raises(ValueError, match=rf"^{stats}: statistics of other features than "):
            Frontend(other, GlobalCMVN(stats))
    old = json.loads(Path(stats).read_text())  # a file of before: not judged
    del old["features_signature"]
    Path(stats).write_text(json.dumps(old))
    Frontend(KaldiFbank(num_mel_bins=80), GlobalCMVN(stats))


@pytest.mark.parametrize(("taken", "used"), [(1.0, 2.0), (2.0, 1.0)])
def test_magnitude_and_power_statistics_are_told_apart_not_on_a_log_scale(tmp_path, taken, used):
    """Without the log, features are small numbers whose kinds differ by less than 1: they are
    told apart by how widely their means spread, either way round."""
    manifest = write_corpus(tmp_path, [16000, 8000])
    compute_cmvn_stats(manifest, LinearSpectrogram(log=False, power=taken), tmp_path / "c.json")
    stats = str(tmp_path / "c.json")
    Frontend(LinearSpectrogram(log=False, power=taken, hop_length=80), GlobalCMVN(stats))
    Frontend(LinearSpectrogram(log=False, power=taken, window="hamming"), GlobalCMVN(stats))
    with pytest.raises(ValueError, match=r"times as widely: another kind or scale"):
        Frontend(LinearSpectrogram(log=False, power=used), GlobalCMVN(stats))


def test_compute_cmvn_stats_without_frames_raises(tmp_path):
    manifest = write_corpus(tmp_path, [300])
    with pytest.raises(ValueError, match="manifest.jsonl"):
        compute_cmvn_stats(manifest, LogMelFilterbank(), tmp_path / "cmvn.json")


@pytest.mark.parametrize("target", [None, -26.0])
def test_the_file_records_the_level_and_a_frontend_at_another_level_is_refused(tmp_path, target):
    manifest = write_corpus(tmp_path, [16000, 8000])
    features = LogMelFilterbank(n_mels=20)
    frontend = features if target is None else Frontend(features, level=LevelNormalizer(target))
    compute_cmvn_stats(manifest, frontend, tmp_path / "cmvn.json")
    assert json.loads((tmp_path / "cmvn.json").read_text())["level_dbfs"] == target
    stats_path = str(tmp_path / "cmvn.json")
    same = None if target is None else LevelNormalizer(target)
    Frontend(LogMelFilterbank(n_mels=20), GlobalCMVN(stats_path), level=same)  # agrees
    other = LevelNormalizer(-30.0) if target is None else None
    # through the config: `asr cmvn --target-dbfs` alone would take 80 log-mel bands' statistics
    with pytest.raises(
        ValueError, match=r"cmvn\.json: CMVN statistics of audio .*\(asr cmvn --config\)"
    ):
        Frontend(LogMelFilterbank(n_mels=20), GlobalCMVN(stats_path), level=other)


def test_files_without_a_recorded_level_are_not_checked(tmp_path):
    feats, lens = torch.randn(1, 5, 3), torch.tensor([5])
    accumulate_cmvn_stats(feats, lens).save(tmp_path / "cmvn.json")
    data = json.loads((tmp_path / "cmvn.json").read_text())
    del data["level_dbfs"]
    (tmp_path / "cmvn.json").write_text(json.dumps(data))
    assert CMVNStats.load(tmp_path / "cmvn.json").level_dbfs == "unknown"
    cmvn = GlobalCMVN(str(tmp_path / "cmvn.json"))
    Frontend(LogMelFilterbank(n_mels=3), cmvn, level=LevelNormalizer(-26.0))


def test_a_config_whose_frontend_does_not_build_is_named_in_one_line(tmp_path):
    config = tmp_path / "forty.yaml"
    config.write_text(
        "model:\n  init_args:\n    frontend:\n      class_path: asr.frontends.Frontend\n"
        "      init_args:\n        features:\n"
        "          class_path: asr.frontends.LogMelFilterbank\n"
        "          init_args: {n_mels: forty}\n"
    )
    with pytest.raises(ValueError, match=r"forty\.yaml: its frontend does not build: .*n_mels.*"
                       r"Got value: forty$"):  # fmt: skip
        config_frontend(config)


@pytest.mark.parametrize("part", ["level", "features"])
def test_a_value_the_frontend_refuses_is_placed_at_its_line(tmp_path, part):
    """Refused as the level normaliser was built, it came wrapped in jsonargparse's list of
    the union's subtypes tried, without a line."""
    config = tmp_path / "refused.yaml"
    config.write_text(
        "model:\n  init_args:\n    frontend:\n      class_path: asr.frontends.Frontend\n"
        "      init_args:\n        level:\n"
        "          class_path: asr.frontends.LevelNormalizer\n"
        f"          init_args: {{target_dbfs: {5 if part == 'level' else -26}}}\n"
        "        features:\n          class_path: asr.frontends.LogMelFilterbank\n"
        f"          init_args: {{n_mels: 40, f_min: {9000 if part == 'features' else 0}}}\n"
    )
    said = "target_dbfs 5.0 must be at most 0" if part == "level" else "LogMelFilterbank: need 0"
    line = 8 if part == "level" else 11
    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}:{line}: {said}"):
        config_frontend(config)


@pytest.mark.parametrize("order", ["n_mels first", "n_mels last"])
def test_of_the_arguments_a_filterbank_checks_the_one_refused_is_named(tmp_path, order):
    """One message over three arguments was placed at whichever the config set last."""
    lines = ["            n_mels: 0\n", "            log_floor: 1.0e-6\n"]
    config = tmp_path / "refused.yaml"
    config.write_text(
        "model:\n  init_args:\n    frontend:\n      class_path: asr.frontends.Frontend\n"
        "      init_args:\n        features:\n"
        "          class_path: asr.frontends.LogMelFilterbank\n          init_args:\n"
        + "".join(lines if order == "n_mels first" else lines[::-1])
    )
    line = 9 if order == "n_mels first" else 10
    said = r"LogMelFilterbank: n_mels \(0\) must be positive$"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}:{line}: {said}"):
        config_frontend(config)


def test_audio_that_cannot_be_read_is_named_with_its_manifest_and_utterance(tmp_path):
    manifest = write_corpus(tmp_path, [16000, 8000])
    (tmp_path / "u1.wav").unlink()
    said = rf"^{manifest} \(u1[^)]*\): audio .*u1\.wav: file not found$"  # its id: u1-<hash>
    with pytest.raises(ValueError, match=said):
        compute_cmvn_stats(manifest, LogMelFilterbank(n_mels=20), tmp_path / "cmvn.json")


def test_features_that_overflow_are_refused_naming_the_batch(tmp_path):
    """Statistics over a non-finite feature would be NaN: refused, not saved."""
    manifest = write_corpus(tmp_path, [16000, 8000])

    class Overflowing(torch.nn.Module):
        def forward(self, wave, lens):
            feats, feat_lens = LogMelFilterbank(n_mels=20)(wave, lens)
            return feats.index_fill(2, torch.tensor([3]), float("inf")), feat_lens

    with pytest.raises(ValueError, match=rf"^{manifest}: non-finite features in one of: u0"):
        compute_cmvn_stats(manifest, Overflowing(), tmp_path / "cmvn.json")
    assert not (tmp_path / "cmvn.json").exists()
