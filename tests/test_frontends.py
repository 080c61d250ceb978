"""Contracts of asr.frontends: lengths, padding invariance, parity with librosa and Kaldi,
CMVN statistics, SpecAugment bounds."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio
from torch import nn

import asr.frontends
from asr.frontends import (
    MFCC,
    CMVNStats,
    Frontend,
    GlobalCMVN,
    KaldiFbank,
    LevelNormalizer,
    LinearSpectrogram,
    LogMelFilterbank,
    SpecAugment,
    UtteranceCMVN,
    accumulate_cmvn_stats,
    num_frames,
)
from asr.models.interfaces import lengths_to_mask

ODD_LENGTHS = [16001, 399, 400, 401, 12345]
PAD_LEFT = (512 - 400) // 2  # where torch.stft and librosa centre a 400-sample window in 512


def waves(lengths: list[int], extra: int = 37, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sines of `lengths` samples, padded with *random* samples (not zeros) to max + extra,
    so any leak of padding into the features shows."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(max(lengths) + extra) / 16000
    freqs = 200 + 3000 * torch.rand(len(lengths), 1, generator=gen)
    wave = 0.3 * torch.sin(2 * torch.pi * freqs * t) + 0.05 * torch.randn(len(t), generator=gen)
    return wave, torch.tensor(lengths, dtype=torch.int64)


def speech(an4_dir: Path, n: int = 3) -> list[np.ndarray]:
    files = sorted((an4_dir / "wav" / "an4_clstk" / "fash").glob("*.wav"))[:n]
    return [sf.read(f, dtype="float32")[0] for f in files]


def fixed_cmvn(dim: int) -> GlobalCMVN:
    return GlobalCMVN(mean=torch.linspace(-3, 3, dim), std=torch.linspace(0.5, 2, dim))


# Every waveform frontend, as factories so each test gets a fresh module.
FRONTENDS: dict[str, Callable[[], nn.Module]] = {
    "logmel": LogMelFilterbank,
    "logmel-slaney": lambda: LogMelFilterbank(mel_scale="slaney", mel_norm="slaney"),
    "logmel-odd-pad": lambda: LogMelFilterbank(n_fft=256, win_length=201, hop_length=80, n_mels=40),
    "mfcc": MFCC,
    "linear-log": LinearSpectrogram,
    "linear-power": lambda: LinearSpectrogram(power=2.0, log=False, window="hamming"),
    "kaldi": KaldiFbank,
    "kaldi-energy": lambda: KaldiFbank(num_mel_bins=40, use_energy=True, int16_scale=False),
    "logmel+utt-cmvn": lambda: Frontend(LogMelFilterbank(), UtteranceCMVN(norm_vars=True)),
    "kaldi+global-cmvn+specaug": lambda: Frontend(KaldiFbank(), fixed_cmvn(80), SpecAugment()),
    "level+logmel+global-cmvn": lambda: Frontend(
        LogMelFilterbank(), fixed_cmvn(80), level=LevelNormalizer()
    ),
}


def frame_geometry(frontend: nn.Module) -> tuple[int, int]:
    features = frontend.features if isinstance(frontend, Frontend) else frontend
    if isinstance(features, KaldiFbank):
        return features.win_length, features.hop_length
    if isinstance(features, MFCC):
        features = features.log_mel
    return features.spectrogram.win_length, features.spectrogram.hop_length


# ----------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("n", [0, 1, 399, 400, 401, 559, 560, 12345, 16000, 16001])
def test_num_frames_counts_whole_windows(n):
    # Brute force: frame i fits iff i * hop + win <= n.
    expected = sum(1 for i in range(n) if i * 160 + 400 <= n)
    assert num_frames(n, 400, 160) == expected
    assert num_frames(torch.tensor([n]), 400, 160).tolist() == [expected]


def test_num_frames_rejects_bad_geometry():
    with pytest.raises(ValueError, match="hop_length"):
        num_frames(100, 400, 0)


@pytest.mark.parametrize("name", FRONTENDS)
def test_lengths_match_frames_produced(name):
    frontend = FRONTENDS[name]().eval()
    wave, lens = waves(ODD_LENGTHS)
    feats, feat_lens = frontend(wave, lens)
    win, hop = frame_geometry(frontend)
    assert feat_lens.dtype == torch.int64
    assert feat_lens.tolist() == [num_frames(n, win, hop) for n in ODD_LENGTHS]
    assert feats.shape == (len(ODD_LENGTHS), int(feat_lens.max()), frontend.output_dim)
    assert feats.dtype == torch.float32
    for b, n in enumerate(ODD_LENGTHS):
        alone, alone_lens = frontend(wave[None, b, :n], lens[b : b + 1])
        assert alone.shape[1] == alone_lens.item() == feat_lens[b]


@pytest.mark.parametrize("name", FRONTENDS)
def test_padding_invariance(name):
    frontend = FRONTENDS[name]().eval()
    wave, lens = waves(ODD_LENGTHS)
    feats, feat_lens = frontend(wave, lens)
    for b, n in enumerate(ODD_LENGTHS):
        alone, _ = frontend(wave[None, b, :n], lens[b : b + 1])
        valid = int(feat_lens[b])
        torch.testing.assert_close(feats[b, :valid], alone[0], rtol=1e-5, atol=1e-5)
        assert feats[b, valid:].abs().sum() == 0, "padding frames must be zero"


@pytest.mark.parametrize("name", FRONTENDS)
def test_frames_follow_the_padded_batch_not_its_longest_wave(name):
    """A shape grid pads waves past the longest one: the features keep that fixed shape (so
    compiled kernels are reused), with the extra frames as padding."""
    frontend = FRONTENDS[name]().eval()
    wave, lens = waves(ODD_LENGTHS)
    win, hop = frame_geometry(frontend)
    padded = torch.nn.functional.pad(wave, (0, 5 * hop + 7))
    feats, feat_lens = frontend(wave, lens)
    grid_feats, grid_lens = frontend(padded, lens)
    assert grid_feats.size(1) == num_frames(padded.size(1), win, hop) > feats.size(1)
    assert torch.equal(grid_lens, feat_lens)
    torch.testing.assert_close(grid_feats[:, : feats.size(1)], feats)
    assert grid_feats[:, feats.size(1) :].abs().sum() == 0, "padding frames must be zero"


@pytest.mark.parametrize("name", FRONTENDS)
def test_all_utterances_shorter_than_a_window_give_no_frames(name):
    frontend = FRONTENDS[name]().eval()
    win, _ = frame_geometry(frontend)
    feats, feat_lens = frontend(torch.randn(2, win - 1), torch.tensor([win - 1, 10]))
    assert feats.shape == (2, 0, frontend.output_dim)
    assert feat_lens.tolist() == [0, 0]


@pytest.mark.parametrize("name", ["logmel", "kaldi"])
def test_bad_batches_raise(name):
    frontend = FRONTENDS[name]()
    with pytest.raises(ValueError, match="2-D"):
        frontend(torch.randn(16000), torch.tensor([16000]))
    with pytest.raises(ValueError, match="outside"):
        frontend(torch.randn(2, 1000), torch.tensor([1000, 1001]))
    with pytest.raises(ValueError, match="lengths of shape"):
        frontend(torch.randn(2, 1000), torch.tensor([1000]))


@pytest.mark.parametrize("name", FRONTENDS)
def test_integer_samples_and_fractional_lengths_are_refused(name):
    """The recognizer scales int16 samples to [-1, 1]; a frontend alone took them as they are
    (a level normaliser gave zeros), and KaldiFbank stopped on float lengths in its loop."""
    frontend = FRONTENDS[name]()
    with pytest.raises(
        ValueError, match=r"floating-point values \(audio in \[-1, 1\]\), got torch"
    ):
        frontend((torch.randn(2, 1000) * 3000).short(), torch.tensor([1000, 800]))
    with pytest.raises(ValueError, match="whole-number lengths, got torch.float32"):
        frontend(torch.randn(2, 1000), torch.tensor([1000.0, 800.0]))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="window"):
        LogMelFilterbank(window="kaiser")
    with pytest.raises(ValueError, match="n_fft"):
        LogMelFilterbank(n_fft=256, win_length=400)
    with pytest.raises(ValueError, match="n_mfcc"):
        MFCC(n_mfcc=81, n_mels=80)
    for features in (LogMelFilterbank, MFCC, LinearSpectrogram):  # not "too short" at fit
        for hop in (0, -160):
            with pytest.raises(ValueError, match=rf"hop_length \({hop}\) must be positive"):
                features(hop_length=hop)
        for power, need in ((0, "positive"), (-1.0, "positive"), (math.inf, "finite"),
                            (math.nan, "finite")):  # fmt: skip
            with pytest.raises(ValueError, match=rf"power \({power}\) must be {need}"):
                features(power=power)  # NaN features on silence
        with pytest.raises(ValueError, match=r"sample_rate \(0\)"):  # not at resampling
            features(sample_rate=0)


# ----------------------------------------------------------------------------- parity


def librosa_mel(y: np.ndarray, **options) -> np.ndarray:
    """librosa mel power `(frames, n_mels)` with our framing: librosa centres the 400-sample window
    in the 512-sample frame, so shifting the signal by that offset aligns the frames."""
    padded = np.pad(y.astype(np.float64), (PAD_LEFT, PAD_LEFT))
    mel = librosa.feature.melspectrogram(
        y=padded,
        sr=16000,
        n_fft=512,
        win_length=400,
        hop_length=160,
        center=False,
        n_mels=80,
        power=2.0,
        window="hann",
        **options,
    )
    return mel.T


def assert_power_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Each value within 1e-4 of itself, plus 1e-5 of its frame's peak: our float32 STFT's
    rounding is relative to the frame's energy, so weak bands of a loud frame get that slack."""
    assert ours.shape == ref.shape
    bound = 1e-4 * ref + 1e-5 * ref.amax(dim=1, keepdim=True)
    worst = ((ours - ref).abs() / bound).max()
    assert worst <= 1, f"error up to {worst:.2f} x the bound"


