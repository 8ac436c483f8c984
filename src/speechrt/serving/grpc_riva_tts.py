"""Riva's speech synthesis over gRPC (`nvidia.riva.tts.RivaSpeechSynthesis`), on the voice the
HTTP routes serve (speechrt.serving.pipelines.TTSService, the same checks, batcher and limits).
`riva.client.SpeechSynthesisService` works against it unmodified.

Synthesize: the whole text's audio; with enable_word_time_offsets, each word's start and end
in milliseconds (meta.words; a voice whose acoustic model gives durations: FastPitch).
SynthesizeOnline: a stream of requests whose texts are pieces of one text (an LLM's tokens, or
whole sentences), joined as they are; each sentence is queued as soon as it is complete and its
audio comes back as it is made, the first frames as soon as they are vocoded (the incremental
splitter of the text-streaming WebSocket and Wyoming: speechrt.serving.text_stream). The end of
the requests ends the last sentence. Every request of one call takes the same voice, encoding,
rate and options; a stream takes plain text (SSML goes to Synthesize).

Encodings: LINEAR_PCM (or ENCODING_UNSPECIFIED): raw 16-bit little-endian PCM, as Riva sends it;
FLAC (Synthesize only): a FLAC file; OGGOPUS: an Ogg/Opus file at 48 kHz (sample_rate_hz 0 or
48000). sample_rate_hz (8-48 kHz; 0: the voice's) resamples the voice's audio. voice_name is the
voice's name, "<name>.<subvoice>" as GetRivaSynthesisConfig lists them, or any name
/v1/audio/speech's `voice` takes; empty: the first speaker. custom_configuration takes
SynthesisOptions fields as strings (pace, seed, pitch_shift, pitch_scale, pitch_flatten, ...).
An `input` beginning with "<speak" is SSML, as on HTTP. Refused with INVALID_ARGUMENT: MULAW and
ALAW output, zero-shot data, custom dictionaries, other languages than English, other keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

import grpc
from riva.client.proto import riva_tts_pb2 as rtts
from riva.client.proto import riva_tts_pb2_grpc as rtts_grpc
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from speechrt.audio import codecs
from speechrt.audio.io import StreamResampler, resample
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.serving.grpc_calls import Refused, streaming, unary
from speechrt.serving.grpc_riva import LANGUAGE, RATES, check_language, request_id
from speechrt.serving.http_errors import ApiError
from speechrt.serving.openai_api import speaker_of, voices_of
from speechrt.serving.text_stream import Segment, SpeechStream
from speechrt.serving.v2models import options_from_params
from speechrt.serving.voices import Audio

if TYPE_CHECKING:
    from riva.client.proto import riva_common_pb2 as riva_common

    from speechrt.serving.pipelines import TTSService
    from speechrt.serving.server import Server

FORMATS = {
    AudioEncoding.ENCODING_UNSPECIFIED: "pcm",
    AudioEncoding.LINEAR_PCM: "pcm",
    AudioEncoding.FLAC: "flac",
    AudioEncoding.OGGOPUS: "opus",
}


@dataclass(frozen=True)
class Speaking:
    """What a SynthesizeSpeechRequest asks for, checked."""

    options: SynthesisOptions
    fmt: str  # speechrt.audio.codecs format: pcm, flac or opus
    rate: int  # Hz of the audio sent


def speaking(request: rtts.SynthesizeSpeechRequest, tts: TTSService, stream: bool) -> Speaking:
    """A SynthesizeSpeechRequest -> Speaking, or a SpeechRTError naming what it cannot honour."""
    fmt = FORMATS.get(request.encoding)
    if fmt is None:
        known = dict(zip(AudioEncoding.values(), AudioEncoding.keys(), strict=True))
        raise SpeechRTError(
            f"encoding {known.get(request.encoding, request.encoding)} is not supported for "
            "speech; use LINEAR_PCM, FLAC or OGGOPUS"
        )
    if stream and fmt not in codecs.STREAMED:
        raise SpeechRTError("SynthesizeOnline sends LINEAR_PCM or OGGOPUS (FLAC is not streamed)")
    rate = request.sample_rate_hz or codecs.output_rate(fmt, tts.sampling_rate)
    if fmt == "opus" and rate != codecs.OPUS_RATE:
        raise SpeechRTError(
            f"OGGOPUS audio is {codecs.OPUS_RATE} Hz: set sample_rate_hz to it or 0"
        )
    if request.sample_rate_hz and not RATES[0] <= rate <= RATES[1]:
        raise SpeechRTError(f"sample_rate_hz must be within {RATES[0]}-{RATES[1]}, got {rate}")
    check_language(request.language_code)
    refused = {
        "zero_shot_data": request.HasField("zero_shot_data"),
        "custom_dictionary": bool(request.custom_dictionary),
        "enable_word_time_offsets in SynthesizeOnline (Synthesize gives them)": (
            stream and request.enable_word_time_offsets
        ),
    }
    asked = [name for name, on in refused.items() if on]
    if asked:
        raise SpeechRTError(f"not supported by this server: {'; '.join(asked)}")
    params = {k: _value(k, v) for k, v in request.custom_configuration.items()}
    if "speaker" in params:
        raise SpeechRTError("custom_configuration: the speaker is chosen by voice_name")
    options = options_from_params(params)
    unknown = sorted(set(params) - set(options.__dataclass_fields__))
    if unknown:
        raise SpeechRTError(
            f"custom_configuration: unknown keys {', '.join(k[:30] for k in unknown)}; it takes "
            "SynthesisOptions fields (pace, seed, pitch_shift, pitch_scale, pitch_flatten, ...)"
        )
    speaker = speaker_for(request.voice_name, tts)
    return Speaking(replace(options, speaker=speaker), fmt, rate)


def _value(key: str, text: str) -> bool | int | float:
    """A custom_configuration value: true/false, an integer, or a number."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise SpeechRTError(
            f"custom_configuration {key[:30]!r}: {text[:30]!r} is no number"
        ) from None


