"""Jasper / QuartzNet as a graph: features, feature_lengths -> log_probs, log_prob_lengths.

The model's forward is already a pure tensor function (masked convolutions, folded BatchNorm).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.arch.jasper import derived_sizes
from speechrt.models.jasper import Jasper


class JasperGraph(nn.Module):
    """forward(features (B, n_feats, T), feature_lengths (B,)) -> (log_probs (B, T', V), (B,))."""

    def __init__(self, model: Jasper) -> None:
        super().__init__()
        self.model = model
        # The cuda runner's layout. Compiled and replayed as one CUDA graph on an H200 (fp16,
        # 800 frames, batch 1), QuartzNet 15x5 took 1.03 ms NCHW and 2.03 ms channels-last: its
        # depthwise convs are slower on NHWC tensors. Jasper's dense convs gain channels-last.
        self.channels_last = not any(model.dims.separable)

    def forward(self, features: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        w = self.model.decoder.weight
        return self.model(features.to(w.dtype), feature_lengths)

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)


def build(model: Jasper, info: object = None) -> JasperGraph:
    return JasperGraph(model)


def example(graph: JasperGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Normalised-feature-like inputs, `length` frames (a multiple of 16 is what DLE feeds)."""
    g = torch.Generator().manual_seed(seed)
    n = graph.model.dims.n_feats
    lengths = torch.tensor([max(1, length - 5 * i) for i in range(batch)])
    feats = torch.randn(batch, n, length, generator=g)
    feats = feats * (torch.arange(length)[None, None, :] < lengths[:, None, None])
    return {"features": feats, "feature_lengths": lengths}


CODE = GraphCode(build, example)  # named by its registry entry (speechrt.arch)
