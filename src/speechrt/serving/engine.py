"""Dynamic batching: one asyncio scheduler per pipeline, all taking turns on the one device thread.

Semantics follow Triton's dynamic batcher: a batch is dispatched as soon as `max_batch_size`
compatible items wait, otherwise once the oldest item has waited `max_queue_delay_ms` (while the
device is busy, items simply accumulate and the next batch leaves at once). Items are compatible
when the adapter gives them the same `key` (e.g. identical synthesis options); among compatible
items the batch is the window of most similar `length`s around its head, so padding stays small.

Three rules keep one request from holding the device:
- Engines take turns: the device is a FIFO lock, and an engine picks its batch only once it holds
  the lock, so every engine waiting gets one batch before any engine gets a second.
- Requests take turns within an engine (start-time fair queueing), and `max_batch_ms` bounds a
  batch's predicted compute time: the queue's rules (speechrt.serving.batch_queue). A single
  item is never split: its size is bounded where requests are cut up.
An item whose future is cancelled (its client went away, its deadline passed, a sibling failed)
while it waits is dropped unstarted and counted (`on_drop`).

The engine knows no models. Like LitServe's hook contract, an adapter supplies
    run_batch(items) -> outputs   (runs on the device thread; one output per item, in order)
    length(item) -> int           (what padding is proportional to)
    key(item) -> Hashable         (items with different keys never share a batch)
and may supply
    launch_batch(items) -> finish (on the device thread: start the batch; finish() -> outputs,
                                   on a thread of its own, waits for them)
If a batch raises, its items are retried one by one, so only the bad item fails.

With `BatchConfig.pipeline` and an adapter that has launch_batch, the device thread starts the
next batch while the last one's outputs are still on their way back (a GPU then has the next
batch queued behind the last): at most two batches of an engine are between launch and finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Generic, Protocol, TypeVar, runtime_checkable

from speechrt.errors import SpeechRTError
from speechrt.serving.batch_queue import FairQueue, Pending

log = logging.getLogger("speechrt.serving")

In = TypeVar("In")  # a batch item
Out = TypeVar("Out")  # its output
T = TypeVar("T")

Clock = Callable[[], float]  # seconds, monotonic


class Adapter(Protocol[In, Out]):
    """What a pipeline gives the batcher; see the module docstring."""

    def run_batch(self, items: list[In]) -> list[Out]: ...

    def length(self, item: In) -> int: ...

    def key(self, item: In) -> Hashable: ...


@runtime_checkable
class Launches(Protocol[In, Out]):
    """An adapter that can also run a batch in two steps (BatchConfig.pipeline)."""

    def launch_batch(self, items: list[In]) -> Callable[[], list[Out]]: ...


class Batcher(Protocol):
    """What a server does with an engine, whatever its items: start, drain, ask its state."""

    name: str

    def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def running(self) -> bool: ...

    @property
    def pending(self) -> int: ...


class Overloaded(Exception):
    """The queue is full: the caller should retry after `retry_after` seconds (HTTP 503)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(Overloaded):
    """The server is draining and accepts no new work (HTTP 503)."""


class InferenceError(Exception):
    """The model failed on an item for a reason other than bad input (HTTP 500)."""


class DeadlineExceeded(Exception):
    """A request did not finish within its time limit (HTTP 504)."""


@dataclass(frozen=True)
class BatchConfig:
    max_batch_size: int = 8  # items per batch
    max_queue_delay_ms: float = 5.0  # how long the oldest item may wait for batch-mates
    max_queue_size: int = 256  # queued items (not counting the batch on the device)
    max_batch_ms: float | None = None  # predicted compute per batch; None: no bound
    pipeline: bool = True  # launch a batch while the last one finishes (adapter.launch_batch)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SpeechRTError(f"max batch size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_ms < 0:
            raise SpeechRTError(f"max queue delay must be >= 0, got {self.max_queue_delay_ms}")
        if self.max_queue_size < 1:
            raise SpeechRTError(f"max queue size must be >= 1, got {self.max_queue_size}")
        if self.max_batch_ms is not None and self.max_batch_ms <= 0:
            raise SpeechRTError(f"max batch time must be > 0 ms, got {self.max_batch_ms}")


@dataclass(frozen=True)
class BatchStats:
    """What one executed batch reports to the metrics."""

    engine: str
    size: int
    queue_s: list[float]  # per item: enqueue -> batch start
    compute_s: float  # wall time of run_batch on the device thread
    ok: bool


