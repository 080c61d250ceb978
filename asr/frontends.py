"""Waveform -> features: level, log-mel, MFCC, linear spectrogram, Kaldi fbank, CMVN, SpecAugment.

Every module here follows one contract, `forward(x, x_lens) -> (y, y_lens)`, batch first with
absolute lengths. Feature extractors take waves `(B, T)` and give features `(B, T', D)`; the
normalisers and SpecAugment take features and keep their shape and lengths.

Framing is Kaldi's `snip_edges`: no centre padding, frame `i` covers samples
`[i * hop, i * hop + win)`, so an utterance of `T` samples gives `num_frames(T, win, hop)`
frames and every frame depends only on that utterance's own samples. Hence *padding
invariance*: `feats[b, :feat_lens[b]]` of a padded batch equals the features of utterance `b`
alone, and frames beyond `feat_lens[b]` are zero. An utterance shorter than one window gives
zero frames (not an error), so one short clip never breaks a batch. The output is trimmed to
`T' = max(feat_lens)`.

Spectra are computed in float32 with autocast disabled, so half-precision inputs and
`torch.autocast` regions give float32 features.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torchaudio
from torch import Tensor, nn
from torch.nn import functional as F

from asr.models.interfaces import lengths_to_mask

# Window names accepted by the STFT frontends; all are periodic (as librosa's `fftbins=True`).
WINDOWS: dict[str, Callable[..., Tensor]] = {
    "hann": torch.hann_window,
    "hamming": torch.hamming_window,
    "blackman": torch.blackman_window,
    "bartlett": torch.bartlett_window,
    "rectangular": torch.ones,
}


def num_frames(num_samples: int | Tensor, win_length: int, hop_length: int) -> int | Tensor:
    """Frames from `num_samples` samples without centre padding (Kaldi `snip_edges`).

    Works on ints and on integer tensors of lengths; fewer samples than one window give 0.

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
    valid = lengths_to_mask(x_lens, x.size(1))  # (B, T)
    return x.masked_fill(~valid[:, :, None], 0.0)


def _check_batch(x: Tensor, x_lens: Tensor, ndim: int) -> None:
    """Raise ValueError unless `x` has `ndim` dims and `x_lens` `(B,)` fits inside it."""
    if x.dim() != ndim:
        raise ValueError(f"expected a {ndim}-D batch, got shape {tuple(x.shape)}")
    if x_lens.shape != (x.size(0),):
        raise ValueError(f"lengths of shape {tuple(x_lens.shape)} for a batch of {x.size(0)}")
    if x_lens.numel() and (int(x_lens.min()) < 0 or int(x_lens.max()) > x.size(1)):
        raise ValueError(f"lengths {x_lens.tolist()} outside [0, {x.size(1)}]")


def _window_fn(name: str) -> Callable[..., Tensor]:
    if name not in WINDOWS:
        raise ValueError(f"unknown window {name!r}; choose one of {sorted(WINDOWS)}")
    return WINDOWS[name]


def _padded_frames(wave: Tensor, win_length: int, hop_length: int) -> int:
    """Frames of the whole padded batch `(B, T)`, not of its longest wave: a batch padded to
    a fixed length (a shape grid) keeps one feature shape, so compiled kernels are reused."""
    return max(num_frames(wave.size(1), win_length, hop_length), 0)


class _SnipEdgesSpectrogram(nn.Module):
    """Power (or magnitude) spectrum `(B, F, T')` framed as `num_frames(T, win, hop)`.

    `torch.stft` frames `n_fft` samples and centres the `win_length` window inside them. Padding
    the wave by the window's offset on the left (and the rest of `n_fft - win_length` on the
    right) makes frame `i` window exactly samples `[i * hop, i * hop + win)`; the padded and
    neighbouring samples meet zero window weight, so they never leak into a frame.
    The power spectrum is `re^2 + im^2` of the complex STFT, which skips the square root (and
    square) that `|z|^2` through `abs` would take.
    """

    def __init__(self, n_fft: int, win_length: int, hop_length: int, window: str, power: float):
        super().__init__()
        if win_length > n_fft:
            raise ValueError(f"win_length ({win_length}) must not exceed n_fft ({n_fft})")
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
        _check_batch(wave, wave_lens, ndim=2)
        lens = num_frames(wave_lens, self.win_length, self.hop_length)
        max_frames = _padded_frames(wave, self.win_length, self.hop_length)
        if max_frames == 0 or wave.size(0) == 0:
            empty = wave.new_zeros(wave.size(0), self.n_freqs, max_frames, dtype=torch.float32)
            return empty, lens
        used = (max_frames - 1) * self.hop_length + self.win_length  # samples the frames cover
        with torch.autocast(device_type=wave.device.type, enabled=False):
            wave = F.pad(wave[:, :used].float(), (self.pad_left, self.pad_right))
            spec = self.stft(wave)  # (B, F, T')
        if spec.is_complex():
            spec = spec.real.square() + spec.imag.square()
        return spec, lens


