"""One GPU check of the runtimes: every model present, every backend, JSON + readable summary.

    python scripts/gpu_check.py                    # on the GPU: default dims, fp16 cuda backend
    python scripts/gpu_check.py --device cpu --quick   # the same path on the CPU, tiny models

For each model kind in the registry it builds a random-weight component (default dims; tiny with
--quick), saves it as a model directory, exports its ONNX graphs (checked by onnxruntime on the
CPU at other sizes), and compares each graph's cuda runner (--precision, compiled, bucketed, CUDA
graphs) with the eager float32 graph: SNR >= 30 dB on float outputs, identical lengths. Then it
runs the TTS pipelines (FastPitch + HiFi-GAN, Tacotron2 + WaveGlow, FastSpeech + HiFi-GAN, with
the denoiser) and the ASR pipeline on each backend against eager float32: audio SNR >= 30 dB,
identical ASR text on a fixed input. Every check is in its own try/except (errors recorded); a
time budget skips what is left. Writes $OUT/gpu_check.json and $OUT/gpu_check.txt (OUT defaults
to ./out); model directories go to a temporary directory, removed at exit. On the CPU the
cuda runner runs uncompiled (its buckets and precision only).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu_check_models import build, speechlike  # noqa: E402

from speechrt.audio.mel import MelConfig  # noqa: E402
from speechrt.repo import ComponentInfo, save_component  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speech synthesis on a graphics processor, checked against its reference, item by item.",
]
MIN_SNR_DB = 30.0
ORDER = ("fastpitch", "hifigan", "quartznet", "fastspeech", "tacotron2", "waveglow", "jasper")
PIPELINES = (("fastpitch", "hifigan"), ("tacotron2", "waveglow"), ("fastspeech", "hifigan"))
# -- measurements ------------------------------------------------------------------------------


def snr_db(ref: torch.Tensor | np.ndarray, x: torch.Tensor | np.ndarray) -> float:
    r = torch.as_tensor(ref).double().cpu()
    e = (torch.as_tensor(x).double().cpu() - r).pow(2).sum()
    return float("inf") if e == 0 else float(10 * torch.log10(r.pow(2).sum() / e))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeat: int = 3) -> tuple[Any, dict]:
    """Result, and seconds of the first call (compilation) and the median of `repeat` more."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return out, {"first_s": round(first, 4), "median_s": round(float(np.median(times)), 5)}


