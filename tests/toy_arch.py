"""A toy architecture written as docs/adding-a-model.md says: the model file's content
(Dims, module, graph wrapper) and the conversion module's (detect, from_dle), here in one helper
module so that test_registry.py can register it without touching src/."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from speechrt.contracts import Contract, TensorSpec
from speechrt.convert import Converted
from speechrt.convert.checkpoints import tensors_of

# -- models/toy.py ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyDims:
    n_channels: int = 3


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
    return model


def example(graph: Toy, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, graph.dims.n_channels, length, generator=g)
    return {"x": x, "lengths": torch.tensor([max(1, length - i) for i in range(batch)])}


# -- the contract builder, torch-free, beside the registry entry ---------------------------------


def toy_contract(d: Mapping[str, Any]) -> Contract:
    c = d.get("n_channels", 3)
    return Contract(
        "toy",
        (
            TensorSpec("x", "float32", ("batch", c, "frames")),
            TensorSpec("lengths", "int64", ("batch",), counts="frames"),
        ),
        (
            TensorSpec("y", "float32", ("batch", c, "frames")),
            TensorSpec("y_lengths", "int64", ("batch",), counts="frames"),
        ),
    )


# -- convert/toy.py -----------------------------------------------------------------------------


def detect(keys: set[str]) -> bool:
    return keys == {"toy_gain"}


def from_dle(ckpt: dict) -> Converted:
    sd = tensors_of(ckpt, "state_dict")
    gain = sd["toy_gain"]
    return Converted("toy", ToyDims(n_channels=gain.shape[0]), {"gain": gain})
