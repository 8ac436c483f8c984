"""Component graphs: one small wrapper module per graph that computes its contract.

A wrapper's `forward` takes the contract's inputs in order and returns its outputs in order, as
torch tensors. The eager runner calls it, the cuda runner compiles it (or its parts), and the
ONNX export traces it: the model modules themselves are never patched.

Each wrapper module gathers its functions in a typed speechrt.arch.GraphCode that the graph's
registry entry names (`Graph.code`): `build(model, info) -> nn.Module`,
`example(graph, batch, length, seed) -> feeds` (valid random inputs whose main dynamic axis is
`length` long) and, for a component whose pipeline stage is more than one graph call per batch (a
decoder loop, noise drawn per item), `stage(parts)` (speechrt.runtime.stages.StageParts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from speechrt.registry import graph as registry_graph
from speechrt.registry import graph_code
from speechrt.repo import ComponentInfo

if TYPE_CHECKING:
    from torch import Tensor, nn

    from speechrt.runtime.stages import StageParts


def stage_builder(graph: str) -> Callable[[StageParts], Any] | None:
    """The `stage(parts)` function of `graph` (speechrt.runtime.stages.StageParts -> the
    component's pipeline stage), or None where the plain stage serves."""
    if not registry_graph(graph).own_stage:
        return None
    return graph_code(graph).stage


def build_graph(graph: str, model: nn.Module, info: ComponentInfo | None) -> nn.Module:
    """The wrapper module computing `graph` from a loaded component, in eval mode."""
    return graph_code(graph).build(model, info).eval()


def example_feeds(
    graph: str, wrapper: nn.Module, batch: int, length: int, seed: int = 0
) -> dict[str, Tensor]:
    """Valid random inputs for `wrapper` (built by build_graph) on the CPU."""
    return graph_code(graph).example(wrapper, batch, length, seed)