def speaker_for(voice_name: str, tts: TTSService) -> int:
    """voice_name -> speaker: empty is the first; "<voice>.<subvoice>" is the subvoice."""
    name, n = tts.tts.name, tts.tts.n_speakers
    if not voice_name:
        return 0
    if voice_name.lower().startswith(f"{name.lower()}."):
        voice_name = voice_name[len(name) + 1 :]
    try:
        return speaker_of(voice_name, name, n)
    except ApiError as e:
        raise SpeechRTError(e.message) from None


def encoded(audio: Audio, sampling_rate: int, s: Speaking) -> bytes:
    """Whole audio (N,) at the voice's rate -> the bytes Synthesize sends."""
    if s.fmt != "opus" and s.rate != sampling_rate:  # (the Opus encoder resamples to 48 kHz)
        audio, sampling_rate = resample(audio, sampling_rate, s.rate), s.rate
    return codecs.encode(audio, sampling_rate, s.fmt)


class StreamEncoder:
    """Audio chunks at the voice's rate -> the bytes SynthesizeOnline sends, as they are ready."""

    def __init__(self, sampling_rate: int, s: Speaking) -> None:
        resampled = s.fmt == "pcm" and s.rate != sampling_rate
        self.resampler = StreamResampler(sampling_rate, s.rate) if resampled else None
        self.encoder = codecs.StreamEncoder(s.fmt, s.rate if s.fmt == "pcm" else sampling_rate)

    def push(self, audio: Audio) -> bytes:
        if self.resampler is not None:
            audio = self.resampler.push(audio)
        return self.encoder.push(audio)

    def finish(self) -> bytes:
        tail = self.encoder.push(self.resampler.flush()) if self.resampler is not None else b""
        return tail + self.encoder.finish()


QUEUED_RESPONSES = 8  # audio chunks made ahead of the client's reading (then the stream waits)
# SynthesizeOnline's queue: a response, the error that ended the stream, or None: it is over
Queued: TypeAlias = "rtts.SynthesizeSpeechResponse | Exception | None"


class Responses:
    """A SpeechStream's audio -> SynthesizeSpeechResponses on a queue, each carrying the id of
    the last request read (Riva's clients send one id for a whole stream). The queue is bounded:
    a client that does not read holds the stream's sentences queued, where its text limit
    counts them."""

    def __init__(self, encoder: StreamEncoder, out: asyncio.Queue[Queued]) -> None:
        self.encoder, self.out = encoder, out
        self.last: riva_common.RequestId | None = None  # the last request's id

    async def _put(self, data: bytes) -> None:
        if data:
            await self.out.put(rtts.SynthesizeSpeechResponse(audio=data, id=self.last))

    async def start(self, segment: Segment) -> None:
        pass

    async def audio(self, segment: Segment, audio: Audio) -> None:
        await self._put(await asyncio.to_thread(self.encoder.push, audio))

    async def done(self, segment: Segment) -> None:
        pass

    async def failed(self, segment: Segment, error: Exception) -> None:
        await self.out.put(error)

    async def finish(self) -> None:
        """The encoder's tail (an Ogg stream's last page)."""
        await self._put(await asyncio.to_thread(self.encoder.finish))


