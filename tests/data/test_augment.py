"""asr.data.augment: WaveAugment validation, WaveAugmenter, and SpeechDataset's augmentation."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import soundfile
import torch

from asr.audio import load_audio
from asr.data.augment import (
    GainAugment,
    NarrowbandAugment,
    NoiseAugment,
    ReverbAugment,
    WaveAugment,
    WaveAugmenter,
)
from asr.data.dataset import SpeechDataset
from asr.data.manifest import Utterance
from asr.perturb import change_speed, power
from tests import test_perturb as perturb_tests
from tests.test_perturb import SR, rng, sine


def speechlike(seconds: float = 0.25, seed: int = 0) -> torch.Tensor:
    return perturb_tests.speechlike(seconds, seed)


def write(path, wave, sample_rate: int = SR, subtype: str = "FLOAT") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.asarray(wave, dtype=np.float32), sample_rate, subtype=subtype)
    return str(path)


def relative_change(out: torch.Tensor, wave: torch.Tensor) -> float:
    return float((out - wave).norm() / wave.norm())


def snr_db(clean: torch.Tensor, noisy: torch.Tensor) -> float:
    return 10 * math.log10(float(power(clean)) / float(power(noisy - clean)))


def band_power(wave: torch.Tensor, centre: float, width: float = 20.0) -> float:
    spectrum = torch.fft.rfft(wave.double()).abs() ** 2
    freqs = torch.fft.rfftfreq(wave.numel(), 1 / SR)
    return float(spectrum[(freqs - centre).abs() < width / 2].sum())


class Talkers:
    """A stub `others(rng, count)`: distinct sines, recording each count asked for."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def __call__(self, generator: np.random.Generator, count: int) -> list[torch.Tensor]:
        self.counts.append(count)
        return [sine(500.0 + 150.0 * k, 0.1 + 0.05 * k) for k in range(count)]


@pytest.fixture
def noise_dir(tmp_path):
    """Noise files, one nested, one at another rate and one shorter than any test wave, and a
    file that is not audio."""
    root = tmp_path / "noise"
    write(root / "hum.wav", sine(3000.0, 0.1))
    write(root / "deeper" / "hiss.WAV", np.random.default_rng(0).standard_normal(8000) * 0.1, 8000)
    (root / "README.txt").write_text("not audio")
    return root


@pytest.fixture
def rir_dir(tmp_path):
    """One impulse response: a delayed unit impulse (so reverberation with it is a no-op)."""
    impulse = np.zeros(300)
    impulse[40] = 0.5
    write(tmp_path / "rirs" / "delta.wav", impulse)
    return tmp_path / "rirs"


# ------------------------------------------------------------------------- validation


# (what is wrong, the config, what the message names)
BAD_CONFIGS = [
    ("noise-prob-above-1", {"noise": NoiseAugment(prob=1.5)}, "augment.noise.prob"),
    ("noise-prob-negative", {"noise": NoiseAugment(prob=-0.1)}, "augment.noise.prob"),
    ("reverb-prob", {"reverb": ReverbAugment(prob=2.0)}, "augment.reverb.prob"),
    ("narrowband-prob", {"narrowband": NarrowbandAugment(prob=-1.0)}, "augment.narrowband.prob"),
    ("gain-prob", {"gain": GainAugment(prob=1.01)}, "augment.gain.prob"),
    ("snr-reversed", {"noise": NoiseAugment(snr_db=(20.0, 0.0))}, "augment.noise.snr_db"),
    ("snr-three-values", {"noise": NoiseAugment(snr_db=(0.0, 10.0, 20.0))}, "snr_db"),
    ("rt60-reversed", {"reverb": ReverbAugment(rt60=(0.9, 0.2))}, "augment.reverb.rt60"),
    ("rt60-zero", {"reverb": ReverbAugment(rt60=(0.0, 0.5))}, "augment.reverb.rt60"),
    ("gain-reversed", {"gain": GainAugment(db=(10.0, -30.0))}, "augment.gain.db"),
    ("snr-nan", {"noise": NoiseAugment(snr_db=(math.nan, math.nan))}, "augment.noise.snr_db"),
    ("rt60-infinite", {"reverb": ReverbAugment(rt60=(0.2, math.inf))}, "augment.reverb.rt60"),
    ("gain-infinite", {"gain": GainAugment(db=(-math.inf, 0.0))}, "augment.gain.db"),
    ("talkers-infinite", {"noise": NoiseAugment(babble_talkers=(3, math.inf))}, "babble_talkers"),
    ("start-epoch-nan", {"start_epoch": math.nan}, "augment.start_epoch"),
    ("unknown-kind", {"noise": NoiseAugment(kinds=("white", "purple"))}, "purple"),
    ("no-kinds", {"noise": NoiseAugment(kinds=())}, "augment.noise.kinds"),
    ("files-no-folder", {"noise": NoiseAugment(kinds=("white", "files"))}, "folder"),
    ("folder-no-files", {"noise": NoiseAugment(kinds=("white",), folder="/noise")}, "folder"),
    ("no-talkers", {"noise": NoiseAugment(babble_talkers=(0, 3))}, "babble_talkers"),
    ("talkers-reversed", {"noise": NoiseAugment(babble_talkers=(5, 3))}, "babble_talkers"),
    ("start-epoch-negative", {"start_epoch": -1}, "augment.start_epoch"),
]


