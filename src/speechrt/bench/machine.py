"""The machine and checkout a measurement was taken on. Imports no torch: the CPU-only
scripts (start-up, streaming, human-speech evaluation) stamp their results with it too."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout holding src/speechrt


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    """`git -C ROOT args` -> its output, stripped."""
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=5)
    return out.stdout.strip()


def git_commit(dirty: bool = False) -> str | None:
    """HEAD of the checkout (+"+dirty" when `dirty` and tracked files changed), or
    $SPEECHRT_COMMIT where the tree travels without .git; None when neither is known."""
    if os.environ.get("SPEECHRT_COMMIT"):
        return os.environ["SPEECHRT_COMMIT"]
    try:
        head = _git("rev-parse", "--short", "HEAD")
        if head and dirty and _git("status", "--porcelain", "--untracked-files=no"):
            head += "+dirty"
        return head or None
    except (OSError, subprocess.SubprocessError):
        return None
