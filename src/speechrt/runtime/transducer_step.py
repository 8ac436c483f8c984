"""CudaGreedy's step (speechrt.runtime.transducer_cuda) as three Triton kernels between its
cuBLAS products, one program per item:

    joint_input: g_b = g'_b if the last step emitted a token; hidden_b = relu(f[b, t_b] + g_b)
    -> hidden @ out_w                      (logits: tokens + blank, durations, padding)
    decide:      label, skip; record a token; count, on_frame, last_frame, t_b; running;
                 layer 0's input row [embed[label or blank], h[0, b]]
    -> [x | h] @ W_0 -> cell (layer 0, and layer 1's input row [h_0', h[1, b]]) -> ... layer L-1
    -> h_{L-1}' @ pred_w                   (g', selected at the next step's joint_input)

The torch step spends ~12 small Inductor kernels between the same four products (~16 launches a
step at batch 128, launch-bound); this one launches 3 + pred_layers. Same decisions: argmax ties
go to the first index (torch.argmax), gates i, f, g, o (nn.LSTM), state float32, products in
the loop's dtype; an item past its end changes nothing. Off the GPU the kernels run only under
Triton's interpreter (TRITON_INTERPRET=1), for the CPU tests.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton; the fused step needs it
    triton = None
WARPS = 4


def supported(device: torch.device) -> bool:
    """Triton is there, and the device is a GPU or Triton's interpreter runs kernels on the CPU."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return triton is not None and (device.type == "cuda" or interpreted)