@pytest.mark.parametrize(
    "config, names", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_augment_configs_raise_value_error(config, names):
    with pytest.raises(ValueError, match=re.escape(names)):
        WaveAugment(**config)


def test_unknown_noise_kind_error_names_the_kind_and_the_options():
    with pytest.raises(ValueError, match="purple") as error:
        WaveAugment(noise=NoiseAugment(kinds=("purple",)))
    for kind in ("white", "pink", "brown", "babble", "files"):
        assert kind in str(error.value)


def test_valid_boundaries_and_active():
    assert not WaveAugment().active
    WaveAugment(noise=NoiseAugment(prob=0.0), gain=GainAugment(prob=1.0, db=(3.0, 3.0)))
    WaveAugment(reverb=ReverbAugment(prob=1.0, rt60=(0.5, 0.5)))
    WaveAugment(noise=NoiseAugment(kinds=("files",), folder="/anywhere"))  # checked when used
    for name, part in (
        ("noise", NoiseAugment(prob=0.1)),
        ("reverb", ReverbAugment(prob=0.1)),
        ("narrowband", NarrowbandAugment(prob=0.1)),
        ("gain", GainAugment(prob=0.1)),
    ):
        assert WaveAugment(**{name: part}).active, name


@pytest.mark.parametrize("mu_law_prob", [-0.5, 1.5])
def test_mu_law_prob_outside_unit_interval_raises(mu_law_prob):
    with pytest.raises(ValueError, match="mu_law_prob"):
        WaveAugment(narrowband=NarrowbandAugment(prob=0.5, mu_law_prob=mu_law_prob))


# ------------------------------------------------------------------------ WaveAugmenter

EVERYTHING = WaveAugment(
    noise=NoiseAugment(prob=1.0, snr_db=(0.0, 10.0)),
    reverb=ReverbAugment(prob=1.0, rt60=(0.3, 0.6)),
    narrowband=NarrowbandAugment(prob=1.0),
    gain=GainAugment(prob=1.0, db=(-12.0, -6.0)),
)

EACH_KIND = {
    **{
        f"noise-{kind}": WaveAugment(noise=NoiseAugment(prob=1.0, snr_db=(0, 10), kinds=(kind,)))
        for kind in ("white", "pink", "brown", "babble")
    },
    "reverb": WaveAugment(reverb=ReverbAugment(prob=1.0, rt60=(0.3, 0.6))),
    "narrowband-mulaw": WaveAugment(narrowband=NarrowbandAugment(prob=1.0, mu_law_prob=1.0)),
    "narrowband-linear": WaveAugment(narrowband=NarrowbandAugment(prob=1.0, mu_law_prob=0.0)),
    "gain": WaveAugment(gain=GainAugment(prob=1.0, db=(-12.0, -6.0))),
}


@pytest.mark.parametrize("name", ["everything", *EACH_KIND])
def test_augmenter_keeps_length_and_dtype_and_changes_the_wave(name):
    augmenter = WaveAugmenter(EVERYTHING if name == "everything" else EACH_KIND[name], SR)
    talkers = Talkers()
    for seed, num_samples in enumerate((3999, 4000, 6001)):
        wave = speechlike(num_samples / SR, seed=seed)
        out = augmenter(wave, rng(seed), talkers)
        assert out.shape == wave.shape and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        assert relative_change(out, wave) > 0.05, (name, seed)
        assert torch.equal(wave, speechlike(num_samples / SR, seed=seed)), "input left alone"
    assert bool(talkers.counts) == (name in ("everything", "noise-babble"))


def test_augmenter_with_nothing_switched_on_returns_the_wave():
    wave = speechlike()
    out = WaveAugmenter(WaveAugment(), SR)(wave, rng(), Talkers())
    assert torch.equal(out, wave)


def test_augmenter_output_is_a_function_of_the_generator_state():
    augmenter = WaveAugmenter(
        WaveAugment(
            noise=NoiseAugment(prob=0.7),
            reverb=ReverbAugment(prob=0.5),
            narrowband=NarrowbandAugment(prob=0.5),
            gain=GainAugment(prob=0.5),
        ),
        SR,
    )
    wave = speechlike()
    for seed in range(6):
        first = augmenter(wave, rng(seed), Talkers())
        assert torch.equal(first, augmenter(wave, rng(seed), Talkers())), seed
        assert torch.equal(first, WaveAugmenter(augmenter.config, SR)(wave, rng(seed), Talkers()))
    outputs = [augmenter(wave, rng(seed), Talkers()) for seed in range(6)]
    assert all(not torch.equal(outputs[0], other) for other in outputs[1:])


def test_augmenter_applies_each_kind_with_its_probability():
    augmenter = WaveAugmenter(WaveAugment(gain=GainAugment(prob=0.3, db=(-6.0, -3.0))), SR)
    wave = speechlike(0.01)
    changed = sum(not torch.equal(augmenter(wave, rng(s)), wave) for s in range(400))
    assert 0.22 < changed / 400 < 0.38


def test_babble_talker_counts_and_noise_kind_draws():
    config = WaveAugment(
        noise=NoiseAugment(prob=1.0, kinds=("white", "babble"), babble_talkers=(2, 4))
    )
    augmenter, talkers = WaveAugmenter(config, SR), Talkers()
    wave = speechlike(0.05)
    for seed in range(100):
        augmenter(wave, rng(seed), talkers)
    assert 30 < len(talkers.counts) < 70, "babble drawn for about half the items"
    assert set(talkers.counts) == {2, 3, 4}, "talker count drawn from the inclusive range"


def test_babble_without_other_utterances_raises():
    augmenter = WaveAugmenter(EACH_KIND["noise-babble"], SR)
    with pytest.raises(ValueError, match="babble"):
        augmenter(speechlike(), rng(), None)


def test_augmenter_noise_lands_within_the_snr_range():
    config = WaveAugment(noise=NoiseAugment(prob=1.0, snr_db=(5.0, 15.0), kinds=("pink",)))
    augmenter, wave = WaveAugmenter(config, SR), speechlike()
    snrs = [snr_db(wave, augmenter(wave, rng(seed))) for seed in range(30)]
    assert 4.9 < min(snrs) and max(snrs) < 15.1
    assert max(snrs) - min(snrs) > 5.0, "the SNR is drawn, not fixed"


# ---------------------------------------------------------------- noise and RIR folders


def test_noise_files_are_found_recursively_and_used(noise_dir, monkeypatch):
    config = WaveAugment(
        noise=NoiseAugment(prob=1.0, snr_db=(5.0, 5.0), kinds=("files",), folder=str(noise_dir))
    )
    augmenter = WaveAugmenter(config, SR)
    found = {path: seconds for path, seconds in augmenter.noise_files}
    assert found == {
        str(noise_dir / "deeper" / "hiss.WAV"): pytest.approx(1.0),
        str(noise_dir / "hum.wav"): pytest.approx(0.1),
    }
    loaded = []

    def recording_load(path, *args, **kwargs):
        loaded.append(path)
        return load_audio(path, *args, **kwargs)

    monkeypatch.setattr("asr.data.augment.load_audio", recording_load)
    wave = speechlike(0.3)  # longer than hum.wav: it is repeated to fit
    for seed in range(12):
        out = augmenter(wave, rng(seed))
        assert out.shape == wave.shape and out.dtype == torch.float32
        assert torch.isfinite(out).all()
        assert snr_db(wave, out) == pytest.approx(5.0, abs=0.1)
        noise = out - wave
        at_3k = band_power(noise, 3000.0) / band_power(noise, 0.0, width=2 * SR)
        if loaded[-1].endswith("hum.wav"):  # a 3 kHz hum, which speechlike() lacks
            assert at_3k > 0.9, seed
        else:  # broadband hiss
            assert at_3k < 0.1, seed
        assert torch.equal(out, augmenter(wave, rng(seed))), "deterministic per seed"
    assert set(loaded) == set(found), "every noise file gets drawn"


def test_a_corrupt_noise_file_is_named(noise_dir):
    corrupt = noise_dir / "deeper" / "broken.wav"
    corrupt.write_bytes(np.random.default_rng(0).bytes(1000))
    config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("files",), folder=str(noise_dir)))
    with pytest.raises(ValueError, match=re.escape(str(corrupt))):
        WaveAugmenter(config, SR)


