"""Device and precision choices shared by the pipelines, the CLI and the server."""

from __future__ import annotations

import torch

from speechrt.errors import SpeechRTError

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> the first CUDA device when present, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpeechRTError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpeechRTError("CUDA was requested but no CUDA device is available")
    return device


def resolve_precision(name: str) -> torch.dtype:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise SpeechRTError(f"unknown precision {name!r}; choose {', '.join(PRECISIONS)}") from None
