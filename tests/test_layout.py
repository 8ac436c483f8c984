"""Channels-last 1-D convolutions (the cuda runner's layout) compute what the models compute."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from speechrt.models.hifigan import HiFiGAN
from speechrt.models.jasper import QuartzNet
from speechrt.registry import preset
from speechrt.runtime.layout import (
    ChannelsLastConv1d,
    ChannelsLastConvTranspose1d,
    channels_last_convs,
)


def _randomize(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv1d(6, 10, 5, stride=2, padding=4, dilation=2),
        nn.Conv1d(6, 6, 7, padding=3, groups=6, bias=False),
        nn.Conv1d(6, 4, 3, padding="same"),
        nn.ConvTranspose1d(6, 4, 16, stride=8, padding=4),
        nn.ConvTranspose1d(6, 4, 5, stride=2, padding=1, output_padding=1),
    ],
)
def test_each_conv_matches(conv: nn.Module) -> None:
    x = torch.randn(3, 6, 29)
    ref = conv(x)
    swapped = channels_last_convs(nn.Sequential(copy.deepcopy(conv)))[0]
    assert isinstance(swapped, ChannelsLastConv1d | ChannelsLastConvTranspose1d)
    for name in ("kernel_size", "stride", "padding", "dilation", "groups"):
        assert getattr(swapped, name) == getattr(conv, name)  # 1-D attributes kept
    out = swapped(x)
    assert out.shape == ref.shape
    assert _rel(out, ref) < 1e-6


def test_hifigan_and_quartznet_match_with_lengths() -> None:
    """Whole models, batched with lengths: within float32 rounding of the originals."""
    hifigan = _randomize(HiFiGAN(preset("hifigan", "tiny")), 0)
    mel, mel_lengths = torch.randn(2, 80, 23), torch.tensor([23, 17])
    fast = channels_last_convs(copy.deepcopy(hifigan))
    with torch.inference_mode():
        assert _rel(fast(mel, mel_lengths), hifigan(mel, mel_lengths)) < 1e-5

    asr = _randomize(QuartzNet(preset("quartznet", "tiny")), 1)
    feats, lengths = torch.randn(2, 64, 40), torch.tensor([40, 31])
    fast_asr = channels_last_convs(copy.deepcopy(asr))
    with torch.inference_mode():
        (ref, ref_len), (out, out_len) = asr(feats, lengths), fast_asr(feats, lengths)
    assert torch.equal(out_len, ref_len)
    assert _rel(out, ref) < 1e-5
    assert not any(type(m) is nn.Conv1d for m in fast_asr.modules())


def test_grouped_convs_can_stay() -> None:
    model = nn.Sequential(nn.Conv1d(6, 6, 5, padding=2, groups=6), nn.Conv1d(6, 4, 1))
    x = torch.randn(2, 6, 11)
    ref = model(x)
    channels_last_convs(model, grouped=False)
    assert type(model[0]) is nn.Conv1d and isinstance(model[1], ChannelsLastConv1d)
    assert _rel(model(x), ref) < 1e-6