class LogMelFilterbank(nn.Module):
    """Log mel filterbank energies, `log(max(mel_power, log_floor))`.

    The default mel scale (HTK, unnormalised triangles) is torchaudio's; `mel_scale="slaney",
    mel_norm="slaney"` gives librosa's default filters instead.

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
        mel_scale: "htk" or "slaney".
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
        self.sample_rate = sample_rate
        self.spectrogram = _SnipEdgesSpectrogram(n_fft, win_length, hop_length, window, power)
        self.mel = torchaudio.transforms.MelScale(
            n_mels=n_mels,
            sample_rate=sample_rate,
            f_min=f_min,
            f_max=f_max,
            n_stft=n_fft // 2 + 1,
            norm=mel_norm,
            mel_scale=mel_scale,
        )
        self.log_floor = log_floor
        self.output_dim = n_mels

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Log-mel features of a padded batch of waves.

        Args:
            wave: `(B, T)` samples, any float dtype.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', n_mels)` float32, zero beyond `feat_lens`; feat_lens `(B,)` int64,
            `num_frames(wave_lens, win_length, hop_length)`.
        """
        spec, lens = self.spectrogram(wave, wave_lens)  # (B, F, T')
        with torch.autocast(device_type=spec.device.type, enabled=False):
            mel = self.mel(spec).clamp(min=self.log_floor).log()  # (B, n_mels, T')
        return zero_padding(mel.transpose(1, 2), lens), lens


