"""A long recording takes turns with the requests behind it: the app in-process with the bundled
recogniser (onnx), each batch the device runs recorded. Every window of a recording is a batch
item of its own, so a short request that arrives while a long one is on the device runs in the
next batch, not after all of the long one's windows (once, 600 s of audio was one item that held
the device ~8 s on a 2-core CPU)."""

from __future__ import annotations

import asyncio
import io
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model
from speechrt.serving import BatchConfig, ServeConfig, Server, create_app

needs_models = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
SR = 16000
LONG_S = 200  # 13 windows of 20 s (4 s overlap): more than three batches of 4


def wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, SR, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def transcribe(client: httpx.AsyncClient, data: bytes) -> httpx.Response:
    files = {"file": ("a.wav", data)}
    return client.post("/v1/audio/transcriptions", data={"model": "whisper-1"}, files=files)


@needs_models
def test_a_short_transcription_runs_before_the_rest_of_a_long_one():
    from speechrt.asr import ASR
    from speechrt.bench.inputs import synthetic_speechlike
    from speechrt.tts import TTS

    asr = ASR(backend="onnx", vad=False)  # fixed windows: 20 s each, whatever the audio holds
    tts = TTS()
    (speech,) = tts.synthesize(["The cat sat on the mat."])
    short = asr.from_rate(speech, tts.sampling_rate)
    long = synthetic_speechlike(LONG_S, SR)
    alone = asr.transcribe([asr.load_audio(wav(short))])[0].text
    config = ServeConfig(BatchConfig(max_batch_size=4, max_queue_delay_ms=0), components=False)
    gate, entered = threading.Event(), threading.Event()
    batches: list[list[int]] = []  # per batch the device ran: its windows' samples

    async def main() -> tuple[httpx.Response, httpx.Response]:
        server = Server(None, asr, config)
        app = create_app(server)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with app.router.lifespan_context(app), client:
            engine = server.engines["asr"]
            run = engine.adapter.run_batch

            def recorded(items):  # on the device thread
                batches.append([seg.samples for seg in items])
                if not entered.is_set():  # the long one's first batch waits for the short one
                    entered.set()
                    assert gate.wait(60), "the test never opened the gate"
                return run(items)

            engine.adapter.run_batch = recorded
            first = asyncio.create_task(transcribe(client, wav(long)))
            assert await asyncio.to_thread(entered.wait, 60), "the long one never started"
            queued = engine.pending  # all of the long one's windows, none finished
            second = asyncio.create_task(transcribe(client, wav(short)))
            while engine.pending == queued:  # until the short one's window is queued
                await asyncio.sleep(0.001)
            gate.set()
            return await asyncio.wait_for(asyncio.gather(first, second), 120)

    long_r, short_r = asyncio.run(main())
    assert long_r.status_code == short_r.status_code == 200, (long_r.text, short_r.text)
    assert short_r.json()["text"] == alone  # a window's text does not depend on its batch-mates
    window = int(asr.window * SR)
    assert [len(b) for b in batches] == [4, 4, 4, 2]
    assert batches[0] == [window] * 4
    assert short.size in batches[1]  # the next batch: before 6 of the long one's 13 windows
    assert sum(n == window for b in batches[1:] for n in b) == 13 - 4
