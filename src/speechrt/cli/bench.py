"""`speechrt bench tts [--acoustic DIR --vocoder DIR] [--backends ...] [--batch-sizes ...]`
(no model given: the bundled ones, as every other command)"""

from __future__ import annotations

import argparse
import json
from typing import Any

from speechrt.cli.flags import add_device_option
from speechrt.errors import SpeechRTError


def _csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", choices=("tts", "asr"), help="pipeline to benchmark")
    p.add_argument("--acoustic", help="acoustic model directory (tts; default: the bundled voice)")
    p.add_argument("--vocoder", help="vocoder model directory (tts)")
    p.add_argument("--model", help="ASR model directory (asr; default: the bundled recogniser)")
    p.add_argument(
        "--durations",
        type=_csv(float),
        default=[2.0, 7.0, 16.7],
        help="asr: audio seconds per item, comma list",
    )
    add_device_option(p)
    p.add_argument(
        "--backends",
        "--backend",
        type=_csv(str),
        default=["eager"],
        help="comma list of auto, eager, onnx, cuda (default: eager)",
    )
    p.add_argument("--precisions", type=_csv(str), default=["fp32"], help="comma list")
    p.add_argument(
        "--variants",
        type=_csv(str),
        help="BACKEND:PRECISION comma list, e.g. eager:fp32,eager:fp16,cuda:fp16 "
        "(instead of every --backends x --precisions pair)",
    )
    p.add_argument("--batch-sizes", type=_csv(int), default=[1, 8], help="comma list")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per case")
    p.add_argument("--iters", type=int, default=50, help="timed runs per case")
    p.add_argument("--denoise", type=float, default=0.0, help="denoiser strength (0 = off)")
    g = p.add_argument_group("load test against running servers (instead of in-process)")
    g.add_argument(
        "--url",
        action="append",
        metavar="[NAME=]URL",
        help="server to load; repeat to compare (e.g. static=http://h:8001 dynamic=http://h:8002)",
    )
    g.add_argument("--concurrency", type=_csv(int), default=[1, 2, 4, 8, 16, 32])
    g.add_argument("--rates", type=_csv(float), default=[], help="open-loop requests/s levels")
    g.add_argument("--seconds", type=float, default=10.0, help="duration of each level")
    g.add_argument(
        "--client-processes", type=int, default=None, metavar="N",
        help="processes that run a closed-loop level's clients (default: one per 8 clients, at "
        "most one per core): one Python process's HTTP client slows down past a few dozen",
    )  # fmt: skip
    p.add_argument("--out-dir", default="bench-results", help="JSON, CSV and PNG go here")
    p.add_argument("--name", default=None, help="file name stem (default: the task)")


def run(args: argparse.Namespace) -> int:
    from speechrt.asr import ASR
    from speechrt.bench.inprocess import Variant, bench_asr, bench_tts
    from speechrt.bench.report import print_table, speedups, write_outputs
    from speechrt.bench.stamp import stamp
    from speechrt.defaults import asr_dir, voice_dirs
    from speechrt.device import resolve_device
    from speechrt.tts import TTS

    if args.url:
        return run_load(args)
    if args.warmup < 0 or args.iters < 1:
        raise SpeechRTError("need --warmup >= 0 and --iters >= 1")
    if any(b < 1 for b in args.batch_sizes):
        raise SpeechRTError("batch sizes must be >= 1")
    device = resolve_device(args.device)
    from speechrt.runtime import BACKENDS

    variants = [Variant(b, p) for b in args.backends for p in args.precisions]
    if args.variants:
        if not all(v.count(":") == 1 for v in args.variants):
            raise SpeechRTError("--variants takes BACKEND:PRECISION pairs, e.g. cuda:fp16")
        variants = [Variant(*v.split(":")) for v in args.variants]

    def check_backend(v: Variant) -> None:
        if v.backend not in ("auto", *BACKENDS):
            raise SpeechRTError(
                f"unknown backend {v.backend!r}; choose auto, {', '.join(BACKENDS)}"
            )

    if args.task == "tts":
        args.acoustic, args.vocoder = map(str, voice_dirs(args.acoustic, args.vocoder))

        def make_tts(v: Variant) -> TTS:
            check_backend(v)
            return TTS(
                args.acoustic,
                args.vocoder,
                device=str(device),
                precision=v.precision,
                backend=v.backend,
            )

        rows = bench_tts(
            make_tts, variants, args.batch_sizes, args.warmup, args.iters, args.denoise
        )
    else:
        args.model = str(asr_dir(args.model))  # (the JSON's config names the directories)
        if any(d <= 0 for d in args.durations):
            raise SpeechRTError("durations must be > 0 seconds")

        def make_asr(v: Variant) -> ASR:
            check_backend(v)
            return ASR(args.model, device=str(device), precision=v.precision, backend=v.backend)

        rows = bench_asr(
            make_asr, variants, args.batch_sizes, args.warmup, args.iters, tuple(args.durations)
        )
    for r in rows:
        r["task"] = args.task
    speedups(rows)
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    result: dict[str, Any] = {"stamp": stamp(device, args._argv)}
    result["config"] = config | {"device": str(device)}
    result["rows"] = rows
    print_table(rows, f"speechrt bench {args.task} on {result['stamp']['gpu'] or device}")
    paths = write_outputs(result, args.out_dir, args.name or args.task)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def run_load(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from speechrt.bench.inputs import TTS_TEXT, synthetic_speechlike
    from speechrt.bench.load import load_sweep, plot_sweep, wav_bytes
    from speechrt.bench.report import print_load_table
    from speechrt.bench.stamp import stamp

    targets = {}
    for i, spec in enumerate(args.url):
        name, _, url = spec.rpartition("=") if "=" in spec.split("://")[0] else ("", "", spec)
        targets[name or f"server{i + 1}"] = url.rstrip("/")
    if any(c < 1 for c in args.concurrency) or any(r <= 0 for r in args.rates):
        raise SpeechRTError("concurrency levels must be >= 1 and rates > 0")
    if args.seconds <= 0:
        raise SpeechRTError("--seconds must be > 0")
    if args.client_processes is not None and args.client_processes < 1:
        raise SpeechRTError("--client-processes must be >= 1")
    audio = wav_bytes(synthetic_speechlike(7.0, 16000), 16000) if args.task == "asr" else None
    rows = load_sweep(
        targets, args.task, args.concurrency, args.rates, args.seconds, TTS_TEXT, audio,
        args.client_processes,
    )  # fmt: skip
    for r in rows:
        r["task"] = args.task
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    result: dict[str, Any] = {"stamp": stamp(torch.device("cpu"), args._argv), "config": config}
    result["rows"] = rows
    result["stamp"]["device"] = "client"
    print_load_table(rows, f"speechrt bench {args.task} --url ({', '.join(targets)})")
    name = args.name or f"{args.task}-load"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot_sweep(rows, out / f"{name}.png", f"{args.task}: latency and throughput vs concurrency")
    print(f"wrote {out / name}.json, {out / name}.png")
    failed = [r for r in rows if r["errors"]]
    if failed:
        total = sum(r["errors"] for r in failed)
        print(f"{total} requests failed; first: {failed[0]['first_error']}")
    return 0