def test_an_empty_noise_file_is_named(noise_dir):
    empty = write(noise_dir / "empty.wav", np.zeros(0))
    config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("files",), folder=str(noise_dir)))
    with pytest.raises(ValueError, match=re.escape(empty)):
        WaveAugmenter(config, SR)


def test_a_noise_file_silent_where_drawn_is_named_once(noise_dir, caplog):
    """Silent noise (or one constant value, a one-sample file repeated) has no level to mix
    at: the utterance stays clean, which would otherwise pass unseen."""
    silent = write(noise_dir / "silent.wav", np.zeros(SR))
    for other in ("hum.wav", "deeper/hiss.WAV"):
        (noise_dir / other).unlink()
    config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("files",), folder=str(noise_dir)))
    augmenter, wave = WaveAugmenter(config, SR), speechlike(0.3)
    with caplog.at_level(logging.WARNING, logger="asr.data.augment"):
        for seed in range(3):
            assert torch.equal(augmenter(wave, rng(seed)), wave)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and silent in said[0] and "adds no noise" in said[0], said


@pytest.mark.parametrize("what", ["noise", "reverb"])
@pytest.mark.parametrize("folder", ["missing", "empty", "no_audio"])
def test_missing_or_audio_free_folders_raise(tmp_path, what, folder):
    path = tmp_path / folder
    if folder != "missing":
        path.mkdir()
    if folder == "no_audio":
        (path / "notes.txt").write_text("no audio here")
        (path / "sub").mkdir()
    if what == "noise":
        config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("files",), folder=str(path)))
    else:
        config = WaveAugment(reverb=ReverbAugment(prob=1.0, folder=str(path)))
    with pytest.raises(ValueError, match=f"augment.{what}.folder"):
        WaveAugmenter(config, SR)


