"""Tiny random-weight models in the published DLE layouts, shared by pipeline, CLI and server tests.

Real mel config (22.05 kHz, hop 256, 80 mels) and the real english_basic symbol set, tiny widths.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from speechrt.convert.hifigan import dle_state_dict
from speechrt.models.fastpitch import FastPitch
from speechrt.models.hifigan import HiFiGAN
from speechrt.registry import preset

TRAIN_SETUP = dict(
    sampling_rate=22050,
    filter_length=1024,
    hop_length=256,
    win_length=1024,
    mel_fmin=0.0,
    mel_fmax=8000.0,
    num_mels=80,
    symbol_set="english_basic",
    text_cleaners=["english_cleaners_v2"],
    p_arpabet=0.0,
)


def tiny_fastpitch(seed: int = 0) -> FastPitch:
    """~3 frames per symbol, so a short sentence gives under a second of audio."""
    model = FastPitch(preset("fastpitch", "tiny")).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        model.duration_predictor.fc.bias.fill_(1.2)
        model.pitch_mean.fill_(200.0)
        model.pitch_std.fill_(50.0)
    return model


def tiny_hifigan(seed: int = 0) -> HiFiGAN:
    """Weight-normed as DLE trains it (g != ||v||), so conversion must fold it."""
    model = HiFiGAN(preset("hifigan", "tiny"), weight_norm=True).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("original1"):  # v
                p.copy_(torch.randn(p.shape, generator=g))
        for name, p in model.named_parameters():
            if name.endswith("original0"):  # g: row norms in [0.5, 1.5], != ||v||
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def save_dle_fastpitch(model: FastPitch, path: Path) -> Path:
    sd = {"module." + k: v.clone() for k, v in model.state_dict().items()}
    sd["module.attention.attn_proj.bias"] = torch.zeros(1)  # training-only aligner, ignored
    config = dataclasses.asdict(model.dims)
    config.pop("pitch_conditioning_formants")
    torch.save({"state_dict": sd, "config": config, "train_setup": TRAIN_SETUP}, path)
    return path


def save_dle_hifigan(model: HiFiGAN, path: Path) -> Path:
    config = dataclasses.asdict(model.dims)
    config.pop("n_mels")
    train_setup = {k: v for k, v in TRAIN_SETUP.items() if k not in ("symbol_set", "p_arpabet")}
    torch.save(
        {"generator": dle_state_dict(model), "config": config, "train_setup": train_setup}, path
    )
    return path


def make_voice(root: Path) -> tuple[Path, Path]:
    """DLE checkpoints -> `speechrt convert` -> (acoustic dir, vocoder dir)."""
    from speechrt.cli import main

    root.mkdir(parents=True, exist_ok=True)
    fp = save_dle_fastpitch(tiny_fastpitch(), root / "FastPitch_checkpoint_1.pt")
    hg = save_dle_hifigan(tiny_hifigan(), root / "hifigan_gen_checkpoint_1.pt")
    assert main(["convert", str(fp), str(root / "fastpitch")]) == 0
    assert main(["convert", str(hg), str(root / "hifigan")]) == 0
    return root / "fastpitch", root / "hifigan"
