"""The cuda runner: half-precision weights, length buckets, torch.compile, CUDA graphs.

Every call pads its inputs to bucketed sizes (batch: repeat item 0; lengths: zeros), so a
compiled, CUDA-graph-captured callable is reused for every call that falls in the same buckets
(torch.compile with dynamic=False specialises once per bucket shape; mode "reduce-overhead"
captures and replays a CUDA graph per shape). Outputs are cropped back to the unpadded sizes and
stay on the GPU. Models mask by lengths, so padding never changes an item's result.

FastPitch and FastSpeech run as two compiled parts: `encode` at (batch, symbols) buckets in
float32, because it decides how many whole frames each symbol gets and half precision would move
frame boundaries, and `decode` (length regulator + decoder + projection) at (batch, frames)
buckets in half precision (the frame bucket is picked from the predicted lengths: one scalar read
back per call). The denoiser stays in float32 (its DFT sums n_fft products per bin).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from speechrt.contracts import Contract
from speechrt.registry import GRAPHS
from speechrt.runtime.bounds import decode_groups
from speechrt.runtime.buckets import Buckets
from speechrt.runtime.eager import to_contract
from speechrt.runtime.graphs.regulated import RegulatedGraph
from speechrt.runtime.layout import channels_last_convs

RECOMPILE_LIMIT = 256  # one compiled variant per bucket shape


def compile_fn(fn: Callable, mode: str | None, device: torch.device | str = "cuda") -> Callable:
    """torch.compile with static shapes; mode None = no compilation (eager, e.g. on the CPU).

    "reduce-overhead": compiled (Inductor's default mode) and replayed as one CUDA graph per
    input shape (`CapturedGraphs`)."""
    if mode is None:
        return fn
    allow_recompiles()
    if mode == "reduce-overhead":
        return CapturedGraphs(torch.compile(fn, dynamic=False), device)
    return torch.compile(fn, dynamic=False, mode=None if mode == "default" else mode)


def allow_recompiles() -> None:
    """Let torch.compile keep one compiled variant per bucket shape (RECOMPILE_LIMIT): past
    Dynamo's default of 8 per function it would run the function uncompiled, silently slow."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):
        if getattr(dynamo_config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
            setattr(dynamo_config, name, RECOMPILE_LIMIT)


class CapturedGraphs:
    """fn replayed as a CUDA graph captured once per input signature (shapes, dtypes).

    A call copies its tensors (on `device` or in host memory) into the graph's static inputs on
    `device`, replays, and returns the graph's static outputs: they are overwritten by the next
    call of the same signature, so callers copy what they keep (CudaRunner.crop does). Replaying
    skips the Python of fn, the compiled function's guards and per-kernel launches: one graph
    launch per call. All graphs of one instance share a memory pool; they run one after another
    on the current stream.
    """

    def __init__(self, fn: Callable, device: torch.device | str = "cuda") -> None:
        self.fn, self.device = fn, torch.device(device)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[Any], Any]] = {}
        self.pool: Any = None

    def __call__(self, *args: Any) -> Any:
        leaves, spec = tree_flatten(args)  # tensors, and constants (e.g. a frame count)
        key = (spec, *((x.shape, x.dtype) if isinstance(x, Tensor) else x for x in leaves))
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self.capture(leaves, spec)
        graph, static, out = entry
        for dst, src in zip(static, leaves, strict=True):
            if isinstance(dst, Tensor):
                dst.copy_(src, non_blocking=True)
        graph.replay()
        return out

    def capture(self, leaves: list[Any], spec: Any) -> tuple:
        static = [x.to(self.device, copy=True) if isinstance(x, Tensor) else x for x in leaves]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compile and warm up outside the capture
            for _ in range(2):
                self.fn(*tree_unflatten(static, spec))
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.fn(*tree_unflatten(static, spec))
        return graph, static, out


def pad_axis(x: Tensor, dim: int, size: int, batch: bool, value: float = 0) -> Tensor:
    """Pad dim of x up to size: the batch axis with copies of item 0, others with `value`."""
    n = x.shape[dim]
    if n == size:
        return x
    if batch:
        index = torch.cat([torch.arange(n), torch.zeros(size - n, dtype=torch.long)])
        return x.index_select(dim, index.to(x.device))
    shape = list(x.shape)
    shape[dim] = size - n
    return torch.cat([x, x.new_full(shape, value)], dim)


