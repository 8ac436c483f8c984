"""The eager runner: a graph wrapper module called as-is (the reference for cuda and onnx)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from speechrt.contracts import Contract


def module_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of a module's first floating-point parameter (float32 when it has none)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def module_device(module: nn.Module) -> torch.device:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


class EagerRunner:
    """Runs `graph` (a wrapper from speechrt.runtime.graphs) in torch eager mode.

    Inputs are moved to the graph's device; float outputs come back as float32, per the contract.
    """

    backend = "eager"

    def __init__(self, graph: nn.Module, contract: Contract) -> None:
        self.graph = graph.eval()
        self.contract = contract
        self.device = module_device(graph)

    @torch.inference_mode()
    def run(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.contract.check_feeds(feeds)
        args = [feeds[n].to(self.device) for n in self.contract.input_names]
        outs = self.graph(*args)
        return to_contract(self.contract, outs)


def to_contract(contract: Contract, outs: tuple[Tensor, ...] | Tensor) -> dict[str, Tensor]:
    """Name a graph's outputs and cast them to the contract's dtypes."""
    outs = (outs,) if isinstance(outs, Tensor) else tuple(outs)
    names = contract.output_names
    if len(outs) != len(names):
        raise RuntimeError(f"{contract.name}: graph returned {len(outs)} outputs, not {names}")
    return {
        n: o.to(getattr(torch, contract.spec(n).dtype)) for n, o in zip(names, outs, strict=True)
    }


@contextmanager
def capture(module: nn.Module, names: list[str]) -> Iterator[dict[str, Tensor]]:
    """Record the (first tensor) output of each named submodule during the `with` body.

    A submodule called several times keeps its last output. Outputs are cloned as float32.
    """
    found: dict[str, Tensor] = {}
    modules = dict(module.named_modules())
    handles = []
    for name in names:

        def hook(_m: nn.Module, _i: object, out: object, name: str = name) -> None:
            t = out[0] if isinstance(out, tuple | list) else out
            if isinstance(t, Tensor):
                found[name] = t.detach().float().clone()

        handles.append(modules[name].register_forward_hook(hook))
    try:
        yield found
    finally:
        for h in handles:
            h.remove()
