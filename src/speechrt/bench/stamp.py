"""What every benchmark result is stamped with: device, GPU, commit, versions, command."""

from __future__ import annotations

import platform
import shlex
import sys
from datetime import datetime, timezone
from importlib import metadata

import torch

from speechrt.bench.machine import cpu_model, git_commit

PACKAGES = ("speechrt", "torch", "numpy", "onnxruntime", "triton", "fastapi", "uvicorn")


def stamp(device: torch.device, argv: list[str] | None = None) -> dict:
    from speechrt import __version__

    versions: dict[str, str | None] = {"speechrt": __version__}
    for name in PACKAGES[1:]:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "gpu": gpu,
        "cpu": cpu_model(),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "commit": git_commit(),
        "python": platform.python_version(),
        "versions": versions,
        "command": shlex.join(["speechrt", *(sys.argv[1:] if argv is None else argv)]),
    }
