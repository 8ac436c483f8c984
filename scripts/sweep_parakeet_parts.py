"""Parts of a FastConformer layer on the GPU, timed alone at parakeet-0.6b dims (batch 128 x 10 s:
125 frames, d_model 1024, 8 heads): the choices scripts/bench_parakeet.py then times whole.

    attention   the fused rel-pos kernel at several tile sizes beside the reference (shifted
                scores + SDPA), compiled, and its error against the reference
    ff          the feed-forward compiled by Inductor's default and with max-autotune (GEMM
                templates that can take SiLU as an epilogue)
    epilogue    the feed-forward's linear1 + SiLU and the conv module's pointwise_conv1 + GLU:
                cuBLAS then Inductor's pass, cuBLAS alone, and speechrt.runtime.linear_act (one
                GEMM, the activation as its epilogue) at several tile shapes; each timed as a
                CUDA graph's replay (no launch overhead; gpu_timing.graph_time_ms), at several
                row counts
    depthwise   the conv module's mask + depthwise conv + SiLU kernel at several tile sizes
    stem        the subsampling's first conv + ReLU + mask + depthwise conv as one kernel at
                several tile sizes, beside the two convs compiled as shifted slices; then the
                next ReLU + mask + strided depthwise conv likewise (strided_depthwise)
    subsampling the dw_striding subsampling at 0.6B dims (80 and 128 mels), compiled with its
                strided convs as taps (Inductor's default, or each conv's output realised)
                or on cuDNN, or its first two convs as the stem kernel
    layer       a whole conformer layer as the cuda runner compiles it, with either attention,
                and with Inductor realising values read by more than two consumers (the conv
                module's GLU output, which its depthwise taps otherwise recompute per tap), and
                with Inductor tuning its own kernels' tiles (the layer norms)

    python scripts/sweep_parakeet_parts.py --out DIR   # writes DIR/parts.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import bench_parakeet  # noqa: E402  (this directory is on the path of a script)
from gpu_timing import graph_time_ms  # noqa: E402

from speechrt.models import parakeet  # noqa: E402
from speechrt.registry import preset  # noqa: E402


def timed(fn, reps: int = 50) -> float:  # noqa: ANN001
    """Median milliseconds of fn(), synchronised (bench_parakeet.timed)."""
    return bench_parakeet.timed(fn, reps) * 1e3


def attention(rows: list[dict], B: int, T: int) -> None:
    from speechrt.runtime.relpos_attention import launch, relpos_attention

    d = preset("parakeet_ctc", "parakeet-ctc-0.6b")
    torch.manual_seed(0)
    att = parakeet.RelPositionAttention(d).cuda().to(torch.bfloat16).eval()
    with torch.no_grad():
        att.pos_bias_u.normal_(0, 0.5)
        att.pos_bias_v.normal_(0, 0.5)
    x = torch.randn(B, T, d.d_model, device="cuda", dtype=torch.bfloat16)
    lengths = torch.randint(T // 2, T + 1, (B,), device="cuda")
    valid = parakeet.valid_mask(lengths, T)
    mask = ~(valid[:, None, :] & valid[:, :, None])[:, None]
    pe = att.project(parakeet.relative_positions(T, d.d_model, x.device))  # (2T - 1, D)
    pad = ~valid[:, None, :]
    ref = torch.compile(att, dynamic=False)
    with torch.inference_mode():
        want = ref(x, pe, mask, pad).float()
        rows.append(
            dict(part="attention", variant="reference", ms=timed(lambda: ref(x, pe, mask, pad)))
        )
        print(rows[-1], flush=True)
        att.use_kernel(relpos_attention)
        fused = torch.compile(att, dynamic=False)
        got = fused(x, pe, mask, pad).float()
        err = max((got[b, :n] - want[b, :n]).abs().max().item() for b, n in enumerate(lengths))
        ms = timed(lambda: fused(x, pe, mask, pad))
        rows.append(dict(part="attention", variant="fused layer", ms=ms, max_err=err,
                         scale=want.abs().max().item()))  # fmt: skip
        print(rows[-1], flush=True)
        H, dk = d.n_heads, d.d_model // d.n_heads
        q, k, v = (torch.randn(B, T, H, dk, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        bd = torch.randn(H, B, T, 2 * T - 1, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
        bias = torch.randn(H, 2 * T - 1, device="cuda", dtype=torch.bfloat16)
        keys = valid.to(torch.int8)
        base = launch(q, k, v, bd, bias, keys, att.pos_bias_u, dk**-0.5, -1, (64, 64, 8, 2))
        for tiles in [(64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2),
                      (64, 64, 2, 2), (128, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 1),
                      (128, 32, 8, 3), (64, 128, 4, 1), (64, 64, 4, 3)]:  # fmt: skip
            try:
                args = (q, k, v, bd, bias, keys, att.pos_bias_u, dk**-0.5, -1)
                out = launch(*args, tiles)
                ms = graph_time_ms(lambda t=tiles, a=args: launch(*a, t))
                same = (out.float() - base.float()).abs().max().item()
            except Exception as e:  # a tile size the GPU cannot hold
                ms, same = float("nan"), repr(e)[:80]
            rows.append(dict(part="attention kernel", variant=str(tiles), ms=ms, vs_first=same))
            print(rows[-1], flush=True)


def feed_forward(rows: list[dict], B: int, T: int) -> None:
    d = preset("parakeet_ctc", "parakeet-ctc-0.6b")
    ff = parakeet.FeedForward(d).cuda().to(torch.bfloat16).eval()
    x = torch.randn(B, T, d.d_model, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for mode in ("default", "max-autotune-no-cudagraphs"):
            t0 = time.perf_counter()
            fn = torch.compile(ff, dynamic=False, mode=mode)
            fn(x)
            compile_s = time.perf_counter() - t0
            rows.append(
                dict(part="ff", variant=mode, ms=timed(lambda f=fn: f(x)), compile_s=compile_s)
            )
            print(rows[-1], flush=True)
            torch._dynamo.reset()


# (BM, BN, BK, GROUP_M, warps, stages, warp-specialised, split epilogue, persistent)
EPILOGUE_TILES = [
    (128, 256, 64, 8, 8, 3, 0, 1, 1), (128, 256, 64, 8, 8, 4, 0, 1, 1),
    (64, 256, 64, 8, 4, 2, 0, 0, 2), (64, 256, 64, 8, 4, 2, 0, 1, 2),
    (64, 256, 64, 8, 4, 2, 0, 0, 0), (128, 128, 64, 8, 4, 2, 0, 0, 2),
    (128, 128, 64, 8, 4, 3, 0, 0, 0), (128, 256, 64, 8, 8, 3, 0, 0, 1),
]  # fmt: skip


def epilogue(rows: list[dict], B: int, T: int) -> None:
    torch.manual_seed(0)
    for K, N, act in ((1024, 4096, "silu"), (1024, 2048, "glu")):
        for M in (B * T, B * T // 4, 1000):
            epilogue_shape(rows, M, K, N, act)


def epilogue_shape(rows: list[dict], M: int, K: int, N: int, act: str) -> None:
    from functools import partial

    import torch.nn.functional as F

    from speechrt.runtime import linear_act as la

    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16) * 0.1
    wi, bi = (la.interleave_glu(w), la.interleave_glu(b)) if act == "glu" else (w, b)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)

    def unfused(x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, w, b)
        return F.glu(y, -1) if act == "glu" else F.silu(y)

    want = F.linear(x.float(), w.float(), b.float())
    want = F.glu(want, -1) if act == "glu" else F.silu(want)
    flops = 2 * M * N * K
    shape = dict(part="epilogue", act=act, M=M, K=K, N=N)
    variants = {
        "cublas + inductor": partial(torch.compile(unfused), x),
        "cublas alone": partial(F.linear, x, w, b),
        **{str(t): partial(la.launch, x, wi, bi, act, t, False) for t in EPILOGUE_TILES},
        **{f"{t} tanh": partial(la.launch, x, wi, bi, act, t, True) for t in EPILOGUE_TILES[:6]},
    }
    for name, fn in variants.items():
        try:
            ms = graph_time_ms(fn)
        except Exception as e:  # a tile shape the GPU cannot hold
            rows.append(dict(shape, variant=name, error=repr(e)[:120]))
            continue
        row = dict(shape, variant=name, ms=ms, tflops=flops / ms / 1e9)
        if name != "cublas alone":
            row["rel_err"] = ((fn().float() - want).abs().max() / want.abs().max()).item()
        rows.append(row)
        print(rows[-1], flush=True)


def subsampling(rows: list[dict], B: int, T: int) -> None:
    from speechrt.runtime import subsampling_stem

    frames = T * 8
    for name in ("parakeet-ctc-0.6b", "parakeet-tdt-0.6b-v2"):
        d = preset(bench_parakeet.kind_of(name), name)
        torch.manual_seed(0)
        sub = parakeet.Subsampling(d).cuda().to(torch.bfloat16).eval()
        x = torch.randn(B, frames, d.n_mels, device="cuda", dtype=torch.bfloat16)
        n = torch.full((B,), frames - 1, device="cuda")
        with torch.inference_mode():
            want = sub(x, n)[0].float()
            for label, taps, options, stem in (
                ("taps, Inductor's default", True, {}, None),
                ("taps, each conv's output realised", True, {"realize_reads_threshold": 1}, None),
                ("cuDNN", False, {}, None),
                ("stem kernel, then taps realised", True, {"realize_reads_threshold": 1}, True),
            ):
                sub.taps = taps
                sub.stem = subsampling_stem.subsampling_stem if stem else None
                fn = torch.compile(parakeet.run_subsampling, dynamic=False, options=options)
                got = fn(sub, x, n)[0].float()
                err = ((got - want).abs().max() / want.abs().max()).item()
                ms = timed(lambda f=fn, s=sub, x=x, n=n: f(s, x, n))
                rows.append(dict(part="subsampling", model=name, variant=label, ms=ms, err=err))
                print(rows[-1], flush=True)
                torch._dynamo.reset()


# (positions, channels, warps, stages) of a stem program
STEM_TILES = [(32, 32, 1, 1), (16, 32, 1, 1), (32, 16, 1, 1), (16, 16, 1, 1), (32, 32, 1, 2),
              (64, 32, 1, 1), (32, 64, 1, 1), (16, 64, 1, 1), (32, 64, 2, 1), (32, 128, 4, 1),
              (64, 64, 4, 1)]  # fmt: skip


def stem(rows: list[dict], B: int, T: int) -> None:
    """The subsampling's first conv + ReLU + mask + depthwise conv (subsampling_stem) at
    several tiles, beside the same two convs compiled as the runner did before (taps)."""
    for name in ("parakeet-ctc-0.6b", "parakeet-tdt-0.6b-v2"):
        with torch.inference_mode():
            stem_model(rows, name, B, T)
        torch._dynamo.reset()


def stem_model(rows: list[dict], name: str, B: int, T: int) -> None:
    from speechrt.arch.parakeet import halve
    from speechrt.runtime import subsampling_stem as st

    d = preset(bench_parakeet.kind_of(name), name)
    torch.manual_seed(0)
    sub = parakeet.Subsampling(d).cuda().to(torch.bfloat16).eval()
    C = d.subsampling_channels
    x = torch.randn(B, T * 8, d.n_mels, device="cuda", dtype=torch.bfloat16)
    n = torch.randint(T * 4, T * 8 + 1, (B,), device="cuda")
    c1, dw = sub.convs[0], sub.convs[1]
    w = (c1.weight.reshape(C, 9), c1.bias, dw.weight.reshape(C, 9), dw.bias)

    def two_convs(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        h = x[:, None] * parakeet.valid_mask(n, x.shape[1])[:, None, :, None]
        n = halve(n)
        h = torch.relu(parakeet.strided_taps(h, c1))
        h = h * parakeet.valid_mask(n, h.shape[2])[:, None, :, None]
        return parakeet.strided_taps(h, dw).permute(0, 2, 3, 1)

    ref = torch.compile(two_convs, dynamic=False, options={"realize_reads_threshold": 1})
    want = ref(x, n).float()
    valid = parakeet.valid_mask(halve(halve(n)), want.shape[1])[..., None, None]
    sweep_tiles(rows, "stem", name, lambda: ref(x, n), want, valid,
                lambda t: st.launch(x, n, *w, tiles=t), STEM_TILES)  # fmt: skip
    # the next ReLU + mask + strided depthwise conv, on the first pointwise conv's output
    h = torch.randn(B, *want.shape[1:], device="cuda", dtype=torch.bfloat16)
    n2 = halve(halve(n))
    dw2 = sub.convs[3]
    wd2 = (dw2.weight.reshape(C, 9), dw2.bias)

    def relu_taps(h: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        h = torch.relu(h) * parakeet.valid_mask(n, h.shape[1])[:, :, None, None]
        return parakeet.strided_taps(h.permute(0, 3, 1, 2), dw2).permute(0, 2, 3, 1)

    ref = torch.compile(relu_taps, dynamic=False, options={"realize_reads_threshold": 1})
    want = ref(h, n2).float()
    valid = parakeet.valid_mask(halve(n2), want.shape[1])[..., None, None]
    sweep_tiles(rows, "depthwise 2", name, lambda: ref(h, n2), want, valid,
                lambda t: st.launch_depthwise(h, n2, *wd2, tiles=t), DEPTHWISE2_TILES)  # fmt: skip


def sweep_tiles(
    rows: list[dict], part: str, name: str, ref: Callable[[], torch.Tensor],
    want: torch.Tensor, valid: torch.Tensor, launch: Callable[[tuple], torch.Tensor],
    tiles_list: list[tuple],
) -> None:  # fmt: skip
    """The compiled reference's time, then each tile's time and largest error on the valid
    rows (relative to the output's scale)."""
    rows.append(dict(part=part, model=name, variant="taps compiled", ms=graph_time_ms(ref)))
    print(rows[-1], flush=True)
    scale = want.abs().max().item()
    for tiles in tiles_list:
        try:
            ms = graph_time_ms(lambda t=tiles: launch(t))
            err = ((launch(tiles).float() - want).abs() * valid).max().item() / scale
        except Exception as e:  # a tile the GPU cannot hold
            ms, err = float("nan"), repr(e)[:80]
        rows.append(dict(part=part, model=name, variant=str(tiles), ms=ms, err=err))
        print(rows[-1], flush=True)


# (positions, channels, warps, stages) of a later strided depthwise program
DEPTHWISE2_TILES = [(32, 128, 4, 1), (16, 128, 4, 1), (64, 64, 4, 1), (32, 64, 2, 1),
                    (64, 128, 8, 1), (16, 256, 4, 1), (8, 256, 2, 1)]  # fmt: skip


# (channels, frames, warps, stages) of a program sliding along the frames
DEPTHWISE_TILES = [(128, 16, 1, 3), (128, 32, 1, 3), (256, 32, 1, 3), (256, 32, 2, 3),
                   (256, 16, 1, 2), (256, 64, 1, 3), (512, 32, 2, 3), (64, 16, 1, 3),
                   (128, 8, 1, 3)]  # fmt: skip


def depthwise(rows: list[dict], B: int, T: int) -> None:
    from speechrt.runtime import depthwise_silu as dw

    d = preset("parakeet_ctc", "parakeet-ctc-0.6b")
    C, k = d.d_model, d.conv_kernel
    torch.manual_seed(0)
    x = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16)
    lengths = torch.randint(T // 2, T + 1, (B,), device="cuda")
    keys = parakeet.valid_mask(lengths, T).to(torch.int8)
    w = torch.randn(C, k, device="cuda", dtype=torch.bfloat16) * 0.3
    bias = torch.randn(C, device="cuda", dtype=torch.bfloat16) * 0.1
    base = dw.launch(x, keys, w, bias).float()
    floor_ms = 2 * x.numel() * 2 / 4.0e9  # read x once, write out once, at 4 TB/s
    for tiles in DEPTHWISE_TILES:
        try:
            ms = graph_time_ms(lambda t=tiles: dw.launch(x, keys, w, bias, t))
            same = (dw.launch(x, keys, w, bias, tiles).float() - base).abs().max().item()
        except Exception as e:  # a tile the GPU cannot hold
            ms, same = float("nan"), repr(e)[:80]
        rows.append(dict(part="depthwise", variant=str(tiles), ms=ms, floor_ms=floor_ms,
                         vs_default=same))  # fmt: skip
        print(rows[-1], flush=True)


def layer(rows: list[dict], B: int, T: int) -> None:
    from speechrt.runtime.relpos_attention import relpos_attention

    d = preset("parakeet_ctc", "parakeet-ctc-0.6b")
    torch.manual_seed(0)
    lay = parakeet.ConformerLayer(d).cuda().to(torch.bfloat16).eval()
    lay.conv.taps = True
    x = torch.randn(B, T, d.d_model, device="cuda", dtype=torch.bfloat16)
    lengths = torch.randint(T // 2, T + 1, (B,), device="cuda")
    valid = parakeet.valid_mask(lengths, T)
    mask = ~(valid[:, None, :] & valid[:, :, None])[:, None]
    pe = lay.self_attn.project(parakeet.relative_positions(T, d.d_model, x.device))
    pad = ~valid[:, None, :]
    from speechrt.runtime import linear_act as la

    w, bias = lay.conv.pointwise_conv1.weight, lay.conv.pointwise_conv1.bias
    lay.conv.register_buffer("glu_weight", la.interleave_glu(w[:, :, 0]), persistent=False)
    lay.conv.register_buffer("glu_bias", la.interleave_glu(bias), persistent=False)
    realize = {"realize_reads_threshold": 2}
    variants = [
        ("reference attention", None, None, {}),
        ("fused attention", relpos_attention, None, {}),
        ("fused, realize reads > 2", relpos_attention, None, realize),
        ("fused, realize, SiLU/GLU epilogues", relpos_attention, True, realize),
        ("the same, coordinate descent tuning", relpos_attention, True,
         {**realize, "coordinate_descent_tuning": True}),
        ("the same, pointwise autotuning", relpos_attention, True,
         {**realize, "max_autotune_pointwise": True}),
    ]  # fmt: skip
    with torch.inference_mode():
        for name, kernel, act, options in variants:
            lay.self_attn.use_kernel(kernel)
            lay.feed_forward1.kernel = lay.feed_forward2.kernel = lay.conv.kernel = (
                la.apply if act else None
            )
            fn = torch.compile(parakeet.run_layer, dynamic=False, options=options)
            h, norm = lay.norm_feed_forward1(x), lay.norm_feed_forward1  # as the next layer's
            t0 = time.perf_counter()
            fn(lay, x, pe, mask, pad, h, norm)
            compile_s = time.perf_counter() - t0
            ms = timed(lambda f=fn, h=h, norm=norm: f(lay, x, pe, mask, pad, h, norm))
            rows.append(dict(part="layer", variant=name, ms=ms, compile_s=compile_s))
            print(rows[-1], flush=True)
            torch._dynamo.reset()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--parts", default="attention,ff,epilogue,subsampling,layer")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--frames", type=int, default=125)
    p.add_argument("--commit", help="the commit of the tree (default: git's HEAD)")
    args = p.parse_args()
    rows: list[dict] = []
    for part in args.parts.split(","):
        parts = {
            "attention": attention, "ff": feed_forward, "epilogue": epilogue,
            "subsampling": subsampling, "layer": layer, "depthwise": depthwise, "stem": stem,
        }  # fmt: skip
        parts[part](rows, args.batch, args.frames)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = bench_parakeet.run_stamp(args.commit)
    (out / "parts.json").write_text(json.dumps({**stamp, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
