"""`python -m ddp_probe ARGS`: speechrt_train's CLI as one data-parallel rank, instrumented
for tests/test_train_ddp.py (started there by speechrt_train.distributed.launch).

PROBE_OUT=DIR   each rank writes DIR/rank<r>.pt when its run ends (weights, optimizer, step, the
                (step, lr_scale) of every step) and appends each step to DIR/rank<r>.steps
PROBE_EVERY=1   ... and DIR/rank<r>-<step>.pt after every step
PROBE_KEEP=K    rank 0 also copies last.pt to DIR/last-K.pt when it writes it at step K
PROBE_FAIL=K    rank 1 raises at the K-th step of this run
PROBE_CLOCK=S0,S1  rank r's clock, as the training loop reads it, moves S_r seconds a step and
                not otherwise (a deadline then falls after a known number of steps)
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from speechrt_train import loop
from speechrt_train.__main__ import main
from speechrt_train.quartznet_train import QuartzNetTrainer

torch.set_num_threads(1)  # as tests/conftest.py: tiny convs, 2 cores
torch.backends.mkldnn.enabled = False
RANK = int(os.environ.get("RANK", "0"))
OUT = Path(os.environ["PROBE_OUT"])
steps: list[tuple[int, float]] = []
_step, _run, _save = QuartzNetTrainer.step, loop.run, loop.save_atomic


def state(trainer: QuartzNetTrainer) -> dict[str, Any]:
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "step": trainer.step_count,
        "steps": steps,
    }


def step(self: QuartzNetTrainer) -> dict[str, torch.Tensor]:
    if RANK == 1 and len(steps) + 1 == int(os.environ.get("PROBE_FAIL", "0")):
        raise RuntimeError("probe: rank 1 fails")
    steps.append((self.step_count + 1, self.lr_scale))
    with open(OUT / f"rank{RANK}.steps", "a") as f:
        f.write(f"{self.step_count + 1} {self.lr_scale!r}\n")
    losses = _step(self)
    if "PROBE_EVERY" in os.environ:
        torch.save(state(self), OUT / f"rank{RANK}-{self.step_count}.pt")
    return losses


def run(trainer: QuartzNetTrainer, *args: Any, **kwargs: Any) -> dict[str, Any]:
    summary = _run(trainer, *args, **kwargs)
    torch.save(state(trainer), OUT / f"rank{RANK}.pt")
    return summary


def save_atomic(obj: Any, path: Path) -> None:
    _save(obj, path)
    if path.name == loop.CHECKPOINT and obj["trainer"]["step"] == int(
        os.environ.get("PROBE_KEEP", "-1")
    ):
        shutil.copy(path, OUT / f"last-{obj['trainer']['step']}.pt")


class Clock:
    """Stands in for the `time` module in speechrt_train.loop: S seconds per step taken."""

    def __init__(self, per_step: float) -> None:
        self.start, self.per_step = time.time(), per_step

    def time(self) -> float:
        return self.start + self.per_step * len(steps)


if "PROBE_CLOCK" in os.environ:
    loop.time = Clock(float(os.environ["PROBE_CLOCK"].split(",")[RANK]))  # type: ignore[assignment]
QuartzNetTrainer.step = step  # type: ignore[method-assign]
loop.run = run
loop.save_atomic = save_atomic

if __name__ == "__main__":
    sys.exit(main())
