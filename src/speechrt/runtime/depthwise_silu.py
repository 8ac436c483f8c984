"""The conv module's middle as one Triton kernel (the cuda runner's Parakeet):

    out[b, t, c] = silu(bias[c] + sum_i w[c, i] * x[b, t + i - (k - 1) // 2, c] * valid[b, ...])

x (B, T, C): the GLU's output; padded frames (valid 0) and frames outside [0, T) read as zero,
as the reference zeroes padded frames and pads the depthwise conv ('same', BatchNorm folded into
w and bias). Inductor compiles the same taps into a kernel that spends its time on index
arithmetic (about 95 us per layer at parakeet-0.6b dims, batch 128 x 10 s, for 64 MB of
traffic); here a program loads k shifted (frames x channels) tiles, channels contiguous.
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
# (frames, channels, warps) of a program's tile
Tiles = tuple[int, int, int]
TILES: Tiles = (32, 128, 4)


def supported(x: Tensor) -> bool:
    return triton is not None and x.is_cuda


if triton is not None:

    @triton.jit
    def _depthwise_silu_kernel(
        x, keys, w, bias, out, T, C, sxb, sxt, skb, sob, sot,
        K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(2)
        t = tl.program_id(0) * BT + tl.arange(0, BT)  # (BT,) output frames
        c = tl.program_id(1) * BC + tl.arange(0, BC)  # (BC,) channels
        cin = c < C
        acc = tl.zeros((BT, BC), dtype=tl.float32)
        for i in tl.static_range(K):  # tap i reads frame t + i - (K - 1) // 2
            src = t + (i - (K - 1) // 2)
            inside = (src >= 0) & (src < T)
            valid = tl.load(keys + b * skb + src, mask=inside, other=0) != 0
            m = valid[:, None] & cin[None, :]
            xv = tl.load(x + b * sxb + src[:, None] * sxt + c[None, :], mask=m, other=0.0)
            wi = tl.load(w + c * K + i, mask=cin, other=0.0).to(tl.float32)
            acc += wi[None, :] * xv.to(tl.float32)
        acc += tl.load(bias + c, mask=cin, other=0.0).to(tl.float32)[None, :]
        y = acc * tl.sigmoid(acc)
        tl.store(out + b * sob + t[:, None] * sot + c[None, :], y.to(out.dtype.element_ty),
                 mask=(t < T)[:, None] & cin[None, :])  # fmt: skip

    # Opaque to torch.compile (it traces the fake below), like speechrt::relpos_attention
    @torch.library.custom_op("speechrt::depthwise_silu", mutates_args=())
    def depthwise_silu(x: Tensor, keys: Tensor, w: Tensor, bias: Tensor) -> Tensor:
        """x (B, T, C), keys (B, T) int8 (1 on valid frames), w (C, k) (odd k), bias (C,)
        -> (B, T, C)"""
        return launch(x, keys, w, bias)

    @depthwise_silu.register_fake
    def _(x: Tensor, *rest: Any) -> Tensor:
        return x.new_empty(x.shape)


def launch(x: Tensor, keys: Tensor, w: Tensor, bias: Tensor, tiles: Tiles = TILES) -> Tensor:
    B, T, C = x.shape
    x, keys, w = x.contiguous(), keys.contiguous(), w.contiguous()
    out = torch.empty_like(x)
    bt, bc, warps = tiles
    grid = (triton.cdiv(T, bt), triton.cdiv(C, bc), B)
    _depthwise_silu_kernel[grid](
        x, keys, w, bias, out, T, C, x.stride(0), x.stride(1), keys.stride(0),
        out.stride(0), out.stride(1), K=w.shape[1], BT=bt, BC=bc, num_warps=warps,
    )  # fmt: skip
    return out
