"""OpenAI's realtime transcription over WebSocket: `/v1/realtime?intent=transcription`.

Client events: `session.update` (GA: session.type "transcription", session.audio.input.format
{type: "audio/pcm", rate} or {type: "audio/pcmu"} / {type: "audio/pcma"}) or
`transcription_session.update` (beta: input_audio_format "pcm16", "g711_ulaw" or "g711_alaw"),
`input_audio_buffer.append` (base64 little-endian 16-bit mono PCM, 24 kHz unless the session says
otherwise; or G.711 mu-law / A-law bytes at 8 kHz, as telephone networks send them),
`input_audio_buffer.commit`, `input_audio_buffer.clear`. Server events:
`session.created`, `session.updated` / `transcription_session.updated`,
`conversation.item.input_audio_transcription.delta` (a chunk of new words, at most every 0.5 s of
audio: speechrt.serving.streams), `input_audio_buffer.committed`,
`conversation.item.input_audio_transcription.completed` (the final text: offline transcription
of the committed audio), `input_audio_buffer.cleared`, and `error` for any event it cannot
follow, after which the session goes on.

Turn detection: `turn_detection` null (the client commits each utterance) or
`{"type": "server_vad", "silence_duration_ms", "prefix_padding_ms"}`: the server's energy
detector (speechrt.asr.vad.TurnDetector, the one offline transcription uses, fed as audio
arrives) sends `input_audio_buffer.speech_started` / `.speech_stopped` and commits the buffer
when speech is followed by `silence_duration_ms` of quiet. Its `threshold` is accepted and not
used (the detector sets its own from the audio's noise floor); `semantic_vad` is refused.
Other differences from OpenAI, by design: a pcm `rate` may be any of 8-48 kHz, not only 24 kHz.
Audio at 8 kHz (G.711 or pcm) is heard through the recogniser's telephone band where it has one
(speechrt.audio.telephone), as an 8 kHz file is.
Limits: a committed utterance holds at most the server's --max-audio-seconds (an append past it
is refused with an error event); one message at most MAX_MESSAGE_BYTES; a session that sends
nothing for `realtime_idle_s` is closed (code 1000 after an error event). Messages are handled in
order as they arrive, with nothing queued beyond the socket's own buffer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import uuid
from typing import TypedDict

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from speechrt.asr.vad import TurnDetector
from speechrt.audio.telephone import G711_RATE, g711_decode
from speechrt.errors import SpeechRTError
from speechrt.serving.streams import RecognitionStream
from speechrt.serving.voices import Audio

router = APIRouter(prefix="/v1")
log = logging.getLogger("speechrt.serving")

DEFAULT_RATE = 24000  # OpenAI's pcm16
# input formats: the GA format type and the beta input_audio_format name -> G.711 law (None:
# 16-bit PCM); G.711 is 8 kHz, as the telephone network sends it
FORMATS = {"audio/pcm": None, "audio/pcmu": "ulaw", "audio/pcma": "alaw"}
BETA_FORMATS = {"pcm16": None, "g711_ulaw": "ulaw", "g711_alaw": "alaw"}
RATES = (8000, 48000)  # the rates a session may ask for
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one WebSocket message (uvicorn's ws_max_size)
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
              "silence_duration_ms": 500}  # OpenAI's defaults  # fmt: skip


class Turn(TypedDict):
    """server_vad's settings, as a session serves them (SERVER_VAD's keys, in its order)."""

    type: str
    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class EventError(Exception):
    """A client event the session cannot follow: answered with an `error` event."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


def law_of(name: object, known: dict[str, str | None], what: str, param: str) -> str | None:
    """A format's name -> its G.711 law (None: 16-bit PCM); an error event for another."""
    if not isinstance(name, str) or name not in known:
        raise EventError(
            f"{what} {str(name)[:30]!r} is not supported; use one of {', '.join(known)}",
            "unsupported_audio_format",
            param,
        )
    return known[name]


