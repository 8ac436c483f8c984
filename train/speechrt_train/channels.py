"""Recording conditions for the recogniser's training audio, on the training device: silence,
a room, coloured noise, a microphone EQ and a telephone channel per item (channel_batch), and
the vocal tract length warp of the spectrum (vtlp_source_bins). speechrt_train.asr_data draws
and applies them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from speechrt.audio import telephone

if TYPE_CHECKING:
    from speechrt_train.asr_data import Augment


def uniform(lo_hi: tuple[float, float], u: Tensor) -> Tensor:
    """u in [0, 1) -> lo + (hi - lo) * u: a draw of one augmentation range."""
    return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * u


SAMPLE_RATE = 16000
EQ_POINTS = 8  # the microphone curve's control points, log-spaced 60 Hz - 8 kHz


def _mu_law(x: Tensor, mu: float = 255.0) -> Tensor:
    """G.711's companding with 8-bit codes: encode, quantize, decode."""
    y = torch.sign(x) * torch.log1p(mu * x.abs()) / math.log1p(mu)
    y = torch.round((y + 1) * 127.5) / 127.5 - 1  # 256 levels over [-1, 1]
    return torch.sign(y) * torch.expm1(y.abs() * math.log1p(mu)) / mu


def channel_batch(
    audio: Tensor, lengths: list[int], aug: Augment, g: torch.Generator, g_noise: torch.Generator
) -> tuple[Tensor, list[int]]:
    """Recording conditions for a padded batch: audio (B, N) of `lengths` -> (B, N') and the
    new lengths (host ints). Per item, as `aug` draws (from `g`, on the CPU): silence before
    and after; a room (the speech convolved with decaying noise plus the direct path); noise
    of a random colour at a random SNR; a microphone's random EQ; a telephone (8-bit mu-law,
    then its 300-3400 Hz band, which also confines the quantization noise to it, as decoding
    8 kHz G.711 does). One FFT and one inverse over the batch (two more where a telephone is
    drawn); the output keeps each item's RMS before the telephone (the gain
    stays `augment_batch`'s); zeros past each length. Room and noise draws from `g_noise`."""
    B, N = audio.shape
    dev = audio.device
    sr = SAMPLE_RATE
    u = torch.rand(B, 10 + EQ_POINTS, generator=g, dtype=torch.float64)
    padded = u[:, 0] < aug.pad_prob
    lead = (u[:, 1] * aug.pad_s * sr * padded).long().tolist()
    new_lengths = [
        n + a + int(t * aug.pad_s * sr * p)
        for n, a, t, p in zip(lengths, lead, u[:, 2].tolist(), padded.tolist(), strict=True)
    ]
    rt60 = uniform(aug.rt60_s, u[:, 4]) * (u[:, 3] < aug.reverb_prob)  # 0: no room
    n_rir = int(rt60.max() * sr)
    n_out = max(new_lengths)
    n_fft = 1 << (n_out + n_rir - 1).bit_length()
    n_bins = n_fft // 2 + 1
    params = torch.stack(
        [
            torch.tensor(lead, dtype=torch.float64),
            torch.tensor(lengths, dtype=torch.float64),
            torch.tensor(new_lengths, dtype=torch.float64),
            rt60,
            10 ** (-uniform(aug.drr_db, u[:, 5]) / 20),  # reverberant amplitude
            (u[:, 6] < aug.colour_noise_prob).double(),
            10 ** (-uniform(aug.colour_snr_db, u[:, 7]) / 10),
            2 * u[:, 8],  # noise slope beta
            (u[:, 9] < aug.phone_prob).double(),
            *(aug.eq_db * (2 * u[:, 10:].T - 1)),  # EQ_POINTS gains (dB)
        ],
        dim=1,
    ).to(dev)  # (B, 9 + EQ_POINTS): one host-to-device copy
    lead_, size, new_size, rt, wet, noisy, inv_snr, beta, phone = params[:, :9].T
    eq = params[:, 9:].float()  # (B, EQ_POINTS)
    # silence: out[b, lead + i] = audio[b, i]
    j = torch.arange(n_out, device=dev)
    src = j[None] - lead_.long()[:, None]
    inside = (src >= 0) & (src < size.long()[:, None])  # (B, n_out): the speech
    x = torch.gather(audio.float(), 1, src.clamp(0, N - 1)) * inside
    spec = torch.fft.rfft(x, n=n_fft)  # (B, n_bins)
    f = torch.fft.rfftfreq(n_fft, 1 / sr, device=dev)  # (n_bins,) Hz
    if n_rir > 0:  # the room: direct path + wet x (unit-energy noise decaying 60 dB in rt60)
        t = torch.arange(n_rir, device=dev) / sr
        decay = torch.exp(-6.9078 * t[None] / rt.clamp(min=1e-3)[:, None].float())
        tail = torch.randn(B, n_rir, generator=g_noise, device=dev) * decay
        tail = tail / tail.square().sum(1, keepdim=True).sqrt().clamp(min=1e-9)
        rir = tail * (wet.float() * (rt > 0))[:, None]
        rir[:, 0] += 1.0
        spec = spec * torch.fft.rfft(rir, n=n_fft)
    # Parseval: a spectrum's power per sample of a signal `count` samples long
    weight = torch.full((n_bins,), 2.0, device=dev)
    weight[0] = 1.0
    weight[-1] = 1.0

    def power(s: Tensor, count: Tensor) -> Tensor:
        return (s.real.square() + s.imag.square()) @ weight / (n_fft * count.float())

    speech_power = power(spec, size).clamp(min=1e-10)  # (B,)
    shape = f.clamp(min=20.0)[None] ** (-beta.float()[:, None] / 2)  # (B, n_bins) amplitude
    noise = (
        torch.complex(
            torch.randn(B, n_bins, generator=g_noise, device=dev),
            torch.randn(B, n_bins, generator=g_noise, device=dev),
        )
        * shape
    )
    scale = speech_power * inv_snr.float() / power(noise, torch.full_like(size, n_fft))
    spec = spec + noise * (scale * noisy.float()).sqrt()[:, None]
    # microphone EQ: gains (dB) at log-spaced points, linear in log frequency between them
    pos = torch.log(f.clamp(60.0, 8000.0) / 60.0) / math.log(8000.0 / 60.0) * (EQ_POINTS - 1)
    i0 = pos.floor().long().clamp(max=EQ_POINTS - 2)
    frac = (pos - i0)[None]
    gain_db = eq[:, i0] * (1 - frac) + eq[:, i0 + 1] * frac  # (B, n_bins)
    spec = spec * (10 ** (gain_db / 20))
    y = torch.fft.irfft(spec, n=n_fft)[:, :n_out]
    valid = j[None] < new_size.long()[:, None]
    y = y * valid
    # the item's RMS over its speech as it came in
    rms_in = (x.square().sum(1) / size.float()).sqrt()
    rms_out = ((y * inside).square().sum(1) / size.float()).sqrt().clamp(min=1e-9)
    y = (y * (rms_in / rms_out)[:, None]).clamp(-1.0, 1.0)
    if bool((u[:, 9] < aug.phone_prob).any()):  # telephone items: mu-law, then the band
        on = phone.bool()[:, None]
        # the band a narrowband source is filtered to when recognised: speechrt.audio.telephone
        band = torch.from_numpy(telephone.response(np.fft.rfftfreq(n_fft, 1 / sr)))
        band = band.to(dev, torch.float32)
        coded = torch.fft.rfft(torch.where(on, _mu_law(y), y), n=n_fft)
        coded = torch.fft.irfft(coded * torch.where(on, band[None], 1.0), n=n_fft)
        y = torch.where(on, coded[:, :n_out].clamp(-1.0, 1.0), y) * valid
    return y, new_lengths


def vtlp_source_bins(alpha: Tensor, n_bins: int, boundary: float = 0.6) -> Tensor:
    """Vocal tract length perturbation as a warp of the spectrum: alpha (B,) -> for each
    output bin, the (fractional) input bin it reads, (B, n_bins). Frequencies up to
    boundary x Nyquist x min(alpha, 1) scale by alpha; above, a line to Nyquist (kept)."""
    nyq = float(n_bins - 1)
    f = torch.arange(n_bins, device=alpha.device, dtype=torch.float32)[None]
    a = alpha.float()[:, None]
    b = boundary * nyq * a.clamp(max=1.0)  # output frequency of the knee
    knee = b / a  # its input frequency
    above = nyq - (nyq - knee) / (nyq - b) * (nyq - f)
    return torch.where(f <= b, f / a, above).clamp(0.0, nyq)
