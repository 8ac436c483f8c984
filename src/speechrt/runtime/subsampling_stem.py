"""The subsampling's first two convolutions as one Triton kernel (the cuda runner's Parakeet).

    h[b, r, s, c]   = relu(b1[c] + sum_{a,e} w1[c, a, e] * x[b, 2r + a - 1, 2s + e - 1])
                      where r < lengths1[b], else 0                        conv 3x3/2, 1 -> C
    out[b, i, j, c] = bd[c] + sum_{a,e} wd[c, a, e] * h[b, 2i + a - 1, 2j + e - 1, c]
                                                                           depthwise 3x3/2

x (B, T, F) features, zero past an item's length and outside the image (the reference masks,
then pads each conv by 1). The first conv's output (B, T/2, F/2, C) is the largest tensor of the
encoder (parakeet-0.6b, batch 128 x 10 s: 1.3 GB in bf16); written, masked, padded and read back
it cost about 2 ms. Here it is never stored: a program takes a block of output positions of one
item and a block of channels, and for each of the depthwise conv's 9 taps computes the first
conv's values under it as one small GEMM on the tensor cores, (positions, 9 input taps padded
to 16) x (16, channels), then ReLU, mask and the depthwise tap in fp32 registers. The first
conv is computed about 2.25x over (neighbouring taps overlap); it is 9 multiply-adds a value.
Output: (B, T/4, F/4, C), channels last, as the pointwise conv that follows reads it.

The later strided depthwise convs (strided_depthwise) read the pointwise conv before them as it
left its GEMM, channels last and before its ReLU:

    out[b, i, j, c] = bd[c] + sum_{a,e} wd[c, a, e] * relu(x[b, 2i + a - 1, 2j + e - 1, c])
                      (rows past lengths[b] and outside the image read as 0)

so the ReLU, the mask and the padding cost no pass of their own over x.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from speechrt.arch.parakeet import halve

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton; the cuda runner needs it
    triton = None
subsampling_stem: Any = None  # the custom op speechrt::subsampling_stem, where Triton is
strided_depthwise: Any = None  # the custom op speechrt::strided_depthwise, where Triton is
# (positions, channels, warps, stages) of a program: the fastest of a sweep on an H200 at
# parakeet-0.6b dims (scripts/sweep_parakeet_parts.py --parts stem)
Tiles = tuple[int, int, int, int]
TILES: Tiles = (32, 32, 1, 1)
DEPTHWISE_TILES: Tiles = (32, 128, 4, 1)  # not yet swept


def supported(x: Tensor) -> bool:
    """Whether the kernel serves this input (Triton and a GPU)."""
    return triton is not None and x.is_cuda


if triton is not None:

    @triton.jit
    def _stem_kernel(
        x, lengths, w1, b1, wd, bd, out, T, F, H1, W1, H2, W2, sxb, sxt, sxf,
        C: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)  # item offsets may pass 2**31 elements
        p = tl.program_id(1) * BP + tl.arange(0, BP)  # (BP,) output positions i * W2 + j
        i, j = p // W2, p % W2
        c = tl.program_id(2) * BC + tl.arange(0, BC)  # (BC,) channels
        cin = c < C
        k = tl.arange(0, 16)  # the first conv's taps, 9 of 16 used
        ka, ke, kin = k // 3, k % 3, k < 9
        w1t = tl.load(w1 + c[None, :] * 9 + k[:, None], mask=kin[:, None] & cin, other=0.0)
        bias1 = tl.load(b1 + c, mask=cin, other=0.0).to(tl.float32)
        L0 = tl.minimum(tl.load(lengths + b), T)
        L1 = tl.where(L0 > 0, (L0 - 1) // 2 + 1, 0)  # the first conv's valid rows
        xb = x + b * sxb
        acc = tl.zeros((BP, BC), tl.float32)
        for tap in tl.static_range(9):  # the depthwise conv's taps
            r = 2 * i + tap // 3 - 1  # (BP,) first-conv row and column under this tap
            s = 2 * j + tap % 3 - 1
            used = (r >= 0) & (r < L1) & (r < H1) & (s >= 0) & (s < W1) & (p < H2 * W2)
            t = 2 * r[:, None] + ka[None, :] - 1  # (BP, 16) input frame and mel bin
            f = 2 * s[:, None] + ke[None, :] - 1
            m = used[:, None] & kin[None, :] & (t >= 0) & (t < L0) & (f >= 0) & (f < F)
            patch = tl.load(xb + t * sxt + f * sxf, mask=m, other=0.0).to(w1t.dtype)
            h = tl.dot(patch, w1t, input_precision=PRECISION)  # (BP, BC)
            h = tl.where(used[:, None], tl.maximum(h + bias1[None, :], 0.0), 0.0)
            acc += h * tl.load(wd + c * 9 + tap, mask=cin, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(bd + c, mask=cin, other=0.0).to(tl.float32)[None, :]
        o = out + (b * H2 * W2 + p[:, None]) * C + c[None, :]
        tl.store(o, acc.to(out.dtype.element_ty), mask=(p < H2 * W2)[:, None] & cin)

    @triton.jit
    def _depthwise_kernel(
        x, lengths, wd, bd, out, H, W, H2, W2,
        C: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)  # item offsets may pass 2**31 elements
        p = tl.program_id(1) * BP + tl.arange(0, BP)  # (BP,) output positions i * W2 + j
        i, j = p // W2, p % W2
        c = tl.program_id(2) * BC + tl.arange(0, BC)  # (BC,) channels
        cin = c < C
        L = tl.minimum(tl.load(lengths + b), H)  # x's valid rows
        xb = x + b * H * W * C
        acc = tl.zeros((BP, BC), tl.float32)
        for tap in tl.static_range(9):
            r = 2 * i + tap // 3 - 1  # (BP,) x's row and column under this tap
            s = 2 * j + tap % 3 - 1
            used = (r >= 0) & (r < L) & (s >= 0) & (s < W) & (p < H2 * W2)
            v = tl.load(xb + (r * W + s)[:, None] * C + c[None, :],
                        mask=used[:, None] & cin[None, :], other=0.0)  # fmt: skip
            w = tl.load(wd + c * 9 + tap, mask=cin, other=0.0).to(tl.float32)
            acc += tl.maximum(v.to(tl.float32), 0.0) * w[None, :]
        acc += tl.load(bd + c, mask=cin, other=0.0).to(tl.float32)[None, :]
        o = out + (b * H2 * W2 + p[:, None]) * C + c[None, :]
        tl.store(o, acc.to(out.dtype.element_ty), mask=(p < H2 * W2)[:, None] & cin[None, :])

    # Opaque to torch.compile (it traces the fakes below), like speechrt::relpos_attention
    @torch.library.custom_op("speechrt::subsampling_stem", mutates_args=())
    def subsampling_stem(
        x: Tensor, lengths: Tensor, w1: Tensor, b1: Tensor, wd: Tensor, bd: Tensor
    ) -> Tensor:
        """x (B, T, F), lengths (B,), w1 (C, 9), b1 (C,), wd (C, 9), bd (C,)
        -> (B, T/4, F/4, C) (each halving as halve())"""
        return launch(x, lengths, w1, b1, wd, bd)

    @subsampling_stem.register_fake
    def _(x: Tensor, lengths: Tensor, w1: Tensor, *rest: Any) -> Tensor:
        B, T, F = x.shape
        return x.new_empty((B, halve(halve(T)), halve(halve(F)), w1.shape[0]), dtype=w1.dtype)

    @torch.library.custom_op("speechrt::strided_depthwise", mutates_args=())
    def strided_depthwise(x: Tensor, lengths: Tensor, wd: Tensor, bd: Tensor) -> Tensor:
        """x (B, H, W, C) before its ReLU, lengths (B,) x's valid rows, wd (C, 9), bd (C,)
        -> (B, H/2, W/2, C) (each halving as halve())"""
        return launch_depthwise(x, lengths, wd, bd)

    @strided_depthwise.register_fake
    def _(x: Tensor, *rest: Any) -> Tensor:
        B, H, W, C = x.shape
        return x.new_empty((B, halve(H), halve(W), C))


def launch(
    x: Tensor, lengths: Tensor, w1: Tensor, b1: Tensor, wd: Tensor, bd: Tensor,
    tiles: Tiles = TILES,
) -> Tensor:  # fmt: skip
    """subsampling_stem's work with `tiles`; the output in w1's dtype."""
    B, T, F = x.shape
    C = w1.shape[0]
    if w1.shape != (C, 9) or wd.shape != (C, 9) or b1.shape != (C,) or bd.shape != (C,):
        raise ValueError(f"stem weights must be ({C}, 9) and ({C},)")
    H1, W1 = halve(T), halve(F)
    H2, W2 = halve(H1), halve(W1)
    out = torch.empty((B, H2, W2, C), device=x.device, dtype=w1.dtype)
    bp, bc, warps, stages = tiles
    bc = min(bc, max(16, triton.next_power_of_2(C)))  # a dot takes 16 columns or more
    grid = (B, triton.cdiv(H2 * W2, bp), triton.cdiv(C, bc))
    _stem_kernel[grid](
        x, lengths.contiguous(), w1.contiguous(), b1, wd.contiguous(), bd, out,
        T, F, H1, W1, H2, W2, x.stride(0), x.stride(1), x.stride(2),
        C=C, BP=bp, BC=bc, PRECISION="ieee" if w1.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def launch_depthwise(
    x: Tensor, lengths: Tensor, wd: Tensor, bd: Tensor, tiles: Tiles = DEPTHWISE_TILES
) -> Tensor:
    """strided_depthwise's work with `tiles`."""
    B, H, W, C = x.shape
    if wd.shape != (C, 9) or bd.shape != (C,):
        raise ValueError(f"depthwise weights must be ({C}, 9) and ({C},)")
    x = x.contiguous()
    H2, W2 = halve(H), halve(W)
    out = x.new_empty((B, H2, W2, C))
    bp, bc, warps, stages = tiles
    bc = min(bc, triton.next_power_of_2(C))
    grid = (B, triton.cdiv(H2 * W2, bp), triton.cdiv(C, bc))
    _depthwise_kernel[grid](
        x, lengths.contiguous(), wd.contiguous(), bd, out, H, W, H2, W2,
        C=C, BP=bp, BC=bc, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