def test_impulse_responses_come_from_the_folder(rir_dir):
    augmenter = WaveAugmenter(WaveAugment(reverb=ReverbAugment(prob=1.0, folder=str(rir_dir))), SR)
    assert len(augmenter.rirs) == 1
    wave = speechlike()
    for seed in range(3):
        # a delayed unit impulse: aligned and level-restored, the wave comes back unchanged,
        # where a simulated room would smear it
        assert torch.allclose(augmenter(wave, rng(seed)), wave, atol=1e-5)
    simulated = WaveAugmenter(WaveAugment(reverb=ReverbAugment(prob=1.0)), SR)
    assert not torch.allclose(simulated(wave, rng()), wave, atol=1e-2)


def test_a_silent_impulse_response_is_named(rir_dir):
    silent = write(rir_dir / "silent.wav", np.zeros(200))
    with pytest.raises(ValueError, match=re.escape(silent)) as error:
        WaveAugmenter(WaveAugment(reverb=ReverbAugment(prob=1.0, folder=str(rir_dir))), SR)
    assert "silent" in str(error.value)


def test_a_corrupt_impulse_response_is_named(rir_dir):
    corrupt = rir_dir / "room.wav"
    corrupt.write_bytes(b"RIFF" + np.random.default_rng(1).bytes(500))
    with pytest.raises(ValueError, match=re.escape(str(corrupt))):
        WaveAugmenter(WaveAugment(reverb=ReverbAugment(prob=1.0, folder=str(rir_dir))), SR)