class RivaTTS(rtts_grpc.RivaSpeechSynthesisServicer):
    def __init__(self, server: Server) -> None:
        assert server.tts is not None
        self.srv, self.tts = server, server.tts

    @unary
    async def Synthesize(
        self, request: rtts.SynthesizeSpeechRequest, context: grpc.aio.ServicerContext
    ) -> rtts.SynthesizeSpeechResponse:
        s = speaking(request, self.tts, stream=False)
        seed = s.options.seed
        words: list[dict[str, str | float]] = []
        async with self.srv.metrics.track("tts"):
            if request.enable_word_time_offsets:
                audio, words = await self.tts.synthesize_with_words(request.text, s.options, seed)
            else:
                (audio,) = await self.tts.synthesize([request.text], s.options, [seed])
        data = await asyncio.to_thread(encoded, audio, self.tts.sampling_rate, s)
        response = rtts.SynthesizeSpeechResponse(audio=data, id=request_id(request))
        response.meta.text = request.text
        for w in words:
            response.meta.words.add(
                word=w["word"],
                start_time=round(float(w["start"]) * 1000),
                end_time=round(float(w["end"]) * 1000),
            )
        return response

    @streaming
    async def SynthesizeOnline(
        self,
        requests: AsyncIterator[rtts.SynthesizeSpeechRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rtts.SynthesizeSpeechResponse]:
        # a reader task feeds the requests' texts to a SpeechStream while this yields its
        # audio: speech for a sentence starts once it is complete, whatever comes after
        out: asyncio.Queue[Queued] = asyncio.Queue(maxsize=QUEUED_RESPONSES)
        reader = asyncio.create_task(self._read(requests, out))
        try:
            while (item := await out.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            reader.cancel()
            await asyncio.wait([reader])

    def _stream(self, s: Speaking, sink: Responses) -> SpeechStream:
        metrics = self.srv.metrics
        return SpeechStream(
            self.tts,
            s.options,
            s.options.seed,
            sink,
            lambda seconds, failure: metrics.record_request("tts", seconds, failure),
        )

    async def _read(
        self, requests: AsyncIterator[rtts.SynthesizeSpeechRequest], out: asyncio.Queue[Queued]
    ) -> None:
        """The requests' texts into one SpeechStream, whose responses go to `out`; then its
        end (None), or the error that ended it."""
        stream: SpeechStream | None = None
        try:
            first: Speaking | None = None
            sink: Responses | None = None
            async for request in requests:
                s = speaking(request, self.tts, stream=True)
                if request.text.lstrip().startswith("<speak"):
                    raise SpeechRTError(
                        "SynthesizeOnline takes plain text, spoken sentence by sentence as it "
                        "arrives; SSML goes to Synthesize"
                    )
                if first is None:
                    first, sink = s, Responses(StreamEncoder(self.tts.sampling_rate, s), out)
                    stream = self._stream(s, sink)
                elif s != first:
                    raise SpeechRTError(
                        "every request of a stream takes the same voice, encoding, rate and "
                        "custom_configuration (its texts are one text)"
                    )
                assert stream is not None and sink is not None
                sink.last = request_id(request)
                await stream.push(request.text)
            if stream is None or sink is None:
                raise SpeechRTError("SynthesizeOnline got no request")
            await stream.finish()
            if stream.count == 0:
                raise SpeechRTError("the stream's text is empty: nothing to speak")
            await sink.finish()
            await out.put(None)
        except Exception as e:  # SynthesizeOnline raises it, ending the call with its status
            await out.put(e)
        finally:
            if stream is not None:
                await stream.close()

    @unary
    async def GetRivaSynthesisConfig(
        self, request: rtts.RivaSynthesisConfigRequest, context: grpc.aio.ServicerContext
    ) -> rtts.RivaSynthesisConfigResponse:
        name, n = self.tts.tts.name, self.tts.tts.n_speakers
        if request.model_name and request.model_name != name:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no voice {request.model_name[:60]!r}")
        subvoices = ",".join(f"{v['id']}:{v['speaker']}" for v in voices_of(name, n))
        params = {
            "language_code": LANGUAGE,
            "voice_name": name,
            "subvoices": subvoices,
            "sample_rate_hz": str(self.tts.sampling_rate),
        }
        Config = rtts.RivaSynthesisConfigResponse.Config
        return rtts.RivaSynthesisConfigResponse(
            model_config=[Config(model_name=name, parameters=params)]
        )


def add_service(grpc_server: grpc.aio.Server, server: Server) -> str:
    rtts_grpc.add_RivaSpeechSynthesisServicer_to_server(RivaTTS(server), grpc_server)
    return "nvidia.riva.tts.RivaSpeechSynthesis"
