"""FastConformer's relative-position attention as one Triton kernel (the cuda runner's Parakeet).

    out[b, i, h] = sum_j softmax_j(s[i, j]) v[b, j, h]
    s[i, j] = ((q[b, i, h] + pos_bias_u[h]) . k[b, j, h] + pos[b, h, i, T - 1 - i + j]) * scale
              where key j is valid (MASKED otherwise; outside the band |i - j| <= context too)
    pos[b, h, i, r] = bd[b, h, i, r] + bias_pos[h, r]

pos (B, H, T, 2T - 1) is the position term (q + pos_bias_v) . linear_pos(pe) against relative
positions T-1 ... -(T-1): bd = q . linear_pos(pe), one cuBLAS batched GEMM outside over q as it
lies in the q, k, v GEMM's rows, and bias_pos = pos_bias_v . linear_pos(pe), (H, 2T - 1), which
the kernel adds (q + pos_bias_v would be one more pass over q). Transformer-XL's shift of it
(models.parakeet.rel_shift) is a strided read here: in rows of stride S, bd[b, h, i, T - 1 - i + j]
lies at i * (S - 1) + (T - 1) + j, so the kernel loads a (query, key) tile of shifted scores as
any 2-D tile, with row stride S - 1 (bias_pos's tile: row stride -1). The reference path
materialises the shifted (B, H, T, T) scores, scales and masks them in separate passes and
hands them to attention as a float mask: several full passes over 32 M scores per layer at
batch 128 x 10 s.

The kernel is flash attention's loop (online softmax over key blocks, fp32 accumulators) for one
(query block, batch item, head). Padded keys get NeMo's MASKED score, which softmax turns into an
exact 0 as NeMo's masked_fill does; padded queries' rows carry values nobody reads.
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
relpos_attention: Any = None  # the custom op speechrt::relpos_attention, where Triton is
MASKED = -10000.0  # NeMo's INF_VAL (models.parakeet.MASKED)


def supported(d_k: int) -> bool:
    """Whether the kernel serves this head size (a power of two Triton's dot takes)."""
    return triton is not None and d_k >= 16 and d_k & (d_k - 1) == 0


if triton is not None:
    _MASKED = tl.constexpr(MASKED * 1.4426950408889634)  # in log2 units, as the scores

    @triton.jit
    def _relpos_kernel(
        q, k, v, bd, bias_pos, keys, bias_u, out,
        T, scale,
        sqb, sqt, skb, skt, svb, svt, sbb, sbh, sbt, sph, skeysb, sob, sot,
        H: tl.constexpr, DK: tl.constexpr, CONTEXT: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # 64-bit item and head offsets: bd's head stride times the head passes 2**31 elements
        # at batch 64 x 2 minutes (a converted model's window)
        b = (tl.program_id(1) // H).to(tl.int64)
        h = (tl.program_id(1) % H).to(tl.int64)
        i0 = tl.program_id(0) * BLOCK_M
        i = i0 + tl.arange(0, BLOCK_M)  # (M,) query frames
        d = tl.arange(0, DK)
        qi = tl.load(q + b * sqb + i[:, None] * sqt + h * DK + d[None, :], mask=(i < T)[:, None],
                     other=0.0)  # fmt: skip
        qi = (qi.to(tl.float32) + tl.load(bias_u + h * DK + d)[None, :].to(tl.float32)).to(
            q.dtype.element_ty
        )  # (M, DK): q + pos_bias_u
        m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)  # running max
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running sum of exp
        acc = tl.zeros((BLOCK_M, DK), dtype=tl.float32)
        lo, hi = 0, T
        if CONTEXT >= 0:  # only the key blocks that meet the band [i - context, i + context]
            lo = tl.maximum(i0 - CONTEXT, 0) // BLOCK_N * BLOCK_N
            hi = tl.minimum(i0 + BLOCK_M + CONTEXT, T)
        for j0 in range(lo, hi, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)  # (N,) key frames
            inside = j < T
            kj = tl.load(k + b * skb + j[:, None] * skt + h * DK + d[None, :],
                         mask=inside[:, None], other=0.0)  # fmt: skip
            if IEEE:  # float32 inputs: full-precision products, not TF32
                s = tl.dot(qi, tl.trans(kj), input_precision="ieee")  # (M, N) fp32
            else:
                s = tl.dot(qi, tl.trans(kj))
            tile = (i < T)[:, None] & inside[None, :]
            r = (T - 1) - i[:, None] + j[None, :]  # (M, N) relative positions
            shifted = bd + b * sbb + h * sbh + i[:, None] * sbt + r
            pos = tl.load(shifted, mask=tile, other=0.0).to(tl.float32)
            pos += tl.load(bias_pos + h * sph + r, mask=tile, other=0.0).to(tl.float32)
            s = (s + pos) * scale  # scores in log2 units (exp2 below): * scale * log2(e)
            see = tl.load(keys + b * skeysb + j, mask=inside, other=0) != 0  # (N,) valid keys
            see = see[None, :] & (i >= 0)[:, None]
            if CONTEXT >= 0:
                dist = i[:, None] - j[None, :]
                see = see & (dist <= CONTEXT) & (dist >= -CONTEXT)
            s = tl.where(see, s, _MASKED)
            s = tl.where(inside[None, :], s, float("-inf"))  # past T: not a key at all
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vj = tl.load(v + b * svb + j[:, None] * svt + h * DK + d[None, :],
                         mask=inside[:, None], other=0.0)  # fmt: skip
            if IEEE:
                acc = tl.dot(p, vj, acc * alpha[:, None], input_precision="ieee")
            else:
                acc = tl.dot(p.to(vj.dtype), vj, acc * alpha[:, None])
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(out + b * sob + i[:, None] * sot + h * DK + d[None, :],
                 acc.to(out.dtype.element_ty), mask=(i < T)[:, None])  # fmt: skip

    # Opaque to torch.compile (it traces the fake below): the compiled layer calls the kernel
    # between its fused pointwise kernels and the CUDA graph captures it with them.
    @torch.library.custom_op("speechrt::relpos_attention", mutates_args=())
    def relpos_attention(
        q: Tensor, k: Tensor, v: Tensor, bd: Tensor, bias_pos: Tensor, keys: Tensor,
        pos_bias_u: Tensor, scale: float, context: int,
    ) -> Tensor:  # fmt: skip
        """q, k, v (B, T, H, d_k) (any batch and frame strides, heads of d_k contiguous),
        bd (B, H, T, 2T - 1) (any strides but the last), bias_pos (H, 2T - 1), keys (B, T) int8
        (1 on valid frames), pos_bias_u (H, d_k); context: the band's half width, -1 for full
        attention -> (B, T, H, d_k) contiguous."""
        return launch(q, k, v, bd, bias_pos, keys, pos_bias_u, scale, context)

    @relpos_attention.register_fake
    def _(q: Tensor, *rest: Any) -> Tensor:
        return q.new_empty(q.shape)


# (BLOCK_M, BLOCK_N, warps, stages)
Tiles = tuple[int, int, int, int]


def launch(
    q: Tensor, k: Tensor, v: Tensor, bd: Tensor, bias_pos: Tensor, keys: Tensor,
    pos_bias_u: Tensor, scale: float, context: int, tiles: Tiles | None = None,
) -> Tensor:  # fmt: skip
    """relpos_attention's work with `tiles` (default: tile_sizes). bd may have any strides but
    the last (e.g. a (H, B, T, P >= 2T - 1) GEMM output, transposed and cropped)."""
    B, T, H, DK = q.shape
    # (B, T, H, d_k) views of (B, T, D) rows, as the kernel indexes them
    q, k, v = (x if x.stride(3) == 1 and x.stride(2) == DK else x.contiguous() for x in (q, k, v))
    keys = keys.contiguous()
    if bd.stride(3) != 1:
        bd = bd.contiguous()
    bias_pos = bias_pos.contiguous()
    out = q.new_empty((B, T, H, DK))
    bm, bn, warps, stages = tiles or tile_sizes(T, DK)
    grid = (triton.cdiv(T, bm), B * H)
    _relpos_kernel[grid](
        q, k, v, bd, bias_pos, keys, pos_bias_u, out,
        T, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        bd.stride(0), bd.stride(1), bd.stride(2), bias_pos.stride(0), keys.stride(0),
        out.stride(0), out.stride(1),
        H=H, DK=DK, CONTEXT=context, IEEE=q.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def tile_sizes(T: int, d_k: int) -> Tiles:
    """(BLOCK_M, BLOCK_N, warps, stages) for T frames of d_k channels per head."""
    # the fastest of a sweep at 0.6B dims, batch 128 x 10 s (125 frames; sweep_parakeet_parts.py):
    # all keys in one block, 81 us; (64, 64, 4, 2) 95 us
    return (64, 128, 4, 1) if T <= 128 else (64, 64, 4, 2)
