"""Tiny random-weight components in model directories, shared by the runtime tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from speechrt.audio.mel import MelConfig
from speechrt.models.fastpitch import FastPitch, FastPitchDims
from speechrt.models.hifigan import HiFiGAN, HiFiGANDims
from speechrt.repo import ComponentInfo, save_component

# hop 16 = 4 x 4 upsampling; a 64-point STFT for the denoiser
MEL = MelConfig(sampling_rate=8000, n_fft=64, hop_length=16, win_length=64, n_mels=10)
FASTPITCH = dict(
    n_mel_channels=10,
    n_symbols=20,
    symbols_embedding_dim=16,
    in_fft_n_layers=2,
    in_fft_n_heads=2,
    in_fft_d_head=4,
    in_fft_conv1d_filter_size=32,
    in_fft_output_size=16,
    out_fft_n_layers=2,
    out_fft_n_heads=2,
    out_fft_d_head=4,
    out_fft_conv1d_filter_size=32,
    out_fft_output_size=16,
    dur_predictor_filter_size=8,
    pitch_predictor_filter_size=8,
    energy_predictor_filter_size=8,
)
HIFIGAN = dict(
    upsample_rates=(4, 4),
    upsample_kernel_sizes=(8, 8),
    upsample_initial_channel=32,
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3, 5), (1, 3, 5)),
    n_mels=10,
)
TEXT = {"symbol_set": "english_basic", "cleaners": "english_cleaners_v2", "p_arpabet": 0.0}


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def fastpitch(seed: int = 0, **over: object) -> FastPitch:
    """~3 frames per symbol, pitch statistics set."""
    model = FastPitch(FastPitchDims(**{**FASTPITCH, **over})).eval()
    randomize(model, seed)
    with torch.no_grad():
        model.duration_predictor.fc.bias.fill_(1.5)
        model.pitch_mean.fill_(200.0)
        model.pitch_std.fill_(50.0)
    return model


def hifigan(seed: int = 1) -> HiFiGAN:
    model = HiFiGAN(HiFiGANDims(**HIFIGAN)).eval()
    randomize(model, seed, 0.1)
    return model


def save(model: torch.nn.Module, out: Path, meta: dict | None = None) -> Path:
    info = ComponentInfo(model.kind, dataclasses.asdict(model.dims), MEL, meta or {})
    return save_component(out, info, model.state_dict())


def voice(root: Path, **over: object) -> tuple[Path, Path]:
    """(acoustic dir, vocoder dir) of a tiny FastPitch + HiFi-GAN voice."""
    return (
        save(fastpitch(**over), root / "fastpitch", {"text": TEXT}),
        save(hifigan(), root / "hifigan"),
    )
