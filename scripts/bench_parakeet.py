"""Parakeet on the GPU: speechrt's cuda runner beside transformers' eager Parakeet (the anchor).

Random weights at the published sizes (speechrt.arch.parakeet presets); 10 s of audio = 1,001
feature frames (125 encoder frames); timed from features on the GPU to text on the host
(CTC: argmax, collapse, labels joined; TDT: the greedy loop's tokens). Each row is measured in
the same process as its anchor:
    hf-eager-bf16    transformers' ParakeetForCTC, bf16, eager (what a user would otherwise pick)
    eager-bf16       speechrt's module, bf16, eager
    cuda-bf16        speechrt's cuda runner: layers compiled once, whole encoder one CUDA graph;
                     TDT: the greedy loop on the device in blocks of CUDA-graph steps
    cuda-bf16-scan   TDT: each step first skips blanks over all frames (pointer jumping)
    cuda-bf16-sdpa   (--compare attention) the reference's attention: shifted scores + SDPA
    cuda-bf16-cublas (--compare epilogues) without speechrt's GEMM epilogues (the SiLU and
                     GLU after cuBLAS) and depthwise kernel: Inductor's kernels instead
    cuda-bf16-no-stem (--compare stem) the subsampling's first two convs as compiled shifted
                     slices, not speechrt's stem kernel
    cuda-bf16[-scan]-torch-step (--compare step) TDT: the greedy step as compiled torch ops,
                     without speechrt's Triton step kernels
    cuda-bf16-scan-block{4,8} (--compare blocks) TDT: the scan loop replayed in blocks of 4 or
                     8 steps, not 16
Floors: FLOPs (counted below) over the measured bf16 matmul rate, weight + activation bytes over
the measured copy bandwidth; the larger is the floor.

    python scripts/bench_parakeet.py --out DIR [--models parakeet-ctc-0.6b,...] [--batches 1,32,128]
Writes DIR/parakeet.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speechrt.arch.parakeet import ParakeetDims, encoder_frames  # noqa: E402
from speechrt.registry import contract, preset  # noqa: E402

SECONDS = 10.0
FRAMES = 1001  # 10 s at 10 ms, as NeMo counts them (len // hop) + 1


def kind_of(name: str) -> str:
    return "parakeet_ctc" if "-ctc-" in name else "parakeet_transducer"


def count(d: ParakeetDims, frames: int) -> tuple[float, float]:
    """(multiply-adds, weight bytes in bf16) of one item's encoder + CTC head."""
    T, D, C = encoder_frames(d, frames), d.d_model, d.subsampling_channels
    f, t, macs = d.n_mels, frames, 0.0
    for i in range(d.subsampling_layers):  # 3x3 conv (1 -> C), then depthwise + pointwise
        t, f = (t - 1) // 2 + 1, (f - 1) // 2 + 1
        macs += t * f * C * 9 + (t * f * C * C if i else 0)
    macs += T * C * f * D
    ff = 2 * 2 * T * D * D * d.ff_expansion
    att = 4 * T * D * D + (2 * T - 1) * D * D + 4 * T * T * D  # q k v out, positions, scores
    conv = 3 * T * D * D + T * D * d.conv_kernel
    macs += d.n_layers * (ff + att + conv) + T * D * d.n_classes
    params = sum(p.numel() for p in build(d).parameters())
    return macs, params * 2.0


def build(d: ParakeetDims) -> torch.nn.Module:
    from speechrt.models.parakeet import ParakeetCTC, ParakeetTransducer

    with torch.device("meta"):
        return (ParakeetCTC if d.head == "ctc" else ParakeetTransducer)(d)


def ceilings() -> dict[str, float]:
    """Measured: bf16 matmul TFLOP/s (8192^3) and device copy GB/s (2 GiB read + write)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(1 << 30, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    mm = timed(lambda: a @ b, 20)
    cp = timed(lambda: y.copy_(x), 20)
    return {"bf16_tflops": 2 * 8192**3 / mm / 1e12, "copy_gbs": 2 * x.numel() * 2 / cp / 1e9}


def run_stamp(commit: str | None) -> dict[str, str]:
    """What a result file records of its run: device, torch, commit and command. The device
    machine's copy of the tree may carry an older HEAD: `commit` (--commit) names the tree."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "commit": commit or head.stdout.strip(),
        "command": " ".join(sys.argv),
    }


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps (after 3 warm-ups), synchronised."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ctc_text(log_probs: torch.Tensor, lengths: torch.Tensor, blank: int) -> list[list[int]]:
    """Greedy CTC on the host from the device argmax: what the pipeline decodes."""
    from speechrt.asr.ctc import greedy_tokens

    return [[t[0] for t in row] for row in greedy_tokens(log_probs, lengths, blank)]