MEL_CONVENTIONS = {  # ours -> librosa
    "htk": (dict(mel_scale="htk", mel_norm=None), dict(htk=True, norm=None)),
    "slaney": (dict(mel_scale="slaney", mel_norm="slaney"), dict(htk=False, norm="slaney")),
}


@pytest.mark.parametrize("convention", MEL_CONVENTIONS)
def test_log_mel_matches_librosa(convention):
    """Mel power (exp of our log-mel; no value is near the floor) against float64 librosa."""
    ours, theirs = MEL_CONVENTIONS[convention]
    wave, lens = waves([16000, 12345])
    feats, feat_lens = LogMelFilterbank(**ours)(wave, lens)
    for b, n in enumerate(lens.tolist()):
        ref = torch.from_numpy(librosa_mel(wave[b, :n].numpy(), **theirs))
        assert ref.shape[0] == feat_lens[b]
        assert_power_close(feats[b, : feat_lens[b]].double().exp(), ref)


@pytest.mark.parametrize("convention", MEL_CONVENTIONS)
def test_mfcc_matches_librosa(convention):
    """librosa.feature.mfcc on the natural-log mel (floor 1e-10), DCT-II ortho, no lifter."""
    ours, theirs = MEL_CONVENTIONS[convention]
    wave, lens = waves([16000])
    feats, _ = MFCC(n_mfcc=40, **ours)(wave, lens)
    log_mel = np.log(np.maximum(librosa_mel(wave[0, :16000].numpy(), **theirs), 1e-10))
    ref = librosa.feature.mfcc(S=log_mel.T, n_mfcc=40, dct_type=2, norm="ortho", lifter=0)
    torch.testing.assert_close(feats[0].double(), torch.from_numpy(ref.T), rtol=1e-4, atol=1e-3)