class MFCC(nn.Module):
    """Mel-frequency cepstral coefficients: orthonormal DCT-II of `LogMelFilterbank` output.

    This is librosa's `mfcc(S=log_mel, dct_type=2, norm="ortho")` convention with a natural
    log (not dB) and no liftering.

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
        if not 0 < n_mfcc <= n_mels:
            raise ValueError(f"n_mfcc ({n_mfcc}) must be in [1, n_mels = {n_mels}]")
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
        dct = torchaudio.functional.create_dct(n_mfcc, n_mels, norm="ortho")  # (n_mels, n_mfcc)
        self.register_buffer("dct", dct, persistent=False)
        self.output_dim = n_mfcc

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """MFCCs of a padded batch of waves.

        Args:
            wave: `(B, T)` samples.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', n_mfcc)` float32, zero beyond `feat_lens`; feat_lens `(B,)`.
        """
        log_mel, lens = self.log_mel(wave, wave_lens)  # (B, T', n_mels)
        with torch.autocast(device_type=log_mel.device.type, enabled=False):
            return log_mel @ self.dct, lens  # padded frames stay zero


class LinearSpectrogram(nn.Module):
    """(Log-)magnitude STFT, `output_dim = n_fft // 2 + 1`.

    Args:
        n_fft: FFT size.
        win_length: window length in samples.
        hop_length: frame shift in samples.
        window: one of `WINDOWS`.
        power: 1 for magnitude, 2 for power.
        log: take `log(max(spec, log_floor))`.
        log_floor: floor applied before the log.
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
    ):
        super().__init__()
        self.spectrogram = _SnipEdgesSpectrogram(n_fft, win_length, hop_length, window, power)
        self.log, self.log_floor = log, log_floor
        self.output_dim = n_fft // 2 + 1

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Spectrogram of a padded batch of waves.

        Args:
            wave: `(B, T)` samples.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', n_fft // 2 + 1)` float32, zero beyond `feat_lens`; feat_lens `(B,)`.
        """
        spec, lens = self.spectrogram(wave, wave_lens)  # (B, F, T')
        if self.log:
            spec = spec.clamp(min=self.log_floor).log()
        return zero_padding(spec.transpose(1, 2), lens), lens


class KaldiFbank(nn.Module):
    """Kaldi-compatible log mel filterbank (`torchaudio.compliance.kaldi.fbank`) per utterance.

    Kaldi works on 16-bit sample values, so with `int16_scale` the [-1, 1] input is multiplied
    by 32768 first; this shifts every log energy by log(32768^2) and keeps Kaldi's
    `energy_floor` and dither on their intended scale. Dither is applied in training mode only.
    Utterances shorter than one frame give zero frames.

    Args:
        sample_rate: sampling rate in Hz.
        num_mel_bins: mel bands (`output_dim`, plus one with `use_energy`).
        frame_length_ms: window length in milliseconds.
        frame_shift_ms: frame shift in milliseconds.
        dither: Gaussian dither amplitude (training only); 0 disables.
        low_freq: lowest mel filter edge in Hz.
        high_freq: highest edge in Hz; <= 0 means offset from Nyquist, as in Kaldi.
        preemphasis_coefficient: pre-emphasis factor.
        window_type: Kaldi window ("povey", "hamming", "hanning", "rectangular", "blackman").
        energy_floor: floor on the energy term.
        use_energy: append log energy as an extra first coefficient.
        remove_dc_offset: subtract each frame's mean.
        int16_scale: multiply the waveform by 32768 (see above).
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
        # The same rounding as torchaudio's kaldi compliance code.
        self.win_length = int(sample_rate * frame_length_ms * 0.001)
        self.hop_length = int(sample_rate * frame_shift_ms * 0.001)
        self.dither = dither
        self.scale = 32768.0 if int16_scale else 1.0
        self.output_dim = num_mel_bins + int(use_energy)

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Kaldi fbank features of a padded batch of waves.

        Args:
            wave: `(B, T)` samples in [-1, 1] (or int16 range with `int16_scale=False`).
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', output_dim)` float32, zero beyond `feat_lens`; feat_lens `(B,)`.
        """
        _check_batch(wave, wave_lens, ndim=2)
        with torch.autocast(device_type=wave.device.type, enabled=False):
            wave = wave.float() * self.scale
            feats = [self._fbank(wave[b, :n]) for b, n in enumerate(wave_lens.tolist())]
        out = wave.new_zeros(
            len(feats), _padded_frames(wave, self.win_length, self.hop_length), self.output_dim
        )
        for b, utterance_feats in enumerate(feats):
            out[b, : len(utterance_feats)] = utterance_feats
        return out, num_frames(wave_lens, self.win_length, self.hop_length)

    def _fbank(self, wave: Tensor) -> Tensor:
        """`(T,)` -> `(frames, output_dim)`."""
        if wave.numel() < self.win_length:
            return wave.new_zeros(0, self.output_dim)
        dither = self.dither if self.training else 0.0
        return torchaudio.compliance.kaldi.fbank(wave[None], dither=dither, **self.options)


# ----------------------------------------------------------------------------- normalisation


def _masked_mean_var(x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
    """Per-utterance mean and (population) variance over valid frames, each `(B, 1, D)`."""
    valid = lengths_to_mask(x_lens, x.size(1))[:, :, None]  # (B, T, 1)
    count = x_lens.clamp(min=1)[:, None, None].to(x.dtype)
    mean = (x * valid).sum(1, keepdim=True) / count
    var = (((x - mean) * valid) ** 2).sum(1, keepdim=True) / count
    return mean, var


class UtteranceCMVN(nn.Module):
    """Per-utterance mean (and optionally variance) normalisation over valid frames only.

    Args:
        norm_means: subtract each utterance's mean.
        norm_vars: divide by each utterance's standard deviation (floored at `std_floor`).
        std_floor: smallest standard deviation divided by.
    """

    def __init__(self, norm_means: bool = True, norm_vars: bool = False, std_floor: float = 1e-5):
        super().__init__()
        self.norm_means, self.norm_vars, self.std_floor = norm_means, norm_vars, std_floor

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Normalise each utterance by its own statistics.

        Args:
            x: `(B, T, D)` features.
            x_lens: `(B,)` valid frames.

        Returns:
            `(B, T, D)` normalised features, zero beyond `x_lens`; `x_lens` unchanged.
        """
        _check_batch(x, x_lens, ndim=3)
        mean, var = _masked_mean_var(x, x_lens)  # (B, 1, D) each
        if self.norm_means:
            x = x - mean
        if self.norm_vars:
            x = x / var.sqrt().clamp(min=self.std_floor)
        return zero_padding(x, x_lens), x_lens


