"""The dynamic batcher with plain Python callables (no models): batches by size, queue delay, key
and length; failures, overload, timeouts, turns between requests and engines, the time budget,
draining, and pipelined batches."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from engine_harness import Doubler, FakeClock, entered, run_engine, settle, spin
from speechrt.client import parse_metrics
from speechrt.errors import SpeechRTError
from speechrt.serving.engine import (
    BatchConfig,
    DeadlineExceeded,
    DeviceWorker,
    Engine,
    Overloaded,
    ShuttingDown,
)
from speechrt.serving.metrics import Metrics


def test_full_batches_leave_at_once_and_keep_order():
    clock = FakeClock()  # never moves: only a full batch can leave
    adapter = Doubler()
    items = [("a", 1, v) for v in range(8)]

    async def body(engine):
        return await engine.infer(items[:4]), await engine.infer(items)

    cfg = BatchConfig(max_batch_size=4, max_queue_delay_ms=5000)
    out, out_all = run_engine(adapter, cfg, body, clock=clock)
    assert out == [0, 2, 4, 6]
    assert out_all == [2 * v for v in range(8)]
    assert [len(b) for b in adapter.batches] == [4, 4, 4]
    assert adapter.threads == {"speechrt-device_0"}  # one device thread for everything


def test_a_lone_item_waits_for_the_queue_delay():
    clock = FakeClock()
    adapter = Doubler()

    async def body(engine):
        (future,) = engine.submit([("a", 1, 1)])
        seen = []
        for now in (0.0, 0.149, 0.150):
            clock.now = now
            engine.poke()
            await settle(engine)
            seen.append(len(adapter.batches))
        return seen, await future

    cfg = BatchConfig(max_batch_size=8, max_queue_delay_ms=150)
    seen, out = run_engine(adapter, cfg, body, clock=clock)
    assert seen == [0, 0, 1] and out == 2


def test_items_arriving_within_the_delay_share_a_batch():
    clock = FakeClock()
    adapter = Doubler()

    async def body(engine):
        futures = []
        for i in range(5):
            clock.now = 0.05 * i  # the last one arrives 200 ms after the first
            futures += engine.submit([("a", 1, i)])
            await settle(engine)
        clock.now = 0.3
        engine.poke()
        return await asyncio.gather(*futures)

    cfg = BatchConfig(max_batch_size=8, max_queue_delay_ms=300)
    out = run_engine(adapter, cfg, body, clock=clock)
    assert out == [0, 2, 4, 6, 8]
    assert [len(b) for b in adapter.batches] == [5]


def test_keys_never_mix_and_lengths_group():
    adapter = Doubler()
    items = [("a", n, n) for n in (1, 100, 2, 101, 3, 102)] + [("b", 5, 7)]

    async def body(engine):
        return await engine.infer(items)

    out = run_engine(adapter, BatchConfig(max_batch_size=3, max_queue_delay_ms=50), body)
    assert out == [2 * v for _, _, v in items]
    groups = sorted(sorted(n for _, n, _ in b) for b in adapter.batches)
    assert groups == [[1, 2, 3], [5], [100, 101, 102]]


def test_a_failing_batch_fails_only_its_bad_item():
    adapter = Doubler()
    items = [("a", 1, 1), ("a", 1, -1), ("a", 1, 3)]

    async def body(engine):
        futures = engine.submit(items)
        results = await asyncio.gather(*futures, return_exceptions=True)
        after = await engine.infer([("a", 1, 5)])  # the engine keeps serving
        return results, after

    results, after = run_engine(adapter, BatchConfig(max_batch_size=4), body)
    assert results[0] == 2 and results[2] == 6 and after == [10]
    assert isinstance(results[1], SpeechRTError)
    assert [len(b) for b in adapter.batches] == [3, 1, 1, 1, 1]


def test_full_queue_is_overloaded_and_huge_requests_are_refused():
    gate = threading.Event()
    adapter = Doubler(gate=gate)

    async def body(engine):
        first = engine.submit([("a", 1, 0)])
        await entered(adapter)  # on the device, leaving the queue empty
        engine.submit([("a", 1, 1), ("a", 1, 2)])
        with pytest.raises(Overloaded):
            engine.submit([("a", 1, 3)])
        with pytest.raises(SpeechRTError, match="queue holds 2"):
            engine.submit([("a", 1, 4)] * 3)
        gate.set()
        return await asyncio.gather(*first)

    cfg = BatchConfig(max_batch_size=1, max_queue_delay_ms=0, max_queue_size=2)
    assert run_engine(adapter, cfg, body) == [0]


def test_timeout_cancels_queued_items_and_counts_them():
    gate = threading.Event()
    adapter = Doubler(gate=gate)
    metrics = Metrics()

    async def body(engine):
        busy = engine.submit([("a", 1, 0)])
        await entered(adapter)  # the device is held until the gate opens
        with pytest.raises(DeadlineExceeded):
            await engine.infer([("a", 1, 9), ("a", 1, 8)], timeout=0.01)
        gate.set()
        await asyncio.gather(*busy)
        await settle(engine)
        return engine.pending, engine.dropped

    cfg = BatchConfig(max_batch_size=1, max_queue_delay_ms=0)
    assert run_engine(adapter, cfg, body, metrics) == (0, 2)
    assert adapter.log == [0]  # the timed-out items never ran
    m = parse_metrics(metrics.render())
    assert m['speechrt_dropped_items_total{model="m",version="1"}'] == 2


def test_requests_take_turns_within_an_engine():
    gate = threading.Event()
    adapter = Doubler(gate=gate)

    async def body(engine):
        long_a = engine.submit([("k", 1, f"a{j}") for j in range(4)])
        await entered(adapter)  # a0 is on the device
        long_b = engine.submit([("k", 1, f"b{j}") for j in range(4)])
        short = engine.submit([("k", 1, "c0")])
        gate.set()
        await asyncio.gather(*long_a, *long_b, *short)

    run_engine(adapter, BatchConfig(max_batch_size=1, max_queue_delay_ms=0), body)
    # one item of each waiting request per round, oldest request first within a round
    assert adapter.log == ["a0", "b0", "c0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_engines_take_turns_on_the_device():
    gate = threading.Event()
    log: list[object] = []
    x, y = Doubler(gate=gate, log=log), Doubler(log=log)
    cfg = BatchConfig(max_batch_size=1, max_queue_delay_ms=0)

    async def main():
        worker = DeviceWorker()
        engines = [Engine(n, a, worker, cfg) for n, a in (("x", x), ("y", y))]
        for engine in engines:
            engine.start()
        xs = engines[0].submit([("a", 1, v) for v in (10, 11, 12)])
        await entered(x)  # x's first batch holds the device
        ys = engines[1].submit([("a", 1, v) for v in (20, 21, 22)])
        await spin()  # y waits for its turn
        ys[0].cancel()  # while it waits: y picks its batch only once it has the device
        gate.set()
        await asyncio.wait_for(asyncio.gather(*xs, *ys[1:]), 60)
        for engine in engines:
            await engine.close()
        worker.close()
        return engines[1].dropped

    assert asyncio.run(main()) == 1
    assert log == [10, 21, 11, 22, 12]


def test_batches_keep_within_the_time_budget():
    clock = FakeClock()
    adapter = Doubler(clock=clock, seconds_per_work=0.01)

    async def body(engine):
        await engine.infer([("a", 5, v) for v in range(8)])  # 0.05 s each
        await engine.infer([("a", 1, v) for v in range(8)])  # 0.01 s each

    cfg = BatchConfig(max_batch_size=8, max_queue_delay_ms=0, max_batch_ms=120)
    run_engine(adapter, cfg, body, clock=clock)
    # nothing measured yet: one item; then two of 0.05 s fit in 0.12 s; eight short ones do
    assert [len(b) for b in adapter.batches] == [1, 2, 2, 2, 1, 8]


def test_close_drains_queued_work_then_refuses():
    adapter = Doubler(sleep=0.02)

    async def main():
        worker = DeviceWorker()
        engine = Engine("m", adapter, worker, BatchConfig(max_batch_size=2))
        engine.start()
        futures = engine.submit([("a", 1, v) for v in range(7)])
        await engine.close()
        with pytest.raises(ShuttingDown):
            engine.submit([("a", 1, 1)])
        worker.close()
        return [f.result() for f in futures]

    assert asyncio.run(main()) == [2 * v for v in range(7)]


@dataclass
class Launcher(Doubler):
    """A Doubler that also launches its batches in two steps (the engine's pipelining).

    launch_batch records the batch's size in `launched` and returns finish; `hold`: the first
    batch's finish waits for it, so a test can watch the next batch launch meanwhile. A batch
    holding a value < 0 fails in finish (its items are then retried with run_batch)."""

    hold: threading.Event | None = None
    launched: list[int] = field(default_factory=list)
    finishers: set[str] = field(default_factory=set)
    second: threading.Event = field(default_factory=threading.Event)  # two batches launched

    def launch_batch(self, items: list[tuple]):
        self.threads.add(threading.current_thread().name)
        self.launched.append(len(items))
        if len(self.launched) >= 2:
            self.second.set()
        first, values = len(self.launched) == 1, [v for _, _, v in items]

        def finish() -> list[int]:
            self.finishers.add(threading.current_thread().name)
            if first and self.hold is not None:
                assert self.hold.wait(30), "the test never released the first batch"
            if any(v < 0 for v in values):
                raise SpeechRTError(f"bad value in {values}")
            return [2 * v for v in values]

        return finish


def test_pipelined_batches_launch_while_the_last_one_finishes():
    hold = threading.Event()
    adapter = Launcher(hold=hold)
    clock = FakeClock()  # never moves: only full batches leave

    async def body(engine):
        first = engine.submit([("a", 1, v) for v in range(8)])
        # batch 1 is held in its finish; batch 2 launches all the same
        assert await asyncio.to_thread(adapter.second.wait, 30), "batch 2 never launched"
        launched_while_held = list(adapter.launched)
        later = engine.submit([("a", 1, v) for v in range(8, 12)])
        await settle(engine)
        third_waits = list(adapter.launched)  # two batches between launch and finish: no third
        hold.set()
        results = await asyncio.gather(*first, *later)
        return launched_while_held, third_waits, results

    cfg = BatchConfig(max_batch_size=4, max_queue_delay_ms=5000, pipeline=True)
    launched_while_held, third_waits, results = run_engine(adapter, cfg, body, clock=clock)
    assert launched_while_held == [4, 4]
    assert third_waits == [4, 4]
    assert adapter.launched == [4, 4, 4]
    assert results == [2 * v for v in range(12)]
    assert adapter.threads == {"speechrt-device_0"}
    assert adapter.finishers == {"speechrt-finish_0"}
    assert adapter.batches == []  # run_batch never ran: every batch launched


def test_pipelined_batch_failing_in_finish_fails_only_its_bad_item():
    adapter = Launcher()
    items = [("a", 1, 1), ("a", 1, -1), ("a", 1, 3)]

    async def body(engine):
        results = await asyncio.gather(*engine.submit(items), return_exceptions=True)
        after = await engine.infer([("a", 1, 5)])
        return results, after

    results, after = run_engine(adapter, BatchConfig(max_batch_size=4, pipeline=True), body)
    assert results[0] == 2 and results[2] == 6 and after == [10]
    assert isinstance(results[1], SpeechRTError)
    assert [len(b) for b in adapter.batches] == [1, 1, 1]  # the failed batch, one by one


def test_pipelined_close_drains_every_batch():
    adapter = Launcher(sleep=0.0)

    async def main():
        worker = DeviceWorker()
        config = BatchConfig(max_batch_size=2, pipeline=True)
        engine = Engine("m", adapter, worker, config)
        engine.start()
        futures = engine.submit([("a", 1, v) for v in range(7)])
        await engine.close()
        worker.close()
        return [f.result() for f in futures], engine.pending

    results, pending = asyncio.run(main())
    assert results == [2 * v for v in range(7)] and pending == 0


def test_pipeline_needs_an_adapter_that_launches():
    """An adapter without launch_batch runs whole batches even with pipeline on."""
    adapter = Doubler()

    async def body(engine):
        return await engine.infer([("a", 1, v) for v in range(3)])

    assert run_engine(adapter, BatchConfig(pipeline=True), body) == [0, 2, 4]
    assert [len(b) for b in adapter.batches] == [3]


def test_bad_config_is_refused():
    with pytest.raises(SpeechRTError):
        BatchConfig(max_batch_size=0)
    with pytest.raises(SpeechRTError):
        BatchConfig(max_queue_delay_ms=-1)
    with pytest.raises(SpeechRTError, match="batch time"):
        BatchConfig(max_batch_ms=0)
