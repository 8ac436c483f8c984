"""A client that goes away stops costing the device: the real server (`speechrt serve` with the
bundled models, on the CPU) drops the unstarted pieces of two abandoned 10,000-character requests
and serves the next short request after at most the pieces already on the device."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx

from speechrt.client import parse_metrics

SENTENCE = (
    "The quick brown fox jumps over the lazy dog near the river bank today, while three small "
    "birds sing in the tall green trees and an old man walks slowly along the dusty road towards "
    "the quiet village where his daughter has lived for many long years. "
)
LONG_TEXT = (SENTENCE * 50)[:10_000].strip()
TTS = '{model="tts",version="1"}'


def tts_metrics(url: str) -> dict[str, float]:
    m = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    names = ("nv_inference_pending_request_count", "nv_inference_count")
    out = {name: m.get(name + TTS, 0.0) for name in names}
    out["dropped"] = m.get("speechrt_dropped_items_total" + TTS, 0.0)
    out["canceled"] = m.get(
        'nv_inference_request_failure{model="tts",version="1",reason="CANCELED"}', 0.0
    )
    return out


def poll(url: str, condition, what: str, seconds: float = 120) -> dict[str, float]:
    """Metrics once `condition(metrics)` holds (an "eventually" condition, generously bounded)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = tts_metrics(url)
        if condition(m):
            return m
        time.sleep(0.01)
    raise AssertionError(f"not within {seconds} s: {what}; metrics {m}")


def send_and_keep_open(url: str, text: str, seed: int) -> socket.socket:
    """POST /v1/audio/speech on a raw connection that the caller later drops unanswered."""
    host = urlsplit(url)
    body = json.dumps({"model": "tts", "voice": "0", "input": text, "seed": seed}).encode()
    head = (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(head.encode() + body)
    return sock


def test_abandoned_requests_are_dropped_and_a_short_one_is_served(start_server):
    url, _ = start_server("--device", "cpu")  # the bundled voice and recogniser
    pending = "nv_inference_pending_request_count"
    first = send_and_keep_open(url, LONG_TEXT, 0)
    # A request's pieces are queued all at once: once any are pending, all of them are.
    after_first = poll(url, lambda m: m[pending] > 0, "the first request queued")
    second = send_and_keep_open(url, LONG_TEXT, 1)
    # Until the second is queued, pending only falls (the device finishes pieces).
    queued = poll(url, lambda m: m[pending] > after_first[pending], "the second request queued")
    total = queued[pending] + queued["nv_inference_count"]  # every piece of both requests
    first.close()
    second.close()

    hi = httpx.post(
        f"{url}/v1/audio/speech",
        json={"model": "tts", "voice": "0", "input": "Hi."},
        timeout=30,  # a hang guard: on a 2-core CPU it answers in under 2 s
    )
    ran_before_hi = tts_metrics(url)["nv_inference_count"] - 1

    assert hi.status_code == 200 and hi.content[:4] == b"RIFF"
    assert ran_before_hi < total / 4  # Hi. did not wait for the abandoned pieces
    done = poll(url, lambda m: m[pending] == 0, "the device idle")
    assert done["canceled"] == 2
    # every piece of the abandoned requests either ran or was dropped unstarted, never both
    assert done["nv_inference_count"] + done["dropped"] == total + 1
    assert done["dropped"] >= total - ran_before_hi - 1
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
