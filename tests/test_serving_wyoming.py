"""Wyoming (Home Assistant's voice protocol) on a real `speechrt serve --wyoming-port` with the
bundled voice and recogniser (onnx), through the `wyoming` package's own client: describe,
transcribe (audio of any rate, width and channels), synthesize, streaming synthesis, and bad
input answered with error events."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import time
import wave
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model
from speechrt.text import split_sentences

pytest.importorskip("wyoming")
from wyoming.asr import Transcribe, Transcript  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.error import Error  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (  # noqa: E402
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from speechrt.serving.wyoming_audio import to_mono  # noqa: E402

needs_models = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
MAX_CHARS = 2000  # the server's --max-text-chars
MAX_SECONDS = 10  # its --max-audio-seconds
IDLE = 4  # its --realtime-idle-seconds
LSB = 2  # int16 steps: a sentence's first frames are vocoded apart (see test_streaming_speech)
TEXT = "Speech recognition works on this machine. Please call Stella."
SUBTYPES = {1: "PCM_U8", 2: "PCM_16", 3: "PCM_24", 4: "PCM_32"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(start_server) -> tuple[str, int]:
    """(HTTP base URL, Wyoming port) of one server."""
    from speechrt.defaults import voice_dirs

    acoustic, vocoder = voice_dirs(None, None)
    port = _free_port()
    url, _ = start_server(
        *("--acoustic", str(acoustic), "--vocoder", str(vocoder)),
        *("--asr", str(default_model(ASR_MODEL)), "--backend", "onnx", "--no-components"),
        *("--max-text-chars", str(MAX_CHARS), "--max-audio-seconds", str(MAX_SECONDS)),
        *("--wyoming-port", str(port), "--realtime-idle-seconds", str(IDLE)),
    )
    return url, port


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def exchange(port: int, events: list[Event], until: str) -> list[Event]:
    """Send `events` on one connection; the events received up to one of type `until`."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for e in events:
            await client.write_event(e)
        out = []
        while True:
            event = await asyncio.wait_for(client.read_event(), 120)
            assert event is not None, f"closed after {[e.type for e in out]}"
            out.append(event)
            if event.type == until:
                return out


def pcm_of(events: list[Event]) -> np.ndarray:
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert all((c.width, c.channels) == (2, 1) for c in chunks)
    return np.frombuffer(b"".join(c.audio for c in chunks), "<i2")


def speech_pcm(url: str, text: str) -> np.ndarray:
    body = {"model": "tts", "voice": "alloy", "input": text, "response_format": "pcm"}
    r = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, "<i2")


@needs_models
def test_describe_names_the_recogniser_and_the_voices(server):
    url, port = server
    (event,) = run(exchange(port, [Describe().event()], "info"))
    info = Info.from_event(event)
    (asr,) = info.asr
    assert [m.name for m in asr.models] == ["asr"] and asr.models[0].languages == ["en"]
    (tts,) = info.tts
    voices = httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    assert [v.name for v in tts.voices] == [voices[0]["id"]]
    assert tts.supports_synthesize_streaming and tts.voices[0].languages == ["en"]


@needs_models
def test_synthesize_gives_the_speech_of_the_http_route(server):
    url, port = server
    events = run(exchange(port, [Synthesize(TEXT).event()], "audio-stop"))
    assert events[0].type == "audio-start"
    start = AudioStart.from_event(events[0])
    assert (start.width, start.channels) == (2, 1)
    got, whole = pcm_of(events), speech_pcm(url, TEXT)
    assert got.shape == whole.shape and np.abs(got.astype(int) - whole).max() <= LSB


@needs_models
def test_streaming_synthesis_speaks_each_sentence_as_it_is_complete(server):
    url, port = server
    text = "The first one. A second sentence, longer than the first! The last"
    name = Info.from_event(run(exchange(port, [Describe().event()], "info"))[0]).tts[0]
    voice = SynthesizeVoice(name=name.voices[0].name)
    words = text.split(" ")
    chunks = [SynthesizeChunk(w if i == 0 else " " + w).event() for i, w in enumerate(words)]
    # Home Assistant also sends the whole text as `synthesize`: not spoken a second time
    request = [SynthesizeStart(voice=voice).event(), *chunks, Synthesize(text, voice).event()]
    events = run(exchange(port, [*request, SynthesizeStop().event()], "synthesize-stopped"))
    kinds = [e.type for e in events if e.type != "audio-chunk"]
    sentences = split_sentences(text)
    assert kinds == ["audio-start", "audio-stop"] * len(sentences) + ["synthesize-stopped"]
    got, whole = pcm_of(events), speech_pcm(url, text)
    assert got.shape == whole.shape and np.abs(got.astype(int) - whole).max() <= LSB