class Session:
    """One WebSocket's transcription session: its settings and the utterance being appended."""

    def __init__(self, ws: WebSocket, model: str) -> None:
        self.ws = ws
        self.srv = ws.app.state.server
        self.model = model
        self.id = _id("sess")
        self.rate = DEFAULT_RATE
        self.law: str | None = None  # G.711's (8 kHz), or None: 16-bit PCM
        self.max_samples = int(self.srv.config.limits.max_audio_seconds * DEFAULT_RATE)
        self.stream: RecognitionStream | None = None
        self.item_id = _id("item")
        self.previous_item: str | None = None
        self.turn: Turn | None = None  # server_vad settings, None: the client commits
        self.detector: TurnDetector | None = None
        self.heard = 0  # samples appended since the detector started (its positions)

    async def send(self, event: dict[str, object]) -> None:
        await self.ws.send_text(json.dumps({"event_id": _id("event"), **event}))

    async def error(self, e: EventError, client_event: str | None) -> None:
        err: dict[str, str | None] = {"type": "invalid_request_error", "code": e.code}
        err.update(message=e.message, param=e.param, event_id=client_event)
        await self.send({"type": "error", "error": err})

    def session_object(self, beta: bool = False) -> dict[str, object]:
        transcription = {"model": self.model, "language": "en", "prompt": ""}
        if beta:
            return {
                "id": self.id,
                "object": "realtime.transcription_session",
                "modalities": ["text"],
                "input_audio_format": {v: k for k, v in BETA_FORMATS.items()}[self.law],
                "input_audio_transcription": transcription,
                "turn_detection": self.turn,
            }
        fmt: dict[str, str | int] = {"type": {v: k for k, v in FORMATS.items()}[self.law]}
        if self.law is None:
            fmt["rate"] = self.rate
        return {
            "type": "transcription",
            "object": "realtime.transcription_session",
            "id": self.id,
            "audio": {"input": {"format": fmt, "transcription": transcription,
                                "turn_detection": self.turn, "noise_reduction": None}},
            "include": [],
        }  # fmt: skip

    # -- client events ---------------------------------------------------------------------------

    async def handle(self, event: dict[str, object]) -> None:
        kind = event.get("type")
        if kind == "input_audio_buffer.append":
            await self.append(event.get("audio"))
        elif kind == "input_audio_buffer.commit":
            await self.commit()
        elif kind == "input_audio_buffer.clear":
            self.stream = None
            await self.send({"type": "input_audio_buffer.cleared"})
        elif kind in ("session.update", "transcription_session.update"):
            beta = kind == "transcription_session.update"
            self.update(event.get("session"), beta)
            updated = "transcription_session.updated" if beta else "session.updated"
            await self.send({"type": updated, "session": self.session_object(beta)})
        else:
            raise EventError(
                f"unsupported event type {str(kind)[:60]!r}; a transcription session takes "
                "session.update, input_audio_buffer.append, .commit and .clear",
                "invalid_event_type",
                "type",
            )

    def update(self, session: object, beta: bool) -> None:
        if not isinstance(session, dict):
            raise EventError("`session` must be an object", "invalid_session", "session")
        law, rate = self.law, self.rate  # a session.update without a format keeps the format
        if beta:
            fmt = session.get("input_audio_format")
            if fmt is not None:
                law = law_of(fmt, BETA_FORMATS, "input_audio_format", "session.input_audio_format")
                rate = DEFAULT_RATE if law is None else G711_RATE
            turn = session.get("turn_detection")
        else:
            if session.get("type", "transcription") != "transcription":
                raise EventError(
                    "only transcription sessions are served (session.type 'transcription')",
                    "unsupported_session_type",
                    "session.type",
                )
            audio = session.get("audio") or {}
            audio_in = (audio.get("input") if isinstance(audio, dict) else audio) or {}
            if not isinstance(audio_in, dict):
                raise EventError(
                    "session.audio.input must be an object", "invalid_session", "session.audio"
                )
            fmt = audio_in.get("format")
            if fmt is not None:
                kind = fmt.get("type", "audio/pcm") if isinstance(fmt, dict) else None
                law = law_of(kind, FORMATS, "audio format", "session.audio.input.format")
                rate = fmt.get("rate", DEFAULT_RATE if law is None else G711_RATE)
                if law is not None and rate != G711_RATE:
                    raise EventError(
                        f"{kind} is {G711_RATE} Hz audio",
                        "invalid_rate",
                        "session.audio.input.format.rate",
                    )
            turn = audio_in.get("turn_detection")
        turn = self.turn_settings(turn)
        if not isinstance(rate, int) or not RATES[0] <= rate <= RATES[1]:
            raise EventError(
                f"rate must be an integer in [{RATES[0]}, {RATES[1]}] Hz",
                "invalid_rate",
                "session.audio.input.format.rate",
            )
        if (rate, law) != (self.rate, self.law) and self.stream is not None:
            raise EventError(
                "the format cannot change while the buffer holds audio (commit or clear it first)",
                "buffer_not_empty",
                "session.audio.input.format",
            )
        self.rate, self.law = rate, law
        self.max_samples = int(self.srv.config.limits.max_audio_seconds * rate)
        if turn != self.turn or (self.detector is not None and self.detector.hop != rate // 100):
            self.turn, self.detector, self.heard = turn, None, 0
            if turn is not None:
                self.detector = TurnDetector(rate, silence=turn["silence_duration_ms"] / 1000)

    @staticmethod
    def turn_settings(turn: object) -> Turn | None:
        """turn_detection as asked -> the settings served (None: the client commits)."""
        if turn is None:
            return None
        bad = EventError(
            'turn_detection must be null or {"type": "server_vad", '
            '"silence_duration_ms": 100-10000, "prefix_padding_ms": 0-10000}',
            "unsupported_turn_detection",
            "session.turn_detection",
        )
        if not isinstance(turn, dict) or turn.get("type") != "server_vad":
            raise bad
        out = {**SERVER_VAD, **{k: v for k, v in turn.items() if v is not None}}
        silence, pad = out["silence_duration_ms"], out["prefix_padding_ms"]
        if isinstance(silence, bool) or isinstance(pad, bool):
            raise bad
        if not isinstance(silence, int) or not isinstance(pad, int):
            raise bad
        threshold = out["threshold"]
        if not 100 <= silence <= 10000 or not 0 <= pad <= 10000:
            raise bad
        if not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise bad
        # create_response etc.: nothing to create
        return Turn(
            type="server_vad",
            threshold=threshold,
            prefix_padding_ms=pad,
            silence_duration_ms=silence,
        )

    async def append(self, audio: object) -> None:
        if not isinstance(audio, str):
            raise EventError("`audio` must be a base64 string", "invalid_audio", "audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("`audio` is not valid base64", "invalid_audio", "audio") from None
        if self.law is not None:  # G.711: a byte per sample
            pcm = g711_decode(data, self.law)
        elif len(data) % 2:
            raise EventError(
                "`audio` must be 16-bit PCM (an even number of bytes)", "invalid_audio", "audio"
            )
        else:
            pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        held = self.stream.samples if self.stream is not None else 0
        if held + pcm.size > self.max_samples:
            limit = self.srv.config.limits.max_audio_seconds
            raise EventError(
                f"the input audio buffer would exceed {limit:g} s; commit it first",
                "input_audio_buffer_too_large",
                "audio",
            )
        if pcm.size == 0:
            return
        events = self.detector.push(pcm) if self.detector is not None else []
        first, done = self.heard, 0  # detector position of pcm[0]; samples of pcm handled
        self.heard += pcm.size
        for kind, at, decided in events:
            if kind == "start":
                pad_ms = self.turn["prefix_padding_ms"] if self.turn is not None else 0
                start_ms = max(0, round(at * 1000 / self.rate) - pad_ms)
                await self.send({"type": "input_audio_buffer.speech_started",
                                 "audio_start_ms": start_ms, "item_id": self.item_id})  # fmt: skip
                continue
            await self.feed(pcm[done : decided - first])  # the utterance ends here
            done = decided - first
            await self.send({"type": "input_audio_buffer.speech_stopped",
                             "audio_end_ms": round(at * 1000 / self.rate),
                             "item_id": self.item_id})  # fmt: skip
            if self.stream is not None:  # else the client committed this utterance already
                await self.commit()
        await self.feed(pcm[done:])

    async def feed(self, pcm: Audio) -> None:
        """Samples into the utterance being heard; its deltas out."""
        if pcm.size == 0:
            return
        if self.stream is None:
            self.stream = RecognitionStream(self.srv, self.rate)
        for delta in await self.stream.push(pcm):
            await self.delta(delta)

    async def delta(self, text: str) -> None:
        await self.send(
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": self.item_id,
                "content_index": 0,
                "delta": text,
            }
        )

    async def commit(self) -> None:
        stream = self.stream
        min_s = self.srv.asr.asr.features.min_samples / self.srv.asr.sampling_rate
        if stream is None or stream.seconds < min_s:
            raise EventError(
                f"the input audio buffer holds less than {min_s * 1000:.0f} ms of audio",
                "input_audio_buffer_commit_empty",
            )
        item = self.item_id
        await self.send(
            {
                "type": "input_audio_buffer.committed",
                "item_id": item,
                "previous_item_id": self.previous_item,
            }
        )
        self.stream, self.previous_item, self.item_id = None, item, _id("item")
        try:
            last, text = await stream.finish()
        except SpeechRTError as e:
            await self.send(
                {
                    "type": "conversation.item.input_audio_transcription.failed",
                    "item_id": item,
                    "content_index": 0,
                    "error": {"type": "invalid_request_error", "message": str(e)},
                }
            )
            return
        if last:
            await self.send(
                {
                    "type": "conversation.item.input_audio_transcription.delta",
                    "item_id": item,
                    "content_index": 0,
                    "delta": last,
                }
            )
        await self.send(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": item,
                "content_index": 0,
                "transcript": text,
                "usage": {"type": "duration", "seconds": round(stream.seconds, 3)},
            }
        )


