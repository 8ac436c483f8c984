"""How scripts/gpu_profile.py measures: CUDA-graph replay time, host wall time, the kernel
table of one call, the host side of one call (launches, syncs, top ops, a Chrome trace) and
FLOPs (torch's counter)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode


def graph_time_ms(fn, iters: int = 50) -> float:
    """Median GPU time of fn() replayed as a CUDA graph (warmed up first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def host_ms(fn, iters: int = 30) -> float:
    """Median wall ms of fn() with a device synchronisation, as a caller sees it."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_table(fn, top: int = 12) -> dict:
    """Kernels of one eager call of fn: count, total ms, the top entries by time."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name].append(e.device_time_total / 1e3)
    rows = sorted(((sum(v), len(v), k) for k, v in by_name.items()), reverse=True)
    return {
        "kernels": sum(n for _, n, _ in rows),
        "kernel_ms": sum(t for t, _, _ in rows),
        "top": [{"ms": round(t, 4), "n": n, "name": k[:120]} for t, n, k in rows[:top]],
    }


def host_table(fn, top: int = 20, trace: Path | None = None) -> dict:
    """Host side of one call of fn: wall ms (median of 20), launches, syncs, the top ops by self
    CPU time, and the device's busy time within the call; `trace`: a gzipped Chrome trace."""
    for _ in range(3):
        fn()
    walls = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    if trace is not None:
        import gzip

        prof.export_chrome_trace(str(trace.with_suffix("")))
        with open(trace.with_suffix(""), "rb") as f, gzip.open(trace, "wb") as g:
            g.write(f.read())
        trace.with_suffix("").unlink()
    avg = prof.key_averages()
    counts = {e.key: e.count for e in avg}
    rows = sorted(avg, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {
        "wall_ms": round(statistics.median(walls), 3),
        "kernel_ms": round(sum(e.device_time_total for e in kernels) / 1e3, 3),
        "kernels": len(kernels),
        "launches": {k: counts.get(k, 0) for k in
                     ("cudaLaunchKernel", "cudaGraphLaunch", "cudaStreamSynchronize",
                      "cudaMemcpyAsync", "cudaDeviceSynchronize", "cuLaunchKernel",
                      "cudaHostAlloc", "cudaMalloc")},
        "top_self_cpu": [{"us": round(e.self_cpu_time_total, 1), "n": e.count, "name": e.key[:100]}
                         for e in rows],
    }  # fmt: skip


def flops_of(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()