def pcm_bytes(audio: np.ndarray, width: int, channels: int) -> bytes:
    """(N,) float -> interleaved little-endian PCM: channel c is the audio times 1 - c / 4."""
    x = np.stack([audio * (1 - c / 4) for c in range(channels)], axis=1)  # (N, channels)
    top = 2.0 ** (8 * width - 1)
    ints = np.clip(np.round(x * top), -top, top - 1).astype(np.int64)
    if width == 1:
        return (ints + 128).astype(np.uint8).tobytes()
    little = ints.astype("<i8").view(np.uint8).reshape(*ints.shape, 8)[..., :width]
    return little.tobytes()


def wav_of(data: bytes, rate: int, width: int, channels: int) -> bytes:
    """A WAV file holding exactly these PCM bytes."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return buf.getvalue()


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 3])
def test_audio_of_any_width_and_channels_reads_as_a_wav_file_does(width: int, channels: int):
    audio = np.sin(np.arange(4000) * 0.05) * np.linspace(-0.99, 0.99, 4000)
    data = pcm_bytes(audio, width, channels)
    read, _ = sf.read(io.BytesIO(wav_of(data, 16000, width, channels)), always_2d=True)
    assert np.allclose(to_mono(data, width, channels), read.mean(axis=1), rtol=0, atol=1e-6)


@needs_models
def test_transcribe_hears_any_format_as_an_uploaded_file(server):
    """48 kHz, 24-bit, stereo in chunks of 1,000 frames: the transcript is the text the OpenAI
    route gives for a WAV file of the same samples."""
    url, port = server
    from speechrt.audio.io import resample

    voice = speech_pcm(url, TEXT).astype(np.float32) / 32768
    data = pcm_bytes(resample(voice, 22050, 48000), 3, 2)
    r = httpx.post(
        f"{url}/v1/audio/transcriptions",
        data={"model": "whisper-1"},
        files={"file": ("a.wav", wav_of(data, 48000, 3, 2))},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    offline = r.json()["text"]
    assert "machine" in offline and "call" in offline  # both sentences were heard
    step = 6 * 1000
    chunks = [
        AudioChunk(48000, 3, 2, data[i : i + step]).event() for i in range(0, len(data), step)
    ]
    request = [Transcribe(language="en-US").event(), AudioStart(48000, 3, 2).event()]
    events = run(exchange(port, [*request, *chunks, AudioStop().event()], "transcript"))
    assert Transcript.from_event(events[-1]).text == offline


# -- bad input -----------------------------------------------------------------------------------


async def errors_of(port: int, steps: list[list[Event]]) -> list[Error]:
    """On one connection: each step's events; the error event each gets, and then nothing
    else before the pong of a ping (the connection goes on)."""
    from wyoming.ping import Ping

    out = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for step in steps:
            for e in step:
                await client.write_event(e)
            error = await asyncio.wait_for(client.read_event(), 60)
            assert error is not None and error.type == "error", error
            out.append(Error.from_event(error))
            await client.write_event(Ping(text="alive").event())
            pong = await asyncio.wait_for(client.read_event(), 60)
            assert pong is not None and pong.type == "pong", pong
    return out


@needs_models
def test_bad_requests_get_one_error_event_each_and_the_connection_goes_on(server):
    _, port = server
    one_second = AudioChunk(16000, 2, 1, bytes(32000)).event()
    steps = [
        [Synthesize("Hello.", SynthesizeVoice(name="nobody")).event()],
        [Synthesize("Hello.", SynthesizeVoice(language="de")).event()],
        [Synthesize("word " * (MAX_CHARS // 5 + 1)).event()],
        [Synthesize("   ").event()],
        [Synthesize("Hello.", text_format="ssml").event()],
        [SynthesizeChunk("Hello.").event()],
        [SynthesizeStop().event()],
        [
            Transcribe(language="de").event(),
            AudioStart(16000, 2, 1).event(),
            one_second,
            AudioStop().event(),
        ],  # fmt: skip
        [AudioStart(1000, 2, 1).event(), one_second, AudioStop().event()],
        [AudioStart(16000, 5, 1).event(), AudioStop().event()],
        [AudioStart(16000, 2, 0).event(), AudioStop().event()],
        [
            AudioStart(16000, 2, 1).event(),
            AudioChunk(16000, 2, 1, b"\0" * 3).event(),
            one_second,
            AudioStop().event(),
        ],  # fmt: skip
        [
            AudioStart(16000, 2, 1).event(),
            AudioChunk(8000, 2, 1, bytes(100)).event(),
            AudioStop().event(),
        ],  # fmt: skip
        [AudioStart(16000, 2, 1).event(), *[one_second] * (MAX_SECONDS + 1), AudioStop().event()],
        [
            AudioStart(16000, 2, 1).event(),
            AudioChunk(16000, 2, 1, bytes(64)).event(),
            AudioStop().event(),
        ],  # fmt: skip  (2 ms: too short for the recogniser)
        [AudioStop().event()],
        [Event("audio-chunk", {"rate": "fast"})],
        [Event("select-program", {"name": "whisper"})],
    ]
    errors = run(errors_of(port, steps))
    codes = [e.code for e in errors]
    assert codes == [
        "unknown_voice", "bad_language", "invalid_input", "invalid_input", "bad_ssml",
        "no_stream", "no_stream", "bad_language", "unsupported_audio_format",
        "unsupported_audio_format", "unsupported_audio_format", "invalid_audio",
        "unsupported_audio_format", "audio_too_long", "invalid_input", "no_audio", "bad_event",
        "bad_program",
    ]  # fmt: skip
    assert "voice 'nobody' not found" in errors[0].text
    assert f"the limit is {MAX_CHARS}" in errors[2].text
    # the connection is still fine: a request after them all is answered
    (info,) = run(exchange(port, [Describe().event()], "info"))
    assert Info.from_event(info).tts


async def raw_exchange(port: int, data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Raw bytes in; (the JSON headers of what came back, whether the server closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    headers: list[dict[str, Any]] = []
    try:
        while line := await asyncio.wait_for(reader.readline(), 60):
            header = json.loads(line)
            if header.get("data_length"):
                header["data"] = json.loads(await reader.readexactly(header["data_length"]))
            headers.append(header)
        return headers, True
    finally:
        writer.close()


@needs_models
@pytest.mark.parametrize(
    "data, words",
    [
        (b"not json\n", "not JSON"),
        (b'{"data": {}}\n', "string `type`"),
        (b'{"type": "audio-chunk", "payload_length": 99999999999}\n', "payload_length"),
        (b'{"type": "synthesize", "data_length": -1}\n', "data_length"),
        (b'{"type": "synthesize", "data_length": 5}\n[1,2]', "data is a JSON object"),
        (b'{"type": "synthesize", "data": {"text": "' + b"a" * 400_000 + b'"}}\n', "header"),
    ],
)
def test_frames_it_cannot_read_get_an_error_and_close_the_connection(server, data, words):
    _, port = server
    headers, closed = run(raw_exchange(port, data))
    assert closed and [h["type"] for h in headers] == ["error"]
    assert headers[0]["data"]["code"] == "bad_frame" and words in headers[0]["data"]["text"]


def tts_cancelled(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics").text
    m = re.search(r'request_failure\{model="tts"[^}]*reason="CANCELED"[^}]*\} (\S+)', metrics)
    return float(m.group(1)) if m else 0.0


@needs_models
def test_a_connection_that_goes_away_cancels_its_synthesis(server):
    url, port = server
    before = tts_cancelled(url)

    async def ask_and_leave() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        data = json.dumps({"text": "A long text to speak. " * 60}).encode()
        header = {"type": "synthesize", "data_length": len(data)}
        writer.write(json.dumps(header).encode() + b"\n" + data)
        await writer.drain()
        writer.close()

    run(ask_and_leave())
    deadline = time.monotonic() + 60
    while tts_cancelled(url) == before:  # the server counts it once it has noticed
        assert time.monotonic() < deadline, "the synthesis was not cancelled"
        time.sleep(0.1)
    assert tts_cancelled(url) == before + 1


@needs_models
def test_an_idle_connection_is_closed(server):
    _, port = server
    # nothing sent: after IDLE seconds, an error and the end of the stream
    headers, closed = run(raw_exchange(port, b""))
    assert closed and [h["data"]["code"] for h in headers] == ["idle_timeout"]


def test_cli_refuses_a_taken_port_and_ray(capsys):
    from speechrt.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--wyoming-port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["serve", "--ray", "--wyoming-port", "10300"]) == 2
    assert "not served with --ray" in capsys.readouterr().err
