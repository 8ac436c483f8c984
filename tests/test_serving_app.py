"""The app in-process with stand-in pipelines: overload (503), timeouts (504), a failing batch
that fails only its bad request, clients that go away, and shutdown. No models, no subprocess."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np
import pytest

from app_harness import SlowTTS, call, run_app, run_raw, speak, until
from speechrt.errors import SpeechRTError
from speechrt.serving import BatchConfig, Limits, ServeConfig, Server, create_app


def test_full_queue_is_503_with_retry_after():
    gate = threading.Event()
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0, max_queue_size=2))
    tts = SlowTTS(gate=gate)

    async def body(client, server):
        first = asyncio.create_task(speak(client, "a"))
        await tts.wait_entered()  # "a" holds the device
        queued = asyncio.create_task(speak(client, "b|c"))
        await until(lambda: server.engines["tts"].pending == 3)  # b and c queued
        refused = await speak(client, "d")
        gate.set()
        return refused, await first, await queued

    refused, first, queued = run_app(tts, config, body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded"
    assert first.status_code == queued.status_code == 200
    assert np.frombuffer(first.content, "<i2")[0] == round(ord("a") / 1000 * 32767)


def test_slow_request_is_504_and_its_queued_work_is_dropped():
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(
        BatchConfig(max_batch_size=1, max_queue_delay_ms=0), Limits(request_timeout_s=0.1)
    )

    async def body(client, server):
        r = await speak(client, "a|b|c")  # "a" holds the device past the deadline
        gate.set()
        engine = server.engines["tts"]
        await until(lambda: engine.pending == 0 and engine.dropped == 2)  # b, c dropped
        return r, (await client.get("/metrics")).text

    r, metrics = run_app(tts, config, body)
    assert r.status_code == 504 and "0.1 s" in r.json()["error"]["message"]
    assert tts.batches == [1]  # b and c never ran
    assert 'speechrt_dropped_items_total{model="tts",version="1"} 2' in metrics


# -- clients that go away, servers that give up --------------------------------------------------


SPEECH = {"model": "tts", "voice": "0", "input": "a|b|c|d", "response_format": "pcm"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_has_its_queued_pieces_dropped(stream):
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0))
    payload = {**SPEECH, **({"stream_format": "audio"} if stream else {})}

    async def body(app, server):
        hang_up = asyncio.Event()
        request = asyncio.create_task(call(app, "/v1/audio/speech", payload, hang_up))
        await tts.wait_entered()  # "a" holds the device; b, c, d are queued
        hang_up.set()
        sent = await request  # ends without raising, though its handler was cancelled
        gate.set()
        engine = server.engines["tts"]
        await until(lambda: engine.pending == 0)  # the device is free
        return sent, engine.dropped, server.metrics.render()

    sent, dropped, metrics = run_raw(tts, config, body)
    assert dropped == 3 and tts.batches == [1]  # b, c and d never ran
    assert not any(m["type"] == "http.response.body" and m.get("body") for m in sent)
    assert 'nv_inference_request_failure{model="tts",version="1",reason="CANCELED"} 1' in metrics


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/v2/models/tts/infer"])
def test_a_request_the_server_cancels_gets_a_json_503(path):
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(BatchConfig(max_batch_size=1, max_queue_delay_ms=0), components=False)
    v2 = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a|b"]}]}
    payload = SPEECH if path.startswith("/v1") else v2

    async def body(app, server):
        request = asyncio.create_task(call(app, path, payload, asyncio.Event()))
        await tts.wait_entered()
        request.cancel()  # what uvicorn does once --graceful-timeout has passed
        sent = await request
        gate.set()
        return sent

    start, content = run_raw(tts, config, body)
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"1"
    error = json.loads(content["body"])["error"]
    assert "shutting down" in (error if path.startswith("/v2") else error["message"])


def test_a_failing_batch_fails_only_the_bad_request():
    tts = SlowTTS()
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
    gate = threading.Event()
    tts = SlowTTS(gate=gate)
    config = ServeConfig(BatchConfig(max_batch_size=2, max_queue_delay_ms=0))

    async def main():
        server = Server(tts, None, config)
        app = create_app(server)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        async with app.router.lifespan_context(app):
            tasks = [asyncio.create_task(speak(client, f"x{i}|y{i}")) for i in range(6)]
            await until(lambda: server.engines["tts"].pending == 12)  # the first two held
            stop = asyncio.create_task(server.stop())  # what the lifespan does on SIGTERM
            await until(lambda: not server.ready)
            gate.set()
            done = await asyncio.gather(*tasks)
            await stop
            late = await speak(client, "too late")
            ready = await client.get("/v2/health/ready")
        await client.aclose()
        return done, late, ready

    done, late, ready = asyncio.run(asyncio.wait_for(main(), 60))  # a hang guard
    assert [r.status_code for r in done] == [200] * 6
    assert late.status_code == 503 and ready.status_code == 503


def test_warm_up_runs_every_batch_size_before_ready(caplog):
    """--warmup: each batch bucket up to --max-batch-size (and a stream's lead) runs once on
    the first piece of each text before the server is ready, as no request has to wait; each
    step is logged as it ends."""
    caplog.set_level("INFO", logger="speechrt.serving")
    tts = SlowTTS()
    config = ServeConfig(
        BatchConfig(max_batch_size=6, max_queue_delay_ms=0), warmup=("warm|up", "longer text")
    )

    async def body(client, server):
        before = list(tts.batches)
        r = await speak(client, "hi")
        return before, server.ready, r.status_code

    before, ready, status = run_app(tts, config, body)
    assert before == [1, 2, 4, 6, 1] * 2 and ready and status == 200
    assert tts.batches == [*before, 1]
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up ")]
    assert len(steps) == 10 and steps[0].startswith("warm-up 1/10: tts text 1, batch 1 (")
    assert steps[-1].startswith("warm-up 10/10: tts text 2, a stream's lead (")


def test_start_up_objects_are_frozen_while_serving():
    """What start-up built is out of the cyclic collector's sight while the server runs (a full
    collection then scans only what requests allocate), and back in it once the server stops."""
    import gc

    async def body(client, server):
        r = await speak(client, "hi")
        return gc.get_freeze_count(), r.status_code

    frozen, status = run_app(SlowTTS(), ServeConfig(), body)
    assert frozen > 0 and status == 200
    assert gc.get_freeze_count() == 0


def test_warmup_flag_gives_the_texts(capsys) -> None:
    from speechrt.bench.inputs import TTS_TEXT
    from speechrt.cli.serve import warmup_texts

    assert warmup_texts(None) is None and warmup_texts([]) == (TTS_TEXT,)
    assert warmup_texts(["a b", "c"]) == ("a b", "c")
    with pytest.raises(SpeechRTError, match="empty"):
        warmup_texts(["ok", " "])


def test_text_limits_count_what_the_model_reads():
    """Pieces and symbols are counted after splitting and encoding, before anything is queued."""
    tts = SlowTTS()
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


def test_serve_pipelines_batches_unless_told_not_to(tiny_voice):
    """`speechrt serve` pipelines speech batches by default; --no-pipeline-batches stops it."""
    from speechrt.cli import build_parser
    from speechrt.cli.serve import serve_config

    voice = ["--acoustic", str(tiny_voice[0]), "--vocoder", str(tiny_voice[1])]
    parse = build_parser().parse_args
    assert serve_config(parse(["serve", *voice])).batch.pipeline
    assert not serve_config(parse(["serve", *voice, "--no-pipeline-batches"])).batch.pipeline


def test_switch_interval_is_one_ms_unless_told(capsys):
    """`speechrt serve` hands the interpreter on after 1 ms by default (--switch-interval-ms);
    a value out of (0, 1000] is one line and exit 2, before any model loads."""
    from speechrt.cli import build_parser, main
    from speechrt.cli.serve import switch_interval

    parse = build_parser().parse_args
    assert switch_interval(parse(["serve"])) == 0.001
    assert switch_interval(parse(["serve", "--switch-interval-ms", "5"])) == 0.005
    for bad in ("0", "-1", "nan", "2000"):
        assert main(["serve", "--switch-interval-ms", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--switch-interval-ms must be in (0, 1000]" in err


def test_pipelined_batches_give_the_same_speech(tiny_voice):
    """Pipelined batches (BatchConfig.pipeline, the default): the tiny voice says the same
    with and without, within one int16 step (batches may group differently, and batched audio
    may differ by a step from the same piece batched otherwise)."""
    from speechrt.tts import TTS

    tts = TTS(*tiny_voice, device="cpu")
    texts = ["Hello world.", "A longer sentence, with a comma. And a second one!", "Hi."]

    def speech(pipeline: bool) -> list[np.ndarray]:
        config = ServeConfig(
            BatchConfig(max_batch_size=4, max_queue_delay_ms=20, pipeline=pipeline)
        )

        async def body(client, server):
            rs = await asyncio.gather(*(speak(client, t) for t in texts))
            assert [r.status_code for r in rs] == [200] * len(texts)
            return [np.frombuffer(r.content, dtype="<i2").astype(np.int32) for r in rs]

        return run_app(tts, config, body)

    for a, b in zip(speech(False), speech(True), strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1
