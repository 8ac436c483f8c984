"""SIGTERM: the server stops accepting, finishes every in-flight request, then exits cleanly;
what is still running when --graceful-timeout has passed is answered 503 with Retry-After."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from speechrt.client import parse_metrics

SENTENCES = " ".join(f"This is sentence number {w} of a long request." for w in "abcdefghij")
REQUESTS = 12


def refused_within(url: str, seconds: float) -> None:
    """Poll until the server refuses connections (an "eventually" condition).

    A probe that was in the listen backlog when the listener closed is reset rather than
    refused; either way the server did not serve it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/v2/health/live", timeout=5)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            return
        time.sleep(0.01)
    raise AssertionError(f"still accepting connections {seconds} s after SIGTERM")


def queued(url: str, pieces: int, model: str = "tts") -> float:
    """Poll until `pieces` items of `model` are queued or done; returns those still pending."""
    labels = f'{{model="{model}",version="1"}}'
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = parse_metrics(httpx.get(f"{url}/metrics").text)
        in_flight = m[f"nv_inference_pending_request_count{labels}"]
        if m.get(f"nv_inference_count{labels}", 0) + in_flight >= pieces:
            return in_flight
        time.sleep(0.01)
    raise AssertionError(f"{pieces} pieces were not queued within 60 s")


def speech(url: str, seed: int) -> httpx.Response:
    """One /v1/audio/speech request of SENTENCES as wav."""
    body = {
        "model": "tts",
        "voice": "0",
        "input": SENTENCES,
        "seed": seed,
        "response_format": "wav",
    }
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


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
        return speech(url, seed)

    with ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(post, seed) for seed in range(REQUESTS)]
        in_flight = queued(url, REQUESTS * 10)  # every request's pieces queued or done
        proc.send_signal(signal.SIGTERM)
        assert in_flight > 0, "the requests finished before SIGTERM: nothing was in flight"
        refused_within(url, 60)  # no longer accepting
        responses = [f.result() for f in futures]
    assert [r.status_code for r in responses] == [200] * REQUESTS
    assert all(r.content[:4] == b"RIFF" and len(r.content) > 1000 for r in responses)
    # uvicorn re-raises the signal once its graceful shutdown is complete
    assert proc.wait(60) == -signal.SIGTERM
    log = proc.log.read_text()
    assert "Waiting for application shutdown" in log and "Application shutdown complete" in log


def test_requests_past_the_graceful_timeout_get_a_json_503(start_server):
    url, proc = start_server(
        *("--device", "cpu", "--no-components"),  # the bundled voice: about 1 s a sentence
        *("--max-batch-size", "1", "--graceful-timeout", "1"),
    )
    requests = 6

    def post(seed: int) -> httpx.Response:
        return speech(url, seed)

    with ThreadPoolExecutor(requests) as pool:
        futures = [pool.submit(post, seed) for seed in range(requests)]
        in_flight = queued(url, requests * 10)
        proc.send_signal(signal.SIGTERM)
        assert in_flight > 10, "too little work in flight to outlast the graceful timeout"
        responses = [f.result() for f in futures]
    assert proc.wait(60) == -signal.SIGTERM
    late = [r for r in responses if r.status_code != 200]
    assert late, "every request finished within the graceful timeout"
    for r in late:
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "shutting down" in r.json()["error"]["message"]
    log = proc.log.read_text()
    assert "Traceback" not in log and "Exception in ASGI application" not in log
