"""Inputs shared by the server tests: a sentence, speech-like audio and its WAV bytes, KServe v2
infer bodies (binary-extension tensors and malformed requests), and the helpers that abandon
requests and watch the TTS model's metrics."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import numpy as np

from speechrt.audio.io import encode_audio
from speechrt.client import parse_metrics

ONE = "Hello there, how are you today?"


def speechlike(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """Tone bursts and near-silence: something for the recogniser to chew on."""
    rng = np.random.default_rng(seed)
    parts, total = [], int(seconds * sr)
    while sum(map(len, parts)) < total:
        n = int(rng.uniform(0.05, 0.4) * sr)
        tone = np.sin(2 * np.pi * rng.uniform(100, 3000) * np.arange(n) / sr) * np.hanning(n)
        parts.append(0.3 * tone if rng.random() < 0.7 else 0.003 * rng.standard_normal(n))
    return np.concatenate(parts)[:total].astype(np.float32)


def wav(audio: np.ndarray, sr: int = 16000) -> bytes:
    return encode_audio(audio, sr, "wav")


# -- KServe v2 infer bodies ----------------------------------------------------------------------

BINARY = "Inference-Header-Content-Length"


def infer_body(feeds: dict[str, np.ndarray], params: dict | None = None) -> tuple[bytes, str]:
    """(body, JSON header length) of a binary-extension infer request: a few bytes of JSON, then
    the tensors' raw bytes, however large they are."""
    datatypes = {"int64": "INT64", "float32": "FP32"}
    inputs, blobs = [], []
    for name, x in feeds.items():
        blobs.append(x.tobytes())
        size = {"binary_data_size": len(blobs[-1])}
        inputs.append({"name": name, "datatype": datatypes[str(x.dtype)], "shape": list(x.shape)})
        inputs[-1]["parameters"] = size
    head = json.dumps({"inputs": inputs, "parameters": params or {}}).encode()
    return head + b"".join(blobs), str(len(head))


def infer(client, model: str, feeds: dict[str, np.ndarray], params: dict | None = None):
    """POST a binary-extension infer request with `client` (httpx.Client or TestClient)."""
    body, head_length = infer_body(feeds, params)
    return client.post(f"/v2/models/{model}/infer", content=body, headers={BINARY: head_length})


def ids(batch: int, symbols: int, pace: float = 1.0) -> dict[str, np.ndarray]:
    """FastPitch's inputs: ids (batch, symbols), lengths (batch,), pace (batch,)."""
    return {
        "ids": np.full((batch, symbols), 5, dtype=np.int64),
        "lengths": np.full(batch, symbols, dtype=np.int64),
        "pace": np.full(batch, pace, dtype=np.float32),
    }


def mel(batch: int, frames: int) -> dict[str, np.ndarray]:
    """HiFi-GAN's inputs: mel (batch, 80, frames), mel_lengths (batch,)."""
    return {
        "mel": np.full((batch, 80, frames), -5.0, dtype=np.float32),
        "mel_lengths": np.full(batch, frames, dtype=np.int64),
    }


TEXT = {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["Hi."]}


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


# Bodies for /v2/models/tts/infer that once got a 500; each must be a 400 with a JSON error.
MALFORMED: dict[str, str] = {
    "datatype object": json.dumps({"inputs": [TEXT | {"datatype": {}}]}),
    "datatype list": json.dumps({"inputs": [TEXT | {"datatype": ["FP32"]}]}),
    "100 dimensions": json.dumps({"inputs": [TEXT | {"shape": [1] * 100}]}),
    "output parameters a string": json.dumps(
        {"inputs": [TEXT], "outputs": [{"name": "AUDIO", "parameters": "x"}]}
    ),
    "output parameters a list": json.dumps(
        {"inputs": [TEXT], "outputs": [{"name": "AUDIO", "parameters": [1]}]}
    ),
    "outputs of numbers": json.dumps({"inputs": [TEXT], "outputs": [1]}),
    "input parameters a list": json.dumps({"inputs": [TEXT | {"parameters": [1]}]}),
    "empty, but too large for numpy": json.dumps({"inputs": [TEXT | {"shape": [0, 10**20]}]}),
    "binary, empty, too large": json.dumps(
        {"inputs": [TEXT | {"shape": [0, 2**62, 2**62], "parameters": {"binary_data_size": 0}}]}
    ),
    "binary_data_output a string": json.dumps(
        {"inputs": [TEXT], "parameters": {"binary_data_output": "yes"}}
    ),
    # parses, but is nested deeper than its shape
    "data nested 900 levels": json.dumps({"inputs": [TEXT | {"data": "@"}]}).replace(
        '"@"', _nested(900, '"Hi."')
    ),
    # past the JSON parser's recursion limit
    "data nested 5,000 levels": json.dumps({"inputs": [TEXT | {"data": "@"}]}).replace(
        '"@"', _nested(5000, '"Hi."')
    ),
    "parameters nested 50,000 levels": json.dumps({"inputs": [TEXT], "parameters": "@"}).replace(
        '"@"', '{"a":' * 50_000 + "1" + "}" * 50_000
    ),
}


# -- abandoned requests and the TTS model's metrics ----------------------------------------------

SENTENCE = (
    "The quick brown fox jumps over the lazy dog near the river bank today, while three small "
    "birds sing in the tall green trees and an old man walks slowly along the dusty road towards "
    "the quiet village where his daughter has lived for many long years. "
)
LONG_TEXT = (SENTENCE * 50)[:10_000].strip()
TTS = '{model="tts",version="1"}'


def tts_metrics(url: str) -> dict[str, float]:
    """The TTS model's pending and run pieces, dropped pieces and cancelled requests."""
    m = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    names = ("nv_inference_pending_request_count", "nv_inference_count")
    out = {name: m.get(name + TTS, 0.0) for name in names}
    out["dropped"] = m.get("speechrt_dropped_items_total" + TTS, 0.0)
    out["canceled"] = m.get(
        'nv_inference_request_failure{model="tts",version="1",reason="CANCELED"}', 0.0
    )
    return out


def poll(
    url: str, condition: Callable[[dict[str, float]], bool], what: str, seconds: float = 120
) -> dict[str, float]:
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