@dataclass(frozen=True, eq=False)
class CMVNStats:
    """Feature statistics accumulated over frames; `+` merges two accumulations.

    >>> s = accumulate_cmvn_stats(torch.tensor([[[1.0], [3.0], [9.0]]]), torch.tensor([2]))
    >>> s.count, s.mean.tolist(), s.std.tolist()
    (2, [2.0], [1.0])
    """

    count: int  # number of frames accumulated
    sum: Tensor  # (D,) float64 per-dimension sum of the frames
    sum_sq: Tensor  # (D,) float64 per-dimension sum of squares
    std_floor: float = 1e-5  # smallest standard deviation reported by `std`

    def __post_init__(self) -> None:
        if self.sum.dim() != 1 or self.sum.shape != self.sum_sq.shape:
            raise ValueError(
                f"sum {tuple(self.sum.shape)} and sum_sq {tuple(self.sum_sq.shape)} must be (D,)"
            )
        if self.count < 0:
            raise ValueError(f"negative frame count {self.count}")

    @property
    def dim(self) -> int:
        return self.sum.numel()

    @property
    def mean(self) -> Tensor:
        """`(D,)` float64 mean per dimension."""
        if self.count == 0:
            raise ValueError("no frames accumulated: the mean is undefined")
        return self.sum / self.count

    @property
    def std(self) -> Tensor:
        """`(D,)` float64 population standard deviation, at least `std_floor`."""
        var = self.sum_sq / self.count - self.mean**2
        return var.clamp(min=self.std_floor**2).sqrt()

    def __add__(self, other: CMVNStats) -> CMVNStats:
        if other.dim != self.dim:
            raise ValueError(f"cannot add stats of dimension {self.dim} and {other.dim}")
        total, total_sq = self.sum + other.sum, self.sum_sq + other.sum_sq
        return CMVNStats(self.count + other.count, total, total_sq, self.std_floor)

    def save(self, path: str | Path) -> None:
        """Write the statistics as JSON (exact float64 round trip)."""
        data = {
            "count": self.count,
            "sum": self.sum.double().tolist(),
            "sum_sq": self.sum_sq.double().tolist(),
            "std_floor": self.std_floor,
        }
        Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CMVNStats:
        """Read statistics written by `save`; a malformed file raises ValueError naming it."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON CMVN stats ({e.msg})") from e
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: bad CMVN stats: {e}") from e

    @classmethod
    def _from_json(cls, data: object) -> CMVNStats:
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        count, std_floor = data["count"], data.get("std_floor", 1e-5)
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError(f"'count' must be an integer, got {count!r}")
        total = torch.tensor(data["sum"], dtype=torch.float64)
        total_sq = torch.tensor(data["sum_sq"], dtype=torch.float64)
        if not (total.isfinite().all() and total_sq.isfinite().all()):
            raise ValueError("non-finite values in 'sum' or 'sum_sq'")
        return cls(count, total, total_sq, float(std_floor))


def accumulate_cmvn_stats(
    feats: Tensor, feat_lens: Tensor, stats: CMVNStats | None = None
) -> CMVNStats:
    """Add the valid frames of a batch to `stats` (padding frames are not counted).

    Args:
        feats: `(B, T, D)` features.
        feat_lens: `(B,)` valid frames per utterance.
        stats: statistics so far, or None to start.

    Returns:
        New statistics including this batch.
    """
    _check_batch(feats, feat_lens, ndim=3)
    valid = lengths_to_mask(feat_lens, feats.size(1))  # (B, T)
    frames = feats[valid].double()  # (N, D)
    batch = CMVNStats(int(valid.sum()), frames.sum(0).cpu(), (frames**2).sum(0).cpu())
    return batch if stats is None else stats + batch


def _load_batch(utterances: list, sample_rate: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Manifest entries -> `(B, T)` zero-padded waves and `(B,)` lengths on `device`."""
    from asr.audio import load_audio

    waves = [load_audio(u.audio_filepath, sample_rate, u.offset, u.duration) for u in utterances]
    lens = torch.tensor([w.numel() for w in waves], dtype=torch.int64)
    return nn.utils.rnn.pad_sequence(waves, batch_first=True).to(device), lens.to(device)


def _module_device(module: nn.Module) -> torch.device:
    tensor = next(module.parameters(), None)
    tensor = next(module.buffers(), None) if tensor is None else tensor
    return torch.device("cpu") if tensor is None else tensor.device


