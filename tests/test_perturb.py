"""asr.perturb: the waveform degradations shared by training augmentation and robustness tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asr.data.dataset import check_speed_factors
from asr.perturb import (
    NOISE_COLORS,
    _fft_size,
    add_noise,
    babble,
    change_gain,
    change_speed,
    colored_noise,
    fit_length,
    power,
    reverberate,
    rms_dbfs,
    synthetic_rir,
    telephone,
)

SR = 16000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def sine(freq: float, seconds: float = 0.5, amplitude: float = 0.5, sample_rate: int = SR):
    t = torch.arange(round(seconds * sample_rate), dtype=torch.float64) / sample_rate
    return (amplitude * torch.sin(2 * math.pi * freq * t)).float()


def speechlike(seconds: float = 0.5, seed: int = 0) -> torch.Tensor:
    """A few harmonics plus a little noise: broadband, float32, not silent."""
    g = torch.Generator().manual_seed(seed)
    wave = sine(220.0, seconds) + 0.5 * sine(440.0, seconds) + 0.3 * sine(1870.0, seconds)
    return (wave + 0.05 * torch.randn(wave.shape, generator=g)).float()


def snr_db(clean: torch.Tensor, noisy: torch.Tensor) -> float:
    return 10 * math.log10(float(power(clean)) / float(power(noisy - clean)))


def band_power(wave: torch.Tensor, low: float, high: float, sample_rate: int = SR) -> float:
    """Total power in [low, high) Hz, from the periodogram."""
    spectrum = torch.fft.rfft(wave.double()).abs() ** 2
    freqs = torch.fft.rfftfreq(wave.numel(), 1 / sample_rate)
    return float(spectrum[(freqs >= low) & (freqs < high)].sum())


# ------------------------------------------------------------------ length, dtype, levels


def degradations():
    """(name, function of a wave) for every length-keeping degradation."""
    cases = [("gain", lambda w: change_gain(w, -12.0))]
    for color in NOISE_COLORS:

        def noisy(w, c=color):
            return add_noise(w, colored_noise(w.numel(), c, rng()), 5.0)

        cases.append((f"noise-{color}", noisy))
    talkers = [speechlike(0.3, seed=1), speechlike(0.8, seed=2), sine(700.0, 0.1)]
    cases.append(("babble", lambda w: add_noise(w, babble(talkers, w.numel(), rng()), 5.0)))
    cases.append(("reverb", lambda w: reverberate(w, synthetic_rir(0.4, SR, rng()))))
    cases.append(("telephone-mulaw", lambda w: telephone(w, SR, mu_law=True)))
    cases.append(("telephone-linear", lambda w: telephone(w, SR, mu_law=False)))
    return cases


@pytest.mark.parametrize("name, degrade", degradations(), ids=[c[0] for c in degradations()])
@pytest.mark.parametrize("num_samples", [7999, 8000])  # odd and even lengths
def test_degradations_keep_length_and_float32(name, degrade, num_samples):
    wave = speechlike(num_samples / SR)
    assert wave.shape == (num_samples,)
    out = degrade(wave)
    assert out.shape == wave.shape and out.dtype == torch.float32, name
    assert torch.isfinite(out).all(), name
    assert not torch.equal(out, wave), f"{name} changed nothing"


def test_change_gain_scales_the_level_by_the_decibels():
    wave = speechlike()
    for db in (-30.0, -6.0, 0.0, 10.0):
        assert rms_dbfs(change_gain(wave, db)) == pytest.approx(rms_dbfs(wave) + db, abs=1e-4)
    assert torch.equal(change_gain(wave, 0.0), wave)


def test_change_speed_is_identity_at_one_and_exact_in_length():
    wave = torch.randn(2, 3001)
    assert change_speed(wave, 1.0) is wave
    for factor in (0.8, 0.9, 0.95, 1.05, 1.1, 1.2):
        assert change_speed(wave, factor).shape == (2, math.ceil(3001 / factor))


@pytest.mark.parametrize("factor", [1.005, 1.0049, 0.006, 0.004, 11.0, 1.234])
def test_a_speed_factor_the_resampler_would_round_is_refused(factor):
    """It is resampled as a ratio of whole numbers up to 100: 1.005 came out unchanged,
    0.006 at 100x the length, 0.004 failed inside torchaudio."""
    with pytest.raises(ValueError, match=f"speed factor {factor:g}: give one in"):
        change_speed(torch.zeros(100), factor)
    with pytest.raises(ValueError, match="speed factor"):
        check_speed_factors([0.9, factor])


def test_change_speed_length_formula_on_1d_waves():
    for num_samples in (1000, 1601, 16000):
        wave = speechlike(num_samples / SR)
        for factor in (0.9, 1.1, 1.5):
            out = change_speed(wave, factor)
            assert out.shape == (math.ceil(num_samples / factor),)
            assert out.dtype == torch.float32


def test_rms_dbfs_of_known_signals():
    square = torch.full((100,), 0.1) * torch.tensor([1.0, -1.0]).repeat(50)
    assert rms_dbfs(square) == pytest.approx(-20.0, abs=1e-6)
    # a full-scale sine is -3 dBFS (10 log10 1/2), a half-scale one 6 dB lower
    assert rms_dbfs(sine(1000.0, amplitude=1.0)) == pytest.approx(-3.0103, abs=1e-3)
    assert rms_dbfs(sine(1000.0, amplitude=0.5)) == pytest.approx(-9.0309, abs=1e-3)
    # a DC offset is not signal; silence is floored, not -inf
    assert rms_dbfs(sine(1000.0, amplitude=0.5) + 0.3) == pytest.approx(-9.0309, abs=1e-3)
    assert rms_dbfs(torch.zeros(100)) == pytest.approx(-200.0)


# ------------------------------------------------------------------------------ noise


@pytest.mark.parametrize("color", sorted(NOISE_COLORS))
@pytest.mark.parametrize("target", [-5.0, 0.0, 10.0, 30.0])
def test_add_noise_hits_the_requested_snr(color, target):
    clean = speechlike()
    noisy = add_noise(clean, colored_noise(clean.numel(), color, rng(3)), target)
    assert noisy.dtype == torch.float32 and noisy.shape == clean.shape
    assert snr_db(clean, noisy) == pytest.approx(target, abs=0.1)


def test_add_noise_snr_does_not_depend_on_the_noise_level():
    clean = speechlike()
    noise = colored_noise(clean.numel(), "white", rng(1))
    quiet, loud = add_noise(clean, 0.01 * noise, 6.0), add_noise(clean, 100.0 * noise, 6.0)
    assert torch.allclose(quiet, loud, atol=1e-5)


def test_add_noise_leaves_a_silent_wave_or_silent_noise_unchanged():
    noise = colored_noise(8000, "white", rng())
    silent = torch.zeros(8000)
    out = add_noise(silent, noise, 10.0)
    assert torch.equal(out, silent) and out is not silent
    wave = speechlike()
    assert torch.equal(add_noise(wave, torch.zeros(wave.numel()), 0.0), wave)


def test_noise_and_babble_add_no_offset_to_the_speech():
    """A talker or noise recorded with a DC offset adds its sound, not its offset: a silent
    take at an offset would otherwise, scaled to unit power, push the speech to full scale."""
    clean = speechlike()
    noise = colored_noise(clean.numel(), "white", rng(1))
    noisy = add_noise(clean, noise + 0.3, 10.0)
    assert float(noisy.mean() - clean.mean()) == pytest.approx(0.0, abs=1e-3)
    torch.testing.assert_close(noisy, add_noise(clean, noise, 10.0))
    offset_talker = torch.full((4000,), -2 / 32768) + 3e-4 * torch.randn(4000)
    dithered = (torch.randint(-1, 2, (4000,)) - 2) / 32768  # a silent 16-bit take, -95 dBFS
    for talkers in ([torch.full((4000,), -2 / 32768)], [sine(300.0, 0.25), offset_talker]):
        mix = babble(talkers, clean.numel(), rng())
        assert float(mix.mean()) == pytest.approx(0.0, abs=1e-3)
        assert float(add_noise(clean, mix, 20.0).abs().max()) < 1.0
    mix = babble([sine(300.0, 0.25), dithered], clean.numel(), rng())
    alone = babble([sine(300.0, 0.25)], clean.numel(), rng())
    assert band_power(mix, 4000.0, 7000.0) < 1e-3 * band_power(mix, 250.0, 350.0)  # no hiss
    assert float(mix.abs().max()) == pytest.approx(float(alone.abs().max()), rel=1e-3)


def test_add_noise_rejects_mismatched_shapes():
    wave = speechlike()
    with pytest.raises(ValueError):
        add_noise(wave, torch.randn(wave.numel() - 1), 10.0)
    with pytest.raises(ValueError):
        add_noise(wave, torch.randn(1, wave.numel()), 10.0)


@pytest.mark.parametrize("color", sorted(NOISE_COLORS))
@pytest.mark.parametrize("num_samples", [2, 1001, 16000])
def test_colored_noise_has_unit_power_and_the_requested_length(color, num_samples):
    noise = colored_noise(num_samples, color, rng(7))
    assert noise.shape == (num_samples,) and noise.dtype == torch.float32
    assert float(power(noise)) == pytest.approx(1.0, rel=1e-4)


def test_colored_noise_spectra_tilt_as_their_color():
    def low_to_high_density(color: str) -> float:
        """Power per hertz below 500 Hz over power per hertz above 4 kHz (averaged over seeds)."""
        low = high = 0.0
        for seed in range(4):
            noise = colored_noise(SR, color, rng(seed))
            low += band_power(noise, 20.0, 500.0) / 480.0
            high += band_power(noise, 4000.0, 8000.0) / 4000.0
        return low / high

    white, pink, brown = (low_to_high_density(c) for c in ("white", "pink", "brown"))
    assert 0.8 < white < 1.25, "white noise is flat"
    assert pink > 10.0, "pink noise has more power at low frequencies"
    assert brown > 10 * pink, "brown noise tilts further than pink"
    # in total power, not just density: pink and brown put more below 500 Hz than above 4 kHz
    for color in ("pink", "brown"):
        noise = colored_noise(SR, color, rng())
        assert band_power(noise, 0.0, 500.0) > band_power(noise, 4000.0, 8001.0), color


@pytest.mark.parametrize("color", sorted(NOISE_COLORS))
def test_colored_noise_is_a_function_of_the_generator_state(color):
    first = colored_noise(4000, color, rng(11))
    assert torch.equal(first, colored_noise(4000, color, rng(11)))
    assert not torch.equal(first, colored_noise(4000, color, rng(12)))


def test_colored_noise_rejects_an_unknown_color_naming_the_options():
    with pytest.raises(ValueError) as error:
        colored_noise(100, "purple", rng())
    message = str(error.value)
    assert "purple" in message
    for color in NOISE_COLORS:
        assert color in message


def test_fit_length_cuts_or_repeats_the_noise():
    noise = torch.arange(10, dtype=torch.float32)
    for num_samples in (1, 7, 10, 25):
        for seed in range(5):
            out = fit_length(noise, num_samples, rng(seed))
            assert out.shape == (num_samples,)
            # consecutive samples of the periodic extension
            assert torch.equal(out, (out[0] + torch.arange(num_samples)) % 10)
    with pytest.raises(ValueError):
        fit_length(torch.zeros(0), 5, rng())


def test_babble_sums_talkers_at_equal_level():
    loud, quiet = sine(300.0, 0.25, amplitude=0.9), sine(2000.0, 0.25, amplitude=0.01)
    mix = babble([loud, quiet], loud.numel(), rng())
    assert mix.shape == loud.shape and mix.dtype == torch.float32
    # each talker normalised to unit power: the quiet one is as present as the loud one
    assert band_power(mix, 250.0, 350.0) == pytest.approx(band_power(mix, 1950.0, 2050.0), rel=0.05)
    with pytest.raises(ValueError):
        babble([], 100, rng())


# ---------------------------------------------------------------------- reverberation


def test_reverberate_with_a_unit_impulse_returns_the_input():
    wave = speechlike()
    for length in (1, 2, 300):
        rir = torch.zeros(length)
        rir[0] = 1.0
        assert torch.allclose(reverberate(wave, rir), wave, atol=1e-5)
    # a scaled or inverted impulse too: the level is set back to the input's
    assert torch.allclose(reverberate(wave, torch.tensor([0.25, 0.0])), wave, atol=1e-5)


def test_reverberate_keeps_the_input_power():
    wave = speechlike()
    for seed, rt60 in enumerate((0.1, 0.4, 0.9)):
        wet = reverberate(wave, synthetic_rir(rt60, SR, rng(seed)))
        assert float(power(wet)) == pytest.approx(float(power(wave)), rel=1e-4)
        assert not torch.allclose(wet, wave, atol=1e-2), "a real room changes the wave"


def test_reverberate_aligns_the_direct_path_to_time_zero():
    wave = speechlike()
    rir = synthetic_rir(0.3, SR, rng(5))
    delayed = torch.cat([torch.zeros(123), rir])
    assert torch.allclose(reverberate(wave, delayed), reverberate(wave, rir), atol=1e-5)
    impulse = torch.zeros(50)
    impulse[17] = -1.0  # the strongest tap, whatever its sign
    assert torch.allclose(reverberate(wave, impulse), -wave, atol=1e-5)


def test_reverberate_rejects_bad_impulse_responses():
    wave = speechlike()
    with pytest.raises(ValueError):
        reverberate(wave, torch.zeros(0))
    with pytest.raises(ValueError):
        reverberate(wave, torch.ones(2, 10))


@pytest.mark.parametrize("rt60", [0.05, 0.3, 0.7, 1.2])
def test_synthetic_rir_shape_peak_and_decay(rt60):
    rir = synthetic_rir(rt60, SR, rng(2))
    assert rir.shape == (math.ceil(rt60 * SR),) and rir.dtype == torch.float32
    assert float(rir[0]) == 1.0
    assert int(rir.abs().argmax()) == 0 and float(rir[1:].abs().max()) < 1.0
    tenth = rir.numel() // 10
    first, last = float((rir[1:tenth] ** 2).sum()), float((rir[-tenth:] ** 2).sum())
    assert last < 1e-3 * first, "the reverberant energy decays"


def test_synthetic_rir_longer_rooms_are_more_reverberant_and_draws_are_seeded():
    def tail_energy(rt60):
        return float((synthetic_rir(rt60, SR, rng())[1:] ** 2).sum())

    assert tail_energy(0.2) < tail_energy(0.5) < tail_energy(1.0)
    assert torch.equal(synthetic_rir(0.4, SR, rng(1)), synthetic_rir(0.4, SR, rng(1)))
    assert not torch.equal(synthetic_rir(0.4, SR, rng(1)), synthetic_rir(0.4, SR, rng(2)))


@pytest.mark.parametrize("rt60", [0.0, -0.5])
def test_synthetic_rir_rejects_non_positive_rt60(rt60):
    with pytest.raises(ValueError):
        synthetic_rir(rt60, SR, rng())


# ---------------------------------------------------------------------------- telephone


@pytest.mark.parametrize("mu_law", [True, False])
def test_telephone_passes_the_voice_band_only(mu_law):
    def passed(freq: float) -> float:
        wave = sine(freq)
        return float(power(telephone(wave, SR, mu_law=mu_law)) / power(wave))

    assert passed(6000.0) < 0.01, "nothing above 4 kHz survives 8 kHz sampling"
    assert passed(1000.0) > 0.9, "the middle of the band passes"
    assert passed(100.0) < 0.1, "the 300 Hz high-pass attenuates 100 Hz"


def test_telephone_mu_law_adds_quantisation_noise_only_with_mu_law():
    wave = sine(1000.0, amplitude=0.3)
    linear, coded = telephone(wave, SR, mu_law=False), telephone(wave, SR, mu_law=True)
    assert not torch.equal(linear, coded)
    # 8-bit mu-law: about 38 dB signal-to-quantisation-noise for a sine at this level
    assert snr_db(linear, coded) > 25.0


@pytest.mark.parametrize("sample_rate", [8000, 16000, 22050])
def test_telephone_keeps_length_at_other_rates(sample_rate):
    wave = sine(1000.0, seconds=0.3, sample_rate=sample_rate)
    out = telephone(wave, sample_rate)
    assert out.shape == wave.shape and out.dtype == torch.float32


@pytest.mark.parametrize("mu_law", [True, False])
def test_telephone_keeps_input_louder_than_full_scale_whole(mu_law):
    wave = sine(1000.0, amplitude=2.0)
    out = telephone(wave, SR, mu_law=mu_law)
    assert float(power(out) / power(wave)) > 0.9
    assert float(out.abs().max()) > 1.5


# -------------------------------------------------------------------------- _fft_size


def test_fft_size_is_the_smallest_5_smooth_number_at_least_n():
    def is_5_smooth(m: int) -> bool:
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    smooth = [m for m in range(1, 4100) if is_5_smooth(m)]
    for n in range(1, 2000):
        assert _fft_size(n) == next(m for m in smooth if m >= n), n
    for n, expected in ((65599, 65610), (1024, 1024), (1025, 1080), (16001, 16200)):
        size = _fft_size(n)
        assert size == expected and is_5_smooth(size)