class CudaRunner:
    """Runs a graph wrapper at bucketed static shapes, compiled, in `dtype` (see module doc)."""

    backend = "cuda"

    def __init__(
        self,
        graph_name: str,
        wrapper: nn.Module,
        contract: Contract,
        device: str | torch.device = "cuda",
        dtype: torch.dtype = torch.float16,
        buckets: Buckets | None = None,
        mode: str | None = "reduce-overhead",
        channels_last: bool | None = None,
    ) -> None:
        """channels_last: run 1-D convolutions channels-last (None: as the wrapper's
        `channels_last` attribute says, else the registry's graph). A graph the registry marks
        float32 stays float32 whatever `dtype`."""
        self.contract = contract
        self.device = torch.device(device)
        self.buckets = buckets if buckets is not None else Buckets()
        spec = GRAPHS.get(graph_name)
        self.dtype = torch.float32 if spec and spec.float32 else dtype
        if channels_last is None:
            channels_last = getattr(wrapper, "channels_last", None)
        if channels_last is None:
            channels_last = bool(spec and spec.channels_last)
        self.channels_last = channels_last
        self.graph = self.prepare(wrapper, self.dtype)
        self.mode = mode
        self.graphs = mode == "reduce-overhead"
        # name -> callable, compiled and plain (plain: the same math, e.g. for verify's hooks)
        self.plain: dict[str, Callable] = {"graph": self.graph}
        self.compiled: dict[str, Callable]
        if getattr(self.graph, "compiles_parts", False) and self.graphs:
            # the wrapper compiled its own parts (precompile): capture, don't compile it whole
            self.compiled = {k: CapturedGraphs(f, self.device) for k, f in self.plain.items()}
        else:
            self.compiled = {k: compile_fn(f, mode, self.device) for k, f in self.plain.items()}

    def prepare(self, wrapper: nn.Module, dtype: torch.dtype) -> nn.Module:
        """A copy of the wrapper on the device, in dtype and layout, in eval mode; a wrapper
        with a `fused()` form (the same function, parity-tested, e.g. convs as GEMMs) runs that,
        and one with a `precompile()` method (its own kernels, compiled side by side) runs it."""
        allow_recompiles()  # precompile()'s own compiled parts, one variant per bucket too
        graph = copy.deepcopy(wrapper)
        fused = getattr(graph, "fused", None)
        if fused is not None:
            graph = fused()
        if self.channels_last:
            channels_last_convs(graph)
        graph = graph.to(self.device, dtype).eval()
        precompile = getattr(graph, "precompile", None)
        if precompile is not None:
            precompile()
        return graph

    def modules(self) -> list[nn.Module]:
        """The modules this runner computes with (verify hooks them)."""
        return [self.graph]

    def padded_sizes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Bucketed sizes; axes that follow from others (e.g. WaveGlow's z) follow them."""
        return self.with_derived({a: self.buckets.size(a, n) for a, n in sizes.items()})

    def with_derived(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """Sizes plus the axes the graph derives from them (e.g. samples = frames * hop)."""
        derive = getattr(self.graph, "derived_sizes", None)
        return {**sizes, **(derive(sizes) if derive else {})}

    def pad(
        self, feeds: Mapping[str, Tensor], padded: Mapping[str, int], compiled: bool = True
    ) -> list[Tensor]:
        """Contract inputs in order, padded to the bucket sizes where they are (host inputs on
        the host), then moved to the device, except for replayed graphs (compiled, with graphs
        on), which copy each input once into their own device buffers."""
        host = compiled and self.graphs
        args = []
        for spec in self.contract.inputs:
            x = feeds[spec.name]
            for dim, axis in spec.dynamic_axes().items():
                x = pad_axis(x, dim, padded[axis], axis == "batch", spec.pad)
            args.append(x if host else x.to(self.device, non_blocking=True))
        return args

    def crop(self, outs: dict[str, Tensor], sizes: Mapping[str, int]) -> dict[str, Tensor]:
        """Outputs cut back to the unpadded sizes, copied out of CUDA-graph-owned memory."""
        cropped = {}
        for name, x in outs.items():
            for dim, axis in self.contract.spec(name).dynamic_axes().items():
                if axis in sizes:
                    x = x.narrow(dim, 0, sizes[axis])
            if self.graphs or not x.is_contiguous():  # own memory, in the contract's layout
                x = x.clone(memory_format=torch.contiguous_format)
            cropped[name] = x
        return cropped

    def _fns(self, compiled: bool) -> dict[str, Callable]:
        return self.compiled if compiled else self.plain

    @torch.inference_mode()
    def run(self, feeds: Mapping[str, Tensor], compiled: bool = True) -> dict[str, Tensor]:
        """Inputs -> outputs on the device; compiled=False runs the same modules uncompiled."""
        sizes = self.contract.check_feeds(feeds)
        padded = self.padded_sizes(sizes)
        fn = self._fns(compiled)["graph"]
        outs = to_contract(self.contract, fn(*self.pad(feeds, padded, compiled)))
        return self.crop(outs, self.with_derived(sizes))


class RegulatedCudaRunner(CudaRunner):
    """FastPitch / FastSpeech: float32 `encode` at (batch, symbols) buckets, then `decode`
    (length regulator + decoder) in half precision at a frame bucket picked from the lengths.

    The graph is a speechrt.runtime.graphs.regulated.RegulatedGraph. As on the eager and onnx
    runners, an item of more than `max_frames` frames (the graph's own cap until a server sets
    its bound) is refused before the decoder runs, and a batch decodes in groups of rows that
    each cost at most one item at the limit (speechrt.runtime.bounds.decode_groups), each group
    padded to a batch bucket.
    """

    # copies of the wrapper above, duck-typed (nn.Module's attributes type as Tensor | Module)
    graph: Any
    encoder: Any

    def __init__(self, graph_name: str, wrapper: nn.Module, contract: Contract, **kw: Any) -> None:
        super().__init__(graph_name, wrapper, contract, **kw)
        self.encoder = self.prepare(wrapper, torch.float32)
        self.plain = {"encode": self.encoder.encode, "decode": self.graph.decode}
        self.compiled = {k: compile_fn(f, self.mode, self.device) for k, f in self.plain.items()}
        self.max_frames: int | None = self.graph.max_frames  # per item (a server sets its own)

    def modules(self) -> list[nn.Module]:
        return [self.encoder, self.graph]

    @torch.inference_mode()
    def run(self, feeds: Mapping[str, Tensor], compiled: bool = True) -> dict[str, Tensor]:
        sizes = self.contract.check_feeds(feeds)
        padded = self.padded_sizes(sizes)
        fns = self._fns(compiled)
        e = fns["encode"](*self.pad(feeds, padded, compiled))
        # the items' frames (B,) on the host: the one read back (the batch's padding rows,
        # copies of item 0, left out)
        frames = self.graph.frame_lengths(e.reps)[: sizes["batch"]].cpu().numpy()
        longest = int(frames.max())
        name, symbols = self.contract.name, e.reps.shape[1]
        groups = decode_groups(name, symbols, frames, self.max_frames)
        n_frames = self.buckets.size("frames", longest)
        if len(groups) == 1:
            mel, mel_lengths = fns["decode"](e.enc, e.reps, n_frames)
        else:
            mel, mel_lengths = self._decode_groups(fns["decode"], e, frames, groups, n_frames)
        outs = to_contract(self.contract, self.graph.assemble(mel, mel_lengths, e))
        return self.crop(outs, {**sizes, "frames": longest})

    def _decode_groups(
        self, decode: Callable, e: Any, frames: Any, groups: list[Any], n_frames: int
    ) -> tuple[Tensor, Tensor]:
        """Each group decoded at its own (batch, frames) buckets -> mel (B', n_mels, n_frames)
        and mel_lengths (B',) in the batch's row order, B' the padded batch (its padding rows
        decoded again as item 0 is)."""
        mels, lengths = [], []
        for g in groups:
            rows = torch.as_tensor(g, device=e.reps.device)
            rows = pad_axis(rows, 0, self.buckets.size("batch", len(g)), batch=True)
            n = self.buckets.size("frames", int(frames[g].max()))
            mel, mel_lengths = decode(e.enc[rows], e.reps[rows], n)
            mel = mel[: len(g)]  # copied out before the next call (a replayed graph's output)
            mels.append(F.pad(mel, (0, n_frames - n)) if n < n_frames else mel.clone())
            lengths.append(mel_lengths[: len(g)].clone())
        order = np.argsort(np.concatenate(groups), kind="stable")  # batch row -> stacked row
        order = np.concatenate([order, np.full(len(e.reps) - len(order), order[0])])
        index = torch.as_tensor(order, device=e.reps.device)
        return torch.cat(mels)[index], torch.cat(lengths)[index]


def cuda_runner(graph_name: str, wrapper: nn.Module, contract: Contract, **kw: Any) -> CudaRunner:
    # a length-regulated wrapper (encode, decode, assemble) runs in two parts, as in eager
    regulated = isinstance(wrapper, RegulatedGraph)
    return (RegulatedCudaRunner if regulated else CudaRunner)(graph_name, wrapper, contract, **kw)