def compute_cmvn_stats(
    manifest_path: str | Path,
    frontend: nn.Module,
    out_path: str | Path,
    sample_rate: int = 16000,
    max_utterances: int | None = None,
    batch_size: int = 16,
) -> CMVNStats:
    """Global CMVN statistics of `frontend` features over a manifest, saved as JSON.

    Pass the feature extractor alone (e.g. `LogMelFilterbank`), not a `Frontend` that already
    normalises. It runs in eval mode (no dither, no augmentation) without gradients.

    Args:
        manifest_path: JSON Lines manifest (`asr.data.manifest`).
        frontend: `forward(wave, wave_lens) -> (feats, feat_lens)`.
        out_path: where to write the statistics (`CMVNStats.save`).
        sample_rate: rate the audio is loaded (and resampled) at.
        max_utterances: use only the first this many utterances.
        batch_size: utterances per forward pass.

    Returns:
        The statistics written to `out_path`.
    """
    from tqdm import tqdm

    from asr.data.manifest import read_manifest

    utterances = read_manifest(manifest_path)[:max_utterances]
    device, was_training = _module_device(frontend), frontend.training
    stats = None
    frontend.eval()
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(utterances), batch_size), desc="cmvn stats"):
                batch = utterances[start : start + batch_size]
                wave, wave_lens = _load_batch(batch, sample_rate, device)
                feats, feat_lens = frontend(wave, wave_lens)
                stats = accumulate_cmvn_stats(feats, feat_lens, stats)
    finally:
        frontend.train(was_training)
    if stats is None or stats.count == 0:
        raise ValueError(f"{manifest_path}: no feature frames to compute CMVN statistics from")
    stats.save(out_path)
    return stats


class GlobalCMVN(nn.Module):
    """Normalise with fixed corpus statistics: `(x - mean) / std` on valid frames.

    Built either from a stats file (`stats_path`, what YAML configs use) or from `mean`/`std`
    tensors. The statistics are buffers, so they follow the module's device and are saved in
    checkpoints.

    Args:
        stats_path: JSON file written by `CMVNStats.save` / `compute_cmvn_stats`.
        mean: `(D,)` mean, instead of `stats_path`.
        std: `(D,)` standard deviation, instead of `stats_path` (default ones).
        norm_means: subtract the mean.
        norm_vars: divide by the standard deviation.
    """

    def __init__(
        self,
        stats_path: str | None = None,
        mean: Tensor | None = None,
        std: Tensor | None = None,
        norm_means: bool = True,
        norm_vars: bool = True,
    ):
        super().__init__()
        if (stats_path is None) == (mean is None):
            raise ValueError("give exactly one of stats_path or mean (and std)")
        if stats_path is not None:
            stats = CMVNStats.load(stats_path)
            mean, std = stats.mean, stats.std
        std = torch.ones_like(mean) if std is None else std
        if mean.dim() != 1 or std.shape != mean.shape:
            raise ValueError(f"mean {tuple(mean.shape)} and std {tuple(std.shape)} must be (D,)")
        if not bool((std > 0).all()):
            raise ValueError(f"std must be positive ({stats_path or 'std tensor'})")
        self.register_buffer("mean", mean.float().clone())
        self.register_buffer("std", std.float().clone())
        self.norm_means, self.norm_vars = norm_means, norm_vars
        self.output_dim = mean.numel()

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Apply the global statistics.

        Args:
            x: `(B, T, D)` features.
            x_lens: `(B,)` valid frames.

        Returns:
            `(B, T, D)` normalised features, zero beyond `x_lens`; `x_lens` unchanged.
        """
        _check_batch(x, x_lens, ndim=3)
        if x.size(2) != self.output_dim:
            raise ValueError(f"features have dimension {x.size(2)}, stats {self.output_dim}")
        if self.norm_means:
            x = x - self.mean
        if self.norm_vars:
            x = x / self.std
        return zero_padding(x, x_lens), x_lens


class LevelNormalizer(nn.Module):
    """Scale each utterance to one RMS level, so the model never sees how loud it was recorded.

    The level is measured over valid samples after removing the mean (a DC offset is not
    speech); the gain is applied to the waveform as it is. A gain ``g`` on the input changes
    nothing but rounding: ``LevelNormalizer()(g * x) == LevelNormalizer()(x)``. Input quieter
    than `floor_dbfs` (digital silence) is raised by at most the gain that brings a
    `floor_dbfs` signal to the target, so silence is not amplified into full-scale noise.

    Args:
        target_dbfs: RMS level every utterance is brought to, in dB re full scale.
        floor_dbfs: levels below this count as silence.
    """

    def __init__(self, target_dbfs: float = -26.0, floor_dbfs: float = -100.0):
        super().__init__()
        if floor_dbfs >= target_dbfs:
            raise ValueError(f"floor_dbfs {floor_dbfs} must be below target_dbfs {target_dbfs}")
        self.target_dbfs, self.floor_dbfs = target_dbfs, floor_dbfs

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Bring every utterance to `target_dbfs`.

        Args:
            wave: `(B, T)` samples.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            `(B, T)` scaled samples in `wave`'s dtype, zero beyond `wave_lens`; `wave_lens`.
        """
        _check_batch(wave, wave_lens, ndim=2)
        x = zero_padding(wave.double()[:, :, None], wave_lens)[:, :, 0]  # (B, T)
        mean, var = _masked_mean_var(x[:, :, None], wave_lens)  # (B, 1, 1) each
        floor = 10 ** (self.floor_dbfs / 10)
        gain = (10 ** (self.target_dbfs / 10) / var[:, 0].clamp(min=floor)).sqrt()  # (B, 1)
        return (x * gain).to(wave.dtype), wave_lens


