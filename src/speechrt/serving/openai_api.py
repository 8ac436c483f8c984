"""The OpenAI audio API: /v1/audio/speech, /v1/audio/transcriptions, /v1/models; and
/v1/audio/voices (the names `voice` takes) and /v1/audio/speech/captioned (speech with its
words' times, as JSON: {audio (base64), format, sample_rate, words: [{word, start, end}]}).

Differences from OpenAI, by design: audio formats are mp3 (the default, as OpenAI's), opus, flac,
wav and pcm, not aac (speechrt.audio.codecs says why); wav, flac, pcm and mp3 carry the voice's
own sampling rate, opus 48 kHz, given in the X-Sample-Rate header (OpenAI's pcm is 24 kHz);
`voice` names a speaker from GET /v1/audio/voices: the voice's name, "N", "speaker-N", or an
OpenAI voice name (alloy, ...: the voice's first speaker); any other is a 400. An
extra `seed` field (default 0) picks the noise of stochastic models, so the same request gives
the same bytes; pitch_shift, pitch_scale, pitch_flatten and denoise are the other
SynthesisOptions. `stream_format: "audio"` streams mp3, opus, wav (a header with unknown length,
then PCM) or pcm: the first sentence's first mel frames as soon as they are vocoded, then each
sentence as it is ready (speechrt.serving.pipelines); a streamed wav or pcm's samples equal the
non-streamed response's within 2 int16 steps (the first sentence is vocoded in two spans), a
streamed mp3 or opus decodes to the same audio (an mp3 stream starts with LAME's encoder delay).
An `input` starting with "<speak" (or "<?xml") is SSML (speechrt.text.ssml); bad markup is a
400 naming it.
Transcription takes any file libsndfile reads (WAV, FLAC, OGG, ...) at any rate; `stream=true`
answers server-sent events of the same transcription (a `transcript.text.delta` per word, then
`transcript.text.done` with the text the same request without `stream` returns); `language`,
`prompt` and `temperature` are accepted and ignored (English models; CTC decoding as the server
was started: greedy, or beam search with the recogniser's word LM).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, TypedDict

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from pydantic import Field as PydanticField
from starlette.datastructures import UploadFile

from speechrt.audio import codecs
from speechrt.options import SynthesisOptions
from speechrt.serving import transcripts
from speechrt.serving.bodies import Body, Field, FormReader, request_body
from speechrt.serving.http_errors import ApiError
from speechrt.serving.metrics import failure_reason

if TYPE_CHECKING:
    from speechrt.serving.server import Server

router = APIRouter(prefix="/v1")

SPEED_RANGE = (0.25, 4.0)  # OpenAI's
STREAM_FORMATS = ("audio",)  # OpenAI's "sse" is not supported
# Model names the OpenAI API accepts for each pipeline (besides the pipeline's own name).
TTS_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
ASR_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
STARTED = int(time.time())


def server_of(request: Request) -> Server:
    return request.app.state.server


def _served(srv: Server, want: str) -> list[str]:
    """The OpenAI model names of this server's `want` ('tts' / 'asr') pipeline."""
    return [n for n in srv.openai_models() if srv.pipeline_of(n) == want]


def check_model(model: str, want: str, served: Sequence[str]) -> None:
    """A 404 unless `model` is one of `served`, the names of this server's `want` models."""
    if model not in served:
        raise ApiError(
            404,
            f"model {model!r} not found; this server's {want} models: "
            f"{', '.join(served) or 'none'}",
            "model_not_found",
            "model",
        )


class VoiceRef(BaseModel):
    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. `instructions`, which we cannot follow

    model: str
    input: str
    voice: str | VoiceRef
    # speech_options checks these three against the constants their schemas show
    response_format: str = PydanticField("mp3", json_schema_extra={"enum": list(codecs.FORMATS)})
    speed: float = PydanticField(
        1.0, json_schema_extra={"minimum": SPEED_RANGE[0], "maximum": SPEED_RANGE[1]}
    )
    stream_format: str | None = PydanticField(
        None, json_schema_extra={"enum": [*STREAM_FORMATS, None]}
    )
    # speechrt extensions: SynthesisOptions fields (speed is `pace`, voice is `speaker`)
    seed: int = 0
    pitch_shift: float = 0.0
    pitch_scale: float = 1.0
    pitch_flatten: bool = False
    denoise: float = 0.0


# OpenAI's voice names: each is the voice's first speaker, so OpenAI clients work unchanged
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
    "verse", "marin", "cedar",
)  # fmt: skip


