"""Time-budgeted, resumable training: the loop every model shares.

    run(trainer, run_dir, minutes)   resume run_dir/last.pt (or warm-start from a compact file),
                                     step until the budget (or max_steps) is spent, checkpoint
                                     every few minutes and at the end, log JSON lines

A trainer is anything with `step() -> dict[str, float]`, `evaluate() -> dict[str, float]`,
`state_dict()` / `load_state_dict()` (everything: weights, optimizers, RNGs, data order) and
`compact_state()` / `load_compact()` (weights only, fp16: small enough to carry between machines).
Resuming from last.pt continues bit-for-bit as if never stopped (tested on CPU), also with
data-parallel ranks (speechrt_train.distributed; resumed by as many ranks as wrote it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from speechrt.errors import SpeechRTError
from speechrt_train.distributed import Ranks

CHECKPOINT = "last.pt"
LOG = "log.jsonl"


class WarmStartError(ValueError):
    """A warm start that cannot be made (wrong kind of model, unreadable directory)."""


class Trainer(Protocol):
    step_count: int

    def step(self) -> dict[str, torch.Tensor]: ...  # detached losses (0-d, on the device)
    def evaluate(self) -> dict[str, float]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def compact_state(self) -> dict[str, Any]: ...
    def load_compact(self, state: dict[str, Any]) -> None: ...
    def load_exported(self, model_dir: str | Path) -> float: ...
    # data-parallel runs only: what differs between ranks, and the replicas' fingerprint
    def rank_state(self) -> dict[str, Any]: ...
    def load_rank_state(self, state: dict[str, Any]) -> None: ...
    def parameter_digest(self) -> str: ...


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: Any, path: Path) -> None:
    """torch.save to `path` (its folder made if missing) through a temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def optimizer_options(device: torch.device) -> dict[str, Any]:
    """Adam(W) keyword arguments for `device`: the fused kernel on CUDA (one launch for all
    parameters instead of one per parameter and operation); the default elsewhere."""
    return {"fused": True} if device.type == "cuda" else {}


def warmup_rsqrt(step: int, warmup: int) -> float:
    """LR factor: linear warm-up to 1, then 1 / sqrt(step / warmup) (needs no run length)."""
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


class Batches:
    """Deterministic length-bucketed batches: epoch e's order is a function of (seed, e).

    Items are shuffled, cut into pools of `pool` batches, each pool sorted by length and cut
    into batches whose padded size (items x longest) stays under `max_units` (or `batch_size`
    items), and the batches shuffled again. `position` resumes mid-epoch."""

    def __init__(
        self,
        lengths: list[int] | np.ndarray,
        batch_size: int,
        seed: int = 0,
        max_units: int | None = None,
        pool: int = 32,
    ) -> None:
        if len(lengths) == 0:
            raise ValueError("no training items")
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.max_units, self.pool = batch_size, seed, max_units, pool
        self.epoch, self.position = 0, 0
        self._order = self._epoch_batches(0)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(len(self.lengths))
        batches: list[list[int]] = []
        span = self.batch_size * self.pool
        for start in range(0, len(perm), span):
            chunk = sorted(perm[start : start + span].tolist(), key=lambda i: self.lengths[i])
            batch: list[int] = []
            for i in chunk:
                longest = max(self.lengths[j] for j in [*batch, i])
                over = self.max_units is not None and longest * (len(batch) + 1) > self.max_units
                if batch and (len(batch) >= self.batch_size or over):
                    batches.append(batch)
                    batch = []
                batch.append(i)
            if batch:
                batches.append(batch)
        order = rng.permutation(len(batches))
        return [batches[k] for k in order]

    def __next__(self) -> list[int]:
        if self.position >= len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_batches(self.epoch)
        batch = self._order[self.position]
        self.position += 1
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._epoch_batches(self.epoch)


def _log(run_dir: Path, record: dict[str, Any]) -> None:
    with open(run_dir / LOG, "a") as f:
        f.write(json.dumps(record) + "\n")