# ----------------------------------------------------------------------------- augmentation


def _uniform_ints(high: Tensor) -> Tensor:
    """Independent integers uniform in `[0, high]` (inclusive), same shape as `high`."""
    return (torch.rand(high.shape, device=high.device) * (high + 1)).floor().long()


def _band_mask(starts: Tensor, widths: Tensor, size: int) -> Tensor:
    """`(B, N)` bands `[start, start + width)` -> `(B, size)` True where any band covers."""
    pos = torch.arange(size, device=starts.device)[None, None, :]  # (1, 1, size)
    inside = (pos >= starts[..., None]) & (pos < (starts + widths)[..., None])  # (B, N, size)
    return inside.any(dim=1)


class SpecAugment(nn.Module):
    """SpecAugment (Park et al., 2019): time warp, frequency masks and time masks.

    Active only in training mode; the identity in eval mode. Everything is drawn per
    utterance within its own valid length, so padding frames are never touched (they stay
    zero) and lengths are unchanged. Randomness comes from torch's generator on the input's
    device, so `torch.manual_seed` makes it reproducible.

    Args:
        time_warp: maximum warp distance W in frames; 0 disables. The valid part is split at a
            random frame c in (W, L - W) and the two sides are linearly resized so the split
            moves to c + w, w uniform in [-W, W].
        freq_masks: number of frequency masks.
        freq_width: maximum width F of a frequency mask (width uniform in [0, F]).
        time_masks: number of time masks.
        time_width: maximum width of a time mask: a fraction of the utterance's length if a
            float below 1, else a number of frames (capped at the length).
        mask_value: value written into masked cells (0 is the mean of normalised features).
    """

    def __init__(
        self,
        time_warp: int = 5,
        freq_masks: int = 2,
        freq_width: int = 27,
        time_masks: int = 2,
        time_width: int | float = 0.05,
        mask_value: float = 0.0,
    ):
        super().__init__()
        if min(time_warp, freq_masks, freq_width, time_masks, time_width) < 0:
            raise ValueError("SpecAugment sizes and counts must be non-negative")
        self.time_warp, self.mask_value = time_warp, mask_value
        self.freq_masks, self.freq_width = freq_masks, freq_width
        self.time_masks, self.time_width = time_masks, time_width

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Augment a batch in training mode; return it unchanged in eval mode.

        Args:
            x: `(B, T, D)` features, zero beyond `x_lens`.
            x_lens: `(B,)` valid frames.

        Returns:
            `(B, T, D)` augmented features; `x_lens` unchanged.
        """
        if not self.training:
            return x, x_lens
        _check_batch(x, x_lens, ndim=3)
        if self.time_warp > 0:
            x = self._warp(x, x_lens)
        mask = self._freq_mask(x)[:, None, :] | self._time_mask(x, x_lens)[:, :, None]
        valid = lengths_to_mask(x_lens, x.size(1))[:, :, None]  # (B, T, 1)
        return x.masked_fill(mask & valid, self.mask_value), x_lens

    def max_time_width(self, length: Tensor) -> Tensor:
        """Largest time-mask width for utterances of `length` frames.

        >>> SpecAugment(time_width=0.05).max_time_width(torch.tensor([10, 100])).tolist()
        [0, 5]
        >>> SpecAugment(time_width=40).max_time_width(torch.tensor([10, 100])).tolist()
        [10, 40]
        """
        if isinstance(self.time_width, float) and self.time_width < 1:
            return (length * self.time_width).floor().long()
        return length.clamp(max=int(self.time_width))

    def _freq_mask(self, x: Tensor) -> Tensor:
        """`(B, D)` True on masked feature channels."""
        batch, dim = x.size(0), x.size(2)
        shape = (batch, self.freq_masks)
        widths = _uniform_ints(torch.full(shape, min(self.freq_width, dim), device=x.device))
        starts = _uniform_ints(dim - widths)
        return _band_mask(starts, widths, dim)

    def _time_mask(self, x: Tensor, x_lens: Tensor) -> Tensor:
        """`(B, T)` True on masked frames, each mask inside its utterance's length."""
        lens = x_lens.to(x.device)[:, None].expand(-1, self.time_masks)  # (B, N)
        widths = _uniform_ints(self.max_time_width(lens))
        starts = _uniform_ints(lens - widths)
        return _band_mask(starts, widths, x.size(1))

    def _warp(self, x: Tensor, x_lens: Tensor) -> Tensor:
        """Time-warp each utterance's valid frames; utterances of <= 2W + 1 frames are kept."""
        out = x.clone()
        for b, length in enumerate(x_lens.tolist()):
            if length < 2 * self.time_warp + 2:
                continue
            centre = int(torch.randint(self.time_warp + 1, length - self.time_warp, ()))
            shift = int(torch.randint(-self.time_warp, self.time_warp + 1, ()))
            out[b, :length] = _warp_one(x[b, :length], centre, centre + shift)
        return out