def speechrt_model(d: ParakeetDims, seed: int) -> torch.nn.Module:
    from speechrt.models.parakeet import ParakeetCTC, ParakeetTransducer

    torch.manual_seed(seed)
    with torch.device("cuda"):
        m = (ParakeetCTC if d.head == "ctc" else ParakeetTransducer)(d).eval()
    return m


def hf_model(d: ParakeetDims, seed: int) -> torch.nn.Module | None:
    try:
        from transformers import ParakeetCTCConfig, ParakeetForCTC
    except ImportError:
        return None
    enc = dict(
        hidden_size=d.d_model, num_hidden_layers=d.n_layers, num_attention_heads=d.n_heads,
        intermediate_size=d.d_model * d.ff_expansion, conv_kernel_size=d.conv_kernel,
        subsampling_conv_channels=d.subsampling_channels, num_mel_bins=d.n_mels,
        scale_input=d.xscaling,
    )  # fmt: skip
    try:
        cfg = ParakeetCTCConfig(
            vocab_size=d.n_classes, encoder_config=enc, pad_token_id=d.vocab_size
        )
        torch.manual_seed(seed)
        with torch.device("cuda"):
            return ParakeetForCTC(cfg).eval().to(torch.bfloat16)
    except Exception as e:  # the anchor is reported missing, not silently replaced
        print(f"transformers' ParakeetForCTC unavailable: {e!r}", flush=True)
        return None


TOKENS_PER_SECOND = 3.5  # English speech, in SentencePiece tokens


@torch.inference_mode()
def calibrate(model: torch.nn.Module, d: ParakeetDims) -> None:
    """Random weights emit a token at nearly every step: shift the blank's score until the
    greedy decoder emits TOKENS_PER_SECOND on random 10 s features (bisection), so the loop
    runs as many steps as it would on speech."""
    from speechrt.runtime.transducer_cuda import CudaGreedy

    g = torch.Generator(device="cuda").manual_seed(7)
    feats = torch.randn(4, d.n_mels, FRAMES, device="cuda", generator=g)
    lengths = torch.full((4,), FRAMES - 1, device="cuda", dtype=torch.long)
    f, n = model(feats, lengths)
    bias = model.joint.out.bias
    base = float(bias[d.vocab_size])
    lo, hi = -50.0, 50.0
    for _ in range(20):
        mid = (lo + hi) / 2
        bias[d.vocab_size] = base + mid
        loop = CudaGreedy(model, compile_step=False)  # it copies the joint's weights
        per_item = sum(len(t) for t in loop(f.float(), n)) / 4
        lo, hi = (mid, hi) if per_item > TOKENS_PER_SECOND * SECONDS else (lo, mid)
    print(f"calibrated blank bias +{mid:.2f}: {per_item:.1f} tokens per 10 s", flush=True)


def bench_model(name: str, batches: list[int], ceil: dict[str, float]) -> list[dict]:
    from speechrt.runtime.buckets import Buckets
    from speechrt.runtime.cuda import CudaRunner
    from speechrt.runtime.graphs.parakeet import EncoderGraph
    from speechrt.runtime.transducer_cuda import CudaGreedy

    d = preset(kind_of(name), name)
    macs, wbytes = count(d, FRAMES)
    model = speechrt_model(d, 0)
    graph = EncoderGraph(model).eval()
    c = contract("parakeet", d)
    buckets = Buckets({"batch": tuple(sorted(set(batches))), "feature_frames": (FRAMES,)})
    runner = CudaRunner("parakeet", graph, c, device="cuda", dtype=torch.bfloat16, buckets=buckets)
    alts = {}  # the same runner with one of its fused kernels switched off (COMPARE)
    for what in (w for w in COMPARE if w in ALTERNATIVES):  # "step", "blocks": the loop, below
        with switched_off(what):
            alts[what] = CudaRunner(
                "parakeet", graph, c, device="cuda", dtype=torch.bfloat16, buckets=buckets
            )
    eager = EncoderGraph(speechrt_model(d, 0).to(torch.bfloat16)).eval()
    loop, others = None, {}
    if d.transducer:
        calibrate(model, d)
        with torch.no_grad():
            eager.model.joint.out.bias.copy_(model.joint.out.bias)
            runner.graph.model.joint.out.bias.copy_(model.joint.out.bias)
        loop = CudaGreedy(model, scan=False, dtype=torch.bfloat16)  # one decision per step
        others = {"cuda-bf16-scan": CudaGreedy(model, scan=True, dtype=torch.bfloat16)}
        if "step" in COMPARE:  # the transducer step without its Triton kernels
            for v, scan in (("cuda-bf16-torch-step", False), ("cuda-bf16-scan-torch-step", True)):
                others[v] = CudaGreedy(model, scan=scan, dtype=torch.bfloat16, fused_step=False)
        if "blocks" in COMPARE:  # shorter blocks of scan steps: fewer steps past the end
            for n in (4, 8):
                others[f"cuda-bf16-scan-block{n}"] = CudaGreedy(
                    model, scan=True, dtype=torch.bfloat16, block=n
                )
    hf = hf_model(d, 0) if d.head == "ctc" else None
    rows = []
    for B in batches:
        rows += bench_batch(name, d, B, runner, eager, hf, loop, macs, wbytes, ceil, others, alts)
    del runner, model, eager, hf, loop, alts
    torch.cuda.empty_cache()
    return rows


