"""Streamed speech on the bundled voice (onnx, as a CPU install runs it): the first audio leaves
while the rest of the response is still being synthesised (in-process, by the order of events),
and through a real server the stream is the whole response's audio in every streamed format."""

from __future__ import annotations

import asyncio
import threading

import httpx
import numpy as np
import pytest

from app_harness import call, run_raw, until
from audio_compare import MAX_LSD_DB, aligned_lsd, decode
from speechrt.audio import codecs
from speechrt.audio.io import read_audio
from speechrt.serving import BatchConfig, ServeConfig

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


def fetch(client: httpx.Client, fmt: str, stream: bool, text: str = THREE) -> bytes:
    """The body of one request."""
    with client.stream("POST", "/v1/audio/speech", json=body(fmt, stream, text)) as r:
        assert r.status_code == 200, r.read()
        return b"".join(r.iter_raw())


def test_the_first_audio_leaves_before_the_rest_is_synthesised():
    """Once the first sentence's lead span is vocoded, the device thread is held until the
    client has the stream's first audio bytes: they arrive while nothing else of the response
    (the rest of sentence one, sentences two and three) has been synthesised. A server that sent
    nothing before the whole response was ready would send nothing while it is held (the test
    then fails at run_raw's hang guard). Then the stream completes."""
    from speechrt.defaults import voice_dirs
    from speechrt.tts import TTS

    tts = TTS(*voice_dirs(None, None), backend="onnx")
    synthesise = tts.ids_to_audio
    release = threading.Event()
    finished: list[int] = []  # batch sizes, as each ids_to_audio call returns

    def ids_to_audio(batch, options, on_head=None):
        def head(heads: list[np.ndarray]) -> None:
            on_head(heads)
            assert release.wait(60), "the test never let the device go on"

        out = synthesise(batch, options, on_head=head if on_head is not None else None)
        finished.append(len(batch))
        return out

    tts.ids_to_audio = ids_to_audio  # type: ignore[method-assign]

    async def run(app, server):
        sent: list[dict] = []
        request = asyncio.create_task(
            call(app, "/v1/audio/speech", body("pcm", True), asyncio.Event(), sent)
        )
        await until(lambda: any(m["type"] == "http.response.body" and m["body"] for m in sent))
        before = list(finished)
        release.set()
        await request
        return before, sent

    before, sent = run_raw(tts, ServeConfig(BatchConfig()), run)
    assert before == []  # the first bytes left while the first batch was still running
    assert sent[0]["status"] == 200 and sent[-1]["type"] == "http.response.body"
    assert not sent[-1].get("more_body", False) and finished  # then the stream completed


@pytest.mark.parametrize("text", [THREE, SSML])
def test_streamed_pcm_is_the_whole_response(url, text):
    with httpx.Client(base_url=url, timeout=120) as client:
        whole = fetch(client, "pcm", False, text)
        with client.stream("POST", "/v1/audio/speech", json=body("pcm", True, text)) as r:
            chunks = [c for c in r.iter_raw() if c]
    assert len(chunks) >= 4  # the head, the rest of sentence one, sentences two and three
    got = np.frombuffer(b"".join(chunks), "<i2").astype(np.int32)
    want = np.frombuffer(whole, "<i2").astype(np.int32)
    assert got.shape == want.shape and np.abs(got - want).max() <= LSB


@pytest.mark.parametrize("fmt", codecs.STREAMED)
def test_every_streamed_format_decodes_to_the_whole_audio(url, fmt):
    with httpx.Client(base_url=url, timeout=120) as client:
        want, sr = read_audio(fetch(client, "wav", False))
        data = fetch(client, fmt, True)
    got = decode(data, fmt, sr)
    if fmt in codecs.LOSSY:
        delay, lsd = aligned_lsd(got, want, sr)
        assert lsd <= MAX_LSD_DB, (delay, lsd)
    else:
        assert got.shape == want.shape
        assert np.abs(np.round(got * 32768) - np.round(want * 32768)).max() <= LSB
