"""Runtimes: one component graph run on named tensors by an eager, cuda or onnx runner.

    contracts.py (speechrt)   what each graph takes and returns; registry.py: which graphs
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
from collections.abc import Sequence
from pathlib import Path

from speechrt.errors import SpeechRTError
from speechrt.runtime.base import BACKENDS

DEFAULT_OPSET = 17  # the ONNX opset `speechrt export` writes (runtime/export.py)


def has_onnx(model_dir: str | Path) -> bool:
    """Whether every graph of the component in model_dir has been exported."""
    from speechrt.registry import ARCHITECTURES

    try:
        kind = json.loads((Path(model_dir) / "model.json").read_text())["kind"]
    except (OSError, ValueError, KeyError):
        return False
    if kind not in ARCHITECTURES:
        return False
    return all((Path(model_dir) / f).is_file() for _, f in ARCHITECTURES[kind].graphs)


def resolve_backend(name: str, device_type: str, model_dirs: Sequence[str | Path] = ()) -> str:
    """'auto' -> cuda on a GPU, else onnx when every model dir holds its ONNX files, else eager."""
    if name == "auto":
        if device_type == "cuda":
            return "cuda"
        if model_dirs and all(has_onnx(d) for d in model_dirs):
            return "onnx"
        return "eager"
    if name not in BACKENDS:
        raise SpeechRTError(f"unknown backend {name!r}; choose auto, {', '.join(BACKENDS)}")
    if name == "cuda" and device_type != "cuda":
        raise SpeechRTError("the cuda backend needs a CUDA device (use --device cuda)")
    return name
