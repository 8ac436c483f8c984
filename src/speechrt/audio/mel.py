"""The DLE TTS mel spectrogram ("Tacotron STFT"), shared by every TTS acoustic model and vocoder.

An acoustic model and a vocoder form a voice only when their MelConfig is equal: the vocoder was
trained to invert exactly this transform.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MelConfig:
    sampling_rate: int = 22050
    n_fft: int = 1024  # "filter_length" in DLE
    hop_length: int = 256  # audio samples per mel frame
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float | None = 8000.0  # None = Nyquist
    log_clamp: float = 1e-5  # log(clamp(mel, min=log_clamp)): "dynamic range compression"

    @classmethod
    def from_dict(cls, d: dict) -> MelConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpeechRTError(f"unknown mel config fields: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def check_matches(self, other: MelConfig, what: str = "acoustic model and vocoder") -> None:
        """Fail loudly when two components disagree on the mel transform."""
        if self != other:
            diff = {
                k: (v, getattr(other, k))
                for k, v in self.to_dict().items()
                if getattr(other, k) != v
            }
            detail = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items())
            raise SpeechRTError(f"mel configs of the {what} differ: {detail}")


def _hz_to_mel(f: np.ndarray | float) -> np.ndarray:
    # Slaney's auditory toolbox scale (librosa htk=False): linear below 1 kHz, log above.
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(
        f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp
    )


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


@lru_cache(maxsize=16)
def mel_filterbank(
    sampling_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None
) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters, (n_mels, n_fft // 2 + 1) float32.

    Same values as librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax) with its defaults.
    """
    fmax = sampling_rate / 2 if fmax is None else fmax
    fft_freqs = np.linspace(0, sampling_rate / 2, 1 + n_fft // 2)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]  # equal-area filters
    return weights.astype(np.float32)


def magnitude_spectrogram(audio: torch.Tensor, cfg: MelConfig) -> torch.Tensor:
    """audio: (B, N) float in [-1, 1] -> magnitude (B, n_fft // 2 + 1, N // hop + 1).

    Periodic Hann window, reflect padding of n_fft / 2 ("center"), no epsilon in the magnitude.
    """
    import torch

    window = torch.hann_window(cfg.win_length, periodic=True, device=audio.device)
    spec = torch.stft(
        audio.float(),
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window=window,
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    return spec.abs()


def mel_spectrogram(audio: torch.Tensor, cfg: MelConfig = MelConfig()) -> torch.Tensor:
    """audio: (B, N) or (N,) float in [-1, 1] -> log mel (B, n_mels, N // hop + 1), natural log."""
    import torch

    squeeze = audio.dim() == 1
    if squeeze:
        audio = audio[None]
    basis = torch.from_numpy(
        mel_filterbank(cfg.sampling_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    ).to(audio.device)
    mel = torch.matmul(basis, magnitude_spectrogram(audio, cfg))
    mel = torch.log(torch.clamp(mel, min=cfg.log_clamp))
    return mel[0] if squeeze else mel
