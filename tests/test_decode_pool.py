"""Decoding apart from the acoustic model: the decode pool's processes give what the recogniser
gives in-process, and a server started with --decode-workers transcribes through them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
TEXTS = ["Speech recognition works on this machine.", "Please call Stella at noon."]


@pytest.fixture(scope="module")
def speech() -> list[np.ndarray]:
    """The bundled voice saying TEXTS, at the recogniser's 16 kHz."""
    from speechrt.audio.io import resample
    from speechrt.tts import TTS

    tts = TTS()
    return [resample(a, tts.sampling_rate, 16000) for a in tts.synthesize(TEXTS)]


def test_pool_decodes_as_the_recogniser(speech: list[np.ndarray]) -> None:
    from speechrt.asr import ASR
    from speechrt.asr.decoding import DecodePool

    asr = ASR()
    assert asr.decoder == "beam"  # the LM travels to the workers
    want = asr.transcribe(speech)
    pool = DecodePool(asr.decoding, 2)
    try:
        pool.warm()
        heard = asr.hear(speech)
        sent = [h.without_audio() for h in heard]
        assert all(s.audio.size == 0 and s.samples > 0 for h in sent for s in h.segments)
        got = [f.result(timeout=60) for f in [pool.submit(h) for h in heard]]
    finally:
        pool.close()
    assert [(t.text, t.words) for t in got] == [(t.text, t.words) for t in want]
    assert all(len(t.text.split()) >= 3 for t in got)


def test_server_with_decode_workers(start_server, speech: list[np.ndarray]) -> None:
    import httpx

    from speechrt.asr import ASR

    url, _ = start_server("--asr", str(default_model(ASR_MODEL)), "--decode-workers", "2")
    asr = ASR()
    for audio in speech:
        buf = io.BytesIO()
        sf.write(buf, audio, 16000, format="WAV")
        # in process: the same 16-bit file, heard alone as a request is (item 0's dither seed)
        (want,) = asr.transcribe([buf.getvalue()])
        files = {"file": ("a.wav", buf.getvalue(), "audio/wav")}
        r = httpx.post(f"{url}/v1/audio/transcriptions", files=files, data={"model": "asr"})
        assert r.status_code == 200 and r.json()["text"] == want.text


def test_decode_workers_flag_is_checked(capsys) -> None:
    from speechrt.cli import main

    assert main(["serve", "--decode-workers", "-1"]) != 0
    assert "--decode-workers must be >= 0" in capsys.readouterr().err


def test_default_pool_only_beside_a_gpu(monkeypatch) -> None:
    """No --decode-workers: no processes on a CPU backend; on cuda one per spare core."""
    import os

    from speechrt.asr import ASR
    from speechrt.serving.server import ServeConfig, Server

    asr = ASR()
    assert Server(asr=asr, config=ServeConfig(components=False)).asr.pool is None
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(asr, "backend", "cuda")  # what the pool size follows
    srv = Server(asr=asr, config=ServeConfig(components=False))
    try:
        assert srv.asr.pool is not None and srv.asr.pool.workers == 3
    finally:
        srv.asr.pool.close()
    explicit = Server(asr=asr, config=ServeConfig(components=False, decode_workers=0))
    assert explicit.asr.pool is None
