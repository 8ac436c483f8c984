"""The eager runner: a graph wrapper module called as-is (the reference for cuda and onnx)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.contracts import Contract
from speechrt.runtime.bounds import decode_groups
from speechrt.runtime.graphs.regulated import RegulatedGraph


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

    Inputs are moved to the graph's device, float inputs cast to its dtype (a half-precision
    model takes back its own float32 outputs); float outputs come back as float32, per the
    contract.
    A length-regulated graph (FastPitch, FastSpeech: `encode`, then `decode` at the frame count
    the encoding decides) refuses an item longer than `max_frames` before decoding, as the cuda
    runner does (None: the graph's own `max_frames`, if it has one), and decodes a batch in
    groups of rows that each cost at most one item at the limit (speechrt.runtime.bounds): the
    decoder's attention grows with the square of the frames.
    """

    backend = "eager"

    def __init__(self, graph: nn.Module, contract: Contract, max_frames: int | None = None) -> None:
        self.graph = graph.eval()
        self.contract = contract
        self.device = module_device(graph)
        self.dtype = module_dtype(graph)
        own = graph.max_frames if isinstance(graph, RegulatedGraph) else None
        self.max_frames: int | None = max_frames or own

    @torch.inference_mode()
    def run(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.contract.check_feeds(feeds)
        args = [
            x.to(self.device, self.dtype) if x.is_floating_point() else x.to(self.device)
            for x in (feeds[n] for n in self.contract.input_names)
        ]
        graph = self.graph
        if self.max_frames is None or not isinstance(graph, RegulatedGraph):
            return to_contract(self.contract, graph(*args))
        e = graph.encode(*args)  # the graph's forward, split where the frame count is known
        frames = graph.frame_lengths(e.reps).cpu()  # (B,)
        longest = int(frames.max())
        groups = decode_groups(self.contract.name, e.reps.shape[1], frames.numpy(), self.max_frames)
        if len(groups) == 1:
            mel, mel_lengths = graph.decode(e.enc, e.reps, longest)
        else:  # each group as long as its own longest item, padded to the batch's
            parts = []
            for g in groups:
                rows = torch.from_numpy(g).to(e.reps.device)
                parts.append(graph.decode(e.enc[rows], e.reps[rows], int(frames[g].max())))
            order = torch.from_numpy(np.argsort(np.concatenate(groups))).to(e.reps.device)
            mel = torch.cat([F.pad(m, (0, longest - m.shape[-1])) for m, _ in parts])[order]
            mel_lengths = torch.cat([n for _, n in parts])[order]
        return to_contract(self.contract, graph.assemble(mel, mel_lengths, e))


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