if triton is not None:

    @triton.jit
    def _joint_input_kernel(
        f, t, g, g_new, token, hidden, running, T, J,
        SELECT: tl.constexpr, GATHER: tl.constexpr, BJ: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        j = tl.arange(0, BJ)
        m = j < J
        gb = tl.load(g + b * J + j, mask=m, other=0.0)
        if SELECT:  # the last step's prediction, where it emitted a token
            emitted = tl.load(token + b) != 0
            gn = tl.load(g_new + b * J + j, mask=m, other=0.0).to(tl.float32)
            gb = tl.where(emitted, gn, gb)
            tl.store(g + b * J + j, gb, mask=m)
        if GATHER:
            tb = tl.minimum(tl.load(t + b), T - 1)  # int64: (b * T + tb) * J may pass 2**31
            fb = tl.load(f + (b * T + tb) * J + j, mask=m, other=0.0)
            x = tl.maximum(fb + gb, 0.0)
            tl.store(hidden + b * J + j, x.to(hidden.dtype.element_ty), mask=m)
        tl.store(running, 0, mask=b == 0)  # decide sets it, after this kernel

    @triton.jit
    def _decide_kernel(
        logits, stride_l, durations, t, lengths, count, on_frame, last_frame, token,
        labels, frames, skips, M, embed, h0, xh, running, H, V, N_DUR, max_symbols,
        BV: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        row = logits + b * stride_l
        v = tl.arange(0, BV)
        scores = tl.load(row + v, mask=v < V + 1, other=float("-inf")).to(tl.float32)
        label = tl.argmax(scores, 0, tie_break_left=True)  # tokens, then the blank (V)
        blank = label == V
        if BD > 0:  # TDT: the duration's argmax picks the skip; a blank moves at least 1
            k = tl.arange(0, BD)
            ds = tl.load(row + V + 1 + k, mask=k < N_DUR, other=float("-inf")).to(tl.float32)
            skip = tl.load(durations + tl.argmax(ds, 0, tie_break_left=True))
            skip = tl.where(blank & (skip == 0), 1, skip)
        else:  # RNN-T: a blank moves one frame, a token none
            skip = blank.to(tl.int64)
        tb = tl.load(t + b)
        end = tl.load(lengths + b)
        active = tb < end
        emit = active & (label != V)
        n = tl.minimum(tl.load(count + b), M - 1)
        tl.store(labels + b * M + n, label.to(tl.int64), mask=emit)
        tl.store(frames + b * M + n, tb, mask=emit)
        tl.store(skips + b * M + n, skip, mask=emit)
        tl.store(count + b, tl.load(count + b) + emit.to(tl.int64))
        last = tl.load(last_frame + b)
        on = tl.load(on_frame + b)
        on = tl.where(emit, tl.where(last == tb, on + 1, 1), on)
        tl.store(on_frame + b, on)
        tl.store(last_frame + b, tl.where(emit, tb, last))
        force = emit & (skip == 0) & (on >= max_symbols)  # the max_symbols-th token here
        t_next = tb + tl.where(active, skip, 0) + force.to(tl.int64)
        tl.store(t + b, t_next)
        tl.store(token + b, emit.to(tl.int8))
        tl.atomic_max(running, 1, mask=t_next < end)
        # layer 0's input row (B, 2H) in the products' dtype: [embed[label or blank], h[0, b]]
        x = tl.arange(0, BH)
        mh = x < H
        symbol = tl.where(emit, label, V)
        e = tl.load(embed + symbol * H + x, mask=mh, other=0.0)
        hb = tl.load(h0 + b * H + x, mask=mh, other=0.0)
        tl.store(xh + b * 2 * H + x, e.to(xh.dtype.element_ty), mask=mh)
        tl.store(xh + b * 2 * H + H + x, hb.to(xh.dtype.element_ty), mask=mh)

    @triton.jit
    def _cell_kernel(
        gates, stride_g, h, c, token, h_up, out, H, LAST: tl.constexpr, BH: tl.constexpr
    ):  # fmt: skip
        b = tl.program_id(0)
        x = tl.arange(0, BH)
        m = x < H
        row = gates + b * stride_g  # (4H,): i, f, g, o
        ig = tl.load(row + x, mask=m, other=0.0).to(tl.float32)
        fg = tl.load(row + H + x, mask=m, other=0.0).to(tl.float32)
        gg = tl.load(row + 2 * H + x, mask=m, other=0.0).to(tl.float32)
        og = tl.load(row + 3 * H + x, mask=m, other=0.0).to(tl.float32)
        cb = tl.load(c + b * H + x, mask=m, other=0.0)
        # tanh(x) = 2 sigmoid(2x) - 1 (absolute error ~1e-7): the interpreter has no libdevice
        ci = tl.sigmoid(fg) * cb + tl.sigmoid(ig) * (2 * tl.sigmoid(2 * gg) - 1)
        hi = tl.sigmoid(og) * (2 * tl.sigmoid(2 * ci) - 1)
        emitted = tl.load(token + b) != 0  # the state moves only with a token
        tl.store(c + b * H + x, ci, mask=m & emitted)
        tl.store(h + b * H + x, hi, mask=m & emitted)
        if LAST:  # the joint projection's input (B, H)
            tl.store(out + b * H + x, hi.to(out.dtype.element_ty), mask=m)
        else:  # the next layer's input row (B, 2H): [h', h[layer + 1, b]]
            up = tl.load(h_up + b * H + x, mask=m, other=0.0)
            tl.store(out + b * 2 * H + x, hi.to(out.dtype.element_ty), mask=m)
            tl.store(out + b * 2 * H + H + x, up.to(out.dtype.element_ty), mask=m)


def joint_input(s: dict[str, Tensor], select: bool, gather: bool) -> None:
    """select: g = g_new where the last step emitted a token; gather: s["hidden"] (B, J) =
    relu(f[b, t_b] + g_b) in the products' dtype. Clears s["running"] for decide."""
    B, T, J = s["f"].shape
    _joint_input_kernel[(B,)](
        s["f"], s["t"], s["g"], s["g_new"], s["token"], s["hidden"], s["running"], T, J,
        SELECT=select, GATHER=gather, BJ=triton.next_power_of_2(J), num_warps=WARPS,
    )  # fmt: skip


def decide(
    logits: Tensor,
    s: dict[str, Tensor],
    embed: Tensor,
    durations: Tensor | None,
    max_symbols: int,
) -> None:
    """logits (B, >= V + 1 + durations: tokens, blank, TDT durations, padding), embed
    (V + 1, H), durations (TDT's, None for RNN-T): one decision per item, as CudaGreedy.step
    takes it, and s["xh"][0] (B, 2H), layer 0's input."""
    B, H = s["g"].shape[0], s["h"].shape[2]
    V = embed.shape[0] - 1
    n_dur = 0 if durations is None else durations.numel()
    dur = s["skips"] if durations is None else durations  # RNN-T: a pointer nobody reads
    _decide_kernel[(B,)](
        logits, logits.stride(0), dur, s["t"], s["lengths"], s["count"], s["on_frame"],
        s["last_frame"], s["token"], s["labels"], s["frames"], s["skips"], s["labels"].shape[1],
        embed, s["h"][0], s["xh"][0], s["running"], H, V, n_dur, max_symbols,
        BV=triton.next_power_of_2(V + 1), BD=triton.next_power_of_2(n_dur) if n_dur else 0,
        BH=triton.next_power_of_2(H), num_warps=WARPS,
    )  # fmt: skip


def cell(gates: Tensor, s: dict[str, Tensor], layer: int) -> None:
    """gates (B, 4H) of `layer` -> its h, c where the step emitted a token, and the next
    layer's input row s["xh"][layer + 1] (B, 2H), or after the last s["x_out"] (B, H)."""
    B, H = gates.shape[0], s["h"].shape[2]
    last = layer == s["h"].shape[0] - 1
    _cell_kernel[(B,)](
        gates, gates.stride(0), s["h"][layer], s["c"][layer], s["token"],
        s["h"][layer if last else layer + 1], s["x_out"] if last else s["xh"][layer + 1], H,
        LAST=last, BH=triton.next_power_of_2(H), num_warps=WARPS,
    )  # fmt: skip
