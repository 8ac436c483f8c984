"""The engine's queue: which waiting items form the next batch (speechrt.serving.engine).

- Requests take turns (start-time fair queueing): item j of a request is tagged with round
  `now + j`, where `now` is the round of the item last dispatched, and the batch's head is the
  queued item of the lowest round. A one-piece request that arrives behind a request of a
  hundred pieces waits for one of them, not a hundred.
- A batch is the head plus compatible items (same key) of the closest lengths, so padding
  stays small, as many as `max_batch_ms` allows: the queue learns seconds per unit of padded
  work (items x longest length) from the batches run; until one has run, a batch holds one item.

No asyncio scheduling and no clock of its own: the engine adds, prunes and takes under its loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

In = TypeVar("In")  # a batch item
Out = TypeVar("Out")  # its output


@dataclass(eq=False)
class Pending(Generic[In, Out]):
    """A queued item and what the queue orders it by."""

    item: In
    key: Hashable
    length: int
    future: asyncio.Future[Out]
    enqueued: float  # the engine's clock
    tag: tuple[int, int]  # (round, arrival): the head of the queue is the lowest


class FairQueue(Generic[In, Out]):
    """Items waiting for the device, in arrival order; `take()` removes the next batch."""

    def __init__(self, max_batch_size: int, max_batch_ms: float | None) -> None:
        self.max_batch_size = max_batch_size
        self.max_batch_ms = max_batch_ms
        self.items: list[Pending[In, Out]] = []  # in arrival order
        self._arrivals = itertools.count()
        self._round = 0  # the round of the last dispatched head
        self.seconds_per_work: float | None = None  # learnt from executed batches

    def __len__(self) -> int:
        return len(self.items)

    def add(
        self,
        items: Sequence[In],
        keys: Sequence[Hashable],
        lengths: Sequence[int],
        futures: Sequence[asyncio.Future[Out]],
        now: float,
    ) -> None:
        """One request's items, each in the next round from the last dispatched one's."""
        self.items += [
            Pending(it, k, n, f, now, (self._round + j, next(self._arrivals)))
            for j, (it, k, n, f) in enumerate(zip(items, keys, lengths, futures, strict=True))
        ]

    def prune(self) -> int:
        """Drop the items whose futures were cancelled (they never started); how many."""
        kept = [p for p in self.items if not p.future.done()]
        dropped = len(self.items) - len(kept)
        self.items = kept
        return dropped

    def head(self) -> Pending[In, Out]:
        return min(self.items, key=lambda p: p.tag)

    def batch_ready(self) -> bool:
        """The head's batch is full (max_batch_size compatible items wait)."""
        key = self.head().key
        return sum(p.key == key for p in self.items) >= self.max_batch_size

    def take(self) -> list[Pending[In, Out]]:
        """Remove and return the next batch, its head first."""
        batch = self._choose(self.head())
        chosen = set(map(id, batch))
        self.items = [p for p in self.items if id(p) not in chosen]
        self._round = max(self._round, batch[0].tag[0])
        return batch

    def learn(self, batch: Sequence[Pending[In, Out]], compute_s: float) -> None:
        """Update the seconds per unit of padded work (an average leaning on the latest)."""
        rate = compute_s / _work(batch)
        old = self.seconds_per_work
        self.seconds_per_work = rate if old is None else 0.5 * old + 0.5 * rate

    def _choose(self, head: Pending[In, Out]) -> list[Pending[In, Out]]:
        """The head plus up to max_batch_size - 1 compatible items of the closest lengths, as
        many as the time budget allows; the head comes first."""
        group = [p for p in self.items if p.key == head.key]
        k = self.max_batch_size
        if len(group) > k:
            group.sort(key=lambda p: p.length)
            h = group.index(head)
            starts = range(max(0, h - k + 1), min(h, len(group) - k) + 1)
            best = min(starts, key=lambda s: group[s + k - 1].length - group[s].length)
            group = group[best : best + k]
        group.sort(key=lambda p: (p is not head, abs(p.length - head.length), p.tag))
        size = 1
        while size < len(group) and self._fits(group[: size + 1]):
            size += 1
        return group[:size]

    def _fits(self, batch: list[Pending[In, Out]]) -> bool:
        if self.max_batch_ms is None:
            return True
        if self.seconds_per_work is None:  # nothing measured yet: one item at a time
            return False
        return self.seconds_per_work * _work(batch) <= self.max_batch_ms / 1000.0


def _work(batch: Sequence[Pending[In, Out]]) -> int:
    """What a batch's compute is proportional to: items x the longest (padded) length."""
    return len(batch) * max(1, max(p.length for p in batch))
