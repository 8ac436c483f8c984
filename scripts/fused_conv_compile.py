"""What compiling HiFi-GAN's fused resblock kernels costs, taps unrolled against one flat loop.

    python scripts/fused_conv_compile.py [--preset hifigan-v1] [--arch 90] [--json OUT.json]

Compiles every variant of speechrt.runtime.fused_conv's kernel that a preset's resblocks launch
(channels per stage x kernel size x dilation x residual), with the tile sizes the cuda runner
picks, for an sm_ARCH GPU, into an empty Triton cache. No GPU is needed: this is the ahead-of-time
compile the runner's first call of each variant pays. The arguments are specialised as the
runner's are (16-byte aligned pointers, sizes and strides divisible by 16, unit strides constant).
Prints seconds per variant and in total, and whether the code uses wgmma and async copies.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from tqdm import tqdm

NAMES = ["x", "w", "bias", "res", "mask", "y", "T",
         "sxb", "sxc", "sxt", "srb", "src", "srt", "smb", "smt", "syb", "syc", "syt"]  # fmt: skip
UNIT = ("sxc", "src", "syc", "smt")  # channels-last: unit strides, which Triton makes constant


def variants(preset: str) -> list[tuple[int, int, int, bool]]:
    """(channels, kernel, dilation, residual) of each distinct resblock conv of the preset."""
    from speechrt.models.hifigan import HiFiGAN
    from speechrt.registry import preset as get_preset
    from speechrt.runtime.graphs.hifigan import HiFiGANGraph

    return sorted(HiFiGANGraph(HiFiGAN(get_preset("hifigan", preset))).fused().fused_variants())


def compile_one(c: int, k: int, d: int, res: bool, flat: bool, arch: int) -> tuple[float, str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from speechrt.runtime.fused_conv import _conv_kernel, tile_sizes

    bt, bco, bci, warps, stages, _ = tile_sizes(c, c)
    const: dict[str, object] = dict(
        C_IN=c, C_OUT=c, K=k, DIL=d, PAD=d * (k - 1) // 2, SLOPE=0.1, HAS_RES=res,
        HAS_MASK=True, FLAT=flat, BLOCK_T=bt, BLOCK_CO=bco, BLOCK_CI=bci,
    )  # fmt: skip
    const.update({n: 1 for n in UNIT})
    sig = {n: "*fp16" if i < 6 else "i32" for i, n in enumerate(NAMES)}
    sig.update({n: "constexpr" for n in const})
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(NAMES) if n not in const}
    src = ASTSource(_conv_kernel, sig, const, attrs)
    t0 = time.perf_counter()
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": warps, "num_stages": stages})  # fmt: skip
    seconds = time.perf_counter() - t0
    ptx = kernel.asm["ptx"]
    return seconds, f"wgmma={'wgmma.mma_async' in ptx} cp.async={'cp.async' in ptx}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="hifigan-v1")
    ap.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    rows, todo = [], variants(args.preset)
    for flat in (False, True):
        for c, k, d, res in tqdm(todo, desc=f"flat={flat}"):
            seconds, code = compile_one(c, k, d, res, flat, args.arch)
            rows.append({"channels": c, "kernel": k, "dilation": d, "residual": res,
                         "flat": flat, "seconds": round(seconds, 3), "code": code})  # fmt: skip
    for flat in (False, True):
        mine = [r for r in rows if r["flat"] == flat]
        total = sum(r["seconds"] for r in mine)
        codes = sorted({r["code"] for r in mine})
        print(f"{'flat loop' if flat else 'taps unrolled'}: {len(mine)} variants, {total:.1f} s "
              f"(max {max(r['seconds'] for r in mine):.1f} s); {', '.join(codes)}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "arch": args.arch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