class VoiceEntry(TypedDict):
    id: str
    speaker: int
    aliases: list[str]


def voices_of(name: str, n_speakers: int) -> list[VoiceEntry]:
    """The speakers of a voice called `name`: {id, speaker, aliases} each. A single-speaker
    voice's id is its name; a multi-speaker one's are "<name>-<N>". Every speaker also answers
    to "N" and "speaker-N", and speaker 0 to the voice's name and OpenAI's voice names."""
    out: list[VoiceEntry] = []
    for n in range(n_speakers):
        ident = name if n_speakers == 1 else f"{name}-{n}"
        aliases = [str(n), f"speaker-{n}"]
        if n == 0:
            aliases += ([name] if n_speakers > 1 else []) + list(OPENAI_VOICES)
        out.append({"id": ident, "speaker": n, "aliases": aliases})
    return out


def speaker_of(voice: str | VoiceRef, name: str, n_speakers: int) -> int:
    """A request's `voice` (a voice id or alias, any case) -> its speaker id; else a 400 that
    names the voices on offer."""
    wanted = (voice.id if isinstance(voice, VoiceRef) else voice).strip().lower()
    entries = voices_of(name, n_speakers)
    for v in entries:
        if wanted in (v["id"].lower(), *v["aliases"]):
            return int(v["speaker"])
    raise ApiError(400, unknown_voice(wanted, entries), "voice_not_found", "voice")


def unknown_voice(wanted: str, entries: list[VoiceEntry]) -> str:
    """What a request may name instead of `wanted`: the voices (at most 8 listed), speaker
    numbers, and OpenAI's names for the first voice."""
    ids = [v["id"] for v in entries]
    listed = ", ".join(ids[:8]) + (f", ... ({len(ids)} voices)" if len(ids) > 8 else "")
    numbers = "0 or speaker-0" if len(ids) == 1 else f"0 to {len(ids) - 1} or speaker-N"
    return (
        f"voice {wanted[:60]!r} not found; this server's voices: {listed}; also {numbers}, "
        f"and OpenAI's voice names ({', '.join(OPENAI_VOICES)}) for {ids[0]}"
    )


def _checked(body: SpeechRequest, srv: Server) -> SynthesisOptions:
    """The request's SynthesisOptions, once its model, format, speed and voice are checked."""
    if srv.tts is None:
        check_model(body.model, "tts", [])  # no voice: a 404 whatever the model
    assert srv.tts is not None
    return speech_options(body, _served(srv, "tts"), srv.tts.tts.name, srv.tts.tts.n_speakers)


def speech_options(
    body: SpeechRequest, served: Sequence[str], voice: str, n_speakers: int
) -> SynthesisOptions:
    """The request's SynthesisOptions, once its model (one of `served`), format, speed, stream
    format and voice (of the voice called `voice`) are checked: every speech route's checks
    (this server's, and the Ray split pipeline's, speechrt.serving.ray_tts)."""
    check_model(body.model, "tts", served)
    fmt = body.response_format
    if fmt not in codecs.FORMATS:
        # kept out on purpose (README, Speech formats): libsndfile has no AAC encoder, and
        # FFmpeg's (PyAV) would bring native libraries the runtime otherwise does without
        why = (
            " (libsndfile, which encodes the audio here, has no AAC encoder)"
            if fmt == "aac"
            else ""
        )
        raise ApiError(
            400,
            f"response_format {fmt!r} is not supported{why}; use {', '.join(codecs.FORMATS)}",
            "unsupported_format",
            "response_format",
        )
    lo, hi = SPEED_RANGE
    if not lo <= body.speed <= hi:
        raise ApiError(400, f"speed must be within [{lo}, {hi}], got {body.speed}", None, "speed")
    if body.stream_format is not None and body.stream_format not in STREAM_FORMATS:
        raise ApiError(
            400, "only stream_format 'audio' is supported", "unsupported_stream", "stream_format"
        )
    if body.stream_format == "audio" and fmt not in codecs.STREAMED:
        raise ApiError(
            400,
            f"streaming supports {', '.join(codecs.STREAMED)}",
            "unsupported_format",
            "stream_format",
        )
    return SynthesisOptions(
        pace=body.speed,
        speaker=speaker_of(body.voice, voice, n_speakers),
        seed=body.seed,
        pitch_shift=body.pitch_shift,
        pitch_scale=body.pitch_scale,
        pitch_flatten=body.pitch_flatten,
        denoise=body.denoise,
    )