# ----------------------------------------------------------------------- SpeechDataset

FREQS = (400.0, 800.0, 1200.0, 1600.0)  # whole periods in 0.25 s: repeats join seamlessly

DATASET_AUGMENT = WaveAugment(
    noise=NoiseAugment(prob=0.8, snr_db=(0.0, 20.0), babble_talkers=(1, 3)),
    reverb=ReverbAugment(prob=0.5, rt60=(0.2, 0.5)),
    narrowband=NarrowbandAugment(prob=0.5),
    gain=GainAugment(prob=0.5),
)


@pytest.fixture
def tones(tmp_path) -> list[Utterance]:
    """One steady tone per file, each at its own frequency, 0.25 s."""
    return [
        Utterance(write(tmp_path / f"t{k}.wav", sine(freq, 0.25)), 0.25, f"tone {k}", id=f"tone{k}")
        for k, freq in enumerate(FREQS)
    ]


def make_dataset(utterances, config=DATASET_AUGMENT, **kwargs) -> SpeechDataset:
    return SpeechDataset(utterances, augment=WaveAugmenter(config, SR), **kwargs)


def test_dataset_augmentation_is_a_function_of_seed_epoch_and_index(tones):
    """What makes kill-and-resume exact: fresh datasets (and an order- and cache-independent
    one) give the same waves for the same (seed, epoch, index)."""
    utterances = tones * 2
    first = make_dataset(utterances, seed=4, speed_perturb=(0.9, 1.0, 1.1))
    second = make_dataset(utterances, seed=4, speed_perturb=(0.9, 1.0, 1.1))
    cached = make_dataset(utterances, seed=4, speed_perturb=(0.9, 1.0, 1.1), cache_audio=True)
    other_seed = make_dataset(utterances, seed=5, speed_perturb=(0.9, 1.0, 1.1))
    waves = {}
    for epoch in (0, 1):
        for dataset in (first, second, cached, other_seed):
            dataset.set_epoch(epoch)
        for index in range(len(utterances)):
            wave = first[index]["wave"]
            assert torch.equal(wave, second[index]["wave"]), (epoch, index)
            assert len(wave) == math.ceil(4000 / first.speed_factor(index))
            assert wave.dtype == torch.float32 and torch.isfinite(wave).all()
            waves[epoch, index] = wave
        for index in reversed(range(len(utterances))):
            assert torch.equal(cached[index]["wave"], waves[epoch, index]), (epoch, index)
    assert (
        sum(not torch.equal(other_seed[i]["wave"], waves[1, i]) for i in range(len(utterances)))
        >= len(utterances) - 1
    )
    for index in range(len(utterances)):
        if first.speed_factor(index, 0) == first.speed_factor(index, 1):
            assert not torch.equal(waves[0, index], waves[1, index]), index


def test_dataset_epochs_draw_different_augmentations_of_the_same_audio(tones):
    config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("white",)))
    dataset = make_dataset(tones, config)
    clean = load_audio(tones[2].audio_filepath)
    seen = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        wave = dataset[2]["wave"]
        assert not torch.equal(wave, clean)
        assert all(not torch.equal(wave, earlier) for earlier in seen), epoch
        seen.append(wave)


def test_epochs_before_start_epoch_are_clean_and_later_ones_as_without_it(tones):
    """A clean start changes nothing but the epochs it covers: from `start_epoch` on, every
    item gets the draws the same config without it gives (so resumes stay exact)."""
    late = make_dataset(tones, replace(DATASET_AUGMENT, start_epoch=2), speed_perturb=(0.9, 1.1))
    always = make_dataset(tones, DATASET_AUGMENT, speed_perturb=(0.9, 1.1))
    for epoch in range(4):
        late.set_epoch(epoch)
        always.set_epoch(epoch)
        for index in range(len(tones)):
            clean = change_speed(load_audio(tones[index].audio_filepath), late.speed_factor(index))
            wave = late[index]["wave"]
            if epoch < 2:
                assert torch.equal(wave, clean), (epoch, index)
            else:
                assert torch.equal(wave, always[index]["wave"]), (epoch, index)


