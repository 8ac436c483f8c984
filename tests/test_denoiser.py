"""Denoiser: DLE's conv-STFT spectral subtraction, batch independence, bias estimation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.signal
import torch
import torch.nn.functional as F
from torch import nn

from speechrt.audio.mel import MelConfig
from speechrt.errors import SpeechRTError
from speechrt.models.denoiser import Denoiser, DenoiserDims
from speechrt.models.hifigan import HiFiGAN, HiFiGANDims

SMALL = DenoiserDims(n_fft=256, hop_length=64, win_length=256)


def conv_stft_denoise(audio: torch.Tensor, bias: torch.Tensor, strength: float, dims: DenoiserDims):
    """The DLE algorithm as documented: DFT-basis conv, pseudo-inverse conv_transpose, envelope."""
    n_fft, hop = dims.n_fft, dims.hop_length
    half = n_fft // 2 + 1
    dft = np.fft.fft(np.eye(n_fft))[:half]
    basis = np.concatenate([dft.real, dft.imag])  # (2 * half, n_fft)
    win = scipy.signal.get_window("hann", dims.win_length, fftbins=True)
    win = np.pad(win, ((n_fft - dims.win_length) // 2, (n_fft - dims.win_length + 1) // 2))
    scale = n_fft / hop
    fwd = torch.from_numpy(basis[:, None, :] * win).float()
    inv = torch.from_numpy(np.linalg.pinv(scale * basis).T[:, None, :] * win).float()
    x = F.pad(audio[:, None], (n_fft // 2, n_fft // 2), mode="reflect")
    out = F.conv1d(x, fwd, stride=hop)
    re, im = out[:, :half], out[:, half:]
    mag = torch.sqrt(re**2 + im**2)
    phase = torch.atan2(im, re)
    mag = (mag - strength * bias).clamp(min=0)
    y = F.conv_transpose1d(torch.cat([mag * phase.cos(), mag * phase.sin()], 1), inv, stride=hop)
    n_frames = mag.shape[-1]
    env = np.zeros(n_fft + hop * (n_frames - 1), dtype=np.float32)
    for f in range(n_frames):
        env[f * hop : f * hop + n_fft] += win**2
    nz = torch.from_numpy(np.nonzero(env > np.finfo(np.float32).tiny)[0])
    y[:, :, nz] /= torch.from_numpy(env)[nz]
    y = y * scale
    return y[:, 0, n_fft // 2 : -(n_fft // 2)]


class HumVocoder(nn.Module):
    """A 'vocoder' whose output is a stationary hum plus the mel's mean as a DC level."""

    def mel_to_audio(self, mel, mel_lengths, options=None, seeds=None):
        t = torch.arange(mel.shape[2] * 64, dtype=torch.float32)
        audio = 0.05 * torch.cos(2 * math.pi * 1000.0 / 8000 * t)[None].repeat(mel.shape[0], 1)
        return audio, mel_lengths * 64


def test_strength_zero_returns_input():
    den = Denoiser()
    den.bias.fill_(1.0)
    for n in (4096, 5000, 700, 3):
        audio = 0.3 * torch.randn(2, n)
        assert (den(audio, 0.0) - audio).abs().max() <= 1e-4


@pytest.mark.parametrize("n", [1280, 1300])
def test_matches_conv_stft_reference(n):
    den = Denoiser(SMALL)
    den.bias.copy_(torch.rand(1, 129, 1) * 0.5)
    audio = 0.3 * torch.randn(1, n)
    expected = conv_stft_denoise(audio, den.bias, 0.2, SMALL)
    got = den(audio, 0.2)
    assert expected.shape[1] == n // 64 * 64  # DLE keeps whole hops only
    assert (got[:, : expected.shape[1]] - expected).abs().max() <= 1e-4


def test_batched_equals_single():
    den = Denoiser(SMALL)
    den.bias.copy_(torch.rand(1, 129, 1))
    lengths = torch.tensor([900, 2000, 129, 70, 0])
    audio = 0.3 * torch.randn(5, 2000)
    audio[0, 900:] = 5.0  # padding garbage must not leak into the valid part
    out = den(audio, 0.1, lengths)
    assert out.shape == audio.shape
    for i, n in enumerate(lengths.tolist()):
        single = den(audio[i : i + 1, :n], 0.1)
        torch.testing.assert_close(out[i, :n], single[0], atol=1e-5, rtol=0)
        assert not out[i, n:].any()


def test_bias_from_vocoder_removes_its_hum():
    mel_cfg = MelConfig(sampling_rate=8000, n_fft=256, hop_length=64, win_length=256)
    den = Denoiser.from_vocoder(HumVocoder(), mel_cfg)
    assert den.dims == SMALL and den.bias.shape == (1, 129, 1)
    hum, _ = HumVocoder().mel_to_audio(torch.zeros(1, 80, 50), torch.tensor([50]))
    t = torch.arange(hum.shape[1], dtype=torch.float32)
    voice = 0.3 * torch.sin(2 * math.pi * 300.0 / 8000 * t) * torch.hann_window(hum.shape[1])
    noisy = voice + hum
    cleaned = den(noisy, 1.0)  # (1, N)
    energy = lambda x: float((x**2).sum())  # noqa: E731
    assert energy(den(hum, 1.0)) < 0.05 * energy(hum)
    assert energy(cleaned) < energy(noisy)
    assert energy(cleaned - voice) < 0.25 * energy(noisy - voice)


def test_bias_from_hifigan_is_first_stft_frame_of_zero_mel_audio():
    dims = HiFiGANDims(
        upsample_rates=(8, 8, 4),
        upsample_kernel_sizes=(16, 16, 8),
        upsample_initial_channel=16,
        resblock="2",
        resblock_kernel_sizes=(3, 5, 7),
        resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)),
    )
    vocoder = HiFiGAN(dims).eval()
    den = Denoiser.from_vocoder(vocoder, MelConfig())
    assert den.dims == DenoiserDims() and den.bias.shape == (1, 513, 1)
    with torch.no_grad():
        audio = vocoder(torch.zeros(1, 80, 88)).squeeze(1)
    spec = torch.stft(
        audio, 1024, 256, 1024, torch.hann_window(1024), center=True, return_complex=True
    )
    assert (den.bias - spec.abs()[:, :, :1]).abs().max() <= 1e-5
    assert den.bias.abs().sum() > 0


def test_bad_inputs():
    den = Denoiser(SMALL)
    with pytest.raises(SpeechRTError, match="expected audio"):
        den(torch.zeros(1, 1, 100), 0.1)
    with pytest.raises(SpeechRTError, match="strength"):
        den(torch.zeros(1, 100), -0.1)
    with pytest.raises(SpeechRTError, match="lengths"):
        den(torch.zeros(2, 100), 0.1, torch.tensor([100, 101]))
