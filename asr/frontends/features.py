"""Waveform -> float32 features, framed as Kaldi's `snip_edges` so padding changes nothing."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable

import torch
import torchaudio
from torch import Tensor, nn
from torch.nn import functional as F

from asr.models.interfaces import lengths_to_mask

# Periodic windows, as librosa's `fftbins=True`.
WINDOWS: dict[str, Callable[..., Tensor]] = {
    "hann": torch.hann_window,
    "hamming": torch.hamming_window,
    "blackman": torch.blackman_window,
    "bartlett": torch.bartlett_window,
    "rectangular": torch.ones,
}


def num_frames(num_samples: int | Tensor, win_length: int, hop_length: int) -> int | Tensor:
    """Frames from `num_samples` samples (int or tensor) without centre padding; 0 if too few.

    >>> [num_frames(n, 400, 160) for n in (0, 399, 400, 559, 560, 16000)]
    [0, 0, 1, 1, 2, 98]
    >>> num_frames(torch.tensor([399, 401, 16001]), 400, 160).tolist()
    [0, 1, 98]
    """
    if win_length <= 0 or hop_length <= 0:
        raise ValueError(f"win_length ({win_length}) and hop_length ({hop_length}) must be > 0")
    frames = (num_samples - win_length) // hop_length + 1
    return frames.clamp(min=0) if isinstance(frames, Tensor) else max(frames, 0)


def zero_padding(x: Tensor, x_lens: Tensor) -> Tensor:
    """`x` `(B, T, D)` with every frame at or beyond `x_lens[b]` set to zero."""
    valid = lengths_to_mask(x_lens, x.size(1))
    return x.masked_fill(~valid[:, :, None], 0.0)


def check_batch(x: Tensor, x_lens: Tensor, ndim: int) -> None:
    """Raise ValueError unless `x` is a floating-point batch of `ndim` dims and `x_lens` `(B,)`,
    whole numbers, fits inside it."""
    if x.dim() != ndim:
        raise ValueError(f"expected a {ndim}-D batch, got shape {tuple(x.shape)}")
    if not x.is_floating_point():  # integer samples: the recognizer scales them, not this
        raise ValueError(f"expected floating-point values (audio in [-1, 1]), got {x.dtype}")
    if x_lens.is_floating_point() or x_lens.is_complex():
        raise ValueError(f"expected whole-number lengths, got {x_lens.dtype}")
    if x_lens.shape != (x.size(0),):
        raise ValueError(f"lengths of shape {tuple(x_lens.shape)} for a batch of {x.size(0)}")
    if x_lens.numel() and (int(x_lens.min()) < 0 or int(x_lens.max()) > x.size(1)):
        raise ValueError(f"lengths {x_lens.tolist()} outside [0, {x.size(1)}]")


def must_be(value: float, zero_ok: bool = False) -> str | None:
    """What a setting that must be finite and positive (>= 0 where `zero_ok`) must be, or None.

    >>> must_be(1e-10), must_be(0.0), must_be(0.0, zero_ok=True), must_be(math.inf)
    (None, 'positive', None, 'finite')
    """
    if not math.isfinite(value):  # inf passes `value > 0`, then gives NaN or inf features
        return "finite"
    if zero_ok:
        return None if value >= 0 else ">= 0"
    return None if value > 0 else "positive"


KALDI_WINDOWS = ("povey", "hamming", "hanning", "rectangular", "blackman")  # torchaudio's kaldi


def _window_fn(name: str) -> Callable[..., Tensor]:
    if name not in WINDOWS:
        raise ValueError(f"window must be one of {sorted(WINDOWS)}, got {name!r}")
    return WINDOWS[name]


def _padded_frames(wave: Tensor, win_length: int, hop_length: int) -> int:
    """Frames of the whole padded batch, so a fixed padded length keeps one feature shape."""
    return max(num_frames(wave.size(1), win_length, hop_length), 0)


class _SnipEdgesSpectrogram(nn.Module):
    """Power (or magnitude) spectrum `(B, F, T')`; frame `i` windows `[i * hop, i * hop + win)`."""

    def __init__(self, n_fft: int, win_length: int, hop_length: int, window: str, power: float):
        super().__init__()
        if win_length > n_fft:
            raise ValueError(f"win_length ({win_length}) must not exceed n_fft ({n_fft})")
        for name, length in (("win_length", win_length), ("hop_length", hop_length)):
            if length < 1:  # else every input read as too short to subsample
                raise ValueError(f"{name} ({length}) must be positive")
        if need := must_be(power):  # else silence gives NaN features
            raise ValueError(f"power ({power}) must be {need}: 1 for magnitude, 2 for power")
        self.win_length, self.hop_length = win_length, hop_length
        self.pad_left = (n_fft - win_length) // 2  # where torch.stft places the window
        self.pad_right = n_fft - win_length - self.pad_left
        self.n_freqs = n_fft // 2 + 1
        self.stft = torchaudio.transforms.Spectrogram(
            n_fft=n_fft,
            win_length=win_length,
            hop_length=hop_length,
            window_fn=_window_fn(window),
            power=None if power == 2 else power,  # None: the complex STFT
            center=False,
        )

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        check_batch(wave, wave_lens, ndim=2)
        lens = num_frames(wave_lens, self.win_length, self.hop_length)
        max_frames = _padded_frames(wave, self.win_length, self.hop_length)
        if max_frames == 0 or wave.size(0) == 0:
            dtype = self.stft.window.dtype  # what the STFT gives: float64 in a double() model
            empty = wave.new_zeros(wave.size(0), self.n_freqs, max_frames, dtype=dtype)
            return empty, lens
        used = (max_frames - 1) * self.hop_length + self.win_length  # samples the frames cover
        with torch.autocast(device_type=wave.device.type, enabled=False):
            wave = F.pad(wave[:, :used].float(), (self.pad_left, self.pad_right))
            spec = self.stft(wave)
        if spec.is_complex():
            spec = spec.real.square() + spec.imag.square()
        return spec, lens


class LogMelFilterbank(nn.Module):
    """Log mel filterbank energies, `log(max(mel_power, log_floor))`.

    Args:
        sample_rate: sampling rate of the input in Hz.
        n_fft: FFT size; the `win_length`-sample frame is zero-padded to it.
        win_length: window (frame) length in samples, 400 = 25 ms at 16 kHz.
        hop_length: frame shift in samples, 160 = 10 ms at 16 kHz.
        n_mels: number of mel bands (`output_dim`).
        f_min: lowest filter edge in Hz.
        f_max: highest filter edge in Hz; None means `sample_rate / 2`.
        window: one of `WINDOWS`.
        power: exponent of the magnitude (2 for power, 1 for magnitude).
        log_floor: values are clamped to at least this before the log.
        mel_scale: "htk" (torchaudio's) or "slaney" (librosa's, with `mel_norm="slaney"`).
        mel_norm: None or "slaney" (area normalisation of the triangles).
    """

    def __init__(
        self,
        sample_rate: int = 16000,
        n_fft: int = 512,
        win_length: int = 400,
        hop_length: int = 160,
        n_mels: int = 80,
        f_min: float = 0.0,
        f_max: float | None = None,
        window: str = "hann",
        power: float = 2.0,
        log_floor: float = 1e-10,
        mel_scale: str = "htk",
        mel_norm: str | None = None,
    ):
        super().__init__()
        for name, value in (
            ("sample_rate", sample_rate),
            ("n_mels", n_mels),
            ("log_floor", log_floor),
        ):
            if need := must_be(value):  # each named alone: a config's line is found by the name
                raise ValueError(f"LogMelFilterbank: {name} ({value}) must be {need}")
        for name, value, allowed in (("mel_scale", mel_scale, ("htk", "slaney")),
                                     ("mel_norm", mel_norm, (None, "slaney"))):  # fmt: skip
            if value not in allowed:  # torchaudio's refusal names neither, in a traceback
                choices = " or ".join(json.dumps(a) for a in allowed)
                raise ValueError(f"LogMelFilterbank: {name} must be {choices}, got {value!r}")
        nyquist = sample_rate / 2
        if not 0 <= f_min < (nyquist if f_max is None else f_max) <= nyquist:
            raise ValueError(
                f"LogMelFilterbank: need 0 <= f_min < f_max <= {nyquist:g} Hz (half the "
                f"{sample_rate} Hz sample rate), got f_min={f_min}, f_max={f_max}"
            )
        self.sample_rate = sample_rate
        self.spectrogram = _SnipEdgesSpectrogram(n_fft, win_length, hop_length, window, power)
        with warnings.catch_warnings():  # torchaudio's warning of empty bands: refused below
            warnings.simplefilter("ignore", UserWarning)
            self.mel = torchaudio.transforms.MelScale(
                n_mels=n_mels,
                sample_rate=sample_rate,
                f_min=f_min,
                f_max=f_max,
                n_stft=n_fft // 2 + 1,
                norm=mel_norm,
                mel_scale=mel_scale,
            )
        empty = int((self.mel.fb.amax(0) == 0).sum())
        if empty:
            raise ValueError(
                f"LogMelFilterbank: {empty} of the {n_mels} mel bands cover no FFT bin "
                f"(n_fft={n_fft}, {f_min:g}-{nyquist if f_max is None else f_max:g} Hz): "
                "use fewer mel bands or a larger n_fft"
            )
        self.log_floor = log_floor
        self.output_dim = n_mels

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)`, wave_lens `(B,)`. Returns: `(B, T', n_mels)`, lengths `(B,)`."""
        spec, lens = self.spectrogram(wave, wave_lens)
        with torch.autocast(device_type=spec.device.type, enabled=False):
            mel = self.mel(spec).clamp(min=self.log_floor).log()  # (B, n_mels, T')
        return zero_padding(mel.transpose(1, 2), lens), lens


