"""Speech for text as it is written, over WebSocket: `/v1/audio/speech/stream`
(docs/streaming-protocols.md).

The query string holds the synthesis options of /v1/audio/speech (model, voice, speed, seed,
pitch_shift, pitch_scale, pitch_flatten, denoise; checked as that route checks them). The
client then sends JSON text messages, each an object with any of:
  "text": "..."    text to append (an LLM's tokens, of any size)
  "flush": true    end the current sentence: speak what is held now
  "cancel": true   drop the held text and all queued speech at once (barge-in)
  "close": true    no more text: speak what is held, send what is queued, then "done" and close
handled in the order cancel, text, flush, close. Each sentence is queued as soon as it is
complete (speechrt.serving.text_stream) and its audio is sent in order, as:
  {"type": "segment.start", "segment": k, "text": "..."}
  binary messages: the segment's audio, 16-bit little-endian mono PCM at `sample_rate`
  {"type": "segment.done", "segment": k, "samples": n}
Other server messages: {"type": "session.created", "sample_rate", "format": "pcm_s16le",
"model", "voice"} first; {"type": "cancelled", "segments": [k, ...]} after a cancel (no audio of
those segments follows it); {"type": "segment.failed", "segment": k, "error"} where a queued
sentence failed; {"type": "error", "error": {"message", "code"}} for a message the session
refuses (it goes on); {"type": "done"} before the server closes after "close".

Limits: the server's request limits per sentence; the text held unspoken at most
--max-text-chars; one message at most MAX_MESSAGE_BYTES; a session with nothing queued that
sends nothing for --realtime-idle-seconds is closed. A client that goes away cancels its queued
sentences.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError
from starlette.types import Message

from speechrt.audio import codecs
from speechrt.errors import SpeechRTError
from speechrt.serving.engine import DeadlineExceeded, InferenceError, Overloaded
from speechrt.serving.http_errors import ApiError
from speechrt.serving.openai_api import SpeechRequest, _checked, voices_of
from speechrt.serving.text_stream import Segment, SpeechStream
from speechrt.serving.voices import Audio

if TYPE_CHECKING:
    from speechrt.options import SynthesisOptions
    from speechrt.serving.server import Server

router = APIRouter(prefix="/v1")

OPTIONS = ("model", "voice", "speed", "seed", "pitch_shift", "pitch_scale", "pitch_flatten",
           "denoise")  # fmt: skip
KEYS = ("text", "flush", "cancel", "close")


def error_code(e: Exception) -> str:
    """The code an error event carries for an exception of the pipeline."""
    if isinstance(e, Overloaded):
        return "overloaded"
    if isinstance(e, DeadlineExceeded):
        return "timeout"
    if isinstance(e, InferenceError):
        return "inference_failed"
    return "invalid_input" if isinstance(e, SpeechRTError) else "internal"


class SocketSink:
    """A SpeechStream's segments as JSON headers and binary PCM messages."""

    def __init__(self, ws: WebSocket, sampling_rate: int) -> None:
        self.ws = ws
        self.encoder = codecs.StreamEncoder("pcm", sampling_rate)
        self.lock = asyncio.Lock()  # one message at a time from the sender and the reader

    async def send(self, event: dict[str, object]) -> None:
        async with self.lock:
            await self.ws.send_text(json.dumps(event))

    async def error(self, message: str, code: str) -> None:
        await self.send({"type": "error", "error": {"message": message, "code": code}})

    async def start(self, segment: Segment) -> None:
        await self.send({"type": "segment.start", "segment": segment.index, "text": segment.text})

    async def audio(self, segment: Segment, audio: Audio) -> None:
        data = self.encoder.push(audio)
        async with self.lock:
            await self.ws.send_bytes(data)

    async def done(self, segment: Segment) -> None:
        await self.send({"type": "segment.done", "segment": segment.index,
                         "samples": segment.samples})  # fmt: skip

    async def failed(self, segment: Segment, error: Exception) -> None:
        err = {"message": str(error), "code": error_code(error)}
        await self.send({"type": "segment.failed", "segment": segment.index, "error": err})


