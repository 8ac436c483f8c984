"""What every benchmark result is stamped with: device, GPU, commit, versions, command."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("speechrt", "torch", "numpy", "onnxruntime", "triton", "fastapi", "uvicorn")


def git_commit() -> str | None:
    """HEAD of the checkout, or $SPEECHRT_COMMIT where the tree travels without .git."""
    if os.environ.get("SPEECHRT_COMMIT"):
        return os.environ["SPEECHRT_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[3]
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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
        "cpu": platform.processor() or platform.machine(),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "commit": git_commit(),
        "python": platform.python_version(),
        "versions": versions,
        "command": shlex.join(["speechrt", *(sys.argv[1:] if argv is None else argv)]),
    }