@router.post("/audio/speech")
async def speech(body: SpeechRequest, request: Request) -> Response:
    srv = server_of(request)
    options = _checked(body, srv)
    assert srv.tts is not None
    fmt = body.response_format
    sr = srv.tts.sampling_rate
    headers = {"X-Sample-Rate": str(codecs.output_rate(fmt, sr))}
    if body.stream_format == "audio":
        return await _stream(srv, body, options, headers)
    async with srv.metrics.track("tts"):
        (audio,) = await srv.tts.synthesize([body.input], options, [body.seed])
    data = await asyncio.to_thread(codecs.encode, audio, sr, fmt)
    return Response(data, media_type=codecs.MEDIA_TYPES[fmt], headers=headers)


@router.post("/audio/speech/captioned")
async def captioned_speech(body: SpeechRequest, request: Request) -> JSONResponse:
    """The speech of /audio/speech (same body; not streamed) with each word's start and end:
    {audio: base64 of the file, format, sample_rate, words: [{word, start, end}]}."""
    srv = server_of(request)
    options = _checked(body, srv)
    assert srv.tts is not None
    if body.stream_format is not None:
        raise ApiError(
            400, "captioned speech is not streamed", "unsupported_stream", "stream_format"
        )
    fmt, sr = body.response_format, srv.tts.sampling_rate
    async with srv.metrics.track("tts"):
        audio, words = await srv.tts.synthesize_with_words(body.input, options, body.seed)
    data = await asyncio.to_thread(codecs.encode, audio, sr, fmt)
    return JSONResponse(
        {
            "audio": base64.b64encode(data).decode("ascii"),
            "format": fmt,
            "sample_rate": codecs.output_rate(fmt, sr),
            "words": words,
        }
    )


async def _stream(
    srv: Server, body: SpeechRequest, options: SynthesisOptions, headers: dict[str, str]
) -> StreamingResponse:
    assert srv.tts is not None
    t0 = time.perf_counter()
    try:
        chunks = await srv.tts.stream(body.input, options, body.seed)
    except Exception as e:
        srv.metrics.record_request("tts", time.perf_counter() - t0, failure_reason(e))
        raise

    encoder = codecs.StreamEncoder(body.response_format, srv.tts.sampling_rate)

    async def audio_bytes() -> AsyncIterator[bytes]:
        failure: str | None = "CANCELED"
        try:
            async for audio in chunks:
                data = await asyncio.to_thread(encoder.push, audio)
                if data:
                    yield data
            tail = await asyncio.to_thread(encoder.finish)
            if tail:
                yield tail
            failure = None
        except Exception:
            failure = "BACKEND"
            raise
        finally:
            srv.metrics.record_request("tts", time.perf_counter() - t0, failure)

    media = codecs.MEDIA_TYPES[body.response_format]
    return StreamingResponse(audio_bytes(), media_type=media, headers=headers)


TRANSCRIPTION_FORM = Body(
    "TranscriptionForm",
    "OpenAI's transcription form; language, prompt and temperature are accepted and ignored.",
    (
        Field("file", "file", "the audio: any file libsndfile reads, at any rate", required=True),
        Field("model", "string", required=True),
        Field("response_format", "string", default="json", choices=transcripts.FORMATS),
        Field(
            "timestamp_granularities[]",
            "array",
            "with response_format verbose_json: word and/or segment times",
            items="string",
            choices=transcripts.GRANULARITIES,
            aliases=("timestamp_granularities",),
        ),
        Field(
            "stream",
            "boolean",
            "server-sent events: transcript.text.delta as words are recognised, then "
            "transcript.text.done with the final text (response_format json or text)",
            default=False,
            example=True,
        ),
        Field("language", "string", example="en"),
        Field("prompt", "string", example="a prompt"),
        Field("temperature", "number", example=0.0),
    ),
)


