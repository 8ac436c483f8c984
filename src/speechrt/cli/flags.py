"""Option groups shared by the subcommands: one declaration and one default each."""

from __future__ import annotations

import argparse

PRECISIONS = ("fp32", "fp16", "bf16")
BACKEND_CHOICES = ("auto", "eager", "onnx", "cuda")


def add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")


def add_precision_option(p: argparse.ArgumentParser, help: str = "") -> None:
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help=help or "weights and activations (default: fp32)",
    )


def add_backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="eager (torch modules), cuda (fp16/bf16, length buckets, torch.compile, CUDA "
        "graphs), onnx (onnxruntime; needs `speechrt export` in each model dir), or auto "
        "(default): cuda on a GPU, else onnx where every model dir holds its ONNX graph (the "
        "bundled models do), else eager",
    )


def add_runtime_options(p: argparse.ArgumentParser) -> None:
    """--device, --precision and --backend: where and how a pipeline runs."""
    add_device_option(p)
    add_precision_option(p)
    add_backend_option(p)
