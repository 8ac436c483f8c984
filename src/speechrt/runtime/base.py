"""What every runner is: one component graph run on named tensors. Imports no torch.

    runner.backend      "eager", "cuda" or "onnx"
    runner.contract     the graph's Contract (speechrt.contracts)
    runner.run(feeds)   {input name: tensor} -> {output name: tensor}

eager and cuda runners take and return torch tensors (cuda ones stay on the GPU); the onnx runner
takes and returns numpy arrays (runtime/stages.py adapts it to torch for the pipelines).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from speechrt.contracts import Contract

BACKENDS = ("eager", "cuda", "onnx")


class Runner(Protocol):
    backend: str
    contract: Contract

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Inputs by contract name -> outputs by contract name."""
        ...
