"""End to end: a real `speechrt serve` process with tiny models, driven by httpx, the official
openai client and tritonclient.http (JSON and binary tensors)."""

from __future__ import annotations

import asyncio
import io
import struct

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch
import tritonclient.http as triton

from serving_inputs import ONE, speechlike, wav
from speechrt.asr import ASR
from speechrt.audio.io import encode_audio, to_int16
from speechrt.client import parse_metrics
from speechrt.device import batch_invariance_holds
from speechrt.options import SynthesisOptions
from speechrt.tts import TTS

THREE = "The first sentence is here. Then a second, longer one follows it! Is this the third?"
LSB = 2  # server vs in-process pipeline: the same samples within 2 int16 steps


@pytest.fixture(autouse=True)
def _as_the_server_runs():
    """The server runs in batch-invariant mode (oneDNN off), so the local references do too."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    yield
    torch.backends.mkldnn.enabled = before


@pytest.fixture(scope="module")
def local_tts(tiny_voice) -> TTS:
    return TTS(*tiny_voice, device="cpu")


@pytest.fixture(scope="module")
def local_asr(tiny_asr) -> ASR:
    return ASR(tiny_asr, device="cpu")


@pytest.fixture(scope="module")
def oai(speech_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{speech_server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def trt(speech_server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(speech_server.removeprefix("http://"))


def pcm_of(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="int16")[0]


def assert_close_pcm(a: np.ndarray, b: np.ndarray, lsb: int = LSB) -> None:
    assert a.shape == b.shape
    assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max(initial=0) <= lsb


def speech(url: str, text: str, **kw) -> httpx.Response:
    body = {"model": "tts-1", "voice": "alloy", "input": text, **kw}
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=60)


# -- health, metadata ----------------------------------------------------------------------------


def test_health_metadata_and_model_lists(speech_server, oai, trt):
    assert httpx.get(f"{speech_server}/v2/health/live").status_code == 200
    assert trt.is_server_live() and trt.is_server_ready()
    assert trt.get_server_metadata()["name"] == "speechrt"
    ids = {m.id for m in oai.models.list()}
    assert {"tts", "tts-1", "asr", "whisper-1"} <= ids
    meta = trt.get_model_metadata("fastpitch")
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]][:2] == [
        ("ids", "INT64"),
        ("lengths", "INT64"),
    ]
    assert meta["outputs"][0] == {"name": "mel", "datatype": "FP32", "shape": [-1, 80, -1]}
    config = trt.get_model_config("fastpitch")
    assert [t["optional"] for t in config["input"]] == [False, False, True, True, True]
    for name in ("tts", "asr", "fastpitch", "hifigan", "quartznet"):
        assert trt.is_model_ready(name)
    assert trt.get_model_config("tts")["max_batch_size"] == 8
    assert trt.get_model_metadata("asr")["inputs"][0]["name"] == "AUDIO"


# -- OpenAI API ----------------------------------------------------------------------------------


def test_openai_speech_matches_the_local_pipeline(oai, local_tts):
    """One piece, the same batch of one: bitwise where the server runs batch-invariant as this
    process does (oneDNN off); else the server runs oneDNN's convolutions, within LSB steps."""
    (audio,) = local_tts.synthesize([ONE], SynthesisOptions(), seeds=[0])
    sr, want = local_tts.sampling_rate, to_int16(audio)
    lsb = 0 if batch_invariance_holds() else LSB
    got = oai.audio.speech.create(model="tts-1", voice="alloy", input=ONE, response_format="wav")
    assert sf.info(io.BytesIO(got.content)).samplerate == sr
    assert_close_pcm(pcm_of(got.content), want, lsb)
    if lsb == 0:
        assert got.content == encode_audio(audio, sr, "wav")
    pcm = oai.audio.speech.create(model="tts", voice="0", input=ONE, response_format="pcm")
    assert_close_pcm(np.frombuffer(pcm.content, dtype="<i2"), want, lsb)
    flac = oai.audio.speech.create(model="tts", voice="0", input=ONE, response_format="flac")
    assert_close_pcm(pcm_of(flac.content), want, lsb)
    fast = oai.audio.speech.create(
        model="tts", voice="0", input=ONE, speed=2.0, response_format="wav"
    )
    assert abs(len(pcm_of(fast.content)) - len(audio) / 2) < 0.1 * len(audio)


def test_same_request_same_bytes_and_several_sentences(speech_server, local_tts):
    first = speech(speech_server, THREE, response_format="wav")
    assert first.status_code == 200 and first.headers["content-type"] == "audio/wav"
    assert speech(speech_server, THREE, response_format="wav").content == first.content
    (audio,) = local_tts.synthesize([THREE], SynthesisOptions(), seeds=[0])
    assert_close_pcm(pcm_of(first.content), to_int16(audio))
    assert int(first.headers["x-sample-rate"]) == local_tts.sampling_rate