def test_linear_spectrogram_matches_librosa_stft():
    wave, lens = waves([12345])
    feats, _ = LinearSpectrogram(log=False)(wave, lens)
    padded = np.pad(wave[0, :12345].double().numpy(), (PAD_LEFT, PAD_LEFT))
    ref = np.abs(librosa.stft(padded, n_fft=512, win_length=400, hop_length=160, center=False))
    torch.testing.assert_close(feats[0].double(), torch.from_numpy(ref.T), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("int16_scale", [True, False])
def test_kaldi_fbank_matches_torchaudio_per_utterance(int16_scale):
    wave, lens = waves(ODD_LENGTHS)
    feats, feat_lens = KaldiFbank(num_mel_bins=40, int16_scale=int16_scale)(wave, lens)
    scale = 32768.0 if int16_scale else 1.0
    for b, n in enumerate(ODD_LENGTHS):
        if n < 400:
            assert feat_lens[b] == 0
            continue
        ref = torchaudio.compliance.kaldi.fbank(wave[None, b, :n] * scale, num_mel_bins=40)
        torch.testing.assert_close(feats[b, : feat_lens[b]], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["logmel", "mfcc", "linear-log", "kaldi"])
def test_features_take_the_dtype_of_the_model_not_of_the_wave(name):
    """A float32 encoder refuses float64 features of numpy audio; a double() one, float32."""
    wave = 0.1 * torch.randn(1, 16000, dtype=torch.float64)
    lens = torch.tensor([16000])
    assert FRONTENDS[name]()(wave, lens)[0].dtype == torch.float32
    assert FRONTENDS[name]().double()(wave.float(), lens)[0].dtype == torch.float64
    assert FRONTENDS[name]().double()(wave, lens)[0].dtype == torch.float64


def test_kaldi_dither_only_in_training():
    wave, lens = waves([8000])
    fbank = KaldiFbank(dither=1.0)
    eval_a, eval_b = fbank.eval()(wave, lens)[0], fbank(wave, lens)[0]
    train = fbank.train()(wave, lens)[0]
    assert torch.equal(eval_a, eval_b)
    assert not torch.allclose(train, eval_a)


@pytest.mark.needs_corpus
@pytest.mark.parametrize("convention", MEL_CONVENTIONS)
def test_log_mel_matches_librosa_on_speech(an4_dir, convention):
    ours, theirs = MEL_CONVENTIONS[convention]
    frontend = LogMelFilterbank(**ours)
    for y in speech(an4_dir):
        feats, _ = frontend(torch.from_numpy(y)[None], torch.tensor([len(y)]))
        ref = torch.from_numpy(librosa_mel(y, **theirs))
        assert_power_close(feats[0].double().exp(), ref)


@pytest.mark.needs_corpus
@pytest.mark.parametrize("name", FRONTENDS)
def test_padding_invariance_on_speech(an4_dir, name):
    frontend = FRONTENDS[name]().eval()
    ys = [torch.from_numpy(y) for y in speech(an4_dir)]
    batch = nn.utils.rnn.pad_sequence(ys, batch_first=True)
    feats, feat_lens = frontend(batch, torch.tensor([len(y) for y in ys]))
    for b, y in enumerate(ys):
        alone, _ = frontend(y[None], torch.tensor([len(y)]))
        torch.testing.assert_close(feats[b, : feat_lens[b]], alone[0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- precision


@pytest.mark.parametrize("name", ["logmel", "mfcc", "linear-log", "kaldi"])
def test_autocast_and_half_inputs_give_float32(name):
    frontend = FRONTENDS[name]().eval()
    wave, lens = waves([16000, 12345])
    reference, _ = frontend(wave, lens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast, _ = frontend(wave, lens)
        half_in, _ = frontend(wave.bfloat16(), lens)
    assert autocast.dtype == half_in.dtype == torch.float32
    torch.testing.assert_close(autocast, reference, rtol=1e-5, atol=1e-5)
    rounded, _ = frontend(wave.bfloat16().float(), lens)  # bf16 only rounds the input
    torch.testing.assert_close(half_in, rounded, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", FRONTENDS)
def test_runs_on_the_input_device(name):
    frontend = FRONTENDS[name]().eval()
    wave, lens = waves(ODD_LENGTHS)
    cpu, cpu_lens = frontend(wave, lens)
    gpu, gpu_lens = frontend.cuda()(wave.cuda(), lens.cuda())
    assert gpu.device.type == gpu_lens.device.type == "cuda"
    assert torch.equal(gpu_lens.cpu(), cpu_lens)
    # fp32 FFTs (cuFFT, pocketFFT) differ by ~1e-7 of a frame's largest bin: a mel bin 24 nats
    # under its frame's peak (a notch after pre-emphasis) moved by 2e-3 on an H200.
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-2)


# ----------------------------------------------------------------------------- CMVN


def padded_features(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(3, 7, 4)` features with garbage (1e6) in the padding, lengths 7, 2, 5."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor([7, 2, 5])
    feats = 3 + 2 * torch.randn(3, 7, 4, generator=gen, dtype=torch.float64)
    valid = lengths_to_mask(lens, 7)
    return feats.masked_fill(~valid[:, :, None], 1e6), lens


def valid_frames(feats: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([feats[b, :n] for b, n in enumerate(lens.tolist())])  # (N, D)


def test_accumulated_stats_count_valid_frames_only():
    feats, lens = padded_features()
    stats = accumulate_cmvn_stats(feats, lens)
    frames = valid_frames(feats, lens)
    assert stats.count == 14 and stats.dim == 4
    torch.testing.assert_close(stats.mean, frames.mean(0))
    torch.testing.assert_close(stats.std, frames.std(0, correction=0))


def test_stats_add_up_across_batches():
    feats, lens = padded_features()
    whole = accumulate_cmvn_stats(feats, lens)
    parts = accumulate_cmvn_stats(feats[1:], lens[1:], accumulate_cmvn_stats(feats[:1], lens[:1]))
    assert parts.count == whole.count
    torch.testing.assert_close(parts.sum, whole.sum)
    torch.testing.assert_close(parts.sum_sq, whole.sum_sq)


def test_std_is_floored():
    stats = accumulate_cmvn_stats(torch.full((1, 5, 2), 7.0), torch.tensor([5]))
    assert stats.std.tolist() == pytest.approx([1e-5, 1e-5])


def test_stats_save_load_round_trip(tmp_path):
    stats = accumulate_cmvn_stats(*padded_features())
    stats.save(tmp_path / "cmvn.json")
    loaded = CMVNStats.load(tmp_path / "cmvn.json")
    assert loaded.count == stats.count and loaded.std_floor == stats.std_floor
    assert torch.equal(loaded.sum, stats.sum) and torch.equal(loaded.sum_sq, stats.sum_sq)
    json.loads((tmp_path / "cmvn.json").read_text())  # plain JSON, not pickle


@pytest.mark.parametrize(
    "content, reason",
    [
        ('{"count": 3, "sum": [1.0, 2.0]', "not valid JSON"),
        ("\x00\x01garbage", "not valid JSON"),
        ("[1, 2, 3]", "JSON object"),
        ('{"count": 3, "sum": [1.0]}', "bad CMVN stats: no 'sum_sq' key"),
        ('{"count": "3", "sum": [1.0], "sum_sq": [1.0]}', "integer"),
        ('{"count": 3, "sum": [1.0, 2.0], "sum_sq": [1.0]}', r"\(D,\)"),
        ('{"count": 3, "sum": ["a"], "sum_sq": [1.0]}', "bad CMVN stats"),
        ('{"count": 3, "sum": [NaN], "sum_sq": [1.0]}', "non-finite"),
        ('{"count": -1, "sum": [1.0], "sum_sq": [1.0]}', "positive integer"),
        ('{"count": 0, "sum": [0.0], "sum_sq": [0.0]}', "positive integer"),
        (b"\x00\xf8\x01BFM ", "not JSON CMVN stats"),  # binary: Kaldi's cmvn.ark
        ("[" * 100_000 + "]" * 100_000, "not JSON CMVN stats"),
        ('{"count": 3, "sum": [1.0, 2.0], "sum_sq": [1.0, 2.0], "features_signature": [1.0]}',
         "'features_signature' has 1 values, 'sum' 2"),
        ('{"count": 1, "sum": [1e40], "sum_sq": [1e80]}', "past float32's range"),
        ('{"count": 3, "sum": [1.0], "sum_sq": [1.0], "std_floor": -1}',
         "'std_floor' must be a positive number, got -1"),  # every deviation floored at 1
        ('{"count": 3, "sum": [1.0], "sum_sq": [1.0], "std_floor": "x"}', "got 'x'"),
    ],
)  # fmt: skip
def test_corrupt_stats_file_names_the_file(tmp_path, content, reason):
    path = tmp_path / "corrupt_cmvn.json"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    with pytest.raises(ValueError, match=reason) as error:
        CMVNStats.load(path)
    assert str(path) in str(error.value)
    with pytest.raises(ValueError, match="corrupt_cmvn.json"):
        GlobalCMVN(stats_path=str(path))


def test_missing_stats_file_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.json: no CMVN statistics file \("):
        GlobalCMVN(stats_path=str(tmp_path / "absent.json"))


def test_statistics_of_other_features_are_refused_naming_their_file(tmp_path):
    feats, lens = padded_features()  # 4 features
    accumulate_cmvn_stats(feats, lens).save(tmp_path / "cmvn80.json")
    with pytest.raises(ValueError, match=r"cmvn80.json: statistics of 4 features, but the "
                       r"features have 40"):  # fmt: skip
        Frontend(LogMelFilterbank(n_mels=40), GlobalCMVN(stats_path=str(tmp_path / "cmvn80.json")))


def test_statistics_of_audio_at_another_rate_are_refused(tmp_path):
    """`asr cmvn` records the rate; statistics of 16 kHz audio do not normalise 8 kHz features
    (nor do older files, without a rate, get refused)."""
    feats, lens = padded_features()
    stats = dataclasses.replace(accumulate_cmvn_stats(feats, lens), sample_rate=16000)
    stats.save(tmp_path / "cmvn.json")
    assert CMVNStats.load(tmp_path / "cmvn.json").sample_rate == 16000
    cmvn = GlobalCMVN(stats_path=str(tmp_path / "cmvn.json"))
    with pytest.raises(ValueError, match=r"cmvn.json: statistics of 16000 Hz audio, but the "
                       r"features take 8000 Hz"):  # fmt: skip
        Frontend(LogMelFilterbank(sample_rate=8000, n_mels=4), cmvn)
    Frontend(LogMelFilterbank(sample_rate=16000, n_mels=4), cmvn)
    dataclasses.replace(stats, sample_rate=None).save(tmp_path / "old.json")
    Frontend(
        LogMelFilterbank(sample_rate=8000, n_mels=4),
        GlobalCMVN(stats_path=str(tmp_path / "old.json")),
    )


def test_global_cmvn_normalises_to_zero_mean_unit_std(tmp_path):
    feats, lens = padded_features()
    accumulate_cmvn_stats(feats, lens).save(tmp_path / "cmvn.json")
    cmvn = GlobalCMVN(stats_path=str(tmp_path / "cmvn.json"))
    out, out_lens = cmvn(feats.float(), lens)
    frames = valid_frames(out, lens)
    assert torch.equal(out_lens, lens)
    torch.testing.assert_close(frames.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(frames.std(0, correction=0), torch.ones(4), atol=1e-5, rtol=0)
    assert out[1, 2:].abs().sum() == 0
    assert set(cmvn.state_dict()) == {"mean", "std"}


def test_global_cmvn_formula_and_options():
    mean, std = torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5])
    x, lens = torch.tensor([[[3.0, 0.0]]]), torch.tensor([1])
    assert GlobalCMVN(mean=mean, std=std)(x, lens)[0].tolist() == [[[1.0, 4.0]]]
    assert GlobalCMVN(mean=mean, std=std, norm_vars=False)(x, lens)[0].tolist() == [[[2.0, 2.0]]]
    assert GlobalCMVN(mean=mean)(x, lens)[0].tolist() == [[[2.0, 2.0]]]
    with pytest.raises(ValueError, match="exactly one"):
        GlobalCMVN()
    with pytest.raises(ValueError, match="dimension"):
        GlobalCMVN(mean=torch.zeros(3))(x, lens)
    with pytest.raises(ValueError, match="positive"):
        GlobalCMVN(mean=mean, std=torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("norm_vars", [False, True])
def test_utterance_cmvn_uses_valid_frames_only(norm_vars):
    feats, lens = padded_features()
    out, _ = UtteranceCMVN(norm_vars=norm_vars)(feats, lens)
    for b, n in enumerate(lens.tolist()):
        torch.testing.assert_close(out[b, :n].mean(0), torch.zeros(4, dtype=torch.float64))
        std = out[b, :n].std(0, correction=0)
        expected = feats[b, :n].std(0, correction=0) if not norm_vars else torch.ones_like(std)
        torch.testing.assert_close(std, expected)
        alone, _ = UtteranceCMVN(norm_vars=norm_vars)(feats[b : b + 1, :n], lens[b : b + 1])
        torch.testing.assert_close(out[b, :n], alone[0])
        assert out[b, n:].abs().sum() == 0


def test_utterance_cmvn_of_a_constant_band_is_zero_alone_or_padded():
    """Digital silence gives constant bands: float32 rounding of their mean, divided by the
    std floor, made noise that changed with the padded length."""
    wave = torch.zeros(2, 16000)
    frontend = Frontend(LogMelFilterbank(n_mels=8), UtteranceCMVN(norm_vars=True))
    batched, lens = frontend(wave, torch.tensor([16000, 9000]))
    alone, _ = frontend(wave[1:, :9000], torch.tensor([9000]))
    assert batched.abs().max() == 0 and alone.abs().max() == 0
    assert int(lens[1]) == alone.size(1)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"n_mels": 300}, "cover no FFT bin"),  # 257 FFT bins
        ({"n_fft": 256, "win_length": 256, "n_mels": 80}, "2 of the 80 mel bands"),
        ({"sample_rate": 8000, "f_max": 8000.0}, r"f_max <= 4000 Hz"),
        ({"f_min": 500.0, "f_max": 400.0}, "f_min < f_max"),
        ({"sample_rate": 0}, "must be positive"),
        ({"n_mels": 0}, "must be positive"),
        ({"log_floor": 0.0}, "must be positive"),
        ({"log_floor": math.inf}, r"log_floor \(inf\) must be finite"),  # inf features
        # named by the argument a config sets (torchaudio's words name neither)
        ({"mel_scale": "foo"}, r"LogMelFilterbank: mel_scale must be \"htk\" or \"slaney\""),
        ({"mel_norm": "foo"}, r"LogMelFilterbank: mel_norm must be null or \"slaney\", got 'foo'"),
        ({"window": "hanning"}, r"window must be one of \[.*'hann'.*\], got 'hanning'"),
    ],
)
def test_log_mel_refuses_options_that_give_empty_or_broken_bands(options, match):
    with pytest.raises(ValueError, match=match):
        LogMelFilterbank(**options)
    with pytest.raises(ValueError, match=match):
        MFCC(n_mfcc=1, **{"n_mels": 1, **options})


def test_floors_that_would_give_infinite_or_nan_features_are_refused():
    with pytest.raises(ValueError, match=r"log_floor \(0.0\) must be positive"):
        LinearSpectrogram(log_floor=0.0)  # log of digital silence: -inf
    with pytest.raises(ValueError, match=r"log_floor \(inf\) must be finite"):
        LinearSpectrogram(log_floor=math.inf)  # every feature: inf
    LinearSpectrogram(log=False, log_floor=0.0)  # not taken
    with pytest.raises(ValueError, match=r"std_floor \(0\) must be positive"):
        UtteranceCMVN(norm_vars=True, std_floor=0)  # a constant band: NaN
    with pytest.raises(ValueError, match=r"std_floor \(inf\) must be finite"):
        UtteranceCMVN(norm_vars=True, std_floor=math.inf)  # every feature: 0
    KaldiFbank(dither=0.0, energy_floor=0.0, use_energy=True)  # Kaldi's own defaults: both off


@pytest.mark.parametrize(
    "options, match",
    [
        ({"window_type": "hann"}, r"window_type must be one of \('povey', .*\), got 'hann'"),
        ({"high_freq": 9000.0}, "high-freq"),
        ({"low_freq": 5000.0, "high_freq": 4000.0}, "low-freq"),
        ({"num_mel_bins": 0}, "must be positive"),
        ({"frame_length_ms": 0.01}, "at least one sample"),
        # not a bare OverflowError from int(), nor NaN or inf features blamed on the audio
        ({"frame_length_ms": math.inf}, r"frame_length_ms \(inf\) must be finite"),
        ({"frame_shift_ms": math.nan}, r"frame_shift_ms \(nan\) must be finite"),
        ({"dither": math.nan}, r"dither \(nan\) must be finite"),
        ({"dither": math.inf}, r"dither \(inf\) must be finite"),
        ({"dither": -1.0}, r"dither \(-1.0\) must be >= 0"),
        ({"energy_floor": math.inf, "use_energy": True}, r"energy_floor \(inf\) must be finite"),
        ({"energy_floor": -1.0}, r"energy_floor \(-1.0\) must be >= 0"),
        ({"sample_rate": 0}, r"sample_rate \(0\) must be positive"),  # not the frame lengths
        ({"num_mel_bins": 128}, "1 of the 128 mel bands cover no FFT bin"),  # FFT of 512
        ({"sample_rate": 8000, "num_mel_bins": 128}, "4 of the 128 mel bands"),
    ],
)
def test_kaldi_fbank_refuses_bad_options_when_built(options, match):
    with pytest.raises(ValueError, match=match):
        KaldiFbank(**options)


# ----------------------------------------------------------------------------- SpecAugment


MASK = -100.0  # a value no feature takes, so masked cells can be counted


def positive_features(lengths: list[int], dim: int = 80, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    feats = 1 + torch.rand(len(lengths), max(lengths), dim, generator=gen)
    return asr.frontends.zero_padding(feats, lens), lens


def test_specaugment_is_identity_in_eval():
    feats, lens = positive_features([50, 30])
    out, out_lens = SpecAugment().eval()(feats, lens)
    assert torch.equal(out, feats) and torch.equal(out_lens, lens)


def test_specaugment_is_deterministic_under_seed():
    feats, lens = positive_features([300, 120, 40])
    augment = SpecAugment(time_width=0.2).train()
    torch.manual_seed(3)
    a, _ = augment(feats, lens)
    torch.manual_seed(3)
    b, _ = augment(feats, lens)
    c, _ = augment(feats, lens)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("time_width", [0.2, 15])
def test_specaugment_masks_within_bounds(time_width):
    lengths = [300, 120, 40, 7]
    feats, lens = positive_features(lengths)
    augment = SpecAugment(
        time_warp=0,
        freq_masks=2,
        freq_width=10,
        time_masks=3,
        time_width=time_width,
        mask_value=MASK,
    ).train()
    max_widths = augment.max_time_width(lens).tolist()
    masked_total = 0
    for seed in range(20):
        torch.manual_seed(seed)
        out, out_lens = augment(feats, lens)
        assert torch.equal(out_lens, lens)
        for b, n in enumerate(lengths):
            masked = out[b, :n] == MASK  # (n, D)
            rows, cols = masked.all(1), masked.all(0)
            # Every masked cell lies in a fully masked frame or a fully masked channel ...
            assert torch.equal(masked, rows[:, None] | cols[None, :])
            # ... at most time_masks * width frames and freq_masks * F channels.
            if not rows.all():
                assert cols.sum() <= 2 * 10
            if not cols.all():
                assert rows.sum() <= 3 * max_widths[b]
            assert torch.equal(out[b, :n][~masked], feats[b, :n][~masked])
            assert out[b, n:].abs().sum() == 0, "padding must stay zero"
            masked_total += int(masked.sum())
    assert masked_total > 0, "20 draws never masked anything"


def test_time_masks_fit_whole_inside_each_length():
    """Bands are drawn to fit, not drawn anywhere and then clipped at the utterance's end."""
    feats, lens = positive_features([50, 9, 3])
    augment = SpecAugment(time_masks=4, time_width=1000).train()
    for seed in range(50):
        torch.manual_seed(seed)
        mask = augment._time_mask(feats, lens)
        assert not (mask & ~lengths_to_mask(lens, 50)).any()


def test_max_time_width_fraction_and_frames():
    lens = torch.tensor([0, 10, 99, 1000])
    assert SpecAugment(time_width=0.05).max_time_width(lens).tolist() == [0, 0, 4, 50]
    assert SpecAugment(time_width=20).max_time_width(lens).tolist() == [0, 10, 20, 20]
    assert SpecAugment(time_width=20.0).max_time_width(lens).tolist() == [0, 10, 20, 20]


def warp_only(time_warp: int = 5) -> SpecAugment:
    return SpecAugment(time_warp=time_warp, freq_masks=0, time_masks=0).train()


def test_time_warp_keeps_constant_features_and_padding():
    lens = torch.tensor([40, 25, 11])
    feats = asr.frontends.zero_padding(torch.arange(1.0, 4.0)[None, None].expand(3, 40, 3), lens)
    torch.manual_seed(0)
    out, out_lens = warp_only()(feats, lens)
    torch.testing.assert_close(out, feats)
    assert torch.equal(out_lens, lens)


def test_time_warp_moves_frames_monotonically_inside_valid_part():
    lens = torch.tensor([60, 45, 12, 11])
    ramp = torch.arange(60.0)[None, :, None].expand(4, 60, 2)
    feats = asr.frontends.zero_padding(ramp, lens)
    changed = 0
    for seed in range(10):
        torch.manual_seed(seed)
        out, _ = warp_only()(feats, lens)
        for b, n in enumerate(lens.tolist()):
            warped = out[b, :n, 0]
            assert (warped.diff() >= -1e-5).all(), "linear resampling of a ramp stays monotone"
            assert warped.min() >= 0 and warped.max() <= n - 1
            assert out[b, n:].abs().sum() == 0
            changed += int(not torch.allclose(warped, feats[b, :n, 0]))
        assert torch.equal(out[3], feats[3]), "11 frames <= 2W + 1: too short to warp"
    assert changed > 0


@pytest.mark.parametrize(
    "setting",
    [
        {"freq_width": -1},
        {"time_width": math.nan},
        {"time_width": math.inf},
        {"mask_value": math.nan},
    ],  # fmt: skip
)
def test_specaugment_refuses_negative_or_not_finite_sizes(setting):
    """At construction, not at the first training batch (NaN passes `min()` unseen)."""
    with pytest.raises(ValueError, match="finite"):
        SpecAugment(**setting)


@pytest.mark.parametrize("name", ["time_warp", "freq_masks", "freq_width", "time_masks"])
def test_specaugment_refuses_fractional_counts_and_takes_whole_floats(name):
    """Counts and widths in bins or frames are whole: 1.5 was taken, and the first training
    batch failed inside torch; 2.0 (a float a caller computed) is 2."""
    with pytest.raises(ValueError, match=f"{name} \\(1.5\\) must be a whole number"):
        SpecAugment(**{name: 1.5})
    augment = SpecAugment(**{name: 2.0}).train()
    feats, lens = torch.randn(2, 50, 20), torch.tensor([50, 40])
    assert augment(feats, lens)[0].shape == feats.shape


# ----------------------------------------------------------------------------- composition


def test_frontend_composes_features_normalize_augment():
    wave, lens = waves([16000, 8000])
    features, cmvn = LogMelFilterbank(n_mels=40), fixed_cmvn(40)
    frontend = Frontend(features, cmvn, SpecAugment(time_width=0.2))
    assert frontend.output_dim == 40
    expected = cmvn(*features(wave, lens))
    torch.testing.assert_close(frontend.eval()(wave, lens), expected)
    torch.manual_seed(0)
    augmented, augmented_lens = frontend.train()(wave, lens)
    torch.manual_seed(0)
    torch.testing.assert_close(augmented, frontend.augment(*expected)[0])
    assert torch.equal(augmented_lens, expected[1])


def test_frontend_builds_from_a_config(tmp_path):
    """What YAML configs do: class_path/init_args with plain values, GlobalCMVN from a path."""
    jsonargparse = pytest.importorskip("jsonargparse")
    accumulate_cmvn_stats(*padded_features()).save(tmp_path / "cmvn.json")
    config = {
        "frontend": {
            "class_path": "asr.frontends.Frontend",
            "init_args": {
                "features": {
                    "class_path": "asr.frontends.KaldiFbank",
                    "init_args": {"num_mel_bins": 4},
                },
                "normalize": {
                    "class_path": "asr.frontends.GlobalCMVN",
                    "init_args": {"stats_path": str(tmp_path / "cmvn.json")},
                },
                "augment": {
                    "class_path": "asr.frontends.SpecAugment",
                    "init_args": {"time_width": 10},
                },
            },
        }
    }
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--frontend", type=nn.Module)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # < 4.49
    frontend = instantiate(parser.parse_object(config)).frontend
    assert isinstance(frontend, Frontend) and frontend.output_dim == 4
    assert isinstance(frontend.normalize, GlobalCMVN) and frontend.augment.time_width == 10
    feats, feat_lens = frontend.eval()(*waves([4000]))
    assert feats.shape == (1, num_frames(4000, 400, 160), 4)


# ----------------------------------------------------------------------------- level


@pytest.mark.parametrize("gain_db", [-30.0, -20.0, -6.0, 6.0, 20.0, 30.0])
@pytest.mark.parametrize("features", [LogMelFilterbank, MFCC, KaldiFbank])
def test_level_normalizer_makes_features_independent_of_gain(features, gain_db):
    frontend = Frontend(features(), level=LevelNormalizer()).eval()
    wave, lens = waves([16000, 9000])
    wave[1, 9000:] = 0.0  # padding beyond the shorter utterance, as collate leaves it
    feats, feat_lens = frontend(wave, lens)
    louder, louder_lens = frontend(wave * 10 ** (gain_db / 20), lens)
    assert torch.equal(louder_lens, feat_lens)
    torch.testing.assert_close(louder, feats, atol=1e-3, rtol=1e-4)


def test_level_normalizer_reaches_the_target_on_valid_samples_only():
    wave, lens = waves([16000, 7000])
    out, out_lens = LevelNormalizer(target_dbfs=-20.0)(wave, lens)
    assert torch.equal(out_lens, lens) and out.dtype == wave.dtype
    for b, n in enumerate(lens.tolist()):
        valid = out[b, :n].double()
        level = 10 * torch.log10(((valid - valid.mean()) ** 2).mean())
        assert float(level) == pytest.approx(-20.0, abs=1e-4)
        assert not out[b, n:].any(), "padding stays zero"


def test_level_normalizer_removes_a_dc_offset():
    """A DC offset is no sound; kept, it reached the lowest mel bins and changed transcripts."""
    wave, lens = waves([16000, 7000])
    plain, _ = LevelNormalizer()(wave, lens)
    offset, _ = LevelNormalizer()(wave + 0.05, lens)  # the padding too: it stays zero
    torch.testing.assert_close(offset, plain, atol=1e-5, rtol=1e-4)
    for b, n in enumerate(lens.tolist()):
        assert abs(float(offset[b, :n].double().mean())) < 1e-6 and not offset[b, n:].any()


def test_level_normalizer_does_not_blow_up_silence():
    wave = torch.zeros(2, 4000)
    wave[1] = 1e-7 * torch.randn(4000)  # about -140 dBFS: below the -100 dBFS floor
    out, _ = LevelNormalizer(target_dbfs=-26.0, floor_dbfs=-100.0)(wave, torch.tensor([4000, 4000]))
    assert not out[0].any()
    assert float(out[1].abs().max()) < 1e-7 * 10 ** (74 / 20) * 10, "gain capped at +74 dB"
    with pytest.raises(ValueError, match="floor_dbfs"):
        LevelNormalizer(target_dbfs=-30.0, floor_dbfs=-20.0)
    for levels in ({"target_dbfs": 4000.0}, {"floor_dbfs": -400.0}):  # 10 ** (x / 10): past floats
        with pytest.raises(ValueError, match="must be at most 0 .full scale., floor_dbfs"):
            LevelNormalizer(**levels)
