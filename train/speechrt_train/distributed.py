"""Data-parallel training over the devices of one machine: one process per device.

    python -m speechrt_train quartznet --gpus N ...

`launch` runs N copies of the command through torchrun's own machinery (elastic_launch:
rendezvous on a free local port, RANK / LOCAL_RANK / WORLD_SIZE set; as soon as one copy fails
the others are ended and the launch exits non-zero). torchrun itself would do the same but
cannot be handed our `--run` (its parser takes it for an abbreviation of `--run-path`).

`Ranks.from_env` joins the copies into one process group: NCCL between GPUs (rank r on
cuda:r), gloo on the CPU (tests); on GPUs a second, gloo group carries the training loop's
host-side messages (rank 0's stop / anneal / checkpoint decisions, the ranks' RNG states at a
checkpoint), so those never wait on the device. Every collective times out after `TIMEOUT`:
a rank stuck without failing cannot hold the others for ever either.

What each rank does is in the trainer (its share of every global batch, one all_reduce of
all gradients per step) and in loop.run (rank 0 decides, logs, evaluates and checkpoints).
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

# the longest any rank waits for the others: rank 0 evaluating (seconds on a GPU) or loading
# the corpus a little later than the others is far below it
TIMEOUT = timedelta(minutes=5)


@dataclass
class Ranks:
    """This process's place in a data-parallel job (the default: the only process)."""

    rank: int = 0
    world: int = 1
    control: Any = None  # the process group of host-side messages (world > 1)

    @property
    def main(self) -> bool:
        """Rank 0: the one that logs, evaluates and writes files."""
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str) -> tuple[Ranks, str]:
        """Join the job `launch` (or torchrun) started, WORLD_SIZE > 1 -> (ranks, this rank's
        device: cuda:LOCAL_RANK for "cuda", else `device`); a plain run -> (Ranks(), device)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(), device
        rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        if device.startswith("cuda"):
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", timeout=TIMEOUT)
            control = dist.new_group(backend="gloo", timeout=TIMEOUT)
        else:
            dist.init_process_group("gloo", timeout=TIMEOUT)
            control = dist.group.WORLD
        return cls(rank, world, control), device

    def broadcast(self, values: list[float]) -> list[float]:
        """Rank 0's `values` on every rank (host floats; one small gloo message)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.broadcast(t, 0, group=self.control)
        return t.tolist()

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` (picklable), in rank order, on rank 0; None elsewhere."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0, group=self.control)
        return out

    def close(self) -> None:
        """Leave the job after a normal end: a barrier first, so that no rank closes its gloo
        connections while another still talks on them (one rank of a two-rank CPU test once
        aborted in teardown: "terminate called without an active exception")."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier(group=self.control)
            dist.destroy_process_group()


def all_reduce_(tensors: list[Tensor]) -> None:
    """Sum `tensors` (one dtype, one device) over all ranks, in place, by one all_reduce of one
    flat copy: one collective whatever the number of tensors, and no kernel per tensor (one
    cat in, one foreach copy back)."""
    flat = _flatten_dense_tensors(tensors)
    dist.all_reduce(flat)
    torch._foreach_copy_(tensors, list(_unflatten_dense_tensors(flat, tensors)))


def launch(nprocs: int, argv: list[str], module: str = "speechrt_train") -> int:
    """Run `python -m <module> *argv` as `nprocs` ranks on this machine (each sees WORLD_SIZE
    and so does not launch again) -> 0, or 1 when a rank failed (the others are ended at
    once: none is left waiting)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # torchrun --standalone: any free port
        max_restarts=0,
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N processes share the cores
    try:
        elastic_launch(config, sys.executable)("-m", module, *argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(f"speechrt_train: rank {rank} failed (exit {failure.exitcode})", file=sys.stderr)
        return 1
    return 0