def test_streaming_sends_the_same_audio_sentence_by_sentence(speech_server, oai):
    """Streamed pcm and wav carry the whole response's samples: bitwise where this CPU's kernels
    are batch-invariant (the server runs --batch-invariant), else within LSB int16 steps (the
    stream vocodes the first sentence in two spans, which such a CPU rounds otherwise)."""
    lsb = 0 if batch_invariance_holds() else LSB
    whole_wav = speech(speech_server, THREE, response_format="wav").content
    whole = np.frombuffer(speech(speech_server, THREE, response_format="pcm").content, "<i2")
    body = {"model": "tts", "voice": "0", "input": THREE, "stream_format": "audio"}
    with httpx.stream(
        "POST", f"{speech_server}/v1/audio/speech", json={**body, "response_format": "pcm"}
    ) as r:
        assert r.status_code == 200
        chunks = list(r.iter_raw())
    assert_close_pcm(np.frombuffer(b"".join(chunks), "<i2"), whole, lsb)
    with oai.audio.speech.with_streaming_response.create(
        model="tts", voice="0", input=THREE, response_format="wav", stream_format="audio"
    ) as r:
        data = r.read()
    sr = sf.info(io.BytesIO(whole_wav)).samplerate
    unknown = b"\xff" * 4  # the RIFF and data lengths are unknown when streaming
    assert data[:12] == b"RIFF" + unknown + b"WAVE"
    assert data[12:36] == b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sr, 2 * sr, 2, 16)
    assert data[36:44] == b"data" + unknown
    assert_close_pcm(np.frombuffer(data[44:], "<i2"), pcm_of(whole_wav), lsb)


def test_openai_transcriptions_in_every_format(oai, local_asr):
    audio = speechlike(2.0, 1)
    data = wav(audio)
    want = local_asr.transcribe([local_asr.load_audio(data)])[0]
    got = oai.audio.transcriptions.create(model="whisper-1", file=("a.wav", data))
    assert got.text == want.text
    verbose = oai.audio.transcriptions.create(
        model="whisper-1",
        file=("a.wav", data),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.text == want.text and verbose.duration == pytest.approx(2.0, abs=1e-3)
    assert [w.word for w in verbose.words] == [w.word for w in want.words]
    assert " ".join(s.text for s in verbose.segments) == want.text
    text = oai.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", data), response_format="text"
    )
    assert text == want.text
    srt = oai.audio.transcriptions.create(model="asr", file=("a.wav", data), response_format="srt")
    assert srt.startswith("1\n00:00:") and " --> " in srt
    vtt = oai.audio.transcriptions.create(model="asr", file=("a.wav", data), response_format="vtt")
    assert vtt.startswith("WEBVTT")
    # another rate and FLAC: decoded and resampled by the server
    flac = encode_audio(audio[::2].copy(), 8000, "flac")
    assert oai.audio.transcriptions.create(model="asr", file=("a.flac", flac)).text


# -- KServe v2 / Triton --------------------------------------------------------------------------


def _infer(trt, model, inputs, outputs, binary):
    tensors = []
    for name, datatype, arr in inputs:
        t = triton.InferInput(name, list(arr.shape), datatype)
        t.set_data_from_numpy(arr, binary_data=binary)
        tensors.append(t)
    wanted = [triton.InferRequestedOutput(n, binary_data=binary) for n in outputs]
    result = trt.infer(model, tensors, outputs=wanted)
    return [result.as_numpy(n) for n in outputs]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_triton_tts_and_asr_pipelines(trt, local_tts, local_asr, binary):
    texts = np.array([ONE.encode(), b"Good bye."], dtype=object)
    audio, lengths = _infer(
        trt, "tts", [("TEXT", "BYTES", texts)], ["AUDIO", "AUDIO_LENGTHS"], binary
    )
    want = local_tts.synthesize([ONE, "Good bye."], SynthesisOptions(), seeds=[0, 1])
    assert audio.dtype == np.float32 and list(lengths) == [len(w) for w in want]
    for row, n, w in zip(audio, lengths, want, strict=True):
        assert_close_pcm(to_int16(row[:n]), to_int16(w))
        assert not row[n:].any()
    speechy = speechlike(1.5, 2)
    (text,) = _infer(trt, "asr", [("AUDIO", "FP32", speechy[None])], ["TEXT"], binary)
    text = text[0].decode() if isinstance(text[0], bytes) else text[0]  # JSON gives str
    assert text == local_asr.transcribe([speechy])[0].text


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_triton_components(trt, local_tts, local_asr, binary):
    ids = [local_tts.text.encode(t) for t in (ONE, "Good bye.")]
    padded = np.zeros((2, max(map(len, ids))), dtype=np.int64)
    for i, x in enumerate(ids):
        padded[i, : len(x)] = x
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    mel, mel_lengths = _infer(
        trt, "fastpitch", [("ids", "INT64", padded), ("lengths", "INT64", lengths)],
        ["mel", "mel_lengths"], binary,
    )  # fmt: skip
    assert mel.shape[:2] == (2, 80) and mel.shape[2] == mel_lengths.max()
    with torch.inference_mode():
        ref, ref_lengths = local_tts.acoustic.generate_mel(
            torch.from_numpy(padded), torch.from_numpy(lengths), SynthesisOptions()
        )
    assert list(mel_lengths) == ref_lengths.tolist()
    n = int(mel_lengths[0])
    assert np.abs(mel[0, :, :n] - ref[0, :, :n].numpy()).max() < 1e-4
    audio, audio_lengths = _infer(
        trt, "hifigan", [("mel", "FP32", mel), ("mel_lengths", "INT64", mel_lengths)],
        ["audio", "audio_lengths"], binary,
    )  # fmt: skip
    assert list(audio_lengths) == [256 * int(m) for m in mel_lengths]
    from speechrt.runtime.featurizer import batch_features

    feats, flen = batch_features([torch.from_numpy(speechlike(1.0, 3))], local_asr.features)
    inputs = [("features", "FP32", feats.numpy()), ("feature_lengths", "INT64", flen.numpy())]
    log_probs, lp_lengths = _infer(
        trt, "quartznet", inputs, ["log_probs", "log_prob_lengths"], binary
    )
    n = int(lp_lengths[0])  # the features are padded to a multiple of 16 frames: so is the output
    assert log_probs.shape[0] == 1 and log_probs.shape[2] == 29 and log_probs.shape[1] >= n
    assert np.allclose(np.exp(log_probs[:, :n]).sum(-1), 1.0, atol=1e-4)


