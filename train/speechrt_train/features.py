"""FastPitch's targets per symbol: YIN pitch and mel energy, averaged over each symbol's frames.

audio (N,) -> frames centred at t * hop (as the mel) -> YIN: cumulative-mean-normalised
difference, first dip under `threshold` in [sr / fmax, sr / fmin] -> f0 Hz (0 = unvoiced)
per symbol: mean of its voiced frames' f0 (0 when none), as DLE's average_pitch
energy: L2 norm of each log-mel frame, averaged per symbol, then log(1 + x), as DLE FastPitch
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

F0_MIN, F0_MAX = 65.0, 600.0  # Hz; covers the slt voice (about 120-300 Hz) with margin
YIN_THRESHOLD = 0.15
SILENCE_RMS = 1e-3  # frames quieter than this (about -60 dBFS) are unvoiced


def frames_of(audio: Tensor, hop: int, frame_length: int) -> Tensor:
    """audio (N,) -> (N // hop + 1, frame_length): frame t centred on sample t * hop."""
    pad = frame_length // 2
    x = F.pad(audio[None, None], (pad, pad), mode="constant")[0, 0]
    return x.unfold(0, frame_length, hop)[: audio.shape[0] // hop + 1]


def yin(
    audio: Tensor,
    sample_rate: int,
    hop: int,
    frame_length: int = 1024,
    fmin: float = F0_MIN,
    fmax: float = F0_MAX,
    threshold: float = YIN_THRESHOLD,
) -> Tensor:
    """audio (N,) float -> f0 (N // hop + 1,) in Hz, 0 where unvoiced (same frames as the mel)."""
    x = frames_of(audio.float(), hop, frame_length)  # (T, W)
    tau_max = min(int(sample_rate / fmin), frame_length // 2)
    tau_min = max(int(sample_rate / fmax), 2)
    width = frame_length - tau_max  # integration window
    n_fft = 1 << (2 * frame_length - 1).bit_length()
    head = x[:, :width]
    # r[tau] = sum_j x[j] x[j + tau] over the window, for every tau at once
    spec = torch.fft.rfft(x, n_fft) * torch.fft.rfft(head, n_fft).conj()
    r = torch.fft.irfft(spec, n_fft)[:, : tau_max + 1]
    sq = F.pad(x.square().cumsum(dim=1), (1, 0))  # sq[k] = sum of x^2 below k
    taus = torch.arange(tau_max + 1, device=x.device)
    energy0 = sq[:, width : width + 1]
    energy_tau = sq[:, taus + width] - sq[:, taus]
    diff = (energy0 + energy_tau - 2 * r).clamp(min=0)  # (T, tau_max + 1)
    cum = diff[:, 1:].cumsum(dim=1)
    cmnd = torch.ones_like(diff)
    cmnd[:, 1:] = torch.where(cum > 0, diff[:, 1:] * taus[1:] / cum.clamp(min=1e-12), 1.0)
    search = cmnd[:, tau_min : tau_max + 1]  # (T, S)
    below = (search < threshold).int().cummax(dim=1).values.bool()  # at or after the first dip
    nxt = torch.cat([search[:, 1:], search[:, -1:]], dim=1)
    pick = below & (search <= nxt)  # the first local minimum once under the threshold
    voiced = pick.any(dim=1)
    idx = pick.int().argmax(dim=1)
    # parabolic interpolation around the minimum
    left = search.gather(1, (idx - 1).clamp(min=0)[:, None])[:, 0]
    mid = search.gather(1, idx[:, None])[:, 0]
    right = search.gather(1, (idx + 1).clamp(max=search.shape[1] - 1)[:, None])[:, 0]
    denom = left - 2 * mid + right
    shift = torch.where(denom.abs() > 1e-9, 0.5 * (left - right) / denom, torch.zeros_like(denom))
    tau = (idx + tau_min).float() + shift.clamp(-1, 1)
    rms = x.square().mean(dim=1).sqrt()
    voiced = voiced & (rms > SILENCE_RMS)
    return torch.where(voiced, sample_rate / tau, torch.zeros_like(tau))


def average_per_symbol(values: Tensor, durations: Tensor) -> Tensor:
    """values (T,) per frame, durations (L,) frames per symbol (sum <= T) -> (L,) mean of each
    symbol's non-zero frames, 0 where it has none (DLE's average_pitch)."""
    ends = durations.long().cumsum(0)
    starts = ends - durations.long()
    total = F.pad(values.float().cumsum(0), (1, 0))
    count = F.pad((values != 0).float().cumsum(0), (1, 0))
    s, c = total[ends] - total[starts], count[ends] - count[starts]
    return torch.where(c > 0, s / c.clamp(min=1), torch.zeros_like(s))


def symbol_targets(
    audio: Tensor, mel: Tensor, durations: Tensor, sample_rate: int, hop: int
) -> tuple[Tensor, Tensor]:
    """audio (N,), log-mel (n_mels, T), durations (L,) -> (pitch Hz (L,), energy (L,))."""
    f0 = yin(audio, sample_rate, hop)[: mel.shape[1]]
    pitch = average_per_symbol(f0, durations)
    energy = torch.log1p(average_per_symbol(mel.float().norm(dim=0), durations))
    return pitch, energy


def normalize_pitch(pitch: Tensor, mean: float, std: float) -> Tensor:
    """Hz -> (Hz - mean) / std; unvoiced (0) stays 0, as DLE."""
    return torch.where(pitch != 0, (pitch - mean) / std, torch.zeros_like(pitch))
