"""`speechrt export DIR [--opset N]`: write DIR/model.onnx (and the component's other graphs)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from speechrt.runtime import DEFAULT_OPSET

    p.add_argument("model_dir", metavar="DIR", help="model directory (from `speechrt convert`)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: 17)")
    p.add_argument(
        "--graph",
        action="append",
        dest="graphs",
        metavar="NAME",
        help="export only this graph (repeatable; default: every graph of the component)",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip running onnxruntime against eager at other sizes after export",
    )


def run(args: argparse.Namespace) -> int:
    from speechrt.runtime.export import CHECKS, export_dir

    paths, checks = export_dir(
        args.model_dir, args.opset, check=not args.no_check, graphs=args.graphs
    )
    for path in paths:
        print(f"wrote {path}")
    if checks:
        worst = max(c.max_abs_error for c in checks)
        sizes = ", ".join(f"{b}x{n}" for b, n in CHECKS)
        print(
            f"onnxruntime matches eager at batch x length {sizes}: "
            f"max error {worst:.3g} (absolute; relative to outputs above 1)"
        )
    return 0
