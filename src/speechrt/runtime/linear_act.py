"""A linear layer with its activation as the GEMM's epilogue (the cuda runner's Parakeet).

    silu: out = silu(x @ w.T + b)                          x (M, K), w (N, K) -> (M, N)
    glu:  out = a * sigmoid(g), [a | g] = x @ w.T + b      x (M, K), w (2N, K) -> (M, N)

cuBLAS takes no SiLU or GLU epilogue, so the layer's compiled code otherwise reads and writes the
GEMM's output once more: at parakeet-0.6b dims and batch 128 x 10 s the feed-forward's hidden
(16,000 x 4,096 bf16, 131 MB) twice per layer. Here the activation is applied to the float32
accumulator before the one store.

The kernel is a persistent tiled GEMM (one program per multiprocessor walking the output tiles in
grouped order) that reads its tiles through the tensor-memory accelerator. For GLU the weight rows
are interleaved once (`interleave_glu`: a_0, g_0, a_1, g_1, ...), so an output tile's columns hold
matching value/gate pairs and the epilogue splits them in registers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # the CPU install has no Triton; the cuda runner needs it
    triton = None
linear_act: Any = None  # the custom op speechrt::linear_act, where Triton is
ACTIVATIONS = ("silu", "glu")
MIN_ROWS = 1000  # fewer rows: cuBLAS, then the activation (apply; tiles would idle most SMs)
SMALL_ROWS = 2048  # fewer rows: SMALL_TILES (more tiles to spread over the multiprocessors)


def supported(x: Tensor) -> bool:
    """Whether the kernel serves these inputs (Triton, a Hopper GPU, half precision)."""
    return (
        triton is not None
        and x.is_cuda
        and torch.cuda.get_device_capability(x.device)[0] >= 9
        and x.dtype in (torch.bfloat16, torch.float16)
    )


def serves(x: Tensor, w: Tensor) -> bool:
    """Whether the kernel pays at these sizes: enough rows, layers at least a tile wide."""
    M, K, N = x.numel() // x.shape[-1], x.shape[-1], w.shape[0]
    return M >= MIN_ROWS and K >= 64 and K % 8 == 0 and N % 256 == 0


def apply(x: Tensor, w: Tensor, b: Tensor, act: str) -> Tensor:
    """The layer as the cuda runner's model calls it (under torch.compile, shapes fixed): the
    kernel where it serves, else the GEMM then the activation, which Inductor fuses into one
    pass. x (..., K), w (N, K), b (N,) -> (..., N), or for GLU (interleave_glu) (..., N / 2)"""
    if serves(x, w):
        return linear_act(x, w, b, act)
    y = F.linear(x, w, b)
    if act == "glu":  # interleaved value, gate pairs
        y = y.unflatten(-1, (-1, 2))
        return y[..., 0] * torch.sigmoid(y[..., 1])
    return F.silu(y)


def interleave_glu(w: Tensor) -> Tensor:
    """(2N, ...) GLU weight or bias, value rows then gate rows -> rows a_0, g_0, a_1, g_1, ..."""
    n = w.shape[0] // 2
    return torch.stack((w[:n], w[n:]), 1).reshape(w.shape)


# the epilogue's sigmoid as 0.5 + 0.5 tanh(x / 2) with the GPU's tanh.approx: one special-
# function op a value where exp and a division take two. The epilogue does not overlap the next
# tile's matmuls, so those ops are time the tensor cores wait: on an H200 at 16,000 x 1,024 ->
# 4,096, 0.218 against 0.237 ms, the same largest error against fp32 (bf16's rounding;
# scripts/sweep_parakeet_parts.py --parts epilogue)
TANH = True

if triton is not None:

    @triton.jit
    def _sigmoid(x, TANH: tl.constexpr):
        if TANH:
            t = tl.inline_asm_elementwise(
                "tanh.approx.f32 $0, $1;", "=r,r", [x * 0.5], dtype=tl.float32, is_pure=True,
                pack=1,
            )  # fmt: skip
            return 0.5 * t + 0.5
        return tl.sigmoid(x)

    @triton.jit
    def _linear_act_kernel(
        x_desc, w_desc, out_desc, bias, M, N, K,
        GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
        GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr, SUBTILE: tl.constexpr,
        TANH: tl.constexpr,
    ):  # fmt: skip
        # N: the GEMM's columns (2x the output's for GLU)
        pid_m_tiles, pid_n_tiles = tl.cdiv(M, BM), tl.cdiv(N, BN)
        tiles = pid_m_tiles * pid_n_tiles
        for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WS):
            # grouped order: GROUP_M row tiles share each weight column tile while in L2
            group = tile // (GROUP_M * pid_n_tiles)
            first_m = group * GROUP_M
            rows = min(pid_m_tiles - first_m, GROUP_M)
            pid_m = first_m + (tile % rows)
            pid_n = (tile % (GROUP_M * pid_n_tiles)) // rows
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                a = x_desc.load([pid_m * BM, k0])  # (BM, BK)
                b = w_desc.load([pid_n * BN, k0])  # (BN, BK)
                acc = tl.dot(a, b.T, acc)
            cols = pid_n * BN + tl.arange(0, BN)
            acc = acc + tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
            if GLU:  # interleaved columns: (BM, BN / 2, 2) -> value, gate
                value, gate = tl.split(tl.reshape(acc, (BM, BN // 2, 2)))
                out = value * _sigmoid(gate, TANH)
                out_desc.store([pid_m * BM, pid_n * (BN // 2)], out.to(out_desc.dtype))
            elif SUBTILE:  # two half-width stores: less shared memory held by the epilogue
                left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
                left = left * _sigmoid(left, TANH)
                out_desc.store([pid_m * BM, pid_n * BN], left.to(out_desc.dtype))
                right = right * _sigmoid(right, TANH)
                out_desc.store([pid_m * BM, pid_n * BN + BN // 2], right.to(out_desc.dtype))
            else:
                out = acc * _sigmoid(acc, TANH)
                out_desc.store([pid_m * BM, pid_n * BN], out.to(out_desc.dtype))

    # Opaque to torch.compile (it traces the fake below), like speechrt::relpos_attention
    @torch.library.custom_op("speechrt::linear_act", mutates_args=())
    def linear_act(x: Tensor, w: Tensor, b: Tensor, act: str) -> Tensor:
        """x (..., K), w (N, K), b (N,) -> silu: (..., N); glu (w, b from interleave_glu):
        (..., N / 2)"""
        return launch(x, w, b, act)

    @linear_act.register_fake
    def _(x: Tensor, w: Tensor, b: Tensor, act: str) -> Tensor:
        n = w.shape[0] // 2 if act == "glu" else w.shape[0]
        return x.new_empty((*x.shape[:-1], n))


# (BM, BN, BK, GROUP_M, warps, stages, warp-specialised, split epilogue, programs per
# multiprocessor: 0 one per tile, else persistent programs walking the tiles; two per
# multiprocessor let one's epilogue run beside the other's matmuls where both fit)
Tiles = tuple[int, int, int, int, int, int, int, int, int]
# the fastest of a sweep on an H200 at parakeet-0.6b dims (16,000 x 1,024 -> 4,096 and -> 2,048;
# scripts/sweep_parakeet_parts.py --parts epilogue): 128 x 256 tiles, 3 stages, split epilogue
TILES: Tiles = (128, 256, 64, 8, 8, 3, 0, 1, 1)
SMALL_TILES: Tiles = (128, 128, 64, 8, 8, 4, 0, 0, 1)
_SMS: dict[int, int] = {}


def launch(
    x: Tensor, w: Tensor, b: Tensor, act: str, tiles: Tiles | None = None, tanh: bool | None = None
) -> Tensor:
    """linear_act's work with `tiles` (default: TILES, or SMALL_TILES for few rows) and the
    sigmoid by tanh.approx or not (default: TANH)."""
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], w.shape[0]
    glu = act == "glu"
    out = x.new_empty((M, N // 2 if glu else N))
    tiles = tiles or (TILES if M >= SMALL_ROWS else SMALL_TILES)
    bm, bn, bk, group, warps, stages, ws, subtile, persistent = tiles
    subtile = subtile and not glu
    dev = x.device.index or 0
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    sms = _SMS[dev]
    x_desc = TensorDescriptor.from_tensor(x2, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w.contiguous(), [bn, bk])
    out_desc = TensorDescriptor.from_tensor(out, [bm, bn // 2 if glu or subtile else bn])
    tiles_total = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    programs = min(sms * persistent, tiles_total) if persistent else tiles_total
    _linear_act_kernel[(programs,)](
        x_desc, w_desc, out_desc, b, M, N, K,
        GLU=glu, BM=bm, BN=bn, BK=bk, GROUP_M=group, NUM_SMS=programs, WS=bool(ws),
        SUBTILE=bool(subtile), TANH=TANH if tanh is None else tanh, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return out.reshape(*lead, out.shape[-1])