def _resize_time(x: Tensor, length: int) -> Tensor:
    """Linear resampling of `(T, D)` frames to `(length, D)`."""
    y = F.interpolate(x.t()[None], size=length, mode="linear", align_corners=False)  # (1, D, L)
    return y[0].t()


def _warp_one(x: Tensor, centre: int, new_centre: int) -> Tensor:
    """Move frame boundary `centre` of `(L, D)` frames to `new_centre`, keeping length L."""
    left = _resize_time(x[:centre], new_centre)
    right = _resize_time(x[centre:], x.size(0) - new_centre)
    return torch.cat([left, right])


# ----------------------------------------------------------------------------- composition


class Frontend(nn.Module):
    """Optional level normalisation, features, optional normalisation, optional augmentation.

    Normalising before augmenting means a masked cell with `mask_value=0` equals the corpus
    mean, as in Park et al. Each part follows `forward(x, x_lens) -> (y, y_lens)`.

    Args:
        features: waves -> features (`LogMelFilterbank`, `MFCC`, `KaldiFbank`, ...).
        normalize: e.g. `GlobalCMVN` or `UtteranceCMVN`.
        augment: e.g. `SpecAugment` (acts in training mode only).
        level: waves -> waves before the features, e.g. `LevelNormalizer`; its CMVN
            statistics must then be computed through it (`asr cmvn --target-dbfs`).
    """

    def __init__(
        self,
        features: nn.Module,
        normalize: nn.Module | None = None,
        augment: nn.Module | None = None,
        level: nn.Module | None = None,
    ):
        super().__init__()
        self.level, self.features = level, features
        self.normalize, self.augment = normalize, augment
        self.output_dim: int = features.output_dim

    def forward(self, wave: Tensor, wave_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Waves to (normalised, augmented) features.

        Args:
            wave: `(B, T)` samples.
            wave_lens: `(B,)` int64 valid samples per utterance.

        Returns:
            feats `(B, T', output_dim)` float32, zero beyond `feat_lens`; feat_lens `(B,)`.
        """
        if self.level is not None:
            wave, wave_lens = self.level(wave, wave_lens)
        feats, feat_lens = self.features(wave, wave_lens)
        if self.normalize is not None:
            feats, feat_lens = self.normalize(feats, feat_lens)
        if self.augment is not None:
            feats, feat_lens = self.augment(feats, feat_lens)
        return feats, feat_lens