@router.websocket("/realtime")
async def realtime(ws: WebSocket) -> None:
    srv = ws.app.state.server
    intent = ws.query_params.get("intent", "transcription")
    model = ws.query_params.get("model")
    # a browser offers ["realtime", "openai-insecure-api-key.KEY"] (speechrt.serving.auth) and
    # drops a connection whose answer names none of them
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    why = code = None
    if srv.asr is None:
        why, code = "this server has no speech recognition model", "model_not_found"
    elif intent != "transcription":
        why = "only transcription sessions are served (?intent=transcription)"
        code = "unsupported_session"
    elif model is not None and srv.pipeline_of(model) != "asr":
        served = ", ".join(n for n in srv.openai_models() if srv.pipeline_of(n) == "asr")
        why = f"model {model[:60]!r} is not a transcription model here; use one of {served}"
        code = "model_not_found"
    if why is not None:
        err = {"type": "invalid_request_error", "code": code, "message": why}
        await ws.send_text(json.dumps({"event_id": _id("event"), "type": "error", "error": err}))
        await ws.close(code=1008)
        return
    session = Session(ws, model or "asr")
    await session.send({"type": "session.created", "session": session.session_object()})
    idle = srv.config.limits.realtime_idle_s
    try:
        while True:
            try:
                message = await asyncio.wait_for(ws.receive(), idle)
            except asyncio.TimeoutError:
                e = EventError(f"no event for {idle:g} s: closing the session", "idle_timeout")
                await session.error(e, None)
                await ws.close(code=1000)
                return
            if message["type"] == "websocket.disconnect":
                return
            event_id = None
            try:
                if message.get("text") is None:
                    raise EventError("events are JSON text messages, not binary", "invalid_json")
                event = json.loads(message["text"])
                if not isinstance(event, dict):
                    raise EventError("an event must be a JSON object", "invalid_json")
                event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
                await session.handle(event)
            except json.JSONDecodeError:
                await session.error(EventError("not valid JSON", "invalid_json"), None)
            except EventError as e:
                await session.error(e, event_id)
            except SpeechRTError as e:
                await session.error(EventError(str(e), "invalid_audio"), event_id)
    except (WebSocketDisconnect, RuntimeError):
        return  # the client went away (RuntimeError: a receive after a close frame)
