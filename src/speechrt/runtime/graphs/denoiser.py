"""The spectral-subtraction denoiser as a graph of real-valued convolutions.

`Denoiser` (models/denoiser.py) uses complex FFTs, which ONNX cannot hold; this graph computes the
same transform the way DLE's STFT does: the windowed DFT as a strided conv1d with a cos/sin basis,
its inverse as a strided conv_transpose1d with the inverse real-DFT basis (overlap-add included),
and the window-envelope normalisation as a conv_transpose1d of the frame mask. It equals
`Denoiser.forward` to float32 rounding (tested), with the strength per item.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.errors import SpeechRTError
from speechrt.models.denoiser import Denoiser, Vocoder
from speechrt.repo import ComponentInfo


def dft_bases(n_fft: int, window: Tensor) -> tuple[Tensor, Tensor]:
    """Forward (2 * n_freq, 1, n_fft) and inverse (2 * n_freq, 1, n_fft) bases, windowed.

    Rows [0, n_freq) are the real parts, [n_freq, 2 n_freq) the imaginary ones. The inverse basis
    is irfft's: 1/N for DC and Nyquist, 2/N between, imaginary parts of DC and Nyquist ignored.
    """
    n_freq = n_fft // 2 + 1
    k = torch.arange(n_freq, dtype=torch.float64)[:, None]
    n = torch.arange(n_fft, dtype=torch.float64)[None, :]
    angle = 2 * math.pi * ((k * n) % n_fft) / n_fft  # reduce first: exact angles for big k * n
    w = window.double()[None, :]
    forward = torch.cat([torch.cos(angle) * w, -torch.sin(angle) * w])
    c = torch.full((n_freq, 1), 2.0 / n_fft, dtype=torch.float64)
    c[0] = c[-1] = 1.0 / n_fft
    sin = torch.sin(angle)
    sin[0] = sin[-1] = 0.0
    inverse = torch.cat([c * torch.cos(angle) * w, -c * sin * w])
    return forward.float()[:, None, :], inverse.float()[:, None, :]


class DenoiserGraph(nn.Module):
    """forward(audio (B, N), audio_lengths (B,), strength (B,)) -> denoised (B, N) float32."""

    forward_basis: Tensor  # buffers, registered in __init__
    inverse_basis: Tensor
    window_sq: Tensor
    bias: Tensor

    def __init__(self, denoiser: Denoiser) -> None:
        super().__init__()
        d = denoiser.dims
        self.n_fft, self.hop = d.n_fft, d.hop_length
        fwd, inv = dft_bases(d.n_fft, denoiser.window.cpu())
        self.register_buffer("forward_basis", fwd.to(denoiser.window.device))
        self.register_buffer("inverse_basis", inv.to(denoiser.window.device))
        self.register_buffer("window_sq", (denoiser.window**2)[None, None, :].clone())
        self.register_buffer("bias", denoiser.bias.clone())  # (1, n_freq, 1)

    def reflect_pad(self, audio: Tensor, lengths: Tensor) -> Tensor:
        """(B, N) -> (B, N + n_fft): item i reflected about its own first lengths[i] samples."""
        N = audio.shape[1]
        pad = self.n_fft // 2
        t = torch.arange(N + 2 * pad, device=audio.device)[None, :] - pad
        n = lengths[:, None]
        period = (2 * (n - 1)).clamp(min=1)
        u = t.abs() % period
        src = torch.where(u < n, u, period - u)  # within [0, n - 1] for n >= 1
        src = torch.where(n > 0, src, torch.zeros_like(src))
        valid = ((t < n + pad) & (n > 0)).to(audio.dtype)
        return torch.gather(audio, 1, src.expand(audio.shape[0], -1)) * valid

    def forward(self, audio: Tensor, audio_lengths: Tensor, strength: Tensor) -> Tensor:
        B, N = audio.shape
        n_freq = self.n_fft // 2 + 1
        keep = (torch.arange(N, device=audio.device)[None, :] < audio_lengths[:, None]).float()
        x = audio.float() * keep
        spec = F.conv1d(
            self.reflect_pad(x, audio_lengths)[:, None, :], self.forward_basis, stride=self.hop
        )  # (B, 2 n_freq, F)
        re, im = spec[:, :n_freq], spec[:, n_freq:]
        mag = torch.sqrt(re * re + im * im)
        new = torch.relu(mag - strength[:, None, None] * self.bias)
        # polar(new, angle): angle(0) = 0, so a zero bin keeps (new, 0)
        nonzero = mag > 0
        safe = torch.where(nonzero, mag, torch.ones_like(mag))
        re = torch.where(nonzero, new * re / safe, new)
        im = torch.where(nonzero, new * im / safe, torch.zeros_like(im))
        n_frames = spec.shape[2]
        f = torch.arange(n_frames, device=audio.device)[None, :]
        frame_mask = (f < audio_lengths[:, None] // self.hop + 1) & (audio_lengths[:, None] > 0)
        frame_mask = frame_mask.float()[:, None, :]  # (B, 1, F)
        ola = F.conv_transpose1d(
            torch.cat([re, im], 1) * frame_mask, self.inverse_basis, stride=self.hop
        )  # (B, 1, n_fft + hop (F - 1))
        envelope = F.conv_transpose1d(frame_mask, self.window_sq, stride=self.hop)
        tiny = torch.finfo(torch.float32).tiny
        ola = torch.where(envelope > tiny, ola / envelope.clamp(min=tiny), ola)
        pad = self.n_fft // 2
        return ola[:, 0, pad : pad + N] * keep


def build(vocoder: nn.Module, info: ComponentInfo | None) -> DenoiserGraph:
    """The denoiser of a vocoder: its bias spectrum is estimated from the vocoder (in float32)."""
    if info is None or info.mel is None:
        kind = "the vocoder" if info is None else info.kind
        raise SpeechRTError(f"{kind}: model.json has no mel config for the denoiser")
    # built only for the vocoder kinds (speechrt.registry), whose modules have mel_to_audio
    return DenoiserGraph(Denoiser.from_vocoder(cast(Vocoder, vocoder), info.mel))


def example(graph: DenoiserGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Random audio: `batch` items, the longest `length` frames of hop samples each."""
    g = torch.Generator().manual_seed(seed)
    n = length * graph.hop
    audio = torch.randn(batch, n, generator=g).mul(0.3).clamp(-1, 1)
    lengths = torch.tensor([max(1, n - 97 * i) for i in range(batch)])
    return {"audio": audio, "audio_lengths": lengths, "strength": torch.full((batch,), 0.1)}


CODE = GraphCode(build, example)  # named by its registry entry (speechrt.arch)
