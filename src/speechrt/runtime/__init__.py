"""Runtimes: one component graph run on named tensors by an eager, cuda or onnx runner.

    arch/ (speechrt)          what each graph takes and returns; registry.py: which graphs
    graphs/                   a wrapper module per graph (what eager runs, cuda compiles,
                              and the ONNX export traces)
    eager.py / cuda.py / onnx.py   the runners; onnx.py imports no torch
    buckets.py                length buckets for static shapes
    export.py                 `speechrt export`
    stages.py                 pipeline stages (acoustic, vocoder, denoiser) on top of runners
    verify.py                 `speechrt verify`

This package's __init__ imports nothing heavy, so `speechrt.runtime.onnx` stays torch-free.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from speechrt.errors import SpeechRTError
from speechrt.runtime.base import BACKENDS

DEFAULT_OPSET = 17  # the ONNX opset `speechrt export` writes (runtime/export.py)


def device_kind(name: str = "auto") -> str:
    """'cpu' or 'cuda' for a device name ('auto', 'cpu', 'cuda', 'cuda:N'), asking torch only
    where the answer needs it: 'auto' is the CPU where no NVIDIA driver is loaded (Linux:
    no /proc/driver/nvidia; macOS: never), so a CPU-only run decides without importing torch."""
    if name == "auto":
        no_driver = sys.platform == "darwin" or (
            sys.platform.startswith("linux") and not Path("/proc/driver/nvidia").exists()
        )
        if no_driver:
            return "cpu"
        from speechrt.device import resolve_device

        return resolve_device(name).type
    kind = name.partition(":")[0]
    if kind not in ("cpu", "cuda"):
        from speechrt.device import resolve_device

        return resolve_device(name).type  # its error names the accepted devices
    return kind


def has_onnx(model_dir: str | Path, main_only: bool = False) -> bool:
    """Whether every graph (main_only: the main one) of the component in model_dir has been
    exported. A pipeline needs only the main graphs to start: it builds the others (a vocoder's
    denoiser) when a call first asks for them; a server exposes every graph from the start."""
    from speechrt.registry import ARCHITECTURES

    try:
        kind = json.loads((Path(model_dir) / "model.json").read_text())["kind"]
    except (OSError, ValueError, KeyError):
        return False
    if kind not in ARCHITECTURES:
        return False
    graphs = ARCHITECTURES[kind].graphs[:1] if main_only else ARCHITECTURES[kind].graphs
    return all((Path(model_dir) / f).is_file() for _, f in graphs)


def resolve_backend(
    name: str, device_type: str, model_dirs: Sequence[str | Path] = (), main_only: bool = False
) -> str:
    """'auto' -> cuda on a GPU, else onnx when every model dir holds its ONNX files (main_only:
    its main graph's, see has_onnx), else eager."""
    if name == "auto":
        if device_type == "cuda":
            return "cuda"
        if model_dirs and all(has_onnx(d, main_only) for d in model_dirs):
            return "onnx"
        return "eager"
    if name not in BACKENDS:
        raise SpeechRTError(f"unknown backend {name!r}; choose auto, {', '.join(BACKENDS)}")
    if name == "cuda" and device_type != "cuda":
        raise SpeechRTError("the cuda backend needs a CUDA device (use --device cuda)")
    return name
