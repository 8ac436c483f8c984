"""Device and precision choices shared by the pipelines, the CLI and the server."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from speechrt.errors import SpeechRTError

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> the first CUDA device when present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpeechRTError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpeechRTError("CUDA was requested but no CUDA device is available")
    return device


def resolve_precision(name: str) -> torch.dtype:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise SpeechRTError(f"unknown precision {name!r}; choose {', '.join(PRECISIONS)}") from None


_batch_invariant = False
_mkldnn_before = True  # torch.backends.mkldnn.enabled before the mode was turned on
MKL_STRICT = "AUTO,STRICT"  # MKL_CBWR value: one reduction order per output, whatever the shape


def batch_invariant() -> bool:
    """Whether batch-invariant mode is on (see set_batch_invariant)."""
    return _batch_invariant


_holds: bool | None = None  # the probe's answer, once asked


@torch.no_grad()
def batch_invariance_holds() -> bool:
    """Whether this machine's CPU kernels give an item the same bits alone and batched, with
    oneDNN off and MKL_CBWR strict (set_batch_invariant's settings, in place while it runs), at
    one thread and at the current count: a small convolution (im2col + sgemm) and a Linear to
    one output (sgemv), as in FastPitch and HiFi-GAN, over an item alone and padded beside
    another. The tiny voice's bitwise serving tests, which run these shapes, passed on the CPUs
    the mode was measured on; MKL on an AMD EPYC (AVX2) rounds both differently by shape (up to
    2e-7)."""
    global _holds
    if _holds is None:
        os.environ.setdefault("MKL_CBWR", MKL_STRICT)
        before, threads = bool(torch.backends.mkldnn.enabled), torch.get_num_threads()
        # torch's stubs type this flag as its descriptor class; reads and writes are bools
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
        try:
            g = torch.Generator().manual_seed(0)
            conv, fc = torch.nn.Conv1d(16, 16, 3, padding=1), torch.nn.Linear(16, 1)
            for p in (*conv.parameters(), *fc.parameters()):
                p.copy_(torch.randn(p.shape, generator=g))
            x = torch.randn(2, 16, 46, generator=g)
            h = x.transpose(1, 2)
            _holds = True
            for n in sorted({1, threads}):
                torch.set_num_threads(n)
                same_conv = torch.equal(conv(x[:1, :, :19])[0, :, :18], conv(x)[0, :, :18])
                _holds &= same_conv and torch.equal(fc(h[:1, :19])[0], fc(h)[0, :19])
        finally:
            torch.set_num_threads(threads)
            torch.backends.mkldnn.enabled = before  # type: ignore[assignment]
    return _holds


def set_batch_invariant(on: bool = True) -> None:
    """Batch-invariant mode for eager CPU inference: an item's output is bitwise the same whether
    it runs alone or batched, at any position, with any batch-mates and any padded length.

    It turns oneDNN off (its convolutions pick kernels by batch shape), makes FastPitch graphs
    built while it is on attend over each item's own length (the padded length would otherwise
    enter the attention sums; runtime/graphs/fastpitch.py passes the switch to the model) and
    asks MKL for strict conditional numerical reproducibility, under which its matrix products
    sum every output in an order that does not depend on the matrix shape. MKL reads MKL_CBWR once,
    at its first operation, so call this before the process runs any model (the server does), or
    start the process with MKL_CBWR=AUTO,STRICT. Measured, not promised by MKL: see docs/design.md.
    Off restores oneDNN as it was. Nothing changes on CUDA (no batch-invariant kernels there).
    """
    global _batch_invariant, _mkldnn_before
    if on == _batch_invariant:
        return
    if on:
        cbwr = os.environ.setdefault("MKL_CBWR", MKL_STRICT)
        if "STRICT" not in cbwr.upper():
            raise SpeechRTError(f"batch-invariant mode needs MKL_CBWR={MKL_STRICT}, not {cbwr!r}")
        if not batch_invariance_holds():
            raise SpeechRTError(
                "batch-invariant mode is not available on this CPU: its matrix kernels round an "
                "item differently alone and batched (speechrt.device.batch_invariance_holds)"
            )
        _mkldnn_before = bool(torch.backends.mkldnn.enabled)
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    else:
        # MKL_CBWR stays: MKL has read it
        torch.backends.mkldnn.enabled = _mkldnn_before  # type: ignore[assignment]
    _batch_invariant = on


def to_host(*arrays: torch.Tensor | np.ndarray) -> list[np.ndarray]:
    """Tensors (any device) -> numpy arrays, from a GPU in one wait: each tensor is copied into
    pinned host memory without blocking, then the copies are waited for once. numpy arrays
    pass through."""
    return to_host_later(*arrays)()


def to_host_later(*arrays: torch.Tensor | np.ndarray) -> Callable[[], list[np.ndarray]]:
    """to_host in two steps: the copies are queued now; the function returned waits for them
    (for an event recorded behind them, not for the whole stream: a later batch may already be
    queued there) and gives the arrays."""
    out: list[Any] = []
    events = {}
    for x in arrays:
        if isinstance(x, np.ndarray) or x.device.type != "cuda":
            out.append(x)
            continue
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        out.append(host)
        if x.device not in events:
            events[x.device] = torch.cuda.Event()
    for device, event in events.items():
        event.record(torch.cuda.current_stream(device))

    def arrays_on_host() -> list[np.ndarray]:
        for event in events.values():
            event.synchronize()
        return [x if isinstance(x, np.ndarray) else x.detach().numpy() for x in out]

    return arrays_on_host
