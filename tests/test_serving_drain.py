"""SIGTERM: the server stops accepting, finishes every in-flight request, then exits cleanly."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from speechrt.client import parse_metrics

SENTENCES = " ".join(f"This is sentence number {w} of a long request." for w in "abcdefghij")
REQUESTS = 12


def test_sigterm_drains_in_flight_requests(start_server, tiny_voice):
    url, proc = start_server(
        *("--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])),
        *(
            "--device",
            "cpu",
            "--threads",
            "1",
            "--max-batch-size",
            "2",
            "--max-queue-delay-ms",
            "1",
        ),
        "--no-components",
    )

    def post(seed: int) -> httpx.Response:
        body = {"model": "tts", "voice": "0", "input": SENTENCES, "seed": seed}
        return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)

    pieces = REQUESTS * 10
    count, pending = (
        'nv_inference_count{model="tts",version="1"}',
        "nv_inference_pending_request_count",
    )
    with ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(post, seed) for seed in range(REQUESTS)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until every request's pieces are queued or done
            m = parse_metrics(httpx.get(f"{url}/metrics").text)
            in_flight = m[f'{pending}{{model="tts",version="1"}}']
            if m.get(count, 0) + in_flight >= pieces:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert in_flight > 0, "the requests finished before SIGTERM: nothing was in flight"
        time.sleep(0.3)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(f"{url}/v2/health/live", timeout=5)
        responses = [f.result() for f in futures]
    assert [r.status_code for r in responses] == [200] * REQUESTS
    assert all(r.content[:4] == b"RIFF" and len(r.content) > 1000 for r in responses)
    # uvicorn re-raises the signal once its graceful shutdown is complete
    assert proc.wait(60) == -signal.SIGTERM
    log = proc.log.read_text()
    assert "Waiting for application shutdown" in log and "Application shutdown complete" in log
