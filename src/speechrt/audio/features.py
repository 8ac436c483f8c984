"""The ASR front end of DLE Jasper/QuartzNet ("FilterbankFeatures"): audio -> normalised log-mel.

    audio (N,) at 16 kHz -(dither)-> pre-emphasis -> STFT (symmetric Hann 320 centred in n_fft 512,
    hop 160, centre=True, reflect padding) -> power -> Slaney mel (64) -> log(x + 1e-20)
    -> per-feature mean/std over the valid frames -> frames >= ceil(N / 160) zeroed
    -> time right-padded to a multiple of 16

Every item is computed on its own samples only (its STFT reflects at its own end), so an item's
features never depend on its batch-mates; at batch size 1 this is exactly DLE's computation.

Two implementations, tested against each other and against DLE's and NeMo's features:
`log_mel_numpy` here, one item at a time in numpy (float64 inside), for the onnx backend, which
imports no torch, and the streaming front end (speechrt.audio.stream_features); and
`speechrt.runtime.featurizer.BatchLogMel`, a padded batch in one pass in torch, for the eager and
cuda backends and training. The dither noise is drawn by each one's own generator. This module
imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from speechrt.audio.mel import mel_filterbank
from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class FeatureConfig:
    """What the acoustic model was trained on; stored in model.json meta["features"]."""

    sample_rate: int = 16000
    win_length: int = 320  # analysis window: 0.02 s
    hop_length: int = 160  # frame shift: 0.01 s
    n_fft: int = 512  # the 320-sample window is zero-padded (centred) to this
    n_mels: int = 64
    fmin: float = 0.0
    fmax: float | None = None  # None = Nyquist (8 kHz)
    preemph: float = 0.97  # y[0] = x[0], y[t] = x[t] - preemph * x[t-1]
    log_guard: float = 1e-20  # log(mel + log_guard)
    std_eps: float = 1e-5  # added to the unbiased per-feature std before dividing
    pad_align: int = 16  # the time axis is right-padded to a multiple of this
    dither: float = 0.0  # DLE adds dither * randn to the audio even at inference; 0 = off
    # the centred STFT pads each item's ends with: "reflect" (DLE) or "zeros" (NeMo)
    center_pad: str = "reflect"
    # frames that count as speech: "ceil" = ceil(N / hop) (DLE), "floor" = N // hop (NeMo)
    valid_rule: str = "ceil"
    # how a source sampled at 8 kHz or less is heard: None, as resampled (DLE's models);
    # "telephone", filtered to the band the model learnt telephone audio in
    # (speechrt.audio.telephone)
    narrowband: str | None = None

    def __post_init__(self) -> None:
        from speechrt.audio.telephone import BANDS

        if self.narrowband is not None and self.narrowband not in BANDS:
            raise SpeechRTError(f"narrowband must be one of {BANDS} or null: {self.narrowband!r}")
        if self.center_pad not in ("reflect", "zeros"):
            raise SpeechRTError(f"center_pad must be reflect or zeros: {self.center_pad!r}")
        if self.valid_rule not in ("ceil", "floor"):
            raise SpeechRTError(f"valid_rule must be ceil or floor: {self.valid_rule!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise SpeechRTError(f"unknown feature config fields: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dle(cls, fb: dict[str, Any]) -> FeatureConfig:
        """From a DLE yaml `input_val.filterbank_features` section (dither is not carried over)."""
        checks = {"window": "hann", "normalize": "per_feature", "frame_splicing": 1, "log": True}
        for key, want in checks.items():
            if fb.get(key, want) != want:
                raise SpeechRTError(
                    f"unsupported feature setting {key}={fb[key]!r} (need {want!r})"
                )
        sr = int(fb.get("sample_rate", 16000))
        win = int(sr * float(fb.get("window_size", 0.02)))
        return cls(
            sample_rate=sr,
            win_length=win,
            hop_length=int(sr * float(fb.get("window_stride", 0.01))),
            # DLE: n_fft defaults to the next power of two above the window
            n_fft=int(fb.get("n_fft") or 1 << (win - 1).bit_length()),
            n_mels=int(fb.get("n_filt", 64)),
            fmin=float(fb.get("lowfreq", 0.0)),
            fmax=float(fb["highfreq"]) if fb.get("highfreq") else None,
            preemph=float(fb.get("preemph", 0.97)),
            pad_align=int(fb.get("pad_align", 16)),
        )

    @property
    def frame_shift(self) -> float:
        """Seconds between feature frames."""
        return self.hop_length / self.sample_rate

    @property
    def min_samples(self) -> int:
        # The reflect padding of the centred STFT needs more than n_fft / 2 samples; one window
        # is the shortest input worth recognising.
        return max(self.win_length, self.n_fft // 2 + 1)

    def valid_frames(self, num_samples: int) -> int:
        """Frames that count as speech (the STFT yields 1 + N // hop): DLE's seq_len
        ceil(N / hop), or NeMo's N // hop."""
        if self.valid_rule == "floor":
            return num_samples // self.hop_length
        return -(-num_samples // self.hop_length)

    def padded_frames(self, num_samples: int) -> int:
        """Frames of one item on its own: 1 + N // hop, rounded up to a multiple of pad_align."""
        n = 1 + num_samples // self.hop_length
        align = max(self.pad_align, 1)
        return -(-n // align) * align


def check_length(n: int, cfg: FeatureConfig) -> None:
    if n < cfg.min_samples:
        raise SpeechRTError(
            f"audio too short: {n} samples at {cfg.sample_rate} Hz "
            f"(need at least {cfg.min_samples}, {cfg.min_samples / cfg.sample_rate:.3f} s)"
        )


@lru_cache(maxsize=8)
def _analysis(cfg: FeatureConfig) -> tuple[np.ndarray, np.ndarray]:
    """The STFT window (n_fft,): a symmetric Hann of win_length centred in n_fft, as
    torch.stft places it; and the mel basis (n_mels, n_fft // 2 + 1) float64. Never written to."""
    window = np.zeros(cfg.n_fft)
    left = (cfg.n_fft - cfg.win_length) // 2
    window[left : left + cfg.win_length] = np.hanning(cfg.win_length)
    basis = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    window.flags.writeable = False
    basis = basis.astype(np.float64)
    basis.flags.writeable = False
    return window, basis


def frames_log_mel(padded: np.ndarray, frames: int, cfg: FeatureConfig) -> np.ndarray:
    """The log-mel before normalisation of the first `frames` frames of a pre-emphasised signal
    padded by n_fft // 2 before its start: frame t reads padded[t * hop : t * hop + n_fft].
    -> (n_mels, frames) float64. The streaming front end (speechrt.audio.stream_features) calls
    it on the frames whose window is complete."""
    window, basis = _analysis(cfg)
    starts = np.arange(frames)[:, None] * cfg.hop_length
    spec = np.fft.rfft(padded[starts + np.arange(cfg.n_fft)[None, :]] * window, axis=1)
    power = (spec.real**2 + spec.imag**2).T  # (n_fft // 2 + 1, frames)
    return np.log(basis @ power + cfg.log_guard)


def log_mel_numpy(
    audio: np.ndarray, cfg: FeatureConfig, rng: np.random.Generator | None = None
) -> np.ndarray:
    """audio (N,) float at cfg.sample_rate -> normalised log-mel (n_mels, 1 + N // hop) float32.

    Frames from valid_frames(N) on are zero (with DLE's rule, only the last one, when N is a
    multiple of hop)."""
    n = audio.shape[-1]
    check_length(n, cfg)
    x = audio.astype(np.float64)
    if cfg.dither > 0:
        rng = rng if rng is not None else np.random.default_rng()
        x = x + cfg.dither * rng.standard_normal(n)
    if cfg.preemph:
        x = np.concatenate((x[:1], x[1:] - cfg.preemph * x[:-1]))
    # torch.stft(center=True): n_fft // 2 reflected (or zero) samples each side
    x = np.pad(x, cfg.n_fft // 2, mode="reflect" if cfg.center_pad == "reflect" else "constant")
    mel = frames_log_mel(x, 1 + n // cfg.hop_length, cfg)
    valid = cfg.valid_frames(n)
    mean = mel[:, :valid].mean(axis=1, keepdims=True)
    std = mel[:, :valid].std(axis=1, ddof=1, keepdims=True)  # unbiased, as DLE
    mel = (mel - mean) / (std + cfg.std_eps)
    mel[:, valid:] = 0.0
    return mel.astype(np.float32)


def batch_features_numpy(
    audios: Sequence[np.ndarray],
    cfg: FeatureConfig,
    rngs: Sequence[np.random.Generator | None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(N_i,) waveforms -> features (B, n_mels, T) float32 and valid frame counts (B,) int64;
    T = the largest padded_frames(N_i), frames past an item's own padded length zero too."""
    if not audios:
        raise SpeechRTError("no audio to featurise")
    gens = list(rngs) if rngs is not None else [None] * len(audios)
    mels = [log_mel_numpy(a, cfg, g) for a, g in zip(audios, gens, strict=True)]
    t_max = max(cfg.padded_frames(a.shape[-1]) for a in audios)
    feats = np.zeros((len(mels), cfg.n_mels, t_max), dtype=np.float32)
    for i, m in enumerate(mels):
        feats[i, :, : m.shape[1]] = m
    lengths = np.array([cfg.valid_frames(a.shape[-1]) for a in audios], dtype=np.int64)
    return feats, lengths
