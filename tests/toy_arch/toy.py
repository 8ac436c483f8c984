"""A toy architecture's arch file, written as docs/adding-a-model.md says for
src/speechrt/arch/<kind>.py. tests/test_registry.py adds this folder to speechrt.arch's path, so
the registry discovers it as `speechrt.arch.toy`; its model file is tests/toy_model.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.contracts import F32, B, Contract, lengths, tensor


@dataclass(frozen=True)
class ToyDims:
    n_channels: int = 3

    @property
    def n_mels(self) -> int:
        return self.n_channels


PRESETS: dict[str, dict[str, Any]] = {"default": {}, "tiny": dict(n_channels=2)}


def contract(d: ToyDims) -> Contract:
    return Contract(
        "toy",
        (tensor("x", F32, B, d.n_mels, "frames"), lengths("lengths", "frames")),
        (tensor("y", F32, B, d.n_mels, "frames"), lengths("y_lengths", "frames")),
    )


ARCHITECTURES = (
    Architecture(
        "toy",
        ToyDims,
        PRESETS,
        "toy_model:Toy",
        ((Graph("toy", contract, "toy_model:CODE", ToyDims), "model.onnx"),),
    ),
)
