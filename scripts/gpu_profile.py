"""Where the GPU time goes: conv layouts and cuDNN autotuning, and the cuda runner's kernels.

    python scripts/gpu_profile.py MODELS_DIR OUT_DIR [--parts micro,tts,asr]

MODELS_DIR holds the default-dims random-weight models of scripts/bench_models.py.
- micro: HiFi-GAN V1 and Jasper 10x5 alone in fp16 at fixed shapes, each variant (NCHW or
  channels-last convs x cuDNN autotuning off/on) captured in a CUDA graph and replayed, so the
  time is the GPU's alone; with FLOPs (torch's counter), achieved TFLOP/s and the kernel table.
- host: each stage of the cuda pipelines (FastPitch + HiFi-GAN, Jasper, QuartzNet) at batch 1
  and 8 as `speechrt bench` runs it: wall time against the device's kernel time, launches,
  copies and syncs, top host ops; a Chrome trace of each whole batch-1 call (trace-*.json.gz).
- fusedconv: the vocoder (cuda runner, 704 frames, batch 1 / 4 / 8) with fused resblocks against
  cuDNN + Inductor, with kernel tables; fusedconv-sweep also times HiFi-GAN's resblock conv as
  cuDNN runs it against the fused Triton kernel over a sweep of its tile sizes (taps unrolled),
  and the best tiles again as one flat loop.
- compiletime: the cuda runner's creation and first call (compile + capture) of HiFi-GAN at
  batch 2 and 4, fused resblocks against cuDNN's; `--compile-threads N` sets how many threads
  compile the fused kernels as the runner is created (0: one by one on first use).
- asrgraph: Jasper and QuartzNet graphs as the cuda runner compiles them, replayed at batch 1
  and 8 with kernel counts; variants with the 1x1 convs as matmuls, compiled as is or with
  Inductor's max-autotune (GEMM templates with the following pointwise work fused in).
- decoder: Tacotron 2's decoder step, DecoderStep against FusedStep, k steps per CUDA graph.
- waveglow: WaveGlow 256's NCHW conv graph against its GEMM form, graph-replayed.
- tts / asr: the cuda runner's pipeline as `speechrt bench` times it, before (NCHW, no autotune)
  and after, with a profile of one iteration: kernel time per stage against wall time.
Writes OUT_DIR/profile.json; prints a summary table last.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from speechrt import registry
from speechrt.bench.machine import git_commit
from speechrt.bench.stamp import stamp
from speechrt.repo import load_component
from speechrt.runtime.layout import channels_last_convs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # as when run as a script
from gpu_profile_vocoder import compiletime, fusedconv  # noqa: E402
from gpu_timing import flops_of, graph_time_ms, host_table, kernel_table  # noqa: E402


def host(models: Path, out: Path) -> dict:
    """Host tables for each stage of the cuda pipelines at batch 1 and 8 (FastPitch + HiFi-GAN,
    Jasper, QuartzNet, 7 s), as `speechrt bench` runs them; a trace of each whole batch-1 call."""
    from speechrt.asr import ASR
    from speechrt.bench.inprocess import TTS_TEXT, synthetic_speechlike
    from speechrt.options import SynthesisOptions
    from speechrt.tts import TTS

    res: dict[str, dict] = {}
    tts = TTS(models / "fastpitch", models / "hifigan", "cuda", "fp16", "cuda")
    opts = SynthesisOptions()
    with torch.inference_mode():
        for bs in (1, 8):
            pieces = tts.text_to_pieces([TTS_TEXT] * bs, list(range(bs)))
            ids, lengths, seeds = tts.batch_to_tensors(pieces)
            mel, mel_lengths = tts.ids_to_mel(ids, lengths, opts, seeds)
            audio, audio_lengths = tts.mel_to_audio(mel, mel_lengths, opts, seeds)
            res[f"tts_b{bs}_input"] = host_table(lambda p=pieces: tts.batch_to_tensors(p))
            res[f"tts_b{bs}_acoustic"] = host_table(
                lambda i=ids, n=lengths, s=seeds: tts.ids_to_mel(i, n, opts, s)
            )
            res[f"tts_b{bs}_vocoder"] = host_table(
                lambda m=mel, n=mel_lengths, s=seeds: tts.mel_to_audio(m, n, opts, s)
            )
            res[f"tts_b{bs}_output"] = host_table(
                lambda a=audio, n=audio_lengths: tts.to_numpy(a, n)
            )

            def whole(p=pieces):
                i, n, s = tts.batch_to_tensors(p)
                m, mn = tts.ids_to_mel(i, n, opts, s)
                return tts.to_numpy(*tts.mel_to_audio(m, mn, opts, s))

            res[f"tts_b{bs}_whole"] = host_table(
                whole, trace=out / f"trace-tts-b{bs}.json.gz" if bs == 1 else None
            )
        for name in ("jasper", "quartznet"):
            asr = ASR(models / name, device="cuda", precision="fp16", backend="cuda")
            audio = synthetic_speechlike(7.0, asr.sample_rate)
            for bs in (1, 8):
                segs = [seg for i in range(bs) for seg in asr.segments(i, audio)]
                feats, flen, samples = asr.featurize(segs)
                lp, lpn = asr.acoustic(feats, flen, samples)
                res[f"{name}_b{bs}_features"] = host_table(lambda s=segs, r=asr: r.featurize(s))
                res[f"{name}_b{bs}_acoustic"] = host_table(
                    lambda f=feats, n=flen, k=samples, r=asr: r.acoustic(f, n, k)
                )
                res[f"{name}_b{bs}_decode"] = host_table(
                    lambda s=segs, a=lp, n=lpn, r=asr: r.decode(s, a, n)
                )

                def whole_asr(s=segs, r=asr):
                    r.decode(s, *r.acoustic(*r.featurize(s)))

                res[f"{name}_b{bs}_whole"] = host_table(
                    whole_asr, trace=out / f"trace-{name}-b{bs}.json.gz" if bs == 1 else None
                )
    for k, v in res.items():
        print(
            f"{k:22} wall {v['wall_ms']:7.3f} ms  kernels {v['kernel_ms']:7.3f} ms "
            f"({v['kernels']})  {v['launches']}",
            flush=True,
        )
        for r in v["top_self_cpu"][:8]:
            print(f"   {r['us']:9.1f} us {r['n']:5d}  {r['name']}")
    return res  # fmt: skip


def micro(models: Path, names: tuple[str, ...] = ("hifigan", "jasper", "quartznet")) -> list[dict]:
    """HiFi-GAN, Jasper, QuartzNet in fp16 at fixed shapes, graph-replayed: each conv layout,
    uncompiled with cuDNN autotuning off and on, and compiled as the cuda runner compiles it."""
    dev = torch.device("cuda")
    cases = []
    for b in (1, 8):
        mel = torch.randn(b, 80, 768, device=dev, dtype=torch.float16)  # 665 frames' bucket
        cases.append(("hifigan", b, (mel, torch.full((b,), 768, device=dev))))
        feats = torch.randn(b, 64, 800, device=dev, dtype=torch.float16)  # 7 s' bucket
        cases.append(("jasper", b, (feats, torch.full((b,), 716, device=dev))))
        cases.append(("quartznet", b, (feats, torch.full((b,), 700, device=dev))))
    cases = [c for c in cases if c[0] in names]
    rows = []
    for name, b, args in cases:
        model, _ = load_component(models / name)
        # layout -> channels_last_convs arguments (None: NCHW, the model as it is)
        layouts: dict[str, dict | None] = {"nchw": None, "channels_last": {}}
        if name == "quartznet":  # depthwise convs left NCHW, the pointwise ones channels-last
            layouts["channels_last_dense"] = {"grouped": False}
        for layout, kw in layouts.items():
            m = copy.deepcopy(model.to(dev, torch.float32))
            if kw is not None:
                channels_last_convs(m, **kw)
            m = m.to(dev, torch.float16).eval()
            fn = torch.inference_mode()(lambda m=m, args=args: m(*args))
            if layout == "nchw":  # the same math in every layout
                flops = flops_of(fn)
            compiled = torch.compile(m, dynamic=False)
            fast = torch.inference_mode()(lambda c=compiled, args=args: c(*args))
            for how, autotune in [("eager", False), ("eager", True), ("compiled", False)]:
                torch.backends.cudnn.benchmark = autotune
                run = fn if how == "eager" else fast
                ms = graph_time_ms(run)
                r = {"model": name, "batch": b, "layout": layout, "cudnn_benchmark": autotune,
                     "compiled": how == "compiled", "graph_ms": round(ms, 4),
                     "gflop": round(flops / 1e9, 1),
                     "tflops": round(flops / ms / 1e9, 1)}  # fmt: skip
                r["profile"] = kernel_table(run)
                print(json.dumps({k: v for k, v in r.items() if k != "profile"}), flush=True)
                rows.append(r)
            torch.backends.cudnn.benchmark = False
    return rows


def asrgraph(models: Path, variants: tuple[str, ...]) -> list[dict]:
    """Jasper and QuartzNet as the cuda runner compiles them (fp16, 800 frames, its layout),
    graph-replayed at batch 1 and 8, with kernel counts, for each variant:
    - "runner": the model's forward as this tree has it;
    - "matmul": QuartzNet's 1x1 convs as matmuls over (B, C, T), compiled the same;
    - "matmul-autotune": the same compiled with mode "max-autotune-no-cudagraphs" (Triton GEMM
      templates, the pointwise work after each GEMM fused into it)."""
    from speechrt.runtime.graphs import build_graph

    def matmul_1x1(conv: torch.nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
        # (B, C_in, T) -> (B, C_out, T), the same math as the 1x1 conv
        y = torch.matmul(conv.weight[:, :, 0], x)
        return y if conv.bias is None else y + conv.bias[:, None]

    dev = torch.device("cuda")
    rows = []
    for name in ("quartznet", "jasper"):
        model, info = load_component(models / name)
        # Jasper's convs run channels-last (modules replaced): its 1x1 convs stay convs
        for variant in variants if name == "quartznet" else ("runner",):
            m = copy.deepcopy(model)
            if variant.startswith("matmul"):
                for mod in m.modules():
                    if isinstance(mod, torch.nn.Conv1d) and mod.kernel_size == (1,):
                        mod.forward = functools.partial(matmul_1x1, mod)  # type: ignore[method-assign]
            graph = build_graph(next(iter(registry.graphs_of(info.kind))), m, info)
            if graph.channels_last:
                channels_last_convs(graph)
            graph = graph.to(dev, torch.float16).eval()
            mode = "max-autotune-no-cudagraphs" if variant.endswith("autotune") else None
            compiled = torch.compile(graph, dynamic=False, mode=mode)
            for b in (1, 8):
                t0 = time.perf_counter()  # this batch's compile (first call) and timing
                feats = torch.randn(b, 64, 800, device=dev)  # the 7 s bucket
                lengths = torch.full((b,), 700, device=dev)
                run = torch.inference_mode()(lambda c=compiled, f=feats, n=lengths: c(f, n))
                ref = torch.inference_mode()(lambda g=graph, f=feats, n=lengths: g(f, n))
                got, want = run()[0].float(), ref()[0].float()
                n_out = int(run()[1][0])
                err = float((got[:, :n_out] - want[:, :n_out]).abs().max())
                ms = graph_time_ms(run)
                r = {"model": name, "variant": variant, "batch": b, "graph_ms": round(ms, 4),
                     "compile_s": round(time.perf_counter() - t0, 1),
                     "max_err_vs_uncompiled": err}  # fmt: skip
                r["profile"] = kernel_table(run)
                print(json.dumps({k: v for k, v in r.items() if k != "profile"}), flush=True)
                rows.append(r)
            torch._dynamo.reset()
    return rows


def decoder(models: Path, k: int = 8) -> list[dict]:
    """Tacotron 2's decoder at batch 1, k steps per CUDA graph (150 symbols): DecoderStep against
    FusedStep (merged GEMMs), uncompiled and compiled, float32; FusedStep with bf16 LSTM GEMMs
    (lstm_in) and all in bf16 for comparison."""
    from speechrt.runtime.graphs.tacotron2 import DecoderStepGraph, example_decoder_step
    from speechrt.runtime.tacotron2 import FusedStep

    dev = torch.device("cuda")
    model, _ = load_component(models / "tacotron2")
    feeds = example_decoder_step(DecoderStepGraph(model), 1, 150, seed=0)
    cases = [("DecoderStep", "fp32", False), ("FusedStep", "fp32", False),
             ("DecoderStep", "fp32", True), ("FusedStep", "fp32", True),
             ("FusedStep", "bf16-lstm", True), ("FusedStep", "bf16", True)]  # fmt: skip
    rows = []
    for variant, name, compiled in cases:
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        x = [v.to(dev, dtype) if v.is_floating_point() else v.to(dev) for v in feeds.values()]
        frame, state, fixed, masks = x[0], tuple(x[1:8]), x[8:11], x[11]
        step = copy.deepcopy(model.decoder)
        step = (FusedStep(step) if variant == "FusedStep" else step).to(dev, dtype).eval()
        if name == "bf16-lstm":
            step.lstm_in(torch.bfloat16)

        def k_steps(step=step, frame=frame, state=state, fixed=fixed, masks=masks):
            for _ in range(k):
                out = step(frame, *state, *fixed, masks)
                frame, state = out[0], tuple(out[2:])
            return frame

        fn = torch.compile(k_steps, dynamic=False) if compiled else k_steps
        fn = torch.inference_mode()(fn)
        ms = graph_time_ms(fn)
        r = {"batch": 1, "dtype": name, "step": variant, "compiled": compiled,
             "us_per_step": round(ms * 1e3 / k, 1)}  # fmt: skip
        r["profile"] = kernel_table(fn)
        r["kernels_per_step"] = r["profile"]["kernels"] / k
        print(json.dumps({n: v for n, v in r.items() if n != "profile"}), flush=True)
        rows.append(r)
    return rows


def waveglow(models: Path) -> list[dict]:
    """WaveGlow 256 in fp16 at 768 frames, uncompiled and replayed as a CUDA graph: the NCHW conv
    graph (WaveGlowGraph) against its GEMM form (WaveGlowGemm), with FLOPs and kernel tables."""
    from speechrt.runtime.graphs.waveglow import WaveGlowGraph
    from speechrt.runtime.graphs.waveglow import example as wg_example

    dev = torch.device("cuda")
    model, _ = load_component(models / "waveglow256")
    rows = []
    for b in (1, 8):
        graph = WaveGlowGraph(model.to(torch.float32))
        feeds = wg_example(graph, b, 768, seed=0)
        args = [v.to(dev) for v in feeds.values()]
        for name, m in (("conv", graph), ("gemm", graph.fused())):
            m = copy.deepcopy(m).to(dev, torch.float16).eval()
            fn = torch.inference_mode()(lambda m=m, args=args: m(*args))
            flops = flops_of(fn)
            ms = graph_time_ms(fn, iters=20)
            r = {"model": "waveglow256", "batch": b, "form": name, "graph_ms": round(ms, 3),
                 "gflop": round(flops / 1e9, 1), "tflops": round(flops / ms / 1e9, 1)}  # fmt: skip
            r["profile"] = kernel_table(fn)
            print(json.dumps({n: v for n, v in r.items() if n != "profile"}), flush=True)
            rows.append(r)
    return rows


def pipelines(models: Path, parts: list[str]) -> list[dict]:
    from speechrt.asr import ASR
    from speechrt.bench.inprocess import TTS_TEXT, Variant, bench_asr, bench_tts
    from speechrt.options import SynthesisOptions
    from speechrt.tts import TTS

    rows = []
    # before: no graph channels-last; after: the graphs the registry marks channels-last
    configs = {"before": (False, False), "after": (True, False)}
    saved = dict(registry.GRAPHS)
    for label, (channels_last, autotune) in configs.items():
        for name, g in saved.items():
            flag = channels_last and g.channels_last
            registry.GRAPHS[name] = dataclasses.replace(g, channels_last=flag)
        torch.backends.cudnn.benchmark = autotune
        v = [Variant("cuda", "fp16")]
        if "tts" in parts:

            def make_tts(v):
                return TTS(models / "fastpitch", models / "hifigan", "cuda", v.precision, v.backend)

            for r in bench_tts(make_tts, v, [1, 8], 10, 50):
                rows.append({"pipeline": "fastpitch-hifigan", "config": label, **r})
                print(label, "tts", r["batch_size"], r["latency_s"]["mean"], r["stages_s"])
            tts = make_tts(v[0])
            ids, lengths, seeds = tts.batch_to_tensors(tts.text_to_pieces([TTS_TEXT], [0]))
            opts = SynthesisOptions()

            @torch.inference_mode()
            def step(tts=tts, ids=ids, lengths=lengths, seeds=seeds, opts=opts):
                mel, mel_lengths = tts.ids_to_mel(ids, lengths, opts, seeds)
                return tts.mel_to_audio(mel, mel_lengths, opts, seeds)

            for _ in range(3):
                step()
            rows.append(
                {
                    "pipeline": "fastpitch-hifigan",
                    "config": label,
                    "profile_b1": kernel_table(step, 25),
                }
            )
        if "asr" in parts:

            def make_asr(v):
                return ASR(
                    models / "jasper", device="cuda", precision=v.precision, backend=v.backend
                )

            for r in bench_asr(make_asr, v, [1, 8], 10, 50, (7.0,)):
                rows.append({"pipeline": "jasper", "config": label, **r})
                print(label, "asr", r["batch_size"], r["latency_s"]["mean"], r["stages_s"])
    registry.GRAPHS.update(saved)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="micro,tts,asr")
    ap.add_argument("--micro-models", default="hifigan,jasper,quartznet")
    ap.add_argument("--asr-variants", default="runner,matmul,matmul-autotune")
    ap.add_argument(
        "--compile-threads", type=int, default=None,
        help="compiletime: threads that compile the fused kernels (0: on first use)",
    )  # fmt: skip
    args = ap.parse_args()
    parts = args.parts.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    result = stamp(torch.device("cuda"))
    result["commit"] = git_commit(dirty=True)
    result["command"] = shlex.join(["python", "scripts/gpu_profile.py", *sys.argv[1:]])
    if "host" in parts:
        result["host"] = host(args.models, args.out)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "decoder" in parts:
        result["decoder"] = decoder(args.models)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "waveglow" in parts:
        result["waveglow"] = waveglow(args.models)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "fusedconv" in parts or "fusedconv-sweep" in parts:
        result["fusedconv"] = fusedconv(args.models, sweep="fusedconv-sweep" in parts)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "compiletime" in parts:
        result["compiletime"] = compiletime(args.models, args.compile_threads)
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "asrgraph" in parts:
        result["asrgraph"] = asrgraph(args.models, tuple(args.asr_variants.split(",")))
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    if "micro" in parts:
        result["micro"] = micro(args.models, tuple(args.micro_models.split(",")))
        (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    result["pipelines"] = []
    for part in ("tts", "asr"):  # written after each, in case the call runs out of time
        if part in parts:
            result["pipelines"] += pipelines(args.models, [part])
            (args.out / "profile.json").write_text(json.dumps(result, indent=1))
    for r in result.get("micro", []):
        print(f"{r['model']:8} b{r['batch']} {r['layout']:19} bench={r['cudnn_benchmark']!s:5} "
              f"compiled={r['compiled']!s:5} "
              f"{r['graph_ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s "
              f"{r['profile']['kernels']} kernels")  # fmt: skip
    for r in result["pipelines"]:
        if "profile_b1" in r:
            p = r["profile_b1"]
            print(f"{r['config']}: b1 tts {p['kernels']} kernels, {p['kernel_ms']:.2f} kernel ms")
            continue
        st = " ".join(f"{k}={v * 1e3:.2f}" for k, v in r["stages_s"].items())
        print(f"{r['pipeline']:18} {r['config']:6} b{r['batch_size']} "
              f"{r['latency_s']['mean'] * 1e3:8.2f} ms  {st}")  # fmt: skip


if __name__ == "__main__":
    main()
