"""Parakeet on every ASR route of a real `speechrt serve`, with tiny random models: the openai
client's transcriptions (json, verbose_json with words, text, srt, vtt, stream=true) and its
realtime WebSocket session, KServe v2 `asr` and the component models, on a TDT transducer
(eager) and on a hybrid's CTC head (`--decoder ctc`, onnx). In-process: component names, the
decoding state's batch axis, bad token ids, and decoding in the decode pool's processes."""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from parakeet_models import sound
from speechrt.asr import ASR
from speechrt.serving.v2metadata import component_names

RATE = 24000  # the realtime session's pcm16
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def wav(audio: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def serve(start_server, model: str, backend: str, *extra: str) -> str:
    from speechrt.device import batch_invariance_holds

    torch_only = ["--threads", "1"] if backend == "eager" else []
    if backend == "eager" and batch_invariance_holds():
        torch_only.append("--batch-invariant")
    url, _ = start_server(
        *("--asr", model, "--device", "cpu", "--backend", backend, *torch_only),
        *("--max-audio-seconds", "30", *extra),
    )
    return url


@pytest.fixture(scope="module")
def tdt(start_server, tiny_parakeet) -> str:
    """A server of the hybrid decoding with its TDT head, on eager."""
    return serve(start_server, str(tiny_parakeet["tdt_ctc"]), "eager")


@pytest.fixture(scope="module")
def ctc(start_server, onnx_parakeet) -> str:
    """A server of the hybrid decoding with its CTC head, on onnx."""
    return serve(start_server, str(onnx_parakeet), "onnx", "--decoder", "ctc")


@pytest.fixture(scope="module")
def local(tiny_parakeet, onnx_parakeet) -> dict[str, ASR]:
    """The recognisers each server holds, in-process."""
    return {
        "tdt": ASR(tiny_parakeet["tdt_ctc"], backend="eager"),
        "ctc": ASR(onnx_parakeet, backend="onnx", decoder="ctc"),
    }


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("which", ["tdt", "ctc"])
def test_openai_transcriptions_json_and_verbose_json(request, local, which: str) -> None:
    url = request.getfixturevalue(which)
    data = wav(sound(2.5, seed=7))
    asr = local[which]
    (want,) = asr.transcribe([asr.load_audio(data)])
    assert len(want.words) >= 5
    oai = client(url)
    assert oai.audio.transcriptions.create(model="whisper-1", file=("a.wav", data)).text == (
        want.text
    )
    verbose = oai.audio.transcriptions.create(
        model="whisper-1",
        file=("a.wav", data),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert verbose.text == want.text and verbose.duration == pytest.approx(2.5, abs=1e-3)
    assert [(w.word, w.start, w.end) for w in verbose.words] == [
        (w.word, round(w.start, 3), round(w.end, 3)) for w in want.words
    ]
    assert all(0 <= w.start <= w.end <= 2.5 for w in verbose.words)


def test_text_srt_vtt_and_the_ctc_head(tdt: str, ctc: str, local) -> None:
    """The other formats; and `--decoder ctc` serves the hybrid's CTC head, whose text is
    not the transducer's."""
    data = wav(sound(2.5, seed=7))
    oai = client(tdt)
    text = oai.audio.transcriptions.create(
        model="asr", file=("a.wav", data), response_format="text"
    )
    assert text.strip() == local["tdt"].transcribe([local["tdt"].load_audio(data)])[0].text
    srt = oai.audio.transcriptions.create(model="asr", file=("a.wav", data), response_format="srt")
    assert srt.startswith("1\n00:00:00,") and " --> " in srt
    vtt = oai.audio.transcriptions.create(model="asr", file=("a.wav", data), response_format="vtt")
    assert vtt.startswith("WEBVTT")
    other = client(ctc).audio.transcriptions.create(model="asr", file=("a.wav", data)).text
    assert other and other != text.strip()


def test_stream_true_gives_deltas_then_the_offline_text(tdt: str) -> None:
    data = wav(sound(3.0, seed=8))
    oai = client(tdt)
    offline = oai.audio.transcriptions.create(model="whisper-1", file=("a.wav", data)).text
    events = list(
        oai.audio.transcriptions.create(model="whisper-1", file=("a.wav", data), stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and events[-1].text == offline
    assert set(kinds[:-1]) == {"transcript.text.delta"} and len(kinds) >= 3


def test_realtime_session_gives_partials_then_the_offline_text(tdt: str) -> None:
    """pcm16 at 24 kHz appended 100 ms at a time: deltas while it comes in (the chunked
    streaming path), then the completed transcript, the offline text of the same samples."""
    from speechrt.audio.io import resample, to_int16

    pcm = to_int16(resample(sound(3.0, seed=9), 16000, RATE))
    offline = client(tdt).audio.transcriptions.create(model="asr", file=("a.wav", wav(pcm, RATE)))

    async def session() -> list:
        oai = openai.AsyncOpenAI(base_url=f"{tdt}/v1", api_key="unused", max_retries=0)
        events = []
        query = {"intent": "transcription"}
        async with oai.realtime.connect(model="whisper-1", extra_query=query) as conn:
            audio_in = {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}
            await conn.session.update(
                session={"type": "transcription", "audio": {"input": audio_in}}
            )
            data = pcm.tobytes()
            step = RATE // 10 * 2
            for start in range(0, len(data), step):
                chunk = base64.b64encode(data[start : start + step]).decode()
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.commit()
            async for event in conn:
                events.append(event)
                if event.type == COMPLETED:
                    break
        return events

    events = asyncio.run(session())
    kinds = [e.type for e in events]
    committed = kinds.index("input_audio_buffer.committed")
    assert kinds.count(DELTA) >= 2 and kinds.index(DELTA) < committed
    assert events[-1].transcript == offline.text


def test_concurrent_transcriptions_batch_and_match_alone(tdt: str) -> None:
    """Requests of 1 to 2.75 s at once share batches (padded to the longest), and each gets
    the words it gets alone: the transducer decodes each item from its own frames."""
    from speechrt.client import parse_metrics

    files = [wav(sound(1.0 + 0.25 * i, seed=30 + i)) for i in range(8)]
    form = {"model": "asr", "response_format": "verbose_json", "timestamp_granularities[]": "word"}

    async def transcribe(data: list[bytes]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=tdt, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v1/audio/transcriptions", data=form, files={"file": d}) for d in data)
            )

    before = parse_metrics(httpx.get(f"{tdt}/metrics").text)
    together = asyncio.run(transcribe(files))
    after = parse_metrics(httpx.get(f"{tdt}/metrics").text)
    key = 'speechrt_batch_size_count{model="asr",version="1"}'
    assert after[key] - before[key] < len(files)  # some batches held several
    for data, r in zip(files, together, strict=True):
        assert r.status_code == 200 and r.json()["words"]
        assert r.content == asyncio.run(transcribe([data]))[0].content


@pytest.mark.parametrize(
    ("which", "platform"), [("tdt", "pytorch_libtorch"), ("ctc", "onnxruntime_onnx")]
)
def test_v2_serves_asr_and_the_component_graphs(request, local, which: str, platform: str):
    """The repository index lists the pipeline and the three graphs; `asr` transcribes as the
    openai route does; a two-item predict step runs on the backend's runner (onnxruntime
    sessions on onnx) as the pipeline's own runner does."""
    url = request.getfixturevalue(which)
    index = httpx.post(f"{url}/v2/repository/index", json={}).json()
    names = {m["name"] for m in index}
    graphs = ["parakeet_transducer", "parakeet_transducer.predict", "parakeet_transducer.joint"]
    assert {"asr", *graphs} <= names
    for name in graphs:
        assert httpx.get(f"{url}/v2/models/{name}").json()["platform"] == platform
    audio = sound(2.0, seed=3)
    body = {"inputs": [{"name": "AUDIO", "datatype": "FP32", "shape": [1, audio.size],
                        "data": audio.tolist()}]}  # fmt: skip
    r = httpx.post(f"{url}/v2/models/asr/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [local[which].transcribe([audio])[0].text]
    rng = np.random.default_rng(0)
    state = (0.5 * rng.standard_normal((1, 2, 16))).astype(np.float32)  # (layers, B, hidden)
    feeds = {"tokens": np.array([3, 40]), "h": state, "c": -state}
    body = {"inputs": [{"name": k, "datatype": "INT64" if v.dtype == np.int64 else "FP32",
                        "shape": list(v.shape), "data": v.ravel().tolist()}
                       for k, v in feeds.items()]}  # fmt: skip
    r = httpx.post(f"{url}/v2/models/parakeet_transducer.predict/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    got = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    asr = local[which]
    if asr.steps is None:  # the CTC head decodes: the transducer's steps on the same backend
        asr = ASR(asr.model_dir, backend=asr.backend)
    g, h, c = asr.steps.predict(feeds["tokens"], feeds["h"], feeds["c"])
    assert got["h_next"].shape == (1, 2, 16)
    for name, want in (("joint_predicted", g), ("h_next", h), ("c_next", c)):
        assert np.abs(got[name] - want).max() < 1e-5, name


# -- in-process ----------------------------------------------------------------------------------


def test_component_names_of_both_kinds() -> None:
    assert component_names("parakeet_ctc") == {"parakeet_ctc": "parakeet"}
    assert component_names("parakeet_transducer") == {
        "parakeet_transducer": "parakeet",
        "parakeet_transducer.predict": "parakeet.predict",
        "parakeet_transducer.joint": "parakeet.joint",
    }


def test_predict_requests_batch_along_the_state_batch_axis(local) -> None:
    """Requests of 1 and 2 items join along h's and c's second axis (layers, batch, hidden)
    and each gets back what it gets alone; a token id past the blank is a 400."""
    from speechrt.serving import Server, create_app
    from speechrt.serving.v2models import ComponentAdapter

    asr = local["tdt"]
    adapter = ComponentAdapter(asr.runners()["parakeet.predict"])
    rng = np.random.default_rng(1)

    def item(n: int) -> dict[str, np.ndarray]:
        h = rng.standard_normal((1, n, 16)).astype(np.float32)
        return {"tokens": rng.integers(0, 41, n), "h": h, "c": h[::-1].copy()}

    one, two = item(1), item(2)
    assert adapter.key(one) == adapter.key(two)
    together = adapter.run_batch([one, two])
    for feeds, out in zip((one, two), together, strict=True):
        (alone,) = adapter.run_batch([feeds])
        assert out["h_next"].shape == feeds["h"].shape
        for name in out:
            assert np.abs(out[name] - alone[name]).max() < 1e-6
    with TestClient(create_app(Server(None, asr))) as web:
        bad = {"inputs": [{"name": "tokens", "datatype": "INT64", "shape": [1], "data": [41]},
                          {"name": "h", "datatype": "FP32", "shape": [1, 1, 16], "data": [0] * 16},
                          {"name": "c", "datatype": "FP32", "shape": [1, 1, 16],
                           "data": [0] * 16}]}  # fmt: skip
        r = web.post("/v2/models/parakeet_transducer.predict/infer", json=bad)
        assert r.status_code == 400 and "tokens" in r.json()["error"]
        assert web.get("/v2/models/parakeet_ctc").status_code == 404


def test_pool_decodes_a_transducer_as_the_recogniser(local) -> None:
    """A transducer's windows carry their tokens (no log-probs) to the decode pool's spawned
    processes, which give the recogniser's transcripts."""
    from speechrt.asr.decoding import DecodePool

    asr = local["tdt"]
    audio = [sound(2.0, seed=5), sound(1.5, seed=6)]
    heard = asr.hear(audio)
    assert all(s.tokens and s.log_probs is None for h in heard for s in h.segments)
    want = [asr.finish(h) for h in heard]
    pool = DecodePool(asr.decoding, 1)
    try:
        got = [f.result(timeout=60) for f in [pool.submit(h) for h in heard]]
    finally:
        pool.close()
    assert [(t.text, t.words) for t in got] == [(t.text, t.words) for t in want]
