"""`speechrt verify DIR --a eager --b onnx|cuda`: per-activation and per-output differences."""

from __future__ import annotations

import argparse

from speechrt.cli.flags import add_device_option, add_precision_option

BACKENDS = ("eager", "onnx", "cuda")
DEFAULT_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2, "bf16": 1e-1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="DIR", help="model directory")
    p.add_argument("--a", default="eager", choices=BACKENDS, help="reference (default: eager)")
    p.add_argument("--b", default="onnx", choices=BACKENDS, help="backend under test")
    add_precision_option(p, "cuda runner precision (default: fp32)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="max abs error allowed on outputs (default: 1e-4 fp32, 5e-2 fp16, 0.1 bf16)",
    )
    add_device_option(p)
    p.add_argument("--graph", default=None, help="only this graph (e.g. denoiser)")
    p.add_argument("--batch", type=int, default=2, help="example batch size (default: 2)")
    p.add_argument("--length", type=int, default=23, help="example length (default: 23)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")


def run(args: argparse.Namespace) -> int:
    from speechrt.errors import SpeechRTError
    from speechrt.runtime.verify import format_report, verify_dir

    if args.batch < 1 or args.length < 1:
        raise SpeechRTError("--batch and --length must be >= 1")
    tolerance = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE[args.precision]
    reports = verify_dir(
        args.model_dir,
        args.a,
        args.b,
        precision=args.precision,
        tolerance=tolerance,
        batch=args.batch,
        length=args.length,
        device=args.device,
        graph=args.graph,
        seed=args.seed,
    )
    for r in reports:
        print(format_report(r, tolerance))
    return 0 if all(r.passed for r in reports) else 1
