"""The toy architecture's model file (docs/adding-a-model.md, src/speechrt/models/<kind>.py):
the module and its graph wrapper. Its arch file is tests/toy_arch/toy.py."""

from __future__ import annotations

import torch
from speechrt.arch.toy import ToyDims
from torch import Tensor, nn

from speechrt.arch import GraphCode


class Toy(nn.Module):
    """x (B, C, T) -> per-channel gain applied, zero past each item's length."""

    kind = "toy"
    role = "vocoder"
    Dims = ToyDims

    def __init__(self, dims: ToyDims) -> None:
        super().__init__()
        self.dims = dims
        self.gain = nn.Parameter(torch.ones(dims.n_channels))

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        keep = torch.arange(x.shape[2]) < lengths[:, None]  # (B, T)
        return x * self.gain[:, None] * keep[:, None], lengths


def build(model: Toy, info: object = None) -> Toy:
    return model  # forward already has the contract's signature


def example(graph: Toy, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, graph.dims.n_channels, length, generator=g)
    return {"x": x, "lengths": torch.tensor([max(1, length - i) for i in range(batch)])}


CODE = GraphCode(build, example)  # named by the entry in tests/toy_arch/toy.py
