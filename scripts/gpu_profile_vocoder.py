"""HiFi-GAN's fused resblock convolutions on the GPU, for scripts/gpu_profile.py's parts
fusedconv, fusedconv-sweep and compiletime (see its docstring)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch
from gpu_timing import host_ms, kernel_table

from speechrt.repo import load_component


def fusedconv(models: Path, sweep: bool = True) -> list[dict]:
    """HiFi-GAN V1's resblock convs: cuDNN's conv (channels-last) alone against the fused Triton
    kernel (leaky ReLU, conv, bias, mask, residual) at its default tiles and over a sweep of tile
    sizes as one flat loop, at each stage's channels and length for 704 frames, K=7, dilation
    3; then the whole vocoder at 704 frames in the cuda runner: cuDNN + Inductor, fused with the
    default tiles, and fused with the sweep's best tiles (a single item fused in the stages of
    at most 64 channels, as the runner does)."""
    import torch.nn.functional as F
    from triton.testing import do_bench

    from speechrt.registry import contract
    from speechrt.runtime import fused_conv
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.graphs.hifigan import FusedResBlock, HiFiGANGraph

    dev, rows, best_flat = torch.device("cuda"), [], {}
    shapes = ((256, 704 * 8), (128, 704 * 64), (64, 704 * 128), (32, 704 * 256))
    default_tiles = fused_conv.tile_sizes
    for c, T in shapes if sweep else ():
        x = torch.randn(1, T, c, device=dev, dtype=torch.float16).transpose(1, 2)
        w = torch.randn(c, c, 7, device=dev, dtype=torch.float16) * 0.05
        bias = torch.zeros(c, device=dev, dtype=torch.float16)
        mask = torch.ones(1, 1, T, device=dev, dtype=torch.float16)
        w4 = w.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        x4 = x.unsqueeze(2)
        cudnn = do_bench(functools.partial(F.conv2d, x4, w4, bias, 1, (0, 9), (1, 3)))
        ref = F.conv1d(F.leaky_relu(x.float(), 0.1), w.float(), bias.float(), 1, 9, 3) + x.float()
        w_kio = w.permute(2, 1, 0).contiguous()
        conv = functools.partial(fused_conv.launch, x, w_kio, bias, 3, 0.1, mask, x)
        grid = [default_tiles(c, c)]
        for bt in (64, 128, 256):
            for bco in sorted({min(c, 64), min(c, 128)}):
                for bci in sorted({min(c, 32), min(c, 64)}):
                    for warps, stages in ((4, 3), (4, 4), (8, 3), (8, 4)):
                        grid.append((bt, bco, bci, warps, stages, True))
        best: dict = {}
        for tiles in grid:
            try:
                y = conv(tiles=tiles)
                err = float((y.float() - ref).abs().max() / ref.abs().max())
                ms = do_bench(functools.partial(conv, tiles=tiles))
            except Exception as e:  # e.g. out of shared memory
                print(c, tiles, type(e).__name__, flush=True)
                continue
            r = {"channels": c, "T": T, "tiles": tiles, "ms": round(ms, 4), "rel_err": err,
                 "default": tiles == grid[0]}  # fmt: skip
            rows.append(r)
            if tiles[5] and (not best or ms < best["ms"]):
                best = r
        best_flat[c] = tuple(best["tiles"])
        flop = 2 * T * c * c * 7
        print(json.dumps({"channels": c, "T": T, "cudnn_ms": round(cudnn, 4),
                          "cudnn_tflops": round(flop / cudnn / 1e9, 1), "best_flat": best,
                          "default": rows[-len(grid)] if rows else None}), flush=True)  # fmt: skip
        rows.append({"channels": c, "T": T, "cudnn_ms": round(cudnn, 4)})
    model, info = load_component(models / "hifigan")
    c = contract("hifigan", info.dims)
    # name -> (resblocks, tiles by input channels or None for the defaults, fused single items
    # at most this many channels, batches)
    configs = {"cudnn": ("cudnn", None, 0, (1, 8)), "fused": ("fused", None, 64, (1, 8))}
    # a single item with more stages fused; the 256-channel stage in smaller tiles (at the
    # default 64 x 128 one item makes 176 programs, 1.3 waves on 132 SMs)
    configs["fused-128"] = ("fused", None, 128, (1,))
    configs["fused-all"] = ("fused", None, 256, (1,))
    configs["fused-all-256-t32"] = ("fused", {256: (32, 128, 32, 4, 4, True)}, 256, (1,))
    configs["fused-all-256-co64"] = ("fused", {256: (64, 64, 32, 4, 4, True)}, 256, (1,))
    if best_flat:
        configs["fused-swept-tiles"] = ("fused", best_flat, 64, (1, 8))
    for name, (blocks, tiles, single, batches) in configs.items():
        fused_conv.tile_sizes = default_tiles
        if tiles is not None:
            fused_conv.tile_sizes = lambda ci, co, t=tiles: t.get(ci) or default_tiles(ci, co)
        wrapper = HiFiGANGraph(model.float())
        if blocks == "cudnn":
            wrapper.fused = None  # type: ignore[assignment]  # the runner then keeps cuDNN
        else:
            wrapper = wrapper.fused()
            wrapper.fused = None  # type: ignore[assignment]  # already fused, as set here
            for m in wrapper.modules():
                if isinstance(m, FusedResBlock):
                    m.cudnn_single = m.weights[0].shape[1] > single
        runner = cuda_runner("hifigan", wrapper, c, device=dev)
        for b in batches:
            mel = torch.randn(b, 80, 704, device=dev) - 5
            feeds = {"mel": mel, "mel_lengths": torch.full((b,), 704, device=dev)}
            t0 = time.perf_counter()
            for _ in range(3):
                runner.run(feeds)
            first = time.perf_counter() - t0
            ms = host_ms(lambda runner=runner, feeds=feeds: runner.run(feeds))
            r = {"vocoder": name, "batch": b, "frames": 704, "ms": round(ms, 4),
                 "first_s": round(first, 1)}  # fmt: skip
            r["profile"] = kernel_table(lambda runner=runner, feeds=feeds: runner.run(feeds))
            print(json.dumps({k: v for k, v in r.items() if k != "profile"}), flush=True)
            rows.append(r)
    fused_conv.tile_sizes = default_tiles
    return rows


def compiletime(models: Path, threads: int | None = None) -> list[dict]:
    """The cuda runner's creation (which compiles the fused kernels from
    fused_conv.COMPILE_THREADS threads; `threads` sets them, 0: compiled on first use) and its
    first call (compile + capture) and replays: HiFi-GAN, 704 frames, batch 2 then 4, with the
    fused resblock kernels and with cuDNN's resblocks. Run each setting in a process of its own
    with empty TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR to time a cold start."""
    import speechrt.runtime.graphs.hifigan as hg
    from speechrt.registry import contract
    from speechrt.runtime import fused_conv
    from speechrt.runtime.cuda import cuda_runner

    if threads is not None:
        fused_conv.COMPILE_THREADS = threads
    dev, rows, frames = torch.device("cuda"), [], 704
    torch.zeros(1, device=dev)  # the CUDA context, outside the timings
    model, info = load_component(models / "hifigan")
    for resblocks in ("fused", "cudnn"):
        wrapper = hg.HiFiGANGraph(model.float())
        if resblocks == "cudnn":
            wrapper.fused = None  # type: ignore[assignment]  # the runner then keeps cuDNN
        t0 = time.perf_counter()
        runner = cuda_runner("hifigan", wrapper, contract("hifigan", info.dims), device=dev)
        create = time.perf_counter() - t0
        for b in (2, 4):
            feeds = {"mel": torch.randn(b, 80, frames, device=dev) - 5,
                     "mel_lengths": torch.full((b,), frames, device=dev)}  # fmt: skip
            t0 = time.perf_counter()
            runner.run(feeds)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = host_ms(lambda runner=runner, feeds=feeds: runner.run(feeds))
            r = {"resblocks": resblocks, "compile_threads": fused_conv.COMPILE_THREADS,
                 "model": "hifigan", "batch": b, "frames": frames,
                 "create_runner_s": round(create, 2), "first_call_s": round(first, 2),
                 "ms": round(ms, 4)}  # fmt: skip
            print(json.dumps(r), flush=True)
            rows.append(r)
    return rows