class Checks:
    """Runs named checks in try/except, within a time budget; collects JSON-able results."""

    def __init__(self, budget: float, save: Callable[[list[dict]], None]) -> None:
        self.start, self.budget, self.results = time.perf_counter(), budget, []
        self.save = save  # called after every check: a killed run keeps what it did

    def run(self, name: str, fn: Callable[[], dict]) -> dict | None:
        elapsed = time.perf_counter() - self.start
        row: dict[str, Any] = {"check": name}
        if elapsed > self.budget:
            row |= {"status": "skipped", "why": f"time budget ({self.budget:.0f} s) spent"}
            self.results.append(row)
            self.save(self.results)
            return None
        t0 = time.perf_counter()
        out = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = fn()
            row |= out
            row.setdefault("status", "pass" if row.get("ok", True) else "FAIL")
        except Exception as e:  # every failure is recorded; the next check still runs
            row |= {"status": "ERROR", "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(limit=6)}  # fmt: skip
        row["seconds"] = round(time.perf_counter() - t0, 2)
        self.results.append(row)
        self.save(self.results)
        print(f"[{time.perf_counter() - self.start:6.1f} s] {name}: {row['status']}", flush=True)
        return out


# -- checks ------------------------------------------------------------------------------------


def check_export(model_dir: Path) -> dict:
    from speechrt.runtime.export import export_dir

    paths, checks = export_dir(model_dir)
    worst = max(c.max_abs_error for c in checks)
    return {"files": [p.name for p in paths], "ort_vs_eager_max_abs": worst, "ok": worst <= 1e-4}


def check_graphs(model_dir: Path, args: argparse.Namespace, device: torch.device) -> dict:
    """cuda runner (precision, compiled) vs the eager float32 graph, per graph and output."""
    from speechrt.device import PRECISIONS
    from speechrt.registry import contract, graphs_of
    from speechrt.repo import load_component
    from speechrt.runtime.buckets import Buckets
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.eager import EagerRunner
    from speechrt.runtime.graphs import build_graph, example_feeds

    model, info = load_component(model_dir, device, torch.float32)
    out, ok = {}, True
    for graph in graphs_of(info.kind):
        wrapper = build_graph(graph, model, info)
        c = contract(graph, info.dims)
        length = 40 if args.quick else {"denoiser": 200, "jasper": 300}.get(graph, 120)
        feeds = {k: v.to(device) for k, v in example_feeds(graph, wrapper, 2, length).items()}
        ref, eager_t = timed(lambda w=wrapper, c=c, f=feeds: EagerRunner(w, c).run(f), device)
        r = cuda_runner(graph, wrapper, c, device=device, dtype=PRECISIONS[args.precision],
                        buckets=Buckets(), mode=args.compile_mode)  # fmt: skip
        got, cuda_t = timed(lambda r=r, f=feeds: r.run(f), device)
        rows = {}
        for name in c.output_names:
            a, b = ref[name], got[name]
            if a.shape != b.shape:
                rows[name] = {"shape": [list(a.shape), list(b.shape)], "ok": False}
            elif a.is_floating_point():
                rows[name] = {"snr_db": round(snr_db(a, b), 2)}
                rows[name]["ok"] = rows[name]["snr_db"] >= MIN_SNR_DB
            else:
                rows[name] = {"identical": bool(torch.equal(a, b))}
                rows[name]["ok"] = rows[name]["identical"]
            ok &= rows[name]["ok"]
        out[graph] = {"outputs": rows, "eager": eager_t, "cuda": cuda_t}
    return {"graphs": out, "ok": ok}


def make_tts(a: Path, v: Path, backend: str, device: torch.device, args: argparse.Namespace):
    from speechrt.runtime.stages import TTSStages
    from speechrt.tts import TTS

    precision = args.precision if backend == "cuda" else "fp32"
    if backend == "cuda" and device.type != "cuda":  # CPU run: the runner logic, uncompiled
        tts = TTS(a, v, device="cpu")
        tts.stages = TTSStages("cuda", device, precision, (tts.acoustic, tts.acoustic_info, a),
                               (tts.vocoder, tts.vocoder_info, v), compile_mode=None)  # fmt: skip
        return tts
    dev = "cpu" if backend == "onnx" else str(device)  # onnxruntime here may be CPU-only
    return TTS(a, v, device=dev, precision=precision, backend=backend)


def check_tts(a: Path, v: Path, args: argparse.Namespace, device: torch.device) -> dict:
    from speechrt.options import SynthesisOptions

    opts = SynthesisOptions(denoise=0.01, seed=1)
    out: dict[str, Any] = {}
    ok = True
    ref = None
    for backend in ("eager", "cuda", "onnx"):
        tts = make_tts(a, v, backend, device, args)
        audio, t = timed(lambda tts=tts: tts.synthesize(TEXTS, opts, seeds=[1, 2]), tts.device, 1)
        seconds = sum(len(x) for x in audio) / tts.sampling_rate
        row = {"device": str(tts.device), **t, "audio_s": round(seconds, 3),
               "rtf": round(seconds / t["median_s"], 2)}  # fmt: skip
        if ref is None:
            ref = audio
        else:
            same = [len(x) == len(y) for x, y in zip(ref, audio, strict=True)]
            row["lengths_equal"] = all(same)
            row["snr_db"] = [round(snr_db(x, y), 2) if s else None
                             for x, y, s in zip(ref, audio, same, strict=True)]  # fmt: skip
            row["ok"] = all(same) and min(row["snr_db"]) >= MIN_SNR_DB
            ok &= row["ok"]
        out[backend] = row
    return {"backends": out, "ok": ok}


def check_asr(model_dir: Path, args: argparse.Namespace, device: torch.device) -> dict:
    from speechrt.asr import ASR
    from speechrt.runtime.buckets import Buckets
    from speechrt.runtime.cuda import cuda_runner
    from speechrt.runtime.graphs import build_graph

    waves = [speechlike(s, i) for i, s in enumerate((3.0, 1.5) if args.quick else (6.0, 2.5))]
    out: dict[str, Any] = {}
    ref, ref_lp = None, None
    ok = True
    for backend in ("eager", "cuda", "onnx"):
        if backend == "cuda" and device.type != "cuda":
            asr = ASR(model_dir, device="cpu")
            c = ASR(model_dir, device="cpu", backend="onnx").runner.contract
            asr.runner = cuda_runner("jasper", build_graph("jasper", asr.model, asr.info), c,
                                     device="cpu", dtype=torch.bfloat16, mode=None,
                                     buckets=Buckets())  # fmt: skip
        else:
            dev = "cpu" if backend == "onnx" else str(device)
            precision = args.precision if backend == "cuda" else "fp32"
            asr = ASR(model_dir, device=dev, precision=precision, backend=backend)
        result, t = timed(lambda asr=asr: asr.transcribe(waves, batch_size=2), asr.device, 1)
        texts = [r.text for r in result]
        row = {"device": str(asr.device), **t, "texts": [x[:80] for x in texts]}
        row["words"] = sum(len(x.split()) for x in texts)
        segs = [seg for i, w in enumerate(waves) for seg in asr.segments(i, w)]
        log_probs = asr.log_probs(segs)[0].float().cpu()  # (B, T', V)
        if ref is None:
            ref, ref_lp = texts, log_probs
            ok &= row["words"] > 0  # identical empty texts would prove nothing
        else:
            row["identical_text"] = texts == ref
            # Random weights give near-ties that any rounding flips. Tolerance: every frame whose
            # greedy label differs must have a reference top-two margin within 4x the measured
            # max abs log-prob error (a flip explained by numerics, not a wrong computation).
            err = float((log_probs - ref_lp).abs().max())
            top2 = ref_lp.topk(2, dim=-1).values
            margin = top2[..., 0] - top2[..., 1]
            flipped = log_probs.argmax(-1) != ref_lp.argmax(-1)
            row["log_prob_max_abs_err"] = err
            row["frames_flipped"] = int(flipped.sum())
            row["frames"] = int(flipped.numel())
            row["max_margin_of_flipped"] = float(margin[flipped].max()) if flipped.any() else 0.0
            explained = bool((margin[flipped] <= 4 * err).all())
            row["ok"] = texts == ref or explained
            ok &= row["ok"]
        out[backend] = row
    return {"backends": out, "ok": ok}


# -- main ---------------------------------------------------------------------------------------


def environment(device: torch.device) -> dict:
    import onnxruntime as ort

    env = {"torch": torch.__version__, "onnxruntime": ort.__version__,
           "ort_providers": ort.get_available_providers(), "device": str(device),
           "python": sys.version.split()[0]}  # fmt: skip
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        try:
            import triton

            env["triton"] = triton.__version__
        except ImportError:
            env["triton"] = None
    return env


def summary(env: dict, results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"speechrt gpu_check  device={env['device']} {env.get('gpu', '')}  "
        f"precision={args.precision} compile={args.compile_mode} quick={args.quick}",
        f"torch {env['torch']}  onnxruntime {env['onnxruntime']} {env['ort_providers']}",
        "",
    ]
    for r in results:
        line = f"{r['status']:7} {r['check']:40} {r.get('seconds', 0):7.1f} s"
        if "error" in r:
            line += f"  {r['error'][:150]}"
        for g, gr in r.get("graphs", {}).items():
            snrs = [f"{n}={o.get('snr_db', o.get('identical', o.get('shape')))}"
                    for n, o in gr["outputs"].items()]  # fmt: skip
            line += f"\n        {g}: {', '.join(snrs)}  eager {gr['eager']['median_s']} s"
            line += f", cuda {gr['cuda']['median_s']} s (first {gr['cuda']['first_s']} s)"
        for b, br in r.get("backends", {}).items():
            extra = {k: br[k] for k in ("snr_db", "identical_text", "words", "rtf") if k in br}
            line += f"\n        {b:5} {br['median_s']} s (first {br['first_s']} s) {extra}"
        if "ort_vs_eager_max_abs" in r:
            line += f"  ORT vs eager max abs {r['ort_vs_eager_max_abs']:.2e}"
        lines.append(line)
    counts = {
        s: sum(r["status"] == s for r in results) for s in ("pass", "FAIL", "ERROR", "skipped")
    }
    lines += ["", "  ".join(f"{k}: {v}" for k, v in counts.items())]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny models (fast; for a CPU run)")
    p.add_argument("--precision", default=None, help="cuda runner precision (fp16; bf16 on CPU)")
    p.add_argument("--compile-mode", help="reduce-overhead (GPU default), default, none")
    p.add_argument("--models", default=",".join(ORDER), help="comma list of kinds")
    p.add_argument("--budget", type=float, default=330.0, help="seconds before skipping the rest")
    args = p.parse_args()
    device = torch.device(args.device)
    args.precision = args.precision or ("fp16" if device.type == "cuda" else "bf16")
    mode = args.compile_mode or ("reduce-overhead" if device.type == "cuda" else "none")
    args.compile_mode = None if mode == "none" else mode
    out = Path(os.environ.get("OUT", "out"))
    out.mkdir(parents=True, exist_ok=True)
    # model directories and ONNX files (GBs at default dims) stay out of $OUT
    work = Path(tempfile.mkdtemp(prefix="speechrt-gpu-check-"))
    atexit.register(shutil.rmtree, work, True)
    from speechrt.registry import ARCHITECTURES

    kinds = [k for k in args.models.split(",") if k in ARCHITECTURES]
    env = environment(device)

    def save_report(results: list[dict]) -> str:
        report = {"environment": env, "args": vars(args), "results": results}
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        text = summary(env, results, args)
        (out / "gpu_check.txt").write_text(text + "\n")
        return text

    checks = Checks(args.budget, save_report)
    dirs: dict[str, Path] = {}

    def component(kind: str) -> None:
        def save() -> dict:
            model, meta = build(kind, args.quick, device)
            mel = None if model.role == "asr" else MelConfig(n_mels=model_mels(model))
            info = ComponentInfo(kind, dataclasses.asdict(model.dims), mel, meta)
            dirs[kind] = save_component(work / kind, info, model.state_dict())
            n = sum(p.numel() for p in model.parameters())
            return {"parameters": n, "dims": "tiny" if args.quick else "default"}

        if checks.run(f"{kind}: build", save) is not None:
            checks.run(
                f"{kind}: cuda vs eager graphs", lambda: check_graphs(dirs[kind], args, device)
            )
            checks.run(f"{kind}: export + ORT", lambda: check_export(dirs[kind]))

    # in order of importance, each pipeline as soon as its components exist (the budget may end)
    for kind in kinds:
        component(kind)
        for a, v in PIPELINES:
            if kind in (a, v) and a in dirs and v in dirs:
                name = f"tts {a}+{v}+denoiser"
                checks.run(name, lambda a=a, v=v: check_tts(dirs[a], dirs[v], args, device))
        if kind in ("quartznet", "jasper") and kind in dirs:
            checks.run(f"asr {kind}", lambda kind=kind: check_asr(dirs[kind], args, device))
    print(save_report(checks.results))
    return 0 if all(r["status"] in ("pass", "skipped") for r in checks.results) else 1


def model_mels(model: torch.nn.Module) -> int:
    d = model.dims
    return getattr(d, "n_mel_channels", None) or getattr(d, "n_mels", 80)


if __name__ == "__main__":
    sys.exit(main())