def test_from_dict_reads_start_epoch_and_rejects_unknown_keys():
    config = WaveAugment.from_dict({"noise": {"prob": 0.5, "snr_db": [0, 30]}, "start_epoch": 7})
    assert config.start_epoch == 7 and config.noise == NoiseAugment(prob=0.5, snr_db=(0, 30))
    assert WaveAugment.from_dict({}).start_epoch == 0
    with pytest.raises(ValueError, match="start_epoch"):
        WaveAugment.from_dict({"nosie": {"prob": 0.5}})


def test_dataset_items_with_the_same_audio_get_different_augmentations(tones):
    config = WaveAugment(noise=NoiseAugment(prob=1.0, kinds=("white",)))
    dataset = make_dataset(tones[:1] * 3, config)
    waves = [dataset[index]["wave"] for index in range(3)]
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not torch.equal(waves[a], waves[b]), (a, b)


def test_cache_holds_clean_waves_under_augmentation(tones):
    """Every kind at probability 1 (babble too, which loads other items into the cache): the
    items are augmented, the cache keeps the clean waves."""
    dataset = make_dataset(tones, EVERYTHING, speed_perturb=(0.9, 1.0), cache_audio=True)
    for epoch in range(3):
        dataset.set_epoch(epoch)
        for index in range(len(tones)):
            wave = dataset[index]["wave"]
            factor = dataset.speed_factor(index)
            clean = change_speed(load_audio(tones[index].audio_filepath), factor)
            assert wave.shape == clean.shape and relative_change(wave, clean) > 0.05
    assert len(dataset._cache) > len(tones), "items and babble talkers were cached"
    for (index, factor), cached in dataset._cache.items():
        fresh = change_speed(load_audio(tones[index].audio_filepath), factor)
        assert torch.equal(cached, fresh), (index, factor)


def test_babble_mixes_only_other_items(tones, monkeypatch):
    config = WaveAugment(
        noise=NoiseAugment(prob=1.0, kinds=("babble",), babble_talkers=(1, len(tones)))
    )
    dataset = make_dataset(tones, config, seed=1)
    calls = []
    load = dataset._wave

    def recording_wave(index, factor):
        calls.append((index, factor))
        return load(index, factor)

    monkeypatch.setattr(dataset, "_wave", recording_wave)
    counts = set()
    for epoch in range(8):
        dataset.set_epoch(epoch)
        for index in range(len(tones)):
            calls.clear()
            dataset[index]
            assert calls[0] == (index, 1.0), "the item itself first"
            talkers = [j for j, _ in calls[1:]]
            assert all(factor == 1.0 for _, factor in calls[1:])
            assert index not in talkers, (epoch, index, talkers)
            assert len(set(talkers)) == len(talkers), "no talker twice"
            assert set(talkers) <= set(range(len(tones)))
            assert 1 <= len(talkers) <= len(tones) - 1
            counts.add(len(talkers))
    assert counts == {1, 2, 3}, "asked for up to 4 talkers, 3 others exist"


def test_babble_noise_holds_every_other_tone_and_not_the_items_own(tones):
    config = WaveAugment(
        noise=NoiseAugment(prob=1.0, snr_db=(0.0, 0.0), kinds=("babble",), babble_talkers=(3, 3))
    )
    dataset = make_dataset(tones, config, seed=2)
    for index, freq in enumerate(FREQS):
        clean = load_audio(tones[index].audio_filepath)
        noise = dataset[index]["wave"] - clean
        others = [band_power(noise, f) for f in FREQS if f != freq]
        assert band_power(noise, freq) < 1e-4 * min(others), index


def test_babble_over_a_dataset_of_one_utterance_is_refused_when_built():
    """It failed inside the first epoch, after setup had accepted it."""
    one = [Utterance("/a/x.wav", 1.0, "X")]
    with pytest.raises(ValueError, match="babble, which mixes other utterances in"):
        SpeechDataset(one, augment=WaveAugmenter(EACH_KIND["noise-babble"], SR))
    SpeechDataset(one, augment=WaveAugmenter(EACH_KIND["noise-white"], SR))
