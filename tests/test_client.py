"""speechrt.client against the shared test server, and `speechrt synthesize --url`."""

from __future__ import annotations

import asyncio
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.audio.io import encode_audio
from speechrt.cli import main
from speechrt.client import AsyncClient, Client, ServerError
from speechrt.errors import SpeechRTError

TEXT = "A client speaks. The server answers."


def assert_same_pcm(a: bytes, b: bytes, lsb: int = 2) -> None:
    """Streamed vs whole 16-bit PCM: a stream vocodes its first frames apart (with real
    context), so its samples equal the whole response's within float rounding: 2 int16 steps."""
    x, y = np.frombuffer(a, "<i2").astype(np.int32), np.frombuffer(b, "<i2").astype(np.int32)
    assert x.shape == y.shape and np.abs(x - y).max() <= lsb


def tone(seconds: float = 1.0, sr: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * np.sin(2 * np.pi * 440 * t) * (t % 0.3 < 0.2)).astype(np.float32)


def test_sync_client(speech_server, tmp_path):
    with Client(speech_server) as c:
        assert c.health()
        assert {"tts", "asr"} <= set(c.models())
        wav = c.synthesize(TEXT)
        direct = httpx.post(
            f"{speech_server}/v1/audio/speech",
            json={"model": "tts", "voice": "0", "input": TEXT, "response_format": "wav"},
            timeout=60,
        )
        # (bitwise only where batch invariance holds: batches may form differently per call)
        assert wav[:44] == direct.content[:44]
        assert_same_pcm(wav[44:], direct.content[44:])
        audio, sr = c.synthesize_array(TEXT)
        ref, ref_sr = sf.read(io.BytesIO(wav), dtype="int16")
        assert sr == ref_sr
        assert_same_pcm(np.round(audio * 32767).astype("<i2").tobytes(), ref.tobytes())
        assert_same_pcm(b"".join(c.stream(TEXT)), c.synthesize(TEXT, "pcm"))
        assert c.synthesize(TEXT, "flac")[:4] == b"fLaC"
        one = "A single sentence, spoken fast."  # (pauses between sentences keep their length)
        assert len(c.synthesize(one, "pcm", speed=2.0)) < len(c.synthesize(one, "pcm")) * 0.7

        speechy = tone()
        (tmp_path / "a.wav").write_bytes(encode_audio(speechy, 16000, "wav"))
        text = c.transcribe(tmp_path / "a.wav")["text"]
        assert c.transcribe(encode_audio(speechy, 16000, "flac"))["text"] == text
        assert c.transcribe(speechy, sampling_rate=16000)["text"] == text
        verbose = c.transcribe(speechy, 16000, "asr", "verbose_json", ["word"])
        assert verbose["text"] == text and "words" in verbose
        assert c.transcribe(speechy, 16000, response_format="text") == {"text": text}
        assert c.metrics()['nv_inference_count{model="tts",version="1"}'] > 0


def test_sync_client_errors(speech_server, tmp_path):
    with Client(speech_server) as c:
        with pytest.raises(ServerError, match="empty") as e:
            c.synthesize("")
        assert e.value.status == 400
        with pytest.raises(ServerError) as e:
            c.synthesize(TEXT, model="nope")
        assert e.value.status == 404
        with pytest.raises(ServerError, match="400"):
            list(c.stream(TEXT, "flac"))
        with pytest.raises(SpeechRTError, match="sampling_rate"):
            c.transcribe(tone())
        with pytest.raises(SpeechRTError, match="cannot read"):
            c.transcribe(tmp_path / "missing.wav")
        with pytest.raises(TypeError, match="colour"):
            c.synthesize(TEXT, colour="blue")
    with Client("http://127.0.0.1:9", timeout=2) as dead:
        assert not dead.health()
        with pytest.raises(SpeechRTError, match="cannot reach"):
            dead.models()


def test_async_client(speech_server):
    async def main_() -> None:
        async with AsyncClient(speech_server) as c:
            assert await c.health()
            assert "tts" in await c.models()
            wavs = await asyncio.gather(*(c.synthesize(TEXT, seed=i) for i in range(4)))
            assert all(w[:4] == b"RIFF" for w in wavs)
            audio, sr = await c.synthesize_array(TEXT)
            assert audio.dtype == np.float32 and sr == 22050
            chunks = [chunk async for chunk in c.stream(TEXT)]
            assert_same_pcm(b"".join(chunks), await c.synthesize(TEXT, "pcm"))
            result = await c.transcribe(tone(), 16000)
            assert isinstance(result["text"], str)
            with pytest.raises(ServerError):
                await c.synthesize(TEXT, speed=9.0)
            assert (await c.metrics())['nv_inference_count{model="tts",version="1"}'] > 0

    asyncio.run(main_())


def test_synthesize_cli_with_url(speech_server, tmp_path, capsys):
    out = tmp_path / "one.wav"
    assert main(["synthesize", TEXT, "-o", str(out), "--url", speech_server]) == 0
    with Client(speech_server) as c:
        assert out.read_bytes() == c.synthesize(TEXT)
        phrases = tmp_path / "phrases.txt"
        phrases.write_text("First phrase.\nSecond phrase!\nThird one?\n")
        args = ["synthesize", "--file", str(phrases), "--out-dir", str(tmp_path / "out")]
        assert (
            main(
                [
                    *args,
                    "--url",
                    speech_server,
                    "--format",
                    "flac",
                    "--seed",
                    "3",
                    "--batch-size",
                    "1",
                ]
            )
            == 0
        )
        for i, text in enumerate(["First phrase.", "Second phrase!", "Third one?"]):
            got = (tmp_path / "out" / f"{i + 1}.flac").read_bytes()
            assert got == c.synthesize(text, "flac", seed=3 + i)
    assert main(["synthesize", "", "-o", str(out), "--url", speech_server]) == 2
    assert "empty" in capsys.readouterr().err


def test_transcribe_cli_with_url(speech_server, tmp_path, capsys):
    a, b, bad = tmp_path / "a.wav", tmp_path / "b.flac", tmp_path / "bad.wav"
    a.write_bytes(encode_audio(tone(1.0), 16000, "wav"))
    b.write_bytes(encode_audio(tone(0.7), 8000, "flac"))
    bad.write_bytes(b"not audio at all" * 20)
    with Client(speech_server) as c:
        want = [c.transcribe(a)["text"], c.transcribe(b)["text"]]
    files = [str(a), str(bad), str(tmp_path / "missing.wav"), str(b)]
    assert main(["transcribe", *files, "--url", speech_server]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{a}\t{want[0]}", f"{b}\t{want[1]}"]
    assert "bad.wav" in err and "missing.wav" in err
    assert main(["transcribe", str(a), "--url", speech_server, "--json"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["file"] == str(a) and line["text"] == want[0] and "words" in line
    assert line["duration"] == pytest.approx(1.0, abs=1e-3)
    assert main(["transcribe", str(a), "--model", str(tmp_path / "none")]) == 2
    assert "none" in capsys.readouterr().err  # a named model that is not there: one line
