"""The app in-process with stand-in pipelines: overload (503), timeouts (504), a failing batch
that fails only its bad request, and drain on shutdown. No models, no subprocess."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

from speechrt.errors import SpeechRTError
from speechrt.serving import BatchConfig, Limits, ServeConfig, Server, create_app
from speechrt.tts import Piece


class SlowTTS:
    """text_to_pieces / ids_to_audio like speechrt.tts.TTS: one piece per '|'-separated part,
    audio = the ids as samples; "boom" anywhere in a batch raises, as a broken kernel would."""

    sampling_rate = 1000

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.batches: list[int] = []

    def text_to_pieces(self, texts, seeds):
        return [
            Piece(i, j, [ord(c) for c in part], seed)
            for i, (text, seed) in enumerate(zip(texts, seeds, strict=True))
            for j, part in enumerate(text.split("|"))
        ]

    def ids_to_audio(self, batch, options):
        self.batches.append(len(batch))
        time.sleep(self.delay)
        if any(p.ids == [ord(c) for c in "boom"] for p in batch):
            raise RuntimeError("kernel exploded")
        return [np.array(p.ids, dtype=np.float32) / 1000.0 for p in batch]


def run_app(tts, config, body):
    async def main():
        server = Server(tts, None, config)
        app = create_app(server)
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://t")
        async with app.router.lifespan_context(app), client:
            return await body(client, server)

    return asyncio.run(main())


def speak(client, text, **kw):
    body = {"model": "tts", "voice": "0", "input": text, "response_format": "pcm", **kw}
    return client.post("/v1/audio/speech", json=body)


def test_full_queue_is_503_with_retry_after():
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0, max_queue_size=2))

    async def body(client, server):
        first = asyncio.create_task(speak(client, "a"))
        await asyncio.sleep(0.05)  # "a" is on the device; the queue holds two more pieces
        queued = asyncio.create_task(speak(client, "b|c"))
        await asyncio.sleep(0.05)
        refused = await speak(client, "d")
        return refused, await first, await queued

    refused, first, queued = run_app(SlowTTS(0.2), config, body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded"
    assert first.status_code == queued.status_code == 200
    assert np.frombuffer(first.content, "<i2")[0] == round(ord("a") / 1000 * 32767)


def test_slow_request_is_504_and_its_queued_work_is_dropped():
    tts = SlowTTS(0.3)
    config = ServeConfig(
        BatchConfig(max_batch_size=1, max_queue_delay_ms=0), Limits(request_timeout_s=0.1)
    )

    async def body(client, server):
        r = await speak(client, "a|b|c")
        await asyncio.sleep(0.5)
        return r, server.engines["tts"].pending

    r, pending = run_app(tts, config, body)
    assert r.status_code == 504 and "0.1 s" in r.json()["error"]["message"]
    assert pending == 0 and tts.batches == [1]  # b and c never ran


def test_a_failing_batch_fails_only_the_bad_request():
    tts = SlowTTS(0.0)
    config = ServeConfig(BatchConfig(max_batch_size=8, max_queue_delay_ms=50))

    async def body(client, server):
        texts = ["fine", "boom", "also fine"]
        rs = await asyncio.gather(*(speak(client, t) for t in texts))
        after = await speak(client, "still serving")
        metrics = (await client.get("/metrics")).text
        return rs, after, metrics

    (ok1, bad, ok2), after, metrics = run_app(tts, config, body)
    assert ok1.status_code == ok2.status_code == after.status_code == 200
    assert bad.status_code == 500 and "kernel exploded" in bad.json()["error"]["message"]
    assert tts.batches[:4] == [3, 1, 1, 1]  # the batch of three, then each item alone
    assert 'nv_inference_request_failure{model="tts",version="1",reason="BACKEND"} 1' in metrics


def test_shutdown_drains_then_refuses():
    tts = SlowTTS(0.05)
    config = ServeConfig(BatchConfig(max_batch_size=2, max_queue_delay_ms=0))

    async def main():
        server = Server(tts, None, config)
        app = create_app(server)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with app.router.lifespan_context(app):
            tasks = [asyncio.create_task(speak(client, f"x{i}|y{i}")) for i in range(6)]
            await asyncio.sleep(0.02)
            stop = asyncio.create_task(server.stop())  # what the lifespan does on SIGTERM
            done = await asyncio.gather(*tasks)
            await stop
            late = await speak(client, "too late")
            ready = await client.get("/v2/health/ready")
        await client.aclose()
        return done, late, ready

    done, late, ready = asyncio.run(main())
    assert [r.status_code for r in done] == [200] * 6
    assert late.status_code == 503 and ready.status_code == 503


def test_text_limits_count_what_the_model_reads():
    """Pieces and symbols are counted after splitting and encoding, before anything is queued."""
    tts = SlowTTS(delay=0.0)
    limits = Limits(max_text_chars=1000, max_text_symbols=50, max_pieces=4)

    async def body(client, server):
        return [await speak(client, t) for t in ("a|b|c|d|e", "x" * 51, "x" * 25 + "|" + "y" * 25)]

    pieces, symbols, fine = run_app(tts, ServeConfig(limits=limits), body)
    assert pieces.status_code == symbols.status_code == 400
    assert pieces.json()["error"]["message"] == (
        "input text split into 5 sentence pieces; the limit is 4 per request"
    )
    assert "read as 51 symbols after normalisation" in symbols.json()["error"]["message"]
    assert fine.status_code == 200
    assert sum(tts.batches) == 2  # only the accepted request's two pieces ran


def test_nothing_to_serve_is_refused():
    try:
        Server(None, None)
    except SpeechRTError as e:
        assert "nothing to serve" in str(e)
    else:
        raise AssertionError("Server() without pipelines must fail")


def test_serve_cli_refuses_bad_setups(capsys, tmp_path, monkeypatch):
    import speechrt.defaults
    from speechrt.cli import main

    monkeypatch.setattr(speechrt.defaults, "DEFAULTS", tmp_path / "none")  # nothing bundled
    assert main(["serve"]) == 2
    assert "none bundled" in capsys.readouterr().err
    assert main(["serve", "--acoustic", str(tmp_path)]) == 2
    assert "--vocoder" in capsys.readouterr().err
    assert main(["serve", "--asr", str(tmp_path / "missing")]) == 2
    assert "not a model directory" in capsys.readouterr().err
    assert main(["serve", "--asr", str(tmp_path), "--max-batch-size", "0"]) == 2
    assert "batch size" in capsys.readouterr().err
