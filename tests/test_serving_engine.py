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


@dataclass
class Doubler:
    """Items are (key, length, value); output 2 * value. Value < 0 makes the batch raise."""

    sleep: float = 0.0
    batches: list[list[tuple]] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)

    def run_batch(self, items: list[tuple]) -> list[int]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(items))
        time.sleep(self.sleep)
        if any(v < 0 for _, _, v in items):
            raise SpeechRTError(f"bad value in {items}")
        return [2 * v for _, _, v in items]

    def length(self, item: tuple) -> int:
        return item[1]

    def key(self, item: tuple) -> Hashable:
        return item[0]


def run_engine(adapter, config, body, metrics=None):
    """Run `body(engine)` inside a started engine, then drain it."""

    async def main():
        worker = DeviceWorker()
        on_batch = metrics.record_batch if metrics else None
        engine = Engine("m", adapter, worker, config, on_batch)
        engine.start()
        try:
            return await body(engine)
        finally:
            await engine.close()
            worker.close()

    return asyncio.run(main())


def test_full_batches_leave_at_once_and_keep_order():
    adapter = Doubler()
    items = [("a", 1, v) for v in range(8)]

    async def body(engine):
        t0 = time.monotonic()
        out = await engine.infer(items[:4])  # exactly max_batch_size: no waiting for the delay
        first = time.monotonic() - t0
        return out, first, await engine.infer(items)

    cfg = BatchConfig(max_batch_size=4, max_queue_delay_ms=5000)
    out, first, out_all = run_engine(adapter, cfg, body)
    assert out == [0, 2, 4, 6] and first < 1.0
    assert out_all == [2 * v for v in range(8)]
    assert all(len(b) <= 4 for b in adapter.batches)
    assert adapter.threads == {"speechrt-device_0"}  # one device thread for everything


def test_a_lone_item_waits_for_the_queue_delay():
    adapter = Doubler()

    async def body(engine):
        t0 = time.monotonic()
        await engine.infer([("a", 1, 1)])
        return time.monotonic() - t0

    waited = run_engine(adapter, BatchConfig(max_batch_size=8, max_queue_delay_ms=150), body)
    assert 0.14 <= waited < 1.0


def test_items_arriving_within_the_delay_share_a_batch():
    adapter = Doubler()

    async def body(engine):
        async def later(i):
            await asyncio.sleep(0.01 * i)
            return await engine.infer([("a", 1, i)])

        return await asyncio.gather(*(later(i) for i in range(5)))

    out = run_engine(adapter, BatchConfig(max_batch_size=8, max_queue_delay_ms=300), body)
    assert out == [[0], [2], [4], [6], [8]]
    assert [len(b) for b in adapter.batches] == [5]


def test_keys_never_mix_and_lengths_group():
    adapter = Doubler(sleep=0.05)
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
    adapter = Doubler(sleep=0.2)

    async def body(engine):
        first = engine.submit([("a", 1, 0)])  # goes to the device, leaving the queue empty
        await asyncio.sleep(0.05)
        engine.submit([("a", 1, 1), ("a", 1, 2)])
        with pytest.raises(Overloaded):
            engine.submit([("a", 1, 3)])
        with pytest.raises(SpeechRTError, match="queue holds 2"):
            engine.submit([("a", 1, 4)] * 3)
        return await asyncio.gather(*first)

    cfg = BatchConfig(max_batch_size=1, max_queue_delay_ms=0, max_queue_size=2)
    assert run_engine(adapter, cfg, body) == [0]


def test_timeout_cancels_queued_items():
    adapter = Doubler(sleep=0.3)

    async def body(engine):
        busy = engine.submit([("a", 1, 0)])
        await asyncio.sleep(0.05)
        with pytest.raises(DeadlineExceeded):
            await engine.infer([("a", 1, 9)], timeout=0.1)
        await asyncio.gather(*busy)
        await asyncio.sleep(0.1)
        return engine.pending

    assert run_engine(adapter, BatchConfig(max_batch_size=1, max_queue_delay_ms=0), body) == 0
    assert [v for b in adapter.batches for _, _, v in b] == [0]  # the timed-out item never ran


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


def test_bad_config_is_refused():
    with pytest.raises(SpeechRTError):
        BatchConfig(max_batch_size=0)
    with pytest.raises(SpeechRTError):
        BatchConfig(max_queue_delay_ms=-1)


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
