"""The dynamic batcher with plain Python callables (no models), plus the v2 codec and metrics."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np
import pytest

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
from speechrt.serving.v2codec import HEADER, InferRequest, encode_response, parse_request


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


def test_metrics_count_batches_and_requests():
    metrics = Metrics()
    adapter = Doubler()

    async def body(engine):
        metrics.register_engine("m", lambda: engine.pending)
        async with metrics.track("m"):
            await engine.infer([("a", 1, v) for v in range(6)])
        with pytest.raises(SpeechRTError):
            async with metrics.track("m"):
                raise SpeechRTError("bad")

    run_engine(adapter, BatchConfig(max_batch_size=4, max_queue_delay_ms=1), body, metrics)
    m = parse_metrics(metrics.render())
    base = 'model="m",version="1"'
    assert m[f"nv_inference_count{{{base}}}"] == 6
    assert m[f"nv_inference_exec_count{{{base}}}"] == 2
    assert m[f"nv_inference_request_success{{{base}}}"] == 1
    assert m[f'nv_inference_request_failure{{{base},reason="REJECTED"}}'] == 1
    assert m[f'speechrt_batch_size_bucket{{{base},le="4"}}'] == 2
    assert m[f'speechrt_batch_size_bucket{{{base},le="1"}}'] == 0
    assert m[f"nv_inference_pending_request_count{{{base}}}"] == 0
    assert m[f"nv_inference_queue_duration_us{{{base}}}"] > 0


# -- KServe v2 codec -----------------------------------------------------------------------------


def binary_request(inputs, outputs=None):
    """(name, datatype, array) -> body, header length; every input as raw binary."""
    heads, blobs = [], []
    for name, datatype, arr in inputs:
        if datatype == "BYTES":
            raw = b"".join(struct.pack("<I", len(b)) + b for b in arr.reshape(-1))
        else:
            raw = arr.tobytes()
        heads.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    head = json.dumps({"inputs": heads, **({"outputs": outputs} if outputs else {})}).encode()
    return head + b"".join(blobs), str(len(head))


def test_v2_binary_and_json_requests_decode_alike():
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    text = np.array([b"hello", "w\u00f6rld".encode()], dtype=object)
    body, n = binary_request([("ids", "INT64", ids), ("TEXT", "BYTES", text)])
    req = parse_request(body, n)
    assert np.array_equal(req.inputs["ids"], ids) and list(req.inputs["TEXT"]) == list(text)
    js = {
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [2, 3], "data": [[0, 1, 2], [3, 4, 5]]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["hello", "w\u00f6rld"]},
        ]
    }
    req2 = parse_request(json.dumps(js).encode(), None)
    assert np.array_equal(req2.inputs["ids"], ids) and list(req2.inputs["TEXT"]) == list(text)


@pytest.mark.parametrize(
    "body, header, match",
    [
        (b"{not json", None, "not valid JSON"),
        (b'{"inputs": []}', None, "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}', None, "2"),
        (b'{"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}', None, "FP8"),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1.5]}]}',
            None,
            "integers",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}]}',
            None,
            "non-negative",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],'
            b' "parameters": {"binary_data_size": 8}}]}1234',
            "88",
            "binary_data_size",
        ),
        (b'{"inputs": [{"name": "x"}]}xx', "abc", "integer"),
        (b'{"inputs": [{"name": "x"}]}', "999", "does not fit"),
    ],
)
def test_v2_malformed_requests_are_speechrt_errors(body, header, match):
    if header == "88":
        header = str(body.index(b"1234"))
    with pytest.raises(SpeechRTError, match=match):
        parse_request(body, header)


def test_v2_response_binary_where_asked():
    req = InferRequest(None, {}, {}, [("A", True), ("T", None)], {})
    outs = {
        "A": np.array([[0.5, -1.0]], dtype=np.float32),
        "T": np.array([b"hi"], dtype=object),
    }
    body, headers = encode_response("m", "1", req, outs)
    n = int(headers[HEADER])
    head = json.loads(body[:n])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert head["outputs"][1]["data"] == ["hi"]
    assert np.array_equal(np.frombuffer(body[n:], "<f4"), outs["A"].reshape(-1))
    req = InferRequest("7", {}, {}, [("nope", None)], {})
    with pytest.raises(SpeechRTError, match="no output"):
        encode_response("m", "1", req, outs)


LATENCY_SCRIPT = """
import sys
from speechrt.serving.metrics import Metrics
m = Metrics()
m.register_engine("m", lambda: 0)
for _ in range(int(sys.argv[1])):
    m.record_request("m", 0.2)
print(m.render())
"""


def test_metrics_add_up_over_processes_sharing_a_directory(tmp_path):
    """prometheus-client's multi-process mode (what Ray replicas use): each process counts its
    own requests, and whichever renders /metrics reports all of them; latency histograms too."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    outs = [
        subprocess.run(
            [sys.executable, "-c", LATENCY_SCRIPT, str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for n in (3, 4)
    ]
    base = 'model="m",version="1"'
    first, last = parse_metrics(outs[0]), parse_metrics(outs[1])
    assert first[f"nv_inference_request_success{{{base}}}"] == 3
    assert last[f"nv_inference_request_success{{{base}}}"] == 7  # both processes
    assert last[f"nv_inference_request_duration_us{{{base}}}"] == 7 * 200_000
    assert last[f'speechrt_request_duration_seconds_bucket{{{base},le="0.1"}}'] == 0
    assert last[f'speechrt_request_duration_seconds_bucket{{{base},le="0.25"}}'] == 7
    assert last[f"speechrt_request_duration_seconds_count{{{base}}}"] == 7
    assert "# TYPE nv_inference_request_success counter" in outs[1]


def test_metrics_histograms_give_latency_quantiles():
    """Request, queue and compute latencies as Prometheus histograms (for histogram_quantile)."""
    metrics = Metrics()
    adapter = Doubler()

    async def body(engine):
        async with metrics.track("m"):
            await engine.infer([("a", 1, v) for v in range(3)])

    run_engine(adapter, BatchConfig(max_batch_size=4, max_queue_delay_ms=1), body, metrics)
    m = parse_metrics(metrics.render())
    base = 'model="m",version="1"'
    assert m[f"speechrt_request_duration_seconds_count{{{base}}}"] == 1
    assert m[f"speechrt_queue_duration_seconds_count{{{base}}}"] == 3  # one per item
    assert m[f"speechrt_compute_duration_seconds_count{{{base}}}"] == 1  # one per batch
    assert m[f'speechrt_compute_duration_seconds_bucket{{{base},le="+Inf"}}'] == 1
    assert "# TYPE speechrt_request_duration_seconds histogram" in metrics.render()
