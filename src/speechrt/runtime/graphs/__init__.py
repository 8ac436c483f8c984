"""Component graphs: one small wrapper module per graph that computes its contract.

A wrapper's `forward` takes the contract's inputs in order and returns its outputs in order, as
torch tensors. The eager runner calls it, the cuda runner compiles it (or its parts), and the
ONNX export traces it: the model modules themselves are never patched.

Each graph module defines `build(model, info) -> nn.Module` and
`example(graph, batch, length, seed) -> feeds` (valid random inputs whose main dynamic axis is
`length` long); a component whose pipeline stage is more than one graph call per batch (a decoder
loop, noise drawn per item) also defines `stage(parts)` (speechrt.runtime.stages.StageParts).
speechrt.registry names each graph's module and its torch.onnx exporter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from speechrt.registry import graph as registry_graph
from speechrt.repo import ComponentInfo

if TYPE_CHECKING:
    from torch import Tensor, nn

# The main graphs whose module defines `stage(parts)`: known without importing the module (and
# torch), so the onnx backend can tell that the plain numpy stages serve the other components.
OWN_STAGES = frozenset({"tacotron2.encoder", "waveglow"})


def _module(graph: str) -> tuple[ModuleType, str]:
    module, _, suffix = registry_graph(graph).wrapper.partition(":")
    return importlib.import_module(module), suffix


def _function(graph: str, what: str) -> Callable:
    module, suffix = _module(graph)
    return getattr(module, what + suffix)


def stage_builder(graph: str) -> Callable | None:
    """The `stage(parts)` function of `graph`'s module (speechrt.runtime.stages.StageParts ->
    the component's pipeline stage), or None where the plain stage serves."""
    if graph not in OWN_STAGES:
        return None
    return _module(graph)[0].stage


def build_graph(graph: str, model: nn.Module, info: ComponentInfo | None) -> nn.Module:
    """The wrapper module computing `graph` from a loaded component, in eval mode."""
    return _function(graph, "build")(model, info).eval()


def example_feeds(
    graph: str, wrapper: nn.Module, batch: int, length: int, seed: int = 0
) -> dict[str, Tensor]:
    """Valid random inputs for `wrapper` (built by build_graph) on the CPU."""
    return _function(graph, "example")(wrapper, batch, length, seed)
