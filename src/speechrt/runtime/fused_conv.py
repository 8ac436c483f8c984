"""A 1-D convolution with its neighbours fused in: leaky ReLU on the input, bias, length mask
and residual sum on the output, as one Triton kernel (the cuda runner's HiFi-GAN resblocks).

    y[b, :, t] = mask[b, 0, t] * (bias + sum_j W[:, :, j] @ lrelu(x[b, :, t + j * dil - pad]))
                 + res[b, :, t]          (mask: 1 or 0 per time step, e.g. inside an item's length)

cuDNN runs the convolution alone, so every conv of a resblock costs one more pass over the
activations for the activation, mask and residual sum (Inductor fuses those into one kernel per
conv). Here the activation is applied to the input tile as it is loaded and the rest to the
accumulator before it is stored: one read of the input and one write of the output per conv.

The kernel is an implicit GEMM over (time, output channel) tiles of one batch item: for each
of the K taps, the input rows shifted by j * dil (zeros outside [0, T)) times that tap's
(C_in, C_out) weights. Tensors are (B, C, T) views of (B, T, C) memory (the runner's
channels-last layout) or any other strides; the weights are given as (K, C_in, C_out).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton; the cuda runner needs it
    triton = None
fused_conv1d: Any = None  # the custom op speechrt::fused_conv1d, where Triton is installed
# (BLOCK_T, BLOCK_CO, BLOCK_CI, warps, stages, flat): flat = one loop over (tap, channel block)
# pairs instead of the taps unrolled, each with its loop over channel blocks
Tiles = tuple[int, int, int, int, int, bool]
# (channels, kernel size, dilation, residual): what one compiled kernel serves
Variant = tuple[int, int, int, bool]
COMPILE_THREADS = min(16, os.cpu_count() or 1)  # precompile's threads; 0: compile on first use


if triton is not None:

    @triton.jit
    def _conv_kernel(
        x, w, bias, res, mask, y,
        T,
        sxb, sxc, sxt, srb, src, srt, smb, smt, syb, syc, syt,
        C_IN: tl.constexpr, C_OUT: tl.constexpr, K: tl.constexpr, DIL: tl.constexpr,
        PAD: tl.constexpr, SLOPE: tl.constexpr, HAS_RES: tl.constexpr, HAS_MASK: tl.constexpr,
        FLAT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_CO: tl.constexpr,
        BLOCK_CI: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(2)
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,) output times
        co = tl.program_id(1) * BLOCK_CO + tl.arange(0, BLOCK_CO)  # (BLOCK_CO,) out channels
        acc = tl.zeros((BLOCK_T, BLOCK_CO), dtype=tl.float32)
        if FLAT:  # one loop over (tap, channel block) pairs (C_IN % BLOCK_CI == 0)
            for kk in range(0, K * C_IN, BLOCK_CI):
                j = kk // C_IN
                ts = t + (j * DIL - PAD)
                ci = kk - j * C_IN + tl.arange(0, BLOCK_CI)
                a = tl.load(
                    x + b * sxb + ts[:, None] * sxt + ci[None, :] * sxc,
                    mask=((ts >= 0) & (ts < T))[:, None],
                    other=0.0,
                )  # (BLOCK_T, BLOCK_CI)
                a = tl.where(a >= 0, a, a * SLOPE)
                rows = kk + tl.arange(0, BLOCK_CI)
                wj = tl.load(
                    w + rows[:, None] * C_OUT + co[None, :], mask=co[None, :] < C_OUT, other=0.0
                )  # (BLOCK_CI, BLOCK_CO)
                acc = tl.dot(a, wj, acc)
        else:  # the taps unrolled, a loop over channel blocks in each
            for j in tl.static_range(K):
                ts = t + (j * DIL - PAD)  # input times of tap j
                inside = (ts >= 0) & (ts < T)
                for c0 in range(0, C_IN, BLOCK_CI):
                    ci = c0 + tl.arange(0, BLOCK_CI)
                    a = tl.load(
                        x + b * sxb + ts[:, None] * sxt + ci[None, :] * sxc,
                        mask=inside[:, None] & (ci[None, :] < C_IN),
                        other=0.0,
                    )  # (BLOCK_T, BLOCK_CI)
                    a = tl.where(a >= 0, a, a * SLOPE)
                    wj = tl.load(
                        w + (j * C_IN + ci[:, None]) * C_OUT + co[None, :],
                        mask=(ci[:, None] < C_IN) & (co[None, :] < C_OUT),
                        other=0.0,
                    )  # (BLOCK_CI, BLOCK_CO)
                    acc = tl.dot(a, wj, acc)
        acc += tl.load(bias + co, mask=co < C_OUT, other=0.0).to(tl.float32)[None, :]
        if HAS_MASK:
            keep = tl.load(mask + b * smb + t * smt, mask=t < T, other=0.0)
            acc = tl.where((keep != 0)[:, None], acc, 0.0)
        out = (t < T)[:, None] & (co < C_OUT)[None, :]
        if HAS_RES:
            r = tl.load(res + b * srb + t[:, None] * srt + co[None, :] * src, mask=out, other=0.0)
            acc += r.to(tl.float32)
        tl.store(y + b * syb + t[:, None] * syt + co[None, :] * syc, acc.to(y.dtype.element_ty),
                 mask=out)  # fmt: skip

    # An op torch.compile calls as it is: compiling a graph with it traces only the fake below,
    # and Triton's own cache keeps one compiled kernel per conv shape for every batch size.
    # Registered with torch.library.triton_op instead (Inductor reads the kernel), compiling
    # HiFi-GAN at batch 2 took 59.7 s with the kernels already in Triton's cache, against 17.2 s
    # with cuDNN's resblocks; replays measured alike (H100, `gpu_profile.py --parts compiletime`).
    @torch.library.custom_op("speechrt::fused_conv1d", mutates_args=())
    def fused_conv1d(
        x: Tensor,
        w_kio: Tensor,
        bias: Tensor,
        dilation: int,
        slope: float,
        mask: Tensor | None = None,
        residual: Tensor | None = None,
    ) -> Tensor:
        """x (B, C_in, T), w_kio (K, C_in, C_out), bias (C_out,) -> (B, C_out, T) ("same"
        padding, odd K), computed as the module doc writes; mask (B, 1, T) of 0 / 1, residual
        (B, C_out, T). The result has x's layout (channels-last memory for channels-last x)."""
        return launch(x, w_kio, bias, dilation, slope, mask, residual)

    @fused_conv1d.register_fake
    def _(x: Tensor, w_kio: Tensor, *rest: Any) -> Tensor:  # what tracing sees: the output
        return empty_out(x, w_kio.shape[2])


