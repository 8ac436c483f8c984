"""Streamed speech through a real server on the bundled voice (onnx, as a CPU install runs it):
the first audio leaves long before a whole response would, and the stream is the whole
response's audio in every streamed format."""

from __future__ import annotations

import statistics
import time

import httpx
import numpy as np
import pytest

import test_serving_formats as formats
from speechrt.audio import codecs

THREE = (
    "Streaming sends the first audio as soon as it exists. "
    "A second sentence follows it, a little longer than the first one was. "
    "And the third sentence closes the request."
)
# silences before, between and after the sentences: the first one goes out with the head
SSML = f'<speak><break time="300ms"/>{THREE} <break time="1s"/>Done.<break time="50ms"/></speak>'
LSB = 2  # the stream's first piece is vocoded in two spans: equal within float rounding


@pytest.fixture(scope="module")
def url(start_server) -> str:
    """Batches unbounded (--max-batch-ms 0): a whole request's three sentences share one batch,
    so without a lead piece a stream's first byte would come when all three are done."""
    from speechrt.defaults import voice_dirs

    acoustic, vocoder = voice_dirs(None, None)
    url, _ = start_server(
        *("--acoustic", str(acoustic), "--vocoder", str(vocoder)),
        *("--backend", "onnx", "--no-components", "--max-batch-ms", "0"),
    )
    return url


def body(fmt: str, stream: bool, text: str = THREE) -> dict[str, str]:
    extra = {"stream_format": "audio"} if stream else {}
    return {"model": "tts", "voice": "alloy", "input": text, "response_format": fmt, **extra}


def fetch(
    client: httpx.Client, fmt: str, stream: bool, text: str = THREE
) -> tuple[float, float, bytes]:
    """(seconds to the first body byte, to the last, the body) of one request."""
    t0 = time.perf_counter()
    first, chunks = None, []
    with client.stream("POST", "/v1/audio/speech", json=body(fmt, stream, text)) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - t0
            chunks.append(chunk)
    last = time.perf_counter() - t0
    return first or last, last, b"".join(chunks)


def test_the_first_byte_comes_before_half_the_whole_request(url):
    """The one wall-clock claim (the spec asks for it): medians of 3, measured side by side.
    Measured on 2 shared cores: first byte ~0.08 s, whole request ~0.5 s."""
    with httpx.Client(base_url=url, timeout=120) as client:
        fetch(client, "pcm", False)  # warm up
        fetch(client, "pcm", True)
        whole, first = [], []
        for _ in range(3):
            whole.append(fetch(client, "pcm", False)[1])
            first.append(fetch(client, "pcm", True)[0])
    assert statistics.median(first) < 0.5 * statistics.median(whole), (first, whole)


@pytest.mark.parametrize("text", [THREE, SSML])
def test_streamed_pcm_is_the_whole_response(url, text):
    with httpx.Client(base_url=url, timeout=120) as client:
        whole = fetch(client, "pcm", False, text)[2]
        with client.stream("POST", "/v1/audio/speech", json=body("pcm", True, text)) as r:
            chunks = [c for c in r.iter_raw() if c]
    assert len(chunks) >= 4  # the head, the rest of sentence one, sentences two and three
    got = np.frombuffer(b"".join(chunks), "<i2").astype(np.int32)
    want = np.frombuffer(whole, "<i2").astype(np.int32)
    assert got.shape == want.shape and np.abs(got - want).max() <= LSB


@pytest.mark.parametrize("fmt", codecs.STREAMED)
def test_every_streamed_format_decodes_to_the_whole_audio(url, fmt):
    with httpx.Client(base_url=url, timeout=120) as client:
        want, sr = formats.read_audio(fetch(client, "wav", False)[2])
        data = fetch(client, fmt, True)[2]
    got = formats.decode(data, fmt, sr)
    if fmt in codecs.LOSSY:
        delay, lsd = formats.aligned_lsd(got, want, sr)
        assert lsd <= formats.MAX_LSD_DB, (delay, lsd)
    else:
        assert got.shape == want.shape
        assert np.abs(np.round(got * 32768) - np.round(want * 32768)).max() <= LSB