def _form_str(form: FormReader, name: str) -> str | None:
    value = form.value(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{name!r} must be a text field, not a file", None, name)
    return value


@router.post(
    "/audio/transcriptions",
    openapi_extra=request_body(TRANSCRIPTION_FORM, "multipart/form-data"),
)
async def transcriptions(request: Request) -> Response:
    srv = server_of(request)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(
            415, "expected a multipart/form-data body with a 'file' field", "unsupported_media"
        )
    form = await request.form(max_files=1, max_fields=64)
    try:
        return await _transcribe(srv, FormReader(form, TRANSCRIPTION_FORM))
    finally:
        await form.close()


async def _transcribe(srv: Server, form: FormReader) -> Response:
    """The form's fields as TRANSCRIPTION_FORM declares them (language, prompt and temperature
    are not read), checked in this order: model, file, formats, stream."""
    model = _form_str(form, "model")
    if not model:
        raise ApiError(400, "missing required parameter 'model'", None, "model")
    check_model(model, "asr", _served(srv, "asr"))
    assert srv.asr is not None
    upload = form.value("file")
    if not isinstance(upload, UploadFile):
        raise ApiError(400, "missing required file 'file'", None, "file")
    fmt = _form_str(form, "response_format")
    formats = TRANSCRIPTION_FORM.field("response_format").choices
    if fmt not in formats:
        raise ApiError(
            400,
            f"response_format {fmt!r} is not one of {', '.join(formats)}",
            "unsupported_format",
            "response_format",
        )
    fields = form.values("timestamp_granularities[]")
    grains = [g for g in fields if isinstance(g, str)]
    for g in fields:
        if g not in TRANSCRIPTION_FORM.field("timestamp_granularities[]").choices:
            # (a file is not one either)
            raise ApiError(
                400, f"unknown timestamp granularity {g!r}", None, "timestamp_granularities"
            )
    if grains and fmt != "verbose_json":
        raise ApiError(
            400,
            "timestamp_granularities need response_format 'verbose_json'",
            None,
            "timestamp_granularities",
        )
    stream = (_form_str(form, "stream") or "false").lower()
    if stream not in ("true", "false"):
        raise ApiError(400, f"stream must be true or false, got {stream[:20]!r}", None, "stream")
    if stream == "true" and fmt not in ("json", "text"):
        raise ApiError(
            400,
            "stream=true sends server-sent events: response_format must be json or text",
            "unsupported_format",
            "response_format",
        )
    data = await upload.read()
    if stream == "true":
        return await _transcribe_stream(srv, data)
    async with srv.metrics.track("asr"):
        audio = await srv.asr.decode(data)
        (result,) = await srv.asr.transcribe([audio])
    if fmt == "json":
        return JSONResponse({"text": result.text})
    if fmt == "verbose_json":
        return JSONResponse(transcripts.verbose_json(result, grains))
    if fmt == "text":
        return PlainTextResponse(result.text)
    if fmt == "srt":
        return PlainTextResponse(transcripts.srt(result))
    return PlainTextResponse(transcripts.vtt(result), media_type="text/vtt")


def _sse(event: dict[str, str]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


async def _transcribe_stream(srv: Server, data: bytes) -> StreamingResponse:
    """Server-sent events of the upload's offline transcription (what the same request without
    `stream` returns, at its cost): a `transcript.text.delta` per word, then
    `transcript.text.done` with the text. The upload is recognised before the stream starts,
    so a bad file or a full queue is a 4xx or 503, not a broken stream. The streaming
    recogniser is for live audio (the realtime WebSocket): run over a whole upload at once it
    recomputes each chunk's context many times (a 599 s upload took 312 s of CPU, 51 s
    offline)."""
    assert srv.asr is not None
    async with srv.metrics.track("asr"):
        audio = await srv.asr.decode(data)
        (result,) = await srv.asr.transcribe([audio])
    text = str(result.text)

    async def events() -> AsyncIterator[bytes]:
        for k, word in enumerate(text.split(" ") if text else []):
            yield _sse({"type": "transcript.text.delta", "delta": (" " if k else "") + word})
        yield _sse({"type": "transcript.text.done", "text": text})

    return StreamingResponse(events(), media_type="text/event-stream")


@router.get("/audio/voices")
async def voices(request: Request) -> dict[str, object]:
    """The loaded voice's speakers, the names `voice` accepts (Kokoro-FastAPI's route)."""
    tts = server_of(request).tts
    if tts is None:
        raise ApiError(404, "this server has no speech synthesis model", "model_not_found")
    return {"object": "list", "voices": voices_of(tts.tts.name, tts.tts.n_speakers)}


def _model_entry(name: str) -> dict[str, str | int]:
    return {"id": name, "object": "model", "created": STARTED, "owned_by": "speechrt"}


@router.get("/models")
async def models(request: Request) -> dict[str, object]:
    names = server_of(request).openai_models()
    return {"object": "list", "data": [_model_entry(n) for n in names]}


@router.get("/models/{model}")
async def model(model: str, request: Request) -> dict[str, str | int]:
    if model not in server_of(request).openai_models():
        raise ApiError(404, f"model {model!r} not found", "model_not_found", "model")
    return _model_entry(model)
