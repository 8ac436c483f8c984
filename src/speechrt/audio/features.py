"""The ASR front end of DLE Jasper/QuartzNet ("FilterbankFeatures"): audio -> normalised log-mel.

    audio (N,) at 16 kHz -(dither)-> pre-emphasis -> STFT (symmetric Hann 320 centred in n_fft 512,
    hop 160, centre=True, reflect padding) -> power -> Slaney mel (64) -> log(x + 1e-20)
    -> per-feature mean/std over the valid frames -> frames >= ceil(N / 160) zeroed
    -> time right-padded to a multiple of 16

Every item is computed on its own samples only (its STFT reflects at its own end), so an item's
features never depend on its batch-mates; at batch size 1 this is exactly DLE's computation.

`log_mel` computes one item and is the reference; `BatchLogMel` computes a padded batch in one
pass of ~20 kernels whatever the batch size (no loop over items, no host sync), with the same
meaning item by item (tests/test_featurizer.py asserts the tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor, nn

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
        """DLE seq_len: ceil(N / hop) frames count as speech (the STFT yields 1 + N // hop)."""
        return -(-num_samples // self.hop_length)

    def padded_frames(self, num_samples: int) -> int:
        """Frames of one item on its own: 1 + N // hop, rounded up to a multiple of pad_align."""
        n = 1 + num_samples // self.hop_length
        align = max(self.pad_align, 1)
        return -(-n // align) * align


@lru_cache(maxsize=8)
def _mel_basis(cfg: FeatureConfig, device: torch.device) -> torch.Tensor:
    fb = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    return torch.from_numpy(fb).to(device)  # (n_mels, n_fft // 2 + 1), never written to


@lru_cache(maxsize=8)
def _window(win_length: int, device: torch.device) -> torch.Tensor:
    return torch.hann_window(win_length, periodic=False, device=device)  # symmetric, as DLE


def log_mel(
    audio: torch.Tensor, cfg: FeatureConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """audio: (N,) float at cfg.sample_rate -> normalised log-mel (n_mels, 1 + N // hop).

    Frames from ceil(N / hop) on are zero (only the last one, when N is a multiple of hop).
    """
    n = audio.shape[-1]
    if n < cfg.min_samples:
        raise SpeechRTError(
            f"audio too short: {n} samples at {cfg.sample_rate} Hz "
            f"(need at least {cfg.min_samples}, {cfg.min_samples / cfg.sample_rate:.3f} s)"
        )
    x = audio.float()
    if cfg.dither > 0:
        noise = torch.randn(n, generator=generator, device=x.device)
        x = x + cfg.dither * noise
    if cfg.preemph:
        x = torch.cat((x[:1], x[1:] - cfg.preemph * x[:-1]))
    spec = torch.stft(
        x,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window=_window(cfg.win_length, x.device),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    power = spec.real.square() + spec.imag.square()  # (n_fft // 2 + 1, frames)
    mel = torch.log(_mel_basis(cfg, x.device) @ power + cfg.log_guard)
    valid = cfg.valid_frames(n)
    mean = mel[:, :valid].mean(dim=1, keepdim=True)
    std = mel[:, :valid].std(dim=1, keepdim=True)  # unbiased, as DLE
    mel = (mel - mean) / (std + cfg.std_eps)
    mel[:, valid:] = 0.0
    return mel


def batch_features(
    audios: Sequence[torch.Tensor],
    cfg: FeatureConfig,
    generators: Sequence[torch.Generator | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of (N_i,) waveforms -> features (B, n_mels, T) and valid frame counts (B,) int64.

    The per-item reference for `BatchLogMel`: one `log_mel` per item.
    T = the largest padded_frames(N_i); frames past an item's own padded length are zero too.
    """
    if not audios:
        raise SpeechRTError("no audio to featurise")
    gens = list(generators) if generators is not None else [None] * len(audios)
    mels = [log_mel(a, cfg, g) for a, g in zip(audios, gens, strict=True)]
    t_max = max(cfg.padded_frames(a.shape[-1]) for a in audios)
    feats = mels[0].new_zeros(len(mels), cfg.n_mels, t_max)
    for i, m in enumerate(mels):
        feats[i, :, : m.shape[1]] = m
    lengths = torch.tensor([cfg.valid_frames(a.shape[-1]) for a in audios], dtype=torch.long)
    return feats, lengths.to(feats.device)


class BatchLogMel(nn.Module):
    """`log_mel` of a padded batch: every item on its own samples, all items in one pass.

    forward(audio (B, N) float, lengths (B,) int64 >= cfg.min_samples, noise (B, N) | None)
        -> features (B, n_mels, padded_frames(N)), valid frames (B,) int64

    Samples of an item past its length are ignored (any finite values); its frames from
    valid_frames(length) on are zero. `noise`: the item's dither noise (standard normal, as
    `log_mel` draws it from the item's generator) in its first `length` samples; required when
    cfg.dither > 0, ignored otherwise. The window and mel basis are buffers, so the module moves
    to a device with `.to` and compiles as a whole.
    """

    def __init__(self, cfg: FeatureConfig) -> None:
        super().__init__()
        self.cfg = cfg
        fb = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
        self.window: Tensor
        self.mel_basis: Tensor
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False), False)
        self.register_buffer("mel_basis", torch.from_numpy(fb), False)  # (n_mels, n_fft // 2 + 1)

    def forward(
        self, audio: Tensor, lengths: Tensor, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        B, N = audio.shape
        x = audio.float()
        n = lengths[:, None]  # (B, 1)
        if cfg.dither > 0:
            if noise is None:
                raise SpeechRTError("dither is on: BatchLogMel needs each item's noise")
            x = x + cfg.dither * noise
        if cfg.preemph:  # sample t depends on t and t - 1 only: padding never leaks in
            x = torch.cat((x[:, :1], x[:, 1:] - cfg.preemph * x[:, :-1]), dim=1)
        # centre=True with reflect padding, each item reflected at its own end: pad samples
        # x[pad], ..., x[1] before every row, and after item i's n samples x[n-2], ..., x[n-1-pad]
        # (written over its padding; its frames past 1 + n // hop read what is left there).
        pad = cfg.n_fft // 2
        x = torch.cat((x[:, 1 : pad + 1].flip(1), x, x.new_zeros(B, pad)), dim=1)  # (B, N + 2 pad)
        k = torch.arange(pad, device=x.device)[None, :]  # (1, pad)
        tail = x.gather(1, n - 2 - k + pad)  # (B, pad): x[n - 2 - k], in padded coordinates
        x = x.scatter(1, n + pad + k, tail)
        spec = torch.stft(
            x,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=self.window,
            center=False,
            return_complex=True,
        )  # (B, n_fft // 2 + 1, 1 + N // hop)
        power = spec.real.square() + spec.imag.square()
        mel = torch.log(self.mel_basis @ power + cfg.log_guard)  # (B, n_mels, T)
        T = mel.shape[2]
        valid = (lengths + cfg.hop_length - 1) // cfg.hop_length  # (B,) = valid_frames
        keep = (torch.arange(T, device=x.device)[None, :] < valid[:, None])[:, None, :]
        count = valid[:, None, None].to(mel.dtype)  # (B, 1, 1)
        mean = torch.where(keep, mel, 0.0).sum(dim=2, keepdim=True) / count
        centred = torch.where(keep, mel - mean, 0.0)
        std = (centred.square().sum(dim=2, keepdim=True) / (count - 1)).sqrt()  # unbiased
        mel = centred / (std + cfg.std_eps)
        return nn.functional.pad(mel, (0, cfg.padded_frames(N) - T)), valid