def empty_out(x: Tensor, c_out: int) -> Tensor:
    """The conv's output for x (B, C_in, T): (B, c_out, T) in x's layout (channels-last memory
    for channels-last x)."""
    B, c_in, T = x.shape
    if x.stride(1) == 1 and c_in > 1:
        return x.new_empty((B, T, c_out)).transpose(1, 2)
    return x.new_empty((B, c_out, T))


def launch(
    x: Tensor,
    w_kio: Tensor,
    bias: Tensor,
    dilation: int,
    slope: float,
    mask: Tensor | None,
    residual: Tensor | None,
    tiles: Tiles | None = None,
) -> Tensor:
    """fused_conv1d's work: the output allocated in x's layout and the kernel launched with
    `tiles` (default: tile_sizes)."""
    B, c_in, T = x.shape
    K, _, c_out = w_kio.shape
    out = empty_out(x, c_out)
    res = residual if residual is not None else out
    keep = mask if mask is not None else out
    bt, bco, bci, warps, stages, flat = tiles or tile_sizes(c_in, c_out)
    flat = flat and c_in % bci == 0
    grid = (triton.cdiv(T, bt), triton.cdiv(c_out, bco), B)
    _conv_kernel[grid](
        x, w_kio, bias, res, keep, out,
        T,
        x.stride(0), x.stride(1), x.stride(2), res.stride(0), res.stride(1), res.stride(2),
        keep.stride(0), keep.stride(2), out.stride(0), out.stride(1), out.stride(2),
        C_IN=c_in, C_OUT=c_out, K=K, DIL=dilation, PAD=dilation * (K - 1) // 2, SLOPE=slope,
        HAS_RES=residual is not None, HAS_MASK=mask is not None, FLAT=flat,
        BLOCK_T=bt, BLOCK_CO=bco, BLOCK_CI=bci, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def tile_sizes(c_in: int, c_out: int) -> Tiles:
    """(BLOCK_T, BLOCK_CO, BLOCK_CI, warps, stages, flat) for a conv's channel counts: the
    fastest of a sweep at HiFi-GAN V1's resblocks (`gpu_profile.py --parts fusedconv-sweep`,
    H100), one flat loop over (tap, channel block) pairs."""
    block_co = min(max(triton.next_power_of_2(c_out), 16), 128)
    if c_in >= 256:  # 32 channels per step, one more stage in flight
        return 64, block_co, 32, 4, 4, True
    return 64, block_co, min(max(triton.next_power_of_2(c_in), 16), 64), 4, 3, True


def precompile(
    variants: Iterable[Variant], dtype: torch.dtype, device: torch.device | str = "cuda"
) -> int:
    """Each kernel variant launched once on a short channels-last input from COMPILE_THREADS
    threads, so that Triton compiles them side by side instead of one after another at a
    graph's first call. The input's sizes and strides are divisible by 16 like every bucket's,
    so the calls that follow find these kernels compiled. HiFi-GAN V1 (48 variants), empty
    caches, H100: creating its runner and the first call at batch 2 took 23.1 s with them
    compiled from 16 threads, against 34.0 s compiling them one by one on first use
    (`gpu_profile.py --parts compiletime`). Returns the number of variants launched."""
    todo = sorted(set(variants))
    if not todo or not COMPILE_THREADS:
        return 0

    def one(v: Variant) -> None:
        c, K, d, res = v
        with torch.cuda.device(device):  # a new thread's current device is the first one
            x = torch.zeros(1, 1024, c, device=device, dtype=dtype).transpose(1, 2)
            w = torch.zeros(K, c, c, device=device, dtype=dtype)
            mask = torch.ones(1, 1, 1024, device=device, dtype=dtype)
            launch(x, w, w.new_zeros(c), d, 0.1, mask, x if res else None)

    with ThreadPoolExecutor(COMPILE_THREADS) as pool:
        list(pool.map(one, todo))
    torch.cuda.synchronize(device)
    return len(todo)