# -- batching under load -------------------------------------------------------------------------


def _texts(n: int) -> list[str]:
    words = (
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
    )
    return [" ".join(words[: 2 + i % 10]).capitalize() + "." for i in range(n)]


def test_concurrent_requests_share_batches_and_match_alone(speech_server):
    texts = _texts(32)
    before = parse_metrics(httpx.get(f"{speech_server}/metrics").text)

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=speech_server, timeout=60) as c:
            bodies = [
                {"model": "tts", "voice": "0", "input": t, "seed": i, "response_format": "pcm"}
                for i, t in enumerate(texts)
            ]
            return await asyncio.gather(*(c.post("/v1/audio/speech", json=b) for b in bodies))

    together = asyncio.run(all_at_once())
    after = parse_metrics(httpx.get(f"{speech_server}/metrics").text)
    key = 'speechrt_batch_size_{}{{model="tts",version="1"{}}}'
    batches = after[key.format("count", "")] - before[key.format("count", "")]
    singles = after[key.format("bucket", ',le="1"')] - before[key.format("bucket", ',le="1"')]
    items = after[key.format("sum", "")] - before[key.format("sum", "")]
    assert items == 32 and batches < 32 and singles < batches  # some batches held several
    for i, (t, r) in enumerate(zip(texts, together, strict=True)):
        assert r.status_code == 200
        alone = speech(speech_server, t, seed=i, response_format="pcm").content
        if batch_invariance_holds():  # --batch-invariant: not one bit depends on the batch-mates
            assert r.content == alone
        else:  # a CPU that rounds by shape (the server runs without the mode): within rounding
            a, b = (np.frombuffer(x, dtype=np.int16).astype(int) for x in (r.content, alone))
            assert a.shape == b.shape and np.abs(a - b).max() <= LSB


def test_concurrent_transcriptions_match_alone(speech_server):
    files = [wav(speechlike(0.5 + 0.25 * i, 10 + i)) for i in range(8)]  # 0.5 to 2.25 s
    before = parse_metrics(httpx.get(f"{speech_server}/metrics").text)
    form = {"model": "asr", "response_format": "verbose_json", "timestamp_granularities[]": "word"}

    async def transcribe(data: list[bytes]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=speech_server, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v1/audio/transcriptions", data=form, files={"file": d}) for d in data)
            )

    together = asyncio.run(transcribe(files))
    after = parse_metrics(httpx.get(f"{speech_server}/metrics").text)
    key = 'speechrt_batch_size_count{model="asr",version="1"}'
    assert after[key] - before[key] < len(files)  # some batches held several
    for data, r in zip(files, together, strict=True):
        assert r.status_code == 200 and r.json()["words"]
        assert r.content == asyncio.run(transcribe([data]))[0].content


# -- metrics -------------------------------------------------------------------------------------


def test_metrics_use_triton_names(speech_server):
    r = httpx.get(f"{speech_server}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = parse_metrics(r.text)
    for name in (
        "nv_inference_request_success",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_pending_request_count",
    ):
        assert m[f'{name}{{model="tts",version="1"}}'] >= 0
    assert "# TYPE nv_inference_request_failure counter" in r.text
    assert "# TYPE speechrt_batch_size histogram" in r.text
