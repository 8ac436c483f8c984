"""Spectral-subtraction denoiser for any vocoder (DLE's WaveGlow/HiFi-GAN `Denoiser`).

The vocoder's own bias ("hiss" it produces even from silence) is estimated once: run the vocoder
on an all-zero mel of 88 frames (WaveGlow with sigma 0), take the STFT magnitude of its first
frame -> bias (1, n_fft / 2 + 1, 1). Denoising subtracts strength * bias from every frame's
magnitude, clamps at 0, and inverts the STFT with the original phase.

The STFT is DLE's conv-based one, written with FFTs: periodic Hann window (zero-padded to n_fft at
the centre), reflect padding of n_fft / 2 on both sides, stride hop; the inverse overlap-adds the
windowed inverse DFTs, divides by the window sum-square envelope where it exceeds float32's tiny,
and drops n_fft / 2 samples at each end. DLE's pseudo-inverse of its half-spectrum basis (scaled,
then rescaled by n_fft / hop) is exactly the inverse real DFT.

Batches: every item is padded by reflecting its own samples, frames past its end are dropped and
the envelope counts only its own frames, so an item's output equals its unbatched output.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from speechrt.arch.denoiser import DenoiserDims
from speechrt.audio.mel import MelConfig
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions

BIAS_FRAMES = 88  # length of the all-zero mel the bias audio is generated from (DLE)
N_OVERLAP = 4  # hop = n_fft / 4 (DLE's `n_overlap`)


class Vocoder(Protocol):
    def mel_to_audio(
        self,
        mel: torch.Tensor,
        mel_lengths: torch.Tensor,
        options: SynthesisOptions,
        seeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class Denoiser(nn.Module):
    """audio (B, N) -> audio (B, N) with the vocoder bias spectrum subtracted.

    Built from a loaded vocoder with `from_vocoder`; it has no checkpoint of its own.
    """

    role = "denoiser"
    Dims = DenoiserDims
    window: torch.Tensor  # buffers, registered in __init__
    bias: torch.Tensor

    def __init__(self, dims: DenoiserDims = DenoiserDims()) -> None:
        super().__init__()
        self.dims = dims
        # Periodic Hann (scipy get_window('hann', fftbins=True)), centred in n_fft.
        w = torch.hann_window(dims.win_length, periodic=True, dtype=torch.float64)
        left = (dims.n_fft - dims.win_length) // 2
        w = F.pad(w, (left, dims.n_fft - dims.win_length - left))
        self.register_buffer("window", w.float(), persistent=False)
        self.register_buffer("bias", torch.zeros(1, dims.n_fft // 2 + 1, 1))

    @classmethod
    @torch.no_grad()
    def from_vocoder(cls, vocoder: Vocoder, mel: MelConfig) -> Denoiser:
        """Estimate the bias spectrum of `vocoder` (with `mel`'s sizes) from an all-zero mel."""
        dims = DenoiserDims(
            n_fft=mel.n_fft, hop_length=mel.n_fft // N_OVERLAP, win_length=mel.win_length
        )
        param = next(iter(vocoder.parameters()), None) if isinstance(vocoder, nn.Module) else None
        device = param.device if param is not None else torch.device("cpu")
        dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
        zeros = torch.zeros(1, mel.n_mels, BIAS_FRAMES, device=device, dtype=dtype)
        lengths = torch.full((1,), BIAS_FRAMES, dtype=torch.long, device=device)
        seeds = torch.zeros(1, dtype=torch.long, device=device)
        audio, _ = vocoder.mel_to_audio(zeros, lengths, SynthesisOptions(sigma=0.0), seeds)
        den = cls(dims).to(device)
        spec = den._stft(audio.float(), torch.full((1,), audio.shape[1], device=device))
        den.bias.copy_(spec[:, :, :1].abs())
        return den

    def _stft(self, audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """audio (B, N) float32, lengths (B,) -> complex spectrum (B, n_fft / 2 + 1, N // hop + 1).

        Item i is reflect-padded by n_fft / 2 around its own first `lengths[i]` samples (items too
        short for one reflection keep reflecting, as numpy's 'reflect' does); zero after that.
        """
        B, N = audio.shape
        pad = self.dims.n_fft // 2
        t = torch.arange(-pad, N + pad, device=audio.device)[None, :]  # (1, N + n_fft)
        n = lengths.to(audio.device, torch.long)[:, None]  # (B, 1)
        period = (2 * (n - 1)).clamp(min=1)
        u = t.abs() % period
        src = torch.where(u < n, u, period - u).clamp(0, max(N - 1, 0))
        valid = (t < n + pad) & (n > 0)
        padded = torch.gather(audio, 1, src.expand(B, -1)) * valid if N else audio.new_zeros(B, 0)
        return torch.stft(
            padded,
            n_fft=self.dims.n_fft,
            hop_length=self.dims.hop_length,
            win_length=self.dims.n_fft,
            window=self.window,
            center=False,
            return_complex=True,
        )

    def _istft(self, spec: torch.Tensor, frame_mask: torch.Tensor, length: int) -> torch.Tensor:
        """spec (B, n_freq, F), frame_mask (B, F) -> audio (B, length): inverse of `_stft`."""
        n_fft, hop = self.dims.n_fft, self.dims.hop_length
        B, _, n_frames = spec.shape
        frames = torch.fft.irfft(spec, n=n_fft, dim=1) * self.window[None, :, None]
        frames = frames * frame_mask[:, None, :]  # (B, n_fft, F)
        total = n_fft + hop * (n_frames - 1)
        fold = dict(output_size=(1, total), kernel_size=(1, n_fft), stride=(1, hop))
        ola = F.fold(frames, **fold).view(B, total)
        wsq = (self.window**2)[None, :, None] * frame_mask[:, None, :]
        envelope = F.fold(wsq, **fold).view(B, total)
        tiny = torch.finfo(torch.float32).tiny
        ola = torch.where(envelope > tiny, ola / envelope.clamp(min=tiny), ola)
        pad = n_fft // 2
        return ola[:, pad : pad + length]

    @torch.no_grad()
    def forward(
        self, audio: torch.Tensor, strength: float = 0.1, lengths: torch.Tensor | None = None
    ) -> torch.Tensor:
        """audio: (B, N) float, lengths: (B,) or None (= all N) -> denoised (B, N) float32.

        Samples past an item's length are ignored and returned as zeros. With N a multiple of the
        hop this equals DLE's Denoiser; otherwise DLE returns only the first N // hop * hop samples,
        which match here, and the tail is reconstructed from the last frame.
        """
        if audio.dim() != 2:
            raise SpeechRTError(f"denoiser: expected audio (B, N), got {tuple(audio.shape)}")
        if strength < 0:
            raise SpeechRTError(f"denoiser: strength must be >= 0, got {strength}")
        B, N = audio.shape
        device = audio.device
        if lengths is None:
            lengths = torch.full((B,), N, dtype=torch.long, device=device)
        elif lengths.shape != (B,) or (B and (lengths.min() < 0 or lengths.max() > N)):
            raise SpeechRTError(f"denoiser: lengths must be ({B},) within [0, {N}]")
        lengths = lengths.to(device=device, dtype=torch.long)
        if N == 0:
            return audio.float()
        keep = torch.arange(N, device=device)[None, :] < lengths[:, None]  # (B, N)
        x = audio.float() * keep
        spec = self._stft(x, lengths)  # (B, n_freq, F)
        magnitude = (spec.abs() - strength * self.bias).clamp(min=0.0)
        spec = torch.polar(magnitude, spec.angle())
        f = torch.arange(spec.shape[2], device=device)[None, :]
        frame_mask = (f < lengths[:, None] // self.dims.hop_length + 1) & (lengths[:, None] > 0)
        return self._istft(spec, frame_mask.float(), N) * keep
