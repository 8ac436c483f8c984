"""The conv module's middle as one Triton kernel (the cuda runner's Parakeet):

    out[b, t, c] = silu(bias[c] + sum_i w[c, i] * x[b, t + i - (k - 1) // 2, c] * valid[b, ...])

x (B, T, C): the GLU's output; padded frames (valid 0) and frames outside [0, T) read as zero,
as the reference zeroes padded frames and pads the depthwise conv ('same', BatchNorm folded into
w and bias). A program slides along the frames of one item and a block of channels, its 9 taps
held in registers: each step reads one new frame row and writes one output row, so x is read
about once (a 2-D tile kernel that loaded its 9 shifted tiles reread x from L2 per tap: 64 us
against 44 us at parakeet-0.6b dims, batch 128 x 10 s; Inductor's kernel for the same taps about
95 us). Written for FastConformer's kernel size 9 (every published Parakeet); others stay on
Inductor's taps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton; the cuda runner needs it
    triton = None
depthwise_silu: Any = None  # the custom op speechrt::depthwise_silu, where Triton is
KERNEL_SIZE = 9
# (channels, frames, warps, stages) of a program: the fastest of a sweep on an H200 at
# parakeet-0.6b dims (scripts/sweep_parakeet_parts.py --parts depthwise)
Tiles = tuple[int, int, int, int]
TILES: Tiles = (128, 16, 1, 3)


def supported(x: Tensor, kernel_size: int) -> bool:
    return triton is not None and x.is_cuda and kernel_size == KERNEL_SIZE


if triton is not None:

    @triton.jit
    def _row(xb, kb, s, T, sxt, cin):
        """Frame s of an item's channel block as float32; 0 outside [0, T) or padded."""
        inside = (s >= 0) & (s < T)
        valid = tl.load(kb + s, mask=inside, other=0) != 0
        return tl.load(xb + s * sxt, mask=cin & valid, other=0.0).to(tl.float32)

    @triton.jit
    def _depthwise_silu_kernel(
        x, keys, w, bias, out, T, C, sxb, sxt, skb, sob, sot, BC: tl.constexpr, TT: tl.constexpr,
    ):  # fmt: skip
        c = tl.program_id(0) * BC + tl.arange(0, BC)  # (BC,) channels
        b = tl.program_id(1).to(tl.int64)  # item offsets may pass 2**31 elements
        t0 = tl.program_id(2) * TT  # frames [t0, t0 + TT)
        cin = c < C
        wc = w + c * 9
        w0 = tl.load(wc + 0, mask=cin, other=0.0).to(tl.float32)
        w1 = tl.load(wc + 1, mask=cin, other=0.0).to(tl.float32)
        w2 = tl.load(wc + 2, mask=cin, other=0.0).to(tl.float32)
        w3 = tl.load(wc + 3, mask=cin, other=0.0).to(tl.float32)
        w4 = tl.load(wc + 4, mask=cin, other=0.0).to(tl.float32)
        w5 = tl.load(wc + 5, mask=cin, other=0.0).to(tl.float32)
        w6 = tl.load(wc + 6, mask=cin, other=0.0).to(tl.float32)
        w7 = tl.load(wc + 7, mask=cin, other=0.0).to(tl.float32)
        w8 = tl.load(wc + 8, mask=cin, other=0.0).to(tl.float32)
        acc0 = tl.load(bias + c, mask=cin, other=0.0).to(tl.float32)
        xb, kb = x + b * sxb + c, keys + b * skb
        # the window: frames t - 4 ... t + 3 before the step that reads t + 4
        r0, r1 = _row(xb, kb, t0 - 4, T, sxt, cin), _row(xb, kb, t0 - 3, T, sxt, cin)
        r2, r3 = _row(xb, kb, t0 - 2, T, sxt, cin), _row(xb, kb, t0 - 1, T, sxt, cin)
        r4, r5 = _row(xb, kb, t0, T, sxt, cin), _row(xb, kb, t0 + 1, T, sxt, cin)
        r6, r7 = _row(xb, kb, t0 + 2, T, sxt, cin), _row(xb, kb, t0 + 3, T, sxt, cin)
        for t in range(t0, tl.minimum(t0 + TT, T)):
            r8 = _row(xb, kb, t + 4, T, sxt, cin)
            acc = acc0 + w0 * r0 + w1 * r1 + w2 * r2 + w3 * r3 + w4 * r4
            acc += w5 * r5 + w6 * r6 + w7 * r7 + w8 * r8
            y = acc * tl.sigmoid(acc)
            tl.store(out + b * sob + t * sot + c, y.to(out.dtype.element_ty), mask=cin)
            r0, r1, r2, r3, r4, r5, r6, r7 = r1, r2, r3, r4, r5, r6, r7, r8

    # Opaque to torch.compile (it traces the fake below), like speechrt::relpos_attention
    @torch.library.custom_op("speechrt::depthwise_silu", mutates_args=())
    def depthwise_silu(x: Tensor, keys: Tensor, w: Tensor, bias: Tensor) -> Tensor:
        """x (B, T, C), keys (B, T) int8 (1 on valid frames), w (C, 9), bias (C,) -> (B, T, C)"""
        return launch(x, keys, w, bias)

    @depthwise_silu.register_fake
    def _(x: Tensor, *rest: Any) -> Tensor:
        return x.new_empty(x.shape)


def launch(x: Tensor, keys: Tensor, w: Tensor, bias: Tensor, tiles: Tiles = TILES) -> Tensor:
    B, T, C = x.shape
    if w.shape != (C, KERNEL_SIZE):
        raise ValueError(f"depthwise weights must be ({C}, {KERNEL_SIZE}), got {tuple(w.shape)}")
    x, keys, w = x.contiguous(), keys.contiguous(), w.contiguous()
    out = torch.empty_like(x)
    bc, tt, warps, stages = tiles
    grid = (triton.cdiv(C, bc), B, triton.cdiv(T, tt))
    _depthwise_silu_kernel[grid](
        x, keys, w, bias, out, T, C, x.stride(0), x.stride(1), keys.stride(0),
        out.stride(0), out.stride(1), BC=bc, TT=tt, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
