"""The serving metrics the batcher records: batch and request counts, latency histograms, and
prometheus-client's multi-process mode."""

from __future__ import annotations

import pytest

from engine_harness import Doubler, run_engine
from speechrt.client import parse_metrics
from speechrt.errors import SpeechRTError
from speechrt.serving.engine import BatchConfig
from speechrt.serving.metrics import Metrics


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
