"""The dynamic batcher's tests' harness: a fake clock, an adapter of plain Python callables (no
models) that doubles its items, and `run_engine`, which runs a test's body in a started engine;
spin / settle / entered let a test act at known points of the event loop and the device."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from speechrt.errors import SpeechRTError
from speechrt.serving.engine import DeviceWorker, Engine


class FakeClock:
    """A clock that moves only when told (the engine's queue delay and batch timings)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Doubler:
    """Items are (key, length, value); output 2 * value. An int value < 0 makes the batch raise.

    `gate`: the first batch waits for it (`entered` is set once it does), so a test can act
    while the device is busy. `clock`, `seconds_per_work`: each batch advances the fake clock by
    seconds_per_work x items x longest length. `log`: every item's value as it runs (may be
    shared by several adapters)."""

    sleep: float = 0.0
    gate: threading.Event | None = None
    clock: FakeClock | None = None
    seconds_per_work: float = 0.0
    log: list[object] = field(default_factory=list)
    batches: list[list[tuple]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    entered: threading.Event = field(default_factory=threading.Event)

    def run_batch(self, items: list[tuple]) -> list[int]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        self.log += [v for _, _, v in items]
        if self.gate is not None and not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        time.sleep(self.sleep)
        if self.clock is not None:
            self.clock.now += self.seconds_per_work * len(items) * max(n for _, n, _ in items)
        if any(isinstance(v, int) and v < 0 for _, _, v in items):
            raise SpeechRTError(f"bad value in {items}")
        return [2 * v for _, _, v in items]

    def length(self, item: tuple) -> int:
        return item[1]

    def key(self, item: tuple) -> Hashable:
        return item[0]


def run_engine(adapter, config, body, metrics=None, clock=time.monotonic):
    """Run `body(engine)` inside a started engine, then drain it."""

    async def main():
        worker = DeviceWorker()
        on_batch = metrics.record_batch if metrics else None
        on_drop = (lambda n: metrics.record_dropped("m", n)) if metrics else None
        engine = Engine("m", adapter, worker, config, on_batch, on_drop, clock)
        engine.start()
        try:
            return await asyncio.wait_for(body(engine), 60)  # a hang guard, not a timing
        finally:
            await engine.close()
            worker.close()

    return asyncio.run(main())


async def spin() -> None:
    """Let the event loop's ready tasks (the schedulers) act on what they have seen."""
    for _ in range(20):
        await asyncio.sleep(0)


async def settle(engine: Engine) -> None:
    """spin(), then let the device finish what it was given (one call at a time, in order)."""
    await spin()
    await engine.worker.run(lambda: None)


async def entered(adapter: Doubler) -> None:
    """Until the adapter's first batch is on the device, waiting at its gate."""
    assert await asyncio.to_thread(adapter.entered.wait, 30), "the first batch never started"
