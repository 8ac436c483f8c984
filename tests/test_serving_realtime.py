"""Streaming recognition through a real `speechrt serve` on the bundled recogniser: the realtime
WebSocket with the openai client, stream=true transcriptions, speechrt's client and CLI, and bad
input answered with error events or 4xx."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
openai = pytest.importorskip("openai")
websockets_sync = pytest.importorskip("websockets.sync.client")

RATE = 24000  # OpenAI's realtime pcm16
MAX_SECONDS = 10  # the server's --max-audio-seconds
IDLE = 3  # the server's --realtime-idle-seconds
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def server(start_server) -> str:
    url, _ = start_server(
        *("--asr", str(default_model(ASR_MODEL)), "--device", "cpu"),
        *("--max-audio-seconds", str(MAX_SECONDS), "--realtime-idle-seconds", str(IDLE)),
    )
    return url


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    """The bundled voice saying two sentences: int16 at 24 kHz (N,)."""
    from speechrt.audio.io import resample, to_int16
    from speechrt.tts import TTS

    tts = TTS(device="cpu")
    (audio,) = tts.synthesize(["Speech recognition works on this machine. Please call Stella."])
    return to_int16(resample(audio, tts.sampling_rate, RATE))


@pytest.fixture(scope="module")
def wav(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def offline(server: str, wav: bytes) -> str:
    """The non-streamed transcription of the same samples."""
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    text = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav)).text
    assert "machine" in text and "call" in text  # both sentences were heard
    return text


def openai_session(
    server: str, pcm: np.ndarray, turn: dict | None, completions: int, step_ms: int = 100
) -> list[Any]:
    """An openai-client realtime transcription session: `pcm` appended in `step_ms` pieces
    (and committed by the client when `turn` is None); its events up to the `completions`-th
    completed transcript."""

    async def session() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
        events: list[Any] = []
        query = {"intent": "transcription"}
        async with client.realtime.connect(model="whisper-1", extra_query=query) as conn:
            audio_in = {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": turn}
            await conn.session.update(
                session={"type": "transcription", "audio": {"input": audio_in}}
            )
            data = pcm.tobytes()
            step = RATE * step_ms // 1000 * 2  # bytes of 16-bit samples
            for start in range(0, len(data), step):
                chunk = base64.b64encode(data[start : start + step]).decode()
                await conn.input_audio_buffer.append(audio=chunk)
            if turn is None:
                await conn.input_audio_buffer.commit()
            async for event in conn:
                events.append(event)
                if [e.type for e in events].count(COMPLETED) == completions:
                    break
        return events

    return asyncio.run(session())


def test_realtime_session_with_the_openai_client(server: str, pcm: np.ndarray, offline: str):
    events = openai_session(server, pcm, None, 1)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["session.created", "session.updated"]
    assert kinds[-1] == COMPLETED
    deltas = [i for i, k in enumerate(kinds) if k == DELTA]
    committed = kinds.index("input_audio_buffer.committed")
    # partials while the audio was coming in (before the commit), the final after it
    assert len([i for i in deltas if i < committed]) >= 3
    assert all(i < len(kinds) - 1 for i in deltas)
    completed = events[-1]
    assert completed.transcript == offline
    assert completed.item_id == events[committed].item_id
    assert completed.usage.seconds == pytest.approx(pcm.shape[0] / RATE, abs=1e-3)


def test_server_vad_commits_each_utterance(server: str):
    """turn_detection server_vad, no commit from the client: two sentences 1.5 s apart come
    back as two items, each started, stopped, committed and completed with its offline text."""
    from speechrt.audio.io import resample, to_int16
    from speechrt.tts import TTS

    tts = TTS(device="cpu")
    said = tts.synthesize(["Speech recognition works on this machine.", "Please call Stella."])
    parts = [to_int16(resample(a, tts.sampling_rate, RATE)) for a in said]
    # each part whole 10 ms blocks long: the session's turn detector splits at block
    # boundaries, so the second part starts in its committed audio on the same 10 ms grid
    # (the features' hop) as it does alone; a shift off that grid is other input, and the
    # recogniser can hear a word differently there
    hop = RATE // 100
    parts = [np.pad(p, (0, -p.size % hop)) for p in parts]
    gap = np.zeros(int(1.5 * RATE), np.int16)
    pcm = np.concatenate([gap[: RATE // 2], parts[0], gap, parts[1], gap])
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    offline = []
    for p in parts:
        buf = io.BytesIO()
        sf.write(buf, p, RATE, format="WAV", subtype="PCM_16")
        offline.append(
            client.audio.transcriptions.create(
                model="whisper-1", file=("a.wav", buf.getvalue())
            ).text
        )

    turn = {"type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 300}
    events = openai_session(server, pcm, turn, 2, step_ms=50)
    turns = [e for e in events if e.type != DELTA][2:]  # after session.created / .updated
    kinds = [e.type for e in turns]
    one = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
           "input_audio_buffer.committed", COMPLETED]  # fmt: skip
    assert kinds == one + one
    assert events[1].session.audio.input.turn_detection.type == "server_vad"
    first, second = turns[:4], turns[4:]
    assert [first[3].transcript, second[3].transcript] == offline
    for item in (first, second):
        assert len({e.item_id for e in item}) == 1
    # where the sentences are (ms): 500-ms lead, prefix padding 300 ms, +-60 ms of frames
    n0 = parts[0].shape[0] * 1000 // RATE
    assert abs(first[0].audio_start_ms - (500 - 300)) <= 60
    assert abs(first[1].audio_end_ms - (500 + n0)) <= 250  # the voice's own trailing silence
    assert abs(second[0].audio_start_ms - (500 + n0 + 1500 - 300)) <= 250
    assert first[3].item_id != second[3].item_id


def test_stream_true_gives_deltas_then_the_offline_text(server: str, wav: bytes, offline: str):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    stream = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav), stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    assert set(kinds[:-1]) == {"transcript.text.delta"} and len(kinds) >= 4
    assert events[-1].text == offline


def test_speechrt_client_streams(server: str, pcm: np.ndarray, wav: bytes, offline: str):
    from speechrt.client import Client

    with Client(server) as c:
        events = list(c.transcribe_stream(wav))
        assert events[-1].kind == "done" and events[-1].text == offline
        assert [e.kind for e in events[:-1]] == ["delta"] * (len(events) - 1)
        audio = pcm.astype(np.float32) / 32768.0
        chunks = [audio[i : i + 2400] for i in range(0, audio.shape[0], 2400)]
        events = list(c.transcribe_realtime(chunks, RATE))
        assert events[-1].kind == "done" and events[-1].text == offline
        assert len(events) >= 3


def test_cli_stream_over_the_server(server: str, wav: bytes, offline: str, tmp_path: Path, capsys):
    from speechrt.cli import main

    path = tmp_path / "a.wav"
    path.write_bytes(wav)
    assert main(["transcribe", "--stream", str(path), "--url", server]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}\t{offline}\n"
    assert err.count("partial\t") >= 3  # not a terminal: a line per partial


def test_telephone_rate_is_heard_alike_on_every_route(
    server: str, pcm: np.ndarray, tmp_path: Path, capsys
):
    """An 8 kHz version of the audio: the file upload, the array upload, a realtime session at
    8 kHz and the CLI streaming the file all hear it through the telephone band: one transcript
    (the same samples everywhere: every route carries them as the same 16-bit values)."""
    from speechrt.audio.io import resample, to_int16
    from speechrt.cli import main
    from speechrt.client import Client

    narrow = resample(pcm.astype(np.float32) / 32768.0, RATE, 8000)
    path = tmp_path / "phone.wav"
    sf.write(path, to_int16(narrow), 8000, subtype="PCM_16")
    with Client(server) as c:
        heard = c.transcribe(path.read_bytes())["text"]
        assert "machine" in heard
        assert c.transcribe(narrow, 8000)["text"] == heard
        chunks = [narrow[i : i + 800] for i in range(0, narrow.shape[0], 800)]
        assert list(c.transcribe_realtime(chunks, 8000))[-1].text == heard
    capsys.readouterr()
    assert main(["transcribe", "--stream", str(path), "--url", server]) == 0
    assert capsys.readouterr().out == f"{path}\t{heard}\n"


def g711_session(server: str, coded: bytes, update: dict[str, Any]) -> list[dict[str, Any]]:
    """A bare session: `update`, then `coded` G.711 bytes appended 100 ms at a time and
    committed; its events up to the completed transcript."""
    s = Raw(server)
    assert s.recv()["type"] == "session.created"
    s.send(update)
    events = [s.recv()]
    turn = {"turn_detection": None}  # an update that names no format keeps the session's
    s.send({"type": update["type"], "session": turn if "input_audio_format" in update["session"]
            else {"audio": {"input": turn}}})  # fmt: skip
    events.append(s.recv())
    for i in range(0, len(coded), 800):
        s.send(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(coded[i : i + 800]).decode(),
            }
        )
    s.send({"type": "input_audio_buffer.commit"})
    while events[-1]["type"] != COMPLETED:
        events.append(s.recv())
    s.ws.close()
    return events


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_g711_sessions_hear_telephone_audio(server: str, pcm: np.ndarray, law: str):
    """G.711 mu-law (GA audio/pcmu) and A-law (beta g711_alaw) bytes at 8 kHz, as telephone
    networks send them: the completed transcript is the one of a G.711 WAV of the same bytes."""
    from speechrt.audio.io import resample
    from speechrt.client import Client

    narrow = resample(pcm.astype(np.float32) / 32768.0, RATE, 8000)
    buf = io.BytesIO()
    sf.write(buf, narrow, 8000, format="RAW", subtype=law.upper())  # libsndfile's G.711 encoder
    coded = buf.getvalue()
    wav = io.BytesIO()
    sf.write(wav, narrow, 8000, format="WAV", subtype=law.upper())  # the same codes in a WAV
    with Client(server) as c:
        heard = c.transcribe(wav.getvalue())["text"]
    assert "machine" in heard
    if law == "ulaw":
        update = {"type": "session.update",
                  "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}}  # fmt: skip
    else:
        update = {"type": "transcription_session.update",
                  "session": {"input_audio_format": "g711_alaw"}}  # fmt: skip
    events = g711_session(server, coded, update)
    session = events[1]["session"]  # after a second update without a format: still G.711
    if law == "ulaw":
        assert session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    else:
        assert session["input_audio_format"] == "g711_alaw"
    assert events[-1]["transcript"] == heard
    assert events[-1]["usage"]["seconds"] == pytest.approx(len(coded) / 8000, abs=1e-3)


class Raw:
    """A bare WebSocket session (no client library checks what is sent)."""

    def __init__(self, server: str, query: str = "intent=transcription") -> None:
        url = server.replace("http://", "ws://") + f"/v1/realtime?{query}"
        self.ws = websockets_sync.connect(url, max_size=None).__enter__()

    def send(self, event: dict[str, Any] | str) -> None:
        self.ws.send(event if isinstance(event, str) else json.dumps(event))

    def recv(self) -> dict[str, Any]:
        return json.loads(self.ws.recv(timeout=30))

    def error_of(self, event: dict[str, Any] | str) -> dict[str, Any]:
        self.send(event)
        reply = self.recv()
        assert reply["type"] == "error", reply
        return reply["error"]


def _b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def test_bad_events_get_error_events_and_the_session_goes_on(server: str):
    s = Raw(server)
    assert s.recv()["type"] == "session.created"
    assert s.error_of({"type": "input_audio_buffer.append", "audio": "no base64!"})["code"] == (
        "invalid_audio"
    )
    assert s.error_of({"type": "input_audio_buffer.append", "audio": "AA=="})["code"] == (
        "invalid_audio"  # one byte: not 16-bit samples
    )
    assert s.error_of({"type": "input_audio_buffer.append", "audio": 12})["code"] == (
        "invalid_audio"
    )
    err = s.error_of({"type": "response.create", "event_id": "evt_1"})
    assert err["code"] == "invalid_event_type" and err["event_id"] == "evt_1"
    assert s.error_of("{not json")["code"] == "invalid_json"
    assert s.error_of("[1, 2]")["code"] == "invalid_json"
    assert s.error_of({"type": "input_audio_buffer.commit"})["code"] == (
        "input_audio_buffer_commit_empty"
    )
    for turn in ({}, {"type": "semantic_vad"}, {"type": "server_vad", "silence_duration_ms": 5}):
        vad = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": turn}}}}
        assert s.error_of(vad)["code"] == "unsupported_turn_detection"

    def fmt(f: Any) -> dict[str, Any]:
        return {"type": "session.update", "session": {"audio": {"input": {"format": f}}}}

    assert s.error_of(fmt({"type": "audio/opus"}))["code"] == "unsupported_audio_format"
    assert s.error_of(fmt({"type": "audio/pcmu", "rate": 16000}))["code"] == "invalid_rate"
    assert s.error_of(fmt("audio/pcmu"))["code"] == "unsupported_audio_format"  # not an object
    for name in ("g729", ["pcm16"]):
        beta = {"type": "transcription_session.update", "session": {"input_audio_format": name}}
        assert s.error_of(beta)["code"] == "unsupported_audio_format"
    for audio in (5, {"input": [1]}):
        bad = {"type": "session.update", "session": {"audio": audio}}
        assert s.error_of(bad)["code"] == "invalid_session"
    # too much audio: refused, the buffer keeps what it had
    s.send({"type": "input_audio_buffer.append", "audio": _b64(np.zeros(RATE // 2))})
    too_much = np.zeros(MAX_SECONDS * RATE, dtype=np.int16)
    err = s.error_of({"type": "input_audio_buffer.append", "audio": _b64(too_much)})
    assert err["code"] == "input_audio_buffer_too_large"
    # nor does the format change under it
    assert s.error_of(fmt({"type": "audio/pcma"}))["code"] == "buffer_not_empty"
    s.send({"type": "input_audio_buffer.clear"})
    assert s.recv()["type"] == "input_audio_buffer.cleared"
    # still alive: the beta session event works
    s.send({"type": "transcription_session.update", "session": {"input_audio_format": "pcm16"}})
    reply = s.recv()
    assert reply["type"] == "transcription_session.updated"
    assert reply["session"]["input_audio_format"] == "pcm16"
    s.ws.close()


def test_idle_session_is_closed(server: str):
    from websockets.exceptions import ConnectionClosedOK

    s = Raw(server)
    assert s.recv()["type"] == "session.created"
    assert s.recv()["error"]["code"] == "idle_timeout"  # after IDLE s without an event
    with pytest.raises(ConnectionClosedOK):
        s.recv()


def test_only_transcription_sessions(server: str):
    from websockets.exceptions import ConnectionClosed

    for query, code in (
        ("model=gpt-realtime", "model_not_found"),
        ("intent=conversation", "unsupported_session"),
    ):
        s = Raw(server, query)
        assert s.recv()["error"]["code"] == code
        with pytest.raises(ConnectionClosed):
            s.recv()


def test_stream_true_bad_requests_are_4xx(server: str, wav: bytes):
    import httpx

    url = f"{server}/v1/audio/transcriptions"
    files = {"file": ("a.wav", wav)}
    r = httpx.post(url, data={"model": "asr", "stream": "true", "response_format": "srt"},
                   files=files)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = httpx.post(url, data={"model": "asr", "stream": "maybe"}, files=files)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    r = httpx.post(url, data={"model": "asr", "stream": "true"}, files={"file": ("a", b"junk")})
    assert r.status_code == 400