def session_options(srv: Server, query: dict[str, str]) -> tuple[SynthesisOptions, str, int]:
    """The query string -> (options, model, seed), checked as /v1/audio/speech checks a body."""
    assert srv.tts is not None
    unknown = sorted(set(query) - set(OPTIONS))
    if unknown:
        raise SpeechRTError(f"unknown parameter {unknown[0][:40]!r}; use {', '.join(OPTIONS)}")
    fields: dict[str, str] = {
        "input": "",
        "response_format": "pcm",
        "model": "tts",
        "voice": srv.tts.tts.name,
        **query,
    }
    try:
        body = SpeechRequest.model_validate(fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise SpeechRTError(f"{where}: {first.get('msg', 'invalid')}") from None
    try:
        options = _checked(body, srv)
    except ApiError as e:
        raise SpeechRTError(e.message) from None
    return options, body.model, body.seed


@router.websocket("/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    srv: Server = ws.app.state.server
    await ws.accept()
    try:
        if srv.tts is None:
            raise SpeechRTError("this server has no speech synthesis model")
        options, model, seed = session_options(srv, dict(ws.query_params))
    except SpeechRTError as e:
        err = {"message": str(e), "code": "invalid_request"}
        await ws.send_text(json.dumps({"type": "error", "error": err}))
        await ws.close(code=1008)
        return
    sr = srv.tts.sampling_rate
    sink = SocketSink(ws, sr)
    stream = SpeechStream(
        srv.tts,
        options,
        seed,
        sink,
        lambda seconds, failure: srv.metrics.record_request("tts", seconds, failure),
    )
    voice = voices_of(srv.tts.tts.name, srv.tts.tts.n_speakers)[options.speaker]["id"]
    await sink.send({"type": "session.created", "sample_rate": sr, "format": "pcm_s16le",
                     "model": model, "voice": voice})  # fmt: skip
    closing: asyncio.Task[None] | None = None

    async def close() -> None:
        await stream.finish()
        await sink.send({"type": "done"})
        await ws.close(code=1000)

    idle = srv.config.limits.realtime_idle_s
    try:
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), idle)
            except asyncio.TimeoutError:
                if not stream.idle or closing is not None:
                    continue  # audio is still on its way: the session is not idle
                await sink.error(f"no message for {idle:g} s: closing the session", "idle_timeout")
                await ws.close(code=1000)
                return
            if message["type"] == "websocket.disconnect":
                return
            try:
                if await handle(stream, sink, message, closing is not None) and not closing:
                    closing = asyncio.create_task(close())
            except (SpeechRTError, Overloaded, DeadlineExceeded, InferenceError) as e:
                await sink.error(str(e), error_code(e))
    except (WebSocketDisconnect, RuntimeError):
        return  # the client went away (RuntimeError: a receive after a close frame)
    finally:
        if closing is not None:
            closing.cancel()
            await asyncio.wait([closing])
            if not closing.cancelled():
                closing.exception()  # a send to a client that went away: nobody to tell
        await stream.close()


async def handle(stream: SpeechStream, sink: SocketSink, message: Message, closing: bool) -> bool:
    """One client message: cancel, text, flush; whether it asks to close (the caller's)."""
    if message.get("text") is None:
        raise SpeechRTError("messages are JSON text, not binary")
    try:
        event = json.loads(message["text"])
    except json.JSONDecodeError:
        raise SpeechRTError("not valid JSON") from None
    if not isinstance(event, dict) or not event:
        raise SpeechRTError(f"a message is a JSON object with any of {', '.join(KEYS)}")
    unknown = sorted(set(event) - set(KEYS))
    if unknown:
        raise SpeechRTError(f"unknown key {unknown[0][:40]!r}; use {', '.join(KEYS)}")
    for key in ("flush", "cancel", "close"):
        if key in event and not isinstance(event[key], bool):
            raise SpeechRTError(f"{key!r} must be true or false")
    text = event.get("text")
    if text is not None and not isinstance(text, str):
        raise SpeechRTError("'text' must be a string")
    if event.get("cancel"):
        dropped = await stream.cancel()
        await sink.send({"type": "cancelled", "segments": [s.index for s in dropped]})
    if closing and (text or event.get("flush")):
        raise SpeechRTError("the stream is closing: no more text")
    if text:
        await stream.push(text)
    if event.get("flush"):
        await stream.flush()
    return bool(event.get("close"))
