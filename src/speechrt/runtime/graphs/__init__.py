"""Component graphs: one small wrapper module per graph that computes its contract.

A wrapper's `forward` takes the contract's inputs in order and returns its outputs in order, as
torch tensors. The eager runner calls it, the cuda runner compiles it (or its parts), and the
ONNX export traces it: the model modules themselves are never patched.

Each graph module defines `build(model, info) -> nn.Module` and
`example(graph, batch, length, seed) -> feeds` (valid random inputs whose main dynamic axis is
`length` long). EXPORTERS says which torch.onnx exporter writes each graph.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from torch import Tensor, nn

from speechrt.errors import SpeechRTError
from speechrt.repo import ComponentInfo

# graph name -> module defining build() and example()
MODULES: dict[str, str] = {
    "fastpitch": "speechrt.runtime.graphs.fastpitch",
    "hifigan": "speechrt.runtime.graphs.hifigan",
    "denoiser": "speechrt.runtime.graphs.denoiser",
}

# "torchscript" = torch.onnx.export(dynamo=False): it keeps data-dependent sizes (the length
# regulator's frame count) and LSTM time axes dynamic, where the dynamo exporter can specialise
# them to the example. Every graph is checked after export at lengths other than the example.
EXPORTERS: dict[str, str] = {
    "fastpitch": "torchscript",
    "hifigan": "torchscript",
    "denoiser": "torchscript",
}


def _module(graph: str) -> ModuleType:
    try:
        return importlib.import_module(MODULES[graph])
    except KeyError:
        raise SpeechRTError(
            f"no graph wrapper for {graph!r}; known: {', '.join(MODULES)}"
        ) from None


def build_graph(graph: str, model: nn.Module, info: ComponentInfo) -> nn.Module:
    """The wrapper module computing `graph` from a loaded component, in eval mode."""
    return _module(graph).build(model, info).eval()


def example_feeds(
    graph: str, wrapper: nn.Module, batch: int, length: int, seed: int = 0
) -> Mapping[str, Tensor]:
    """Valid random inputs for `wrapper` (built by build_graph) on the CPU."""
    return _module(graph).example(wrapper, batch, length, seed)