def _resume(trainer: Trainer, state: dict[str, Any], ranks: Ranks, name: str, ckpt: Path) -> None:
    """Load last.pt: the shared state (weights, optimizer, data order), then this rank's own
    RNG states as the run that wrote it saved them (a one-process run's: rank 0's). A rank
    that run did not have keeps the fresh states its trainer was seeded with."""
    own = trainer.rank_state() if ranks.world > 1 else None
    trainer.load_state_dict(state["trainer"])
    written = state.get("ranks") or [{"rng": state["rng"]}]
    if ranks.rank < len(written):
        set_rng_state(written[ranks.rank]["rng"])
        if "trainer" in written[ranks.rank]:
            trainer.load_rank_state(written[ranks.rank]["trainer"])
    elif own is not None:
        trainer.load_rank_state(own)
    if ranks.main:
        print(f"{name}: resumed {ckpt} at step {trainer.step_count}", file=sys.stderr)
        if len(written) != ranks.world:  # the weights and data order go on; the RNGs differ
            print(
                f"{name}: {ckpt} was written by {len(written)} process(es), this run has "
                f"{ranks.world}: not an exact continuation",
                file=sys.stderr,
            )


def run(
    trainer: Trainer,
    run_dir: str | Path,
    minutes: float,
    max_steps: int | None = None,
    checkpoint_minutes: float = 3.0,
    log_every: int = 100,
    eval_every: int | None = None,
    warm_start: str | Path | None = None,
    progress: bool = True,
    name: str = "train",
    anneal_minutes: float = 0.0,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """Train for `minutes` of wall time (or until trainer.step_count == max_steps); resumable.
    With `anneal_minutes`, trainer.lr_scale falls linearly from 1 to 0 over the last
    anneal_minutes of the budget (a run's final chunk: the weights settle before export).

    Data-parallel (`ranks`, world > 1): every rank runs this with its own trainer. Rank 0
    decides before each step whether to go on, the step's lr_scale and whether to checkpoint
    first, and broadcasts that (one small host message), so all ranks stop at the same step
    with the same schedule; rank 0 alone logs, evaluates and writes last.pt, which holds the
    shared state once and every rank's RNG states, so that every rank resumes exactly.

    Returns a summary: steps, seconds, last logged losses, last evaluation."""
    from tqdm import tqdm

    ranks = ranks or Ranks()
    main = ranks.main
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / CHECKPOINT
    elapsed_before = 0.0
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        _resume(trainer, state, ranks, name, ckpt)
        elapsed_before = float(state["elapsed"])
    elif warm_start and Path(warm_start).is_dir():  # an exported component (QuartzNet only)
        try:
            elapsed_before = trainer.load_exported(warm_start)
        except (ValueError, SpeechRTError) as e:
            raise WarmStartError(f"--warm-start {warm_start}: {e}") from None
        if main:
            print(
                f"{name}: warm start from the exported {warm_start} (step {trainer.step_count})",
                file=sys.stderr,
            )
    elif warm_start and Path(warm_start).exists():
        compact = torch.load(warm_start, map_location="cpu", weights_only=True)
        trainer.load_compact(compact)
        elapsed_before = float(compact.get("elapsed", 0.0))
        if main:
            print(
                f"{name}: warm start from {warm_start} (step {trainer.step_count})", file=sys.stderr
            )

    start = time.time()
    budget = 60.0 * minutes
    last_ckpt = start
    sums: dict[str, Any] = {}
    count = 0
    last: dict[str, float] = {}
    evaluation: dict[str, float] = {}
    interactive = sys.stderr.isatty()
    first = True  # log the first step of every chunk
    printed = 0.0  # without a bar, a log line goes to stderr at most once a minute
    bar = tqdm(
        total=max(int(budget), 1),
        desc=name,
        unit="s",
        disable=not (progress and main),
        mininterval=1 if interactive else 30,
        bar_format="{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} s {postfix}",
    )

    def save() -> None:
        total = elapsed_before + time.time() - start
        per_rank: dict[str, Any] = {"rng": rng_state()}
        if ranks.world > 1:
            per_rank["trainer"] = trainer.rank_state()
            per_rank["digest"] = trainer.parameter_digest()
        written = ranks.gather(per_rank)
        if not main:
            return
        assert written is not None
        if len({w.pop("digest", None) for w in written}) > 1:
            raise RuntimeError(f"{name}: the ranks' weights differ at step {trainer.step_count}")
        state = {"trainer": trainer.state_dict(), "rng": written[0]["rng"], "elapsed": total}
        if ranks.world > 1:
            state["ranks"] = written
        save_atomic(state, ckpt)

    with bar:
        while True:
            # rank 0's clock decides for every rank: go on?, this step's lr_scale, save first?
            now = time.time() - start
            going = now < budget and (max_steps is None or trainer.step_count < max_steps)
            left = max(budget - now, 0.0)
            scale = min(1.0, left / (60.0 * anneal_minutes)) if anneal_minutes > 0 else 1.0
            decision = [
                float(going),
                scale,
                float(time.time() - last_ckpt > 60 * checkpoint_minutes),
            ]
            go, lr_scale, due = ranks.broadcast(decision)
            if not go:
                break
            if due:
                save()
                last_ckpt = time.time()
            if anneal_minutes > 0:
                trainer.lr_scale = lr_scale
            losses = trainer.step()
            if not main:
                continue
            for k, v in losses.items():  # summed on the device; read at log time only
                sums[k] = sums.get(k, 0.0) + v
            count += 1
            step = trainer.step_count
            if step % log_every == 0 or first:
                first = False
                last = {k: float(v) / count for k, v in sums.items()}
                record = {"step": step, "seconds": round(elapsed_before + time.time() - start, 1)}
                _log(run_dir, {**record, **{k: round(v, 5) for k, v in last.items()}})
                if not progress and time.time() - printed >= 60:
                    print(f"{name}: {json.dumps({**record, **last})}", file=sys.stderr)
                    printed = time.time()
                bar.set_postfix_str(
                    f"step {step} " + " ".join(f"{k} {v:.3f}" for k, v in last.items())
                )
                sums, count = {}, 0
            if eval_every and step % eval_every == 0:
                evaluation = trainer.evaluate()
                _log(run_dir, {"step": step, "eval": evaluation})
            now_s = min(int(time.time() - start), bar.total)
            if now_s > bar.n:
                bar.update(now_s - bar.n)
        if count:  # the steps since the last log line
            last = {k: float(v) / count for k, v in sums.items()}
            record = {
                "step": trainer.step_count,
                "seconds": round(elapsed_before + time.time() - start, 1),
            }
            _log(run_dir, {**record, **{k: round(v, 5) for k, v in last.items()}})
        if main:
            evaluation = trainer.evaluate()
            _log(run_dir, {"step": trainer.step_count, "eval": evaluation})
        save()
    total = elapsed_before + time.time() - start
    summary = {"steps": trainer.step_count, "seconds": round(total, 1), "last": last}
    summary["eval"] = evaluation
    return summary


def write_compact(trainer: Trainer, run_dir: str | Path, path: str | Path) -> Path:
    """The trainer's weights (fp16) + step + elapsed time: a file to carry to another machine."""
    ckpt = Path(run_dir) / CHECKPOINT
    elapsed = 0.0
    if ckpt.exists():
        elapsed = float(torch.load(ckpt, map_location="cpu", weights_only=True)["elapsed"])
    state = {**trainer.compact_state(), "elapsed": elapsed}
    save_atomic(state, Path(path))
    return Path(path)


def check_weights(weights: list[float], count: int) -> None:
    """ValueError unless there are two or more inputs, one weight each, >= 0, summing to 1."""
    if count != len(weights) or count < 2:
        raise ValueError("average: give two or more inputs and one weight for each")
    if abs(sum(weights) - 1.0) > 1e-6 or min(weights) < 0:
        raise ValueError(f"average: weights {weights} must be >= 0 and sum to 1")


def average_compact(paths: list[str | Path], weights: list[float]) -> dict[str, Any]:
    """Compact files of one model -> their weighted average (weights summing to 1): each float
    tensor averaged in fp32, stored in its own dtype; the rest (counters, config) from the last
    file, a FastConformer's tokenizer only where every file has the same; step and elapsed the
    largest; "averaged" lists each file's step and weight. Averaging two checkpoints of one run
    often keeps what each learnt (model soups)."""
    check_weights(weights, len(paths))
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    out = dict(states[-1])
    for key, last in states[-1].items():
        if not isinstance(last, dict) or key == "config":
            continue
        shapes = {name: t.shape for name, t in last.items()}
        if any({n: t.shape for n, t in s.get(key, {}).items()} != shapes for s in states):
            raise ValueError(f"average: the files' {key!r} tensors differ")
        out[key] = {}
        for name, tensor in last.items():
            if key == "tokenizer" and any(not s[key][name].equal(tensor) for s in states):
                raise ValueError("average: the files' tokenizers differ (other pieces)")
            if tensor.is_floating_point():
                mean = sum(w * s[key][name].float() for w, s in zip(weights, states, strict=True))
                tensor = mean.to(tensor.dtype)
            out[key][name] = tensor
    out["step"] = max(int(s["step"]) for s in states)
    out["elapsed"] = max(float(s.get("elapsed", 0.0)) for s in states)
    out["averaged"] = [
        {"step": int(s["step"]), "weight": w} for s, w in zip(states, weights, strict=True)
    ]
    return out


class Checkpointed:
    """The Trainer protocol's four state methods, from two tables a trainer names:
    `_state_parts()` (name -> anything with state_dict/load_state_dict, or a torch.Generator:
    the whole training state) and `_weight_parts()` (name -> module: the compact file)."""

    config: Any
    step_count: int
    lr_scale = 1.0  # set by run(): the final minutes' linear decay (anneal_minutes)

    def _state_parts(self) -> dict[str, Any]:
        raise NotImplementedError

    def _weight_parts(self) -> dict[str, torch.nn.Module]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        parts = {
            k: v.get_state() if isinstance(v, torch.Generator) else v.state_dict()
            for k, v in self._state_parts().items()
        }
        return {"config": dataclasses.asdict(self.config), **parts, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in self._state_parts().items():
            if isinstance(v, torch.Generator):
                v.set_state(state[k])
            else:
                v.load_state_dict(state[k])
        self.step_count = int(state["step"])

    def rank_state(self) -> dict[str, Any]:
        """The part of the state that differs between data-parallel ranks: the generators
        (each rank draws its own augmentation); all else is the same on every rank."""
        parts = self._state_parts().items()
        return {k: v.get_state() for k, v in parts if isinstance(v, torch.Generator)}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        for k, v in self._state_parts().items():
            if isinstance(v, torch.Generator):
                v.set_state(state[k])

    def parameter_digest(self) -> str:
        """SHA-1 of every parameter's bytes (not the buffers: BatchNorm statistics are each
        rank's own): data-parallel replicas must agree to the bit."""
        h = hashlib.sha1()
        for module in self._weight_parts().values():
            for p in module.parameters():
                h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def compact_state(self) -> dict[str, Any]:
        weights = {k: half(m.state_dict()) for k, m in self._weight_parts().items()}
        # the config rides along for the export's summary (model cards); loading ignores it
        return {**weights, "step": self.step_count, "config": dataclasses.asdict(self.config)}

    def load_compact(self, state: dict[str, Any]) -> None:
        for k, m in self._weight_parts().items():
            m.load_state_dict(full(state[k]))
        self.step_count = int(state["step"])

    def load_exported(self, model_dir: str | Path) -> float:
        """Warm-start from an exported component (trainers that can unfold one override it)."""
        raise ValueError(
            f"{model_dir}: a model directory; this trainer warm-starts from compact files only"
        )


def half(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Float tensors to fp16 (for compact files); others unchanged."""
    return {k: v.half() if v.is_floating_point() else v for k, v in state.items()}


def full(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `half`: float tensors back to fp32; others unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
