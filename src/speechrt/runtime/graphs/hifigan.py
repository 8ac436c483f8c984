"""HiFi-GAN as a named-tensor graph: mel, mel_lengths -> audio, audio_lengths."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from speechrt.arch.hifigan import derived_sizes
from speechrt.models.hifigan import HiFiGAN


class HiFiGANGraph(nn.Module):
    """forward(mel (B, n_mels, T), mel_lengths (B,)) -> (audio (B, T * hop), audio_lengths (B,))."""

    def __init__(self, model: HiFiGAN) -> None:
        super().__init__()
        self.model = model
        self.hop = model.dims.hop_length

    def forward(self, mel: Tensor, mel_lengths: Tensor) -> tuple[Tensor, Tensor]:
        audio = self.model(mel.to(self.model.conv_pre.weight.dtype), mel_lengths).squeeze(1)
        return audio, mel_lengths * self.hop

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)


def build(model: HiFiGAN, info: object = None) -> HiFiGANGraph:
    return HiFiGANGraph(model)


def example(graph: HiFiGANGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Random log-mel-like inputs: `batch` items, the longest `length` frames."""
    g = torch.Generator().manual_seed(seed)
    mel = torch.randn(batch, graph.model.dims.n_mels, length, generator=g) - 5.0
    lengths = torch.tensor([max(1, length - 3 * i) for i in range(batch)])
    return {"mel": mel, "mel_lengths": lengths}
