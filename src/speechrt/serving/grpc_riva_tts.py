"""Riva's speech synthesis over gRPC (`nvidia.riva.tts.RivaSpeechSynthesis`), on the voice the
HTTP routes serve (speechrt.serving.pipelines.TTSService, the same checks, batcher and limits).
`riva.client.SpeechSynthesisService` works against it unmodified.

Synthesize: the whole text's audio; with enable_word_time_offsets, each word's start and end
in milliseconds (meta.words; a voice whose acoustic model gives durations: FastPitch).
SynthesizeOnline: a stream of requests, each a text, read in turn; the audio comes back as it
is made: the first sentence's first frames as soon as they are vocoded, then each sentence
(TTSService.stream). Every request of one call takes the same encoding and rate.

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
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import grpc
import numpy as np
from riva.client.proto import riva_tts_pb2 as rtts
from riva.client.proto import riva_tts_pb2_grpc as rtts_grpc
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from speechrt.audio import codecs
from speechrt.audio.io import StreamResampler, resample
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.serving.errors import ApiError
from speechrt.serving.grpc_calls import Refused, streaming, unary
from speechrt.serving.grpc_riva import LANGUAGE, RATES, check_language, request_id
from speechrt.serving.metrics import failure_reason
from speechrt.serving.openai_api import speaker_of, voices_of
from speechrt.serving.v2models import options_from_params

if TYPE_CHECKING:
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


def speaking(request: Any, tts: TTSService, stream: bool) -> Speaking:
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


def encoded(audio: np.ndarray, sampling_rate: int, s: Speaking) -> bytes:
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

    def push(self, audio: np.ndarray) -> bytes:
        if self.resampler is not None:
            audio = self.resampler.push(audio)
        return self.encoder.push(audio)

    def finish(self) -> bytes:
        tail = self.encoder.push(self.resampler.flush()) if self.resampler is not None else b""
        return tail + self.encoder.finish()


class RivaTTS(rtts_grpc.RivaSpeechSynthesisServicer):
    def __init__(self, server: Server) -> None:
        assert server.tts is not None
        self.srv, self.tts = server, server.tts

    @unary
    async def Synthesize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        s = speaking(request, self.tts, stream=False)
        seed = s.options.seed
        words: list[dict[str, Any]] = []
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
                word=w["word"], start_time=round(w["start"] * 1000), end_time=round(w["end"] * 1000)
            )
        return response

    @streaming
    async def SynthesizeOnline(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        first: Speaking | None = None
        encoder: StreamEncoder | None = None
        last = None  # the id of the last request read
        async for request in requests:
            last = request_id(request)
            s = speaking(request, self.tts, stream=True)
            if first is None:
                first, encoder = s, StreamEncoder(self.tts.sampling_rate, s)
            elif (s.fmt, s.rate) != (first.fmt, first.rate):
                raise SpeechRTError("every request of a stream takes the same encoding and rate")
            assert encoder is not None
            async for data in self._speak(request, s, encoder):
                yield rtts.SynthesizeSpeechResponse(audio=data, id=request_id(request))
        if encoder is not None:
            tail = await asyncio.to_thread(encoder.finish)
            if tail:
                yield rtts.SynthesizeSpeechResponse(audio=tail, id=last)

    async def _speak(
        self, request: Any, s: Speaking, encoder: StreamEncoder
    ) -> AsyncIterator[bytes]:
        """One text's audio, encoded, as each piece is made (a request's metrics, as HTTP's)."""
        t0 = time.perf_counter()
        failure: str | None = "CANCELED"
        try:
            chunks = cast(
                AsyncGenerator[np.ndarray, None],
                await self.tts.stream(request.text, s.options, s.options.seed),
            )
            async with aclosing(chunks):  # however this ends, its queued pieces are cancelled
                async for audio in chunks:
                    data = await asyncio.to_thread(encoder.push, audio)
                    if data:
                        yield data
            failure = None
        except Exception as e:
            failure = failure_reason(e)
            raise
        finally:
            self.srv.metrics.record_request("tts", time.perf_counter() - t0, failure)

    @unary
    async def GetRivaSynthesisConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
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