class DeviceWorker:
    """The one thread that owns the device; engines take turns on it (`turn`), first come first
    served, and run their batches there (`run`), one at a time."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speechrt-device")
        self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speechrt-finish")
        self._lock = asyncio.Lock()  # FIFO: a waiting engine goes before one coming back

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._lock:
            yield

    async def run(self, fn: Callable[[], T]) -> T:
        """fn() on the device thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def finish(self, fn: Callable[[], T]) -> T:
        """A launched batch's finish(), off the device thread (it waits for the device)."""
        return await asyncio.get_running_loop().run_in_executor(self._finisher, fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._finisher.shutdown(wait=True)


class Engine(Generic[In, Out]):
    """A dynamic batcher for one adapter; start() inside the event loop, close() to drain.

    `clock` times the queue delay and the batches (tests pass a fake one); `on_drop(n)` hears of
    n items dropped unstarted because their futures were cancelled.
    """

    def __init__(
        self,
        name: str,
        adapter: Adapter[In, Out],
        worker: DeviceWorker,
        config: BatchConfig | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.name = name
        self.adapter = adapter
        self.worker = worker
        self.config = config or BatchConfig()
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.clock = clock
        self.dropped = 0  # items dropped unstarted, in total
        self.queue: FairQueue[In, Out] = FairQueue(
            self.config.max_batch_size, self.config.max_batch_ms
        )
        self._executing = 0  # items between dispatch and their futures' results
        self._finishing: set[asyncio.Task[None]] = set()  # pipelined batches coming back
        self._launches = asyncio.Semaphore(2)  # pipelined batches between launch and finish
        self._pipelined = self.config.pipeline and isinstance(adapter, Launches)
        self._closing = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"engine {self.name} already started")
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name=f"engine-{self.name}")

    async def close(self) -> None:
        """Stop taking work, finish everything queued or running, then stop the scheduler."""
        self._closing = True
        if self._task is None:
            return
        self._notify()
        await self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    @property
    def pending(self) -> int:
        """Items queued or on the device."""
        return sum(not p.future.done() for p in self.queue.items) + self._executing

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, items: Sequence[In]) -> list[asyncio.Future[Out]]:
        """Queue all items of one request at once (all or none); one future per item."""
        if self._closing or self._task is None:
            raise ShuttingDown(f"{self.name}: the server is shutting down")
        limit = self.config.max_queue_size
        if len(items) > limit:
            raise SpeechRTError(
                f"request needs {len(items)} {self.name} batch items; the queue holds {limit}"
            )
        if len(self.queue) + len(items) > limit:
            self._prune()
            if len(self.queue) + len(items) > limit:
                raise Overloaded(f"{self.name}: queue full ({limit} items), retry later")
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Out]] = [loop.create_future() for _ in items]
        keys = [self.adapter.key(it) for it in items]
        lengths = [self.adapter.length(it) for it in items]
        self.queue.add(items, keys, lengths, futures, self.clock())
        self._notify()
        return futures

    async def infer(self, items: Sequence[In], timeout: float | None = None) -> list[Out]:
        """Submit and wait for every item; on timeout the unfinished items are cancelled."""
        futures = self.submit(items)
        return await wait_all(futures, timeout)

    def poke(self) -> None:
        """Make the scheduler look at its queue and clock again (after a fake clock moved)."""
        self._notify()

    # -- scheduling ----------------------------------------------------------------------------

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _sleep(self, timeout: float | None) -> None:
        assert self._wake is not None
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _prune(self) -> None:
        """Drop the queued items whose futures were cancelled (they never started)."""
        dropped = self.queue.prune()
        if dropped:
            self.dropped += dropped
            if self.on_drop is not None:
                self.on_drop(dropped)

    async def _loop(self) -> None:
        while True:
            self._prune()
            if not self.queue:
                if self._closing:
                    await asyncio.gather(*self._finishing)
                    return
                await self._sleep(None)
                continue
            await self._wait_for_batch_mates()
            if self._pipelined:  # (before the turn: other engines need not wait on this one)
                await self._launches.acquire()
            launched = False
            try:
                async with self.worker.turn():
                    self._prune()  # items may have been cancelled while another engine ran
                    if not self.queue:
                        continue
                    batch = self.queue.take()
                    try:
                        if self._pipelined:
                            launched = await self._launch(batch)
                        else:
                            await self._execute(batch)
                    except Exception:  # never let the scheduler die; items already failed
                        log.exception("engine %s: scheduler error", self.name)
            finally:
                if self._pipelined and not launched:
                    self._launches.release()

    async def _wait_for_batch_mates(self) -> None:
        """Until the head's batch is full or the oldest item has waited max_queue_delay_ms."""
        delay = self.config.max_queue_delay_ms / 1000.0
        while not self._closing:
            self._prune()
            if not self.queue:
                return
            remaining = self.queue.items[0].enqueued + delay - self.clock()
            if self.queue.batch_ready() or remaining <= 0:
                return
            await self._sleep(remaining)

    def _timed_run(self, items: list[In]) -> tuple[list[Out], float]:
        t0 = self.clock()
        outputs = self.adapter.run_batch(items)
        if len(outputs) != len(items):
            raise RuntimeError(
                f"{self.name}: run_batch returned {len(outputs)} outputs for {len(items)} items"
            )
        return outputs, self.clock() - t0

    async def _run(self, batch: list[Pending[In, Out]]) -> list[Out]:
        start = self.clock()
        queue_s = [start - p.enqueued for p in batch]
        try:
            outputs, compute_s = await self.worker.run(
                partial(self._timed_run, [p.item for p in batch])
            )
        except BaseException:
            self._report(BatchStats(self.name, len(batch), queue_s, self.clock() - start, False))
            raise
        self.queue.learn(batch, compute_s)
        self._report(BatchStats(self.name, len(batch), queue_s, compute_s, True))
        return outputs

    def _report(self, stats: BatchStats) -> None:
        if self.on_batch is not None:
            self.on_batch(stats)

    async def _execute(self, batch: list[Pending[In, Out]]) -> None:
        self._executing += len(batch)
        try:
            try:
                outputs = await self._run(batch)
            except Exception as e:
                await self._one_by_one(batch, e)
                return
            for p, out in zip(batch, outputs, strict=True):
                _settle(p.future, out)
        finally:
            self._executing -= len(batch)

    async def _one_by_one(self, batch: list[Pending[In, Out]], e: Exception) -> None:
        """After batch failed with e: its items run alone, so only a bad one fails."""
        if len(batch) == 1:
            _fail(batch[0].future, self._item_error(e))
            return
        log.warning(
            "engine %s: batch of %d failed (%s); retrying its items one by one",
            self.name,
            len(batch),
            e,
        )
        for p in batch:
            try:
                if not p.future.done():
                    (out,) = await self._run([p])
                    _settle(p.future, out)
            except Exception as e1:
                _fail(p.future, self._item_error(e1))

    async def _launch(self, batch: list[Pending[In, Out]]) -> bool:
        """Start batch on the device and leave its finish to a task; False if it failed to
        start (its items have been retried one by one)."""
        self._executing += len(batch)
        start = self.clock()
        queue_s = [start - p.enqueued for p in batch]
        assert isinstance(self.adapter, Launches)
        try:
            finish = await self.worker.run(
                partial(self.adapter.launch_batch, [p.item for p in batch])
            )
        except Exception as e:
            self._report(BatchStats(self.name, len(batch), queue_s, self.clock() - start, False))
            try:
                await self._one_by_one(batch, e)
            finally:
                self._executing -= len(batch)
            return False
        task = asyncio.create_task(self._finish(batch, finish, start, queue_s))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return True

    async def _finish(
        self,
        batch: list[Pending[In, Out]],
        finish: Callable[[], list[Out]],
        start: float,
        queue_s: list[float],
    ) -> None:
        """A launched batch's outputs to its futures (compute_s: launch to outputs)."""
        outputs: list[Out] = []
        error: Exception | None = None
        try:
            outputs = await self.worker.finish(finish)
        except Exception as e:
            error = e
        finally:
            self._launches.release()
        try:
            if error is None and len(outputs) != len(batch):
                error = RuntimeError(
                    f"{self.name}: launch_batch gave {len(outputs)} outputs for {len(batch)} items"
                )
            compute_s = self.clock() - start
            self._report(BatchStats(self.name, len(batch), queue_s, compute_s, error is None))
            if error is not None:
                async with self.worker.turn():  # the retries take turns like any batch
                    await self._one_by_one(batch, error)
                return
            self.queue.learn(batch, compute_s)
            for p, out in zip(batch, outputs, strict=True):
                _settle(p.future, out)
        except Exception:  # a finishing task must not die with its futures unsettled
            log.exception("engine %s: finishing a batch failed", self.name)
            for p in batch:
                _fail(p.future, InferenceError(f"{self.name}: the batch was lost"))
        finally:
            self._executing -= len(batch)

    def _item_error(self, e: Exception) -> Exception:
        """Bad input stays a SpeechRTError (HTTP 400); anything else is logged once and becomes
        an InferenceError (HTTP 500) for this item only."""
        if isinstance(e, SpeechRTError):
            return e
        log.error("engine %s: an item failed", self.name, exc_info=e)
        error = InferenceError(f"{self.name} failed: {type(e).__name__}: {e}")
        error.__cause__ = e
        return error


def _settle(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # else cancelled by a timeout or a client that went away
        future.set_result(result)


def _fail(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


async def wait_all(futures: Sequence[asyncio.Future[T]], timeout: float | None) -> list[T]:
    """All results in order. On timeout (DeadlineExceeded), the first error, or cancellation of
    the caller, the rest are cancelled, so their queued items are dropped unstarted."""
    try:
        if futures:
            await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
        for f in futures:
            if f.done() and not f.cancelled() and (error := f.exception()) is not None:
                raise error
        if not all(f.done() for f in futures):
            raise DeadlineExceeded(f"request did not finish within {timeout:g} s")
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()