class MFCC(nn.Module):
    """MFCCs: orthonormal DCT-II of `LogMelFilterbank` output (natural log, no liftering).

    Args:
        n_mfcc: number of coefficients kept (`output_dim`), at most `n_mels`.
        **log-mel options: as `LogMelFilterbank`.
    """

    def __init__(
        self,
        n_mfcc: int = 40,
        sample_rate: int = 16000,
        n_fft: int = 512,
        win_length: int = 400,
        hop_length: int = 160,
        n_mels: int = 80,
        f_min: float = 0.0,
        f_max: float | None = None,
        window: str = "hann",
        power: float = 2.0,
        log_floor: float = 1e-10,
        mel_scale: str = "htk",
        mel_norm: str | None = None,
    ):
        super().__init__()
        self.sample_rate = sample_rate
        self.log_mel = LogMelFilterbank(
            sample_rate=sample_rate,
            n_fft=n_fft,
            win_length=win_length,
            hop_length=hop_length,
            n_mels=n_mels,
            f_min=f_min,
            f_max=f_max,
            window=window,
            power=power,
            log_floor=log_floor,
            mel_scale=mel_scale,
            mel_norm=mel_norm,
        )
        if not 0 < n_mfcc <= n_mels:
            raise ValueError(f"n_mfcc ({n_mfcc}) must be in [1, n_mels = {n_mels}]")
        dct = torchaudio.functional.create_dct(n_mfcc, n_mels, norm="ortho")  # (n_mels, n_mfcc)
        self.register_buffer("dct", dct, persistent=False)
        self.output_dim = n_mfcc

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)`, wave_lens `(B,)`. Returns: `(B, T', n_mfcc)`, lengths `(B,)`."""
        log_mel, lens = self.log_mel(wave, wave_lens)
        with torch.autocast(device_type=log_mel.device.type, enabled=False):
            return log_mel @ self.dct, lens  # padded frames stay zero


class LinearSpectrogram(nn.Module):
    """(Log-)magnitude STFT, `output_dim = n_fft // 2 + 1`.

    Args:
        power: 1 for magnitude, 2 for power.
        log: take `log(max(spec, log_floor))`.
        sample_rate: the audio's rate in Hz, which recognizers resample their input to.
        others: as `LogMelFilterbank`.
    """

    def __init__(
        self,
        n_fft: int = 512,
        win_length: int = 400,
        hop_length: int = 160,
        window: str = "hann",
        power: float = 1.0,
        log: bool = True,
        log_floor: float = 1e-10,
        sample_rate: int = 16000,
    ):
        super().__init__()
        if log and (need := must_be(log_floor)):  # digital silence would give -inf features
            raise ValueError(f"log_floor ({log_floor}) must be {need}")
        if need := must_be(sample_rate):  # else refused by resampling, far from the config
            raise ValueError(f"LinearSpectrogram: sample_rate ({sample_rate}) must be {need}")
        self.sample_rate = sample_rate
        self.spectrogram = _SnipEdgesSpectrogram(n_fft, win_length, hop_length, window, power)
        self.log, self.log_floor = log, log_floor
        self.output_dim = n_fft // 2 + 1

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)`, wave_lens `(B,)`. Returns: `(B, T', F)`, lengths `(B,)`."""
        spec, lens = self.spectrogram(wave, wave_lens)
        if self.log:
            spec = spec.clamp(min=self.log_floor).log()
        return zero_padding(spec.transpose(1, 2), lens), lens


class KaldiFbank(nn.Module):
    """Kaldi-compatible log mel filterbank (`torchaudio.compliance.kaldi.fbank`) per utterance.

    Args:
        sample_rate: sampling rate in Hz.
        num_mel_bins: mel bands (`output_dim`, plus one with `use_energy`).
        frame_length_ms: window length in milliseconds.
        frame_shift_ms: frame shift in milliseconds.
        dither: Gaussian dither amplitude (training only); 0 disables.
        low_freq: lowest mel filter edge in Hz.
        high_freq: highest edge in Hz; <= 0 means offset from Nyquist, as in Kaldi.
        preemphasis_coefficient: pre-emphasis factor.
        window_type: one of `KALDI_WINDOWS`.
        energy_floor: floor on the energy term.
        use_energy: append log energy as an extra first coefficient.
        remove_dc_offset: subtract each frame's mean.
        int16_scale: scale [-1, 1] input to Kaldi's 16-bit range (keeps `energy_floor` meaning).
    """

    def __init__(
        self,
        sample_rate: int = 16000,
        num_mel_bins: int = 80,
        frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0,
        dither: float = 0.0,
        low_freq: float = 20.0,
        high_freq: float = 0.0,
        preemphasis_coefficient: float = 0.97,
        window_type: str = "povey",
        energy_floor: float = 1.0,
        use_energy: bool = False,
        remove_dc_offset: bool = True,
        int16_scale: bool = True,
    ):
        super().__init__()
        if need := must_be(sample_rate):  # else blamed on the frame lengths
            raise ValueError(f"KaldiFbank: sample_rate ({sample_rate}) must be {need}")
        for name, value in (("dither", dither), ("energy_floor", energy_floor)):
            if need := must_be(value, zero_ok=True):  # else NaN features, blamed on the data
                raise ValueError(f"KaldiFbank: {name} ({value}) must be {need}")
        if window_type not in KALDI_WINDOWS:
            raise ValueError(
                f"KaldiFbank: window_type must be one of {KALDI_WINDOWS}, got {window_type!r}"
            )
        self.sample_rate = sample_rate
        self.options = dict(
            sample_frequency=float(sample_rate),
            num_mel_bins=num_mel_bins,
            frame_length=frame_length_ms,
            frame_shift=frame_shift_ms,
            low_freq=low_freq,
            high_freq=high_freq,
            preemphasis_coefficient=preemphasis_coefficient,
            window_type=window_type,
            energy_floor=energy_floor,
            use_energy=use_energy,
            remove_dc_offset=remove_dc_offset,
            snip_edges=True,
        )
        for name, ms in (("frame_length_ms", frame_length_ms), ("frame_shift_ms", frame_shift_ms)):
            if not math.isfinite(ms):  # else a bare OverflowError from int() below
                raise ValueError(f"KaldiFbank: {name} ({ms}) must be finite")
        # the same rounding as torchaudio's kaldi compliance code
        self.win_length = int(sample_rate * frame_length_ms * 0.001)
        self.hop_length = int(sample_rate * frame_shift_ms * 0.001)
        frames = {"frame_length_ms": (frame_length_ms, self.win_length),
                  "frame_shift_ms": (frame_shift_ms, self.hop_length)}  # fmt: skip
        for name, (ms, samples) in frames.items():
            if samples < 1:
                raise ValueError(
                    f"KaldiFbank: {name} ({ms}) must give at least one sample at {sample_rate} Hz"
                )
        if num_mel_bins < 1:
            raise ValueError(f"KaldiFbank: num_mel_bins ({num_mel_bins}) must be positive")
        try:  # torchaudio checks its options only on the first wave, with bare assertions
            torchaudio.compliance.kaldi.fbank(torch.zeros(1, self.win_length), **self.options)
        except Exception as e:
            raise ValueError(f"KaldiFbank: {e or type(e).__name__} (options {self.options})") from e
        padded = 1 << (self.win_length - 1).bit_length()  # the FFT size torchaudio rounds up to
        banks, _ = torchaudio.compliance.kaldi.get_mel_banks(
            num_mel_bins, padded, float(sample_rate), low_freq, high_freq, 100.0, -500.0, 1.0
        )  # its defaults; it does not check for bands without bins, which are log(eps) always
        empty = int((banks.amax(1) == 0).sum())
        if empty:
            raise ValueError(
                f"KaldiFbank: {empty} of the {num_mel_bins} mel bands cover no FFT bin (an "
                f"FFT of {padded} at {sample_rate} Hz): fewer num_mel_bins, or a longer "
                "frame_length_ms"
            )
        self.dither = dither
        # no data: it follows .double() and .to(), so the features take the model's dtype
        self.register_buffer("dtype_tag", torch.empty(0), persistent=False)
        self.scale = 32768.0 if int16_scale else 1.0
        self.output_dim = num_mel_bins + int(use_energy)

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Args: wave `(B, T)` in [-1, 1], wave_lens `(B,)`. Returns: `(B, T', D)`, lengths."""
        check_batch(wave, wave_lens, ndim=2)
        with torch.autocast(device_type=wave.device.type, enabled=False):
            wave = wave.float() * self.scale
            feats = [self._fbank(wave[b, :n]) for b, n in enumerate(wave_lens.tolist())]
        out = wave.new_zeros(
            len(feats),
            _padded_frames(wave, self.win_length, self.hop_length),
            self.output_dim,
            dtype=self.dtype_tag.dtype,
        )
        for b, utterance_feats in enumerate(feats):
            out[b, : len(utterance_feats)] = utterance_feats
        return out, num_frames(wave_lens, self.win_length, self.hop_length)

    def _fbank(self, wave: Tensor) -> Tensor:
        if wave.numel() < self.win_length:
            return wave.new_zeros(0, self.output_dim)
        dither = self.dither if self.training else 0.0
        return torchaudio.compliance.kaldi.fbank(wave[None], dither=dither, **self.options)