PROFILE = False
PROFILE_DIR: Path | None = None  # where profile() writes every kernel (--out)
COMPARE: list[str] = []
# --compare NAME: (the module, the flag it turns off, the variant's name)
ALTERNATIVES = {
    "attention": ("speechrt.runtime.graphs.parakeet", "FUSED_ATTENTION", "cuda-bf16-sdpa"),
    "epilogues": ("speechrt.runtime.graphs.parakeet", "FUSED_EPILOGUES", "cuda-bf16-cublas"),
    "stem": ("speechrt.runtime.graphs.parakeet", "FUSED_STEM", "cuda-bf16-no-stem"),
}


@contextlib.contextmanager
def switched_off(what: str) -> Iterator[None]:
    """ALTERNATIVES[what]'s flag False while the runner is built and its graph captured."""
    module, flag, _ = ALTERNATIVES[what]
    mod = importlib.import_module(module)
    setattr(mod, flag, False)
    try:
        yield
    finally:
        setattr(mod, flag, True)


def profile(what: str, variants: dict, seconds: dict[str, float]) -> None:
    """The CUDA kernels of each speechrt variant over 3 calls: the 24 costliest printed, every
    kernel written to PROFILE_DIR, and the kernels' total per call beside the call's timed
    wall time (`seconds`), whose difference is time the GPU sat idle (launch gaps, the host)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for v, fn in variants.items():
        if not v.startswith("cuda"):
            continue
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        events = prof.key_averages()
        busy_ms = sum(e.self_device_time_total for e in events) / 3 / 1e3
        wall_ms = seconds[v] * 1e3
        print(f"--- {what} {v}: kernels {busy_ms:.2f} ms a call of {wall_ms:.2f} ms "
              f"({busy_ms / wall_ms:.0%} busy)")  # fmt: skip
        print(events.table(sort_by="cuda_time_total", row_limit=24, max_name_column_width=60))
        if PROFILE_DIR is not None:
            name = re.sub(r"[^A-Za-z0-9.-]+", "-", f"profile-{what}-{v}") + ".txt"
            table = events.table(sort_by="cuda_time_total", row_limit=-1, max_name_column_width=90)
            (PROFILE_DIR / name).write_text(table)


def decode(d: ParakeetDims, out: dict, loop: object) -> object:
    """Graph outputs on the GPU -> tokens on the host: TDT's greedy loop or CTC's argmax."""
    if loop is not None:
        return loop(out["joint_encoded"].float(), out["encoded_lengths"])  # type: ignore[operator]
    return ctc_text(out["log_probs"], out["encoded_lengths"], d.vocab_size)


def bench_batch(
    name, d, B, runner, eager, hf, loop, macs, wbytes, ceil, others, alts
) -> list[dict]:  # noqa: ANN001
    from speechrt.runtime.graphs.parakeet import EncoderGraph

    c = runner.contract
    g = torch.Generator(device="cuda").manual_seed(B)
    feats = torch.randn(B, d.n_mels, FRAMES, device="cuda", generator=g)
    lengths = torch.full((B,), FRAMES - 1, device="cuda", dtype=torch.long)
    feeds = {"features": feats, "feature_lengths": lengths}
    audio = B * SECONDS
    floor = max(2 * macs * B / (ceil["bf16_tflops"] * 1e12), wbytes / (ceil["copy_gbs"] * 1e9))
    reps = 30 if B <= 8 else 10
    variants = {
        "eager-bf16": lambda: decode(
            d, dict(zip(c.output_names, eager(feats, lengths), strict=True)), loop
        ),
        "cuda-bf16": lambda: decode(d, runner.run(feeds), loop),
    }
    for v, other in others.items():
        variants[v] = lambda o=other: decode(d, runner.run(feeds), o)
    for what, alt in alts.items():
        variants[ALTERNATIVES[what][2]] = lambda a=alt: decode(d, a.run(feeds), loop)
    if hf is not None:
        x = feats.transpose(1, 2).to(torch.bfloat16).contiguous()
        n = torch.full((B,), encoder_frames(d, FRAMES - 1), device="cuda")
        variants = {
            "hf-eager-bf16": lambda: ctc_text(hf(input_features=x).logits.float(), n, d.vocab_size),
            **variants,
        }
    rows = []
    with torch.inference_mode():
        t0 = time.perf_counter()
        runner.run(feeds)  # compile + capture outside the timing
        t_compile = time.perf_counter() - t0
        for what, alt in alts.items():  # flags read as the CUDA graph is captured
            with switched_off(what):
                alt.run(feeds)
        from torch._dynamo.utils import counters

        print("dynamo", dict(counters["stats"]), flush=True)
        results = {}
        for v, fn in variants.items():
            try:
                results[v] = timed(fn, reps)
            except torch.cuda.OutOfMemoryError:
                results[v] = float("nan")
                torch.cuda.empty_cache()
        if PROFILE:
            profile(f"{name} B={B}", variants, results)
        # the fast path against eager fp32 on these inputs
        ref = EncoderGraph(speechrt_model(d, 0)).eval()
        want = dict(zip(c.output_names, ref(feats, lengths), strict=True))
        got = runner.run(feeds)
        key = "log_probs" if d.has_ctc else "joint_encoded"
        rel = float((got[key].float() - want[key]).norm() / want[key].norm())
        steps = None
        if loop is not None:
            toks = loop(got["joint_encoded"].float(), got["encoded_lengths"])
            ref_toks = loop(want["joint_encoded"].float(), want["encoded_lengths"])
            steps = sum(len(t) for t in toks) / B
            same = sum(a == b for a, b in zip(toks, ref_toks, strict=True)) / B
        else:
            a = got["log_probs"].argmax(-1)
            same = float((a == want["log_probs"].argmax(-1)).float().mean())
        del ref, want, got
    anchor = results.get("hf-eager-bf16", results["eager-bf16"])
    for v, sec in results.items():
        rows.append(
            dict(
                model=name, batch=B, variant=v, ms=sec * 1e3, rtfx=audio / sec,
                floor_ms=floor * 1e3, over_floor=sec / floor, vs_anchor=anchor / sec,
                rel_err_vs_fp32=rel, agree_vs_fp32=same, compile_s=t_compile,
                tokens_per_item=steps,
            )
        )  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="parakeet-ctc-0.6b,parakeet-tdt-0.6b-v2,parakeet-ctc-1.1b")
    p.add_argument("--batches", default="1,32,128")
    p.add_argument("--commit", help="the commit of the tree (default: git's HEAD)")
    p.add_argument(
        "--profile", action="store_true",
        help="print the costliest CUDA kernels and the GPU's busy share; every kernel to --out",
    )  # fmt: skip
    p.add_argument(
        "--compare", default="",
        help="also time the cuda runner without its fused attention or epilogues: "
        "attention,epilogues,stem,step,blocks",
    )  # fmt: skip
    args = p.parse_args()
    global PROFILE, PROFILE_DIR, COMPARE
    PROFILE, COMPARE = args.profile, [w for w in args.compare.split(",") if w]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    PROFILE_DIR = out if PROFILE else None
    stamp = run_stamp(args.commit)
    ceil = ceilings()
    print(json.dumps({**stamp, **ceil}), flush=True)
    rows = []
    for name in args.models.split(","):
        rows += bench_model(name, [int(b) for b in args.batches.split(",")], ceil)
    (out / "parakeet.json").write_text(
        json.dumps({**stamp, "ceilings": ceil, "rows": rows}, indent=1)
    )
    print(
        f"\n{'model':24} {'B':>4} {'variant':14} {'ms':>9} {'RTFx':>9} {'floor':>7} {'x anchor':>8}"
    )
    for r in rows:
        print(
            f"{r['model']:24} {r['batch']:4d} {r['variant']:14} {r['ms']:9.2f} {r['rtfx']:9.0f} "
            f"{r['floor_ms']:7.2f} {r['vs_anchor']:8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
