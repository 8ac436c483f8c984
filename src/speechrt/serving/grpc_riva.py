"""Riva's speech recognition over gRPC (`nvidia.riva.asr.RivaSpeechRecognition`), on the
recogniser the HTTP routes serve (speechrt.serving.pipelines.ASRService); the synthesis service
is speechrt.serving.grpc_riva_tts. `riva.client.ASRService` works against it unmodified.

Recognize: the audio is a file (bytes that begin as a WAV, FLAC or Ogg file: any format
libsndfile reads, as HTTP uploads) or raw samples: 16-bit little-endian PCM (LINEAR_PCM or
ENCODING_UNSPECIFIED) or G.711 (MULAW, ALAW: 8 kHz unless sample_rate_hertz says otherwise),
channels averaged. Word times (enable_word_time_offsets) are in milliseconds.

StreamingRecognize: the first request carries the config, the others audio: raw LINEAR_PCM,
MULAW or ALAW, or a 16-bit PCM WAV file's bytes (riva.client sends a file as it is, header
first). The stream is one utterance: interim results (interim_results) carry the newest partial
transcript, whole, about every 0.5 s of audio (speechrt.serving.streams; without them the
audio is only gathered, no streaming step runs); when the client ends
the stream, one final result carries the offline transcription of all its audio, the text and
words Recognize gives for the same samples. A stream holds at most --max-audio-seconds.

Fields speechrt cannot honour are refused with INVALID_ARGUMENT: profanity_filter, speech
contexts (word boosting), speaker diarization, per-channel recognition, endpointing,
custom_configuration, runtime_config, automatic punctuation from a recogniser without
punctuation in its vocabulary, a language other than English, a model this server does not
serve. verbatim_transcripts may be either: transcripts are always verbatim (no inverse text
normalisation), and proto3 cannot tell false from unset. max_alternatives is a maximum: one is
returned.
"""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import numpy as np
from riva.client.proto import riva_asr_pb2 as rasr
from riva.client.proto import riva_asr_pb2_grpc as rasr_grpc
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from speechrt.audio.telephone import G711_RATE, g711_decode
from speechrt.errors import SpeechRTError
from speechrt.serving.grpc_calls import Refused, streaming, unary
from speechrt.serving.metrics import failure_reason
from speechrt.serving.streams import RecognitionStream
from speechrt.serving.voices import Audio

if TYPE_CHECKING:
    from riva.client.proto import riva_common_pb2 as riva_common
    from riva.client.proto import riva_tts_pb2 as rtts

    from speechrt.asr.decoding import Transcript
    from speechrt.serving.server import Server

# (nvidia-riva-client ships its generated protobuf modules without type stubs: mypy reads the
# message classes named here as untyped, and checks no field of them)

LANGUAGE = "en-US"  # the language every speechrt model speaks
RATES = (8000, 48000)  # the raw sample rates accepted, Hz (as the realtime WebSocket's)
MAX_CHANNELS = 8  # of raw audio (averaged)
MAX_HEADER = 64 * 1024  # bytes of a streamed WAV file before its data chunk
FILE_MAGIC = (b"RIFF", b"fLaC", b"OggS")  # WAV, FLAC, Ogg: decoded by libsndfile
G711 = {AudioEncoding.MULAW: "ulaw", AudioEncoding.ALAW: "alaw"}
RAW = (AudioEncoding.ENCODING_UNSPECIFIED, AudioEncoding.LINEAR_PCM, *G711)
FILES = (AudioEncoding.FLAC, AudioEncoding.OGGOPUS)


def check_language(code: str) -> None:
    if code and not (code.lower() == "en" or code.lower().startswith("en-")):
        raise SpeechRTError(f"language_code {code[:20]!r}: this server's models speak {LANGUAGE}")


@dataclass(frozen=True)
class Hearing:
    """What a RecognitionConfig asks for, checked."""

    encoding: int  # AudioEncoding
    rate: int  # Hz of raw audio; 0: not given (a file's or WAV header's own)
    channels: int  # of raw audio
    words: bool  # word time offsets


def hearing(config: rasr.RecognitionConfig, srv: Server, stream: bool) -> Hearing:
    """A RecognitionConfig -> Hearing, or a SpeechRTError naming the field it cannot honour."""
    assert srv.asr is not None
    enc = config.encoding
    if enc not in (*RAW, *FILES):
        raise SpeechRTError(f"encoding {enc} is not supported; use LINEAR_PCM, FLAC, MULAW, ...")
    if stream and enc in FILES:
        raise SpeechRTError(
            "StreamingRecognize takes LINEAR_PCM (raw, or a WAV file's bytes), MULAW or ALAW; "
            "FLAC and OGGOPUS files go to Recognize"
        )
    rate = config.sample_rate_hertz or (G711_RATE if enc in G711 else 0)
    if rate and not RATES[0] <= rate <= RATES[1]:
        raise SpeechRTError(f"sample_rate_hertz must be within {RATES[0]}-{RATES[1]}, got {rate}")
    channels = config.audio_channel_count or 1
    if not 1 <= channels <= MAX_CHANNELS:
        raise SpeechRTError(f"audio_channel_count must be within 1-{MAX_CHANNELS}")
    check_language(config.language_code)
    served = [n for n in srv.openai_models() if srv.pipeline_of(n) == "asr"]
    if config.model and config.model not in served:
        raise SpeechRTError(f"model {config.model[:60]!r} is not served; use {', '.join(served)}")
    if config.max_alternatives < 0:
        raise SpeechRTError("max_alternatives must be >= 0")
    refused = {
        "profanity_filter": config.profanity_filter,
        "speech_contexts (word boosting)": len(config.speech_contexts) > 0,
        "enable_separate_recognition_per_channel": config.enable_separate_recognition_per_channel,
        "diarization_config (speaker diarization)": (
            config.diarization_config.enable_speaker_diarization
        ),
        "endpointing_config (the stream is one utterance)": config.HasField("endpointing_config"),
        "custom_configuration": len(config.custom_configuration) > 0,
        "enable_automatic_punctuation (this recogniser does not punctuate)": (
            config.enable_automatic_punctuation and not punctuates(srv.asr.asr)
        ),
    }
    asked = [name for name, on in refused.items() if on]
    if asked:
        raise SpeechRTError(f"not supported by this server: {'; '.join(asked)}")
    return Hearing(enc, rate, channels, config.enable_word_time_offsets)


def punctuates(asr: object) -> bool:
    """Whether the recogniser's vocabulary holds sentence punctuation."""
    return any(ch in label for label in getattr(asr, "labels", ()) for ch in ".,?!")


class RawAudio:
    """Audio bytes, in pieces of any size -> float32 samples (N,), channels averaged: 16-bit
    little-endian PCM (after a WAV header, where LINEAR_PCM bytes begin as a WAV file) or G.711.
    `rate` is known once the first bytes are read."""

    def __init__(self, h: Hearing) -> None:
        self.law = G711.get(h.encoding)
        self.rate, self.channels = h.rate, h.channels
        self.given_rate, self.given_channels = h.rate, h.channels
        self.pending = b""  # bytes short of a frame (or of the WAV header)
        self.started = self.law is not None  # only LINEAR_PCM may begin with a WAV header
        self.left: int | None = None  # data bytes the WAV header announced, still to come

    def push(self, data: bytes) -> Audio:
        if self.started and self.left is not None:  # a WAV file's chunks after its data
            data, self.left = data[: self.left], max(0, self.left - len(data))
        self.pending += data
        if not self.started and not self._header(final=False):
            return np.zeros(0, dtype=np.float32)
        frame = self.channels * (1 if self.law else 2)
        n = len(self.pending) // frame * frame
        chunk, self.pending = self.pending[:n], self.pending[n:]
        if self.law is not None:
            x = g711_decode(chunk, self.law)
        else:
            x = np.frombuffer(chunk, dtype="<i2").astype(np.float32) / 32768.0
        return x.reshape(-1, self.channels).mean(axis=1) if self.channels > 1 else x

    def end(self) -> Audio:
        """The samples still held; the audio must end on a whole frame."""
        if not self.started:
            if not self.pending:
                return np.zeros(0, dtype=np.float32)  # no audio came
            self._header(final=True)
        out = self.push(b"")
        if self.pending:
            raise SpeechRTError(f"the audio ends inside a sample frame ({len(self.pending)} bytes)")
        return out

    def _header(self, final: bool) -> bool:
        """Read a WAV header at the start, if there is one; False: more bytes are needed."""
        p = self.pending
        if len(p) < 12 and not final:
            return False
        if p[:4] != b"RIFF" or p[8:12] != b"WAVE":
            if not self.rate:
                raise SpeechRTError("raw LINEAR_PCM audio needs sample_rate_hertz")
            self.started = True
            return True
        pos, fmt = 12, None
        while True:
            if len(p) < pos + 8:
                return self._wait(final)
            chunk, size = p[pos : pos + 4], struct.unpack_from("<I", p, pos + 4)[0]
            if chunk == b"data":
                break
            if len(p) < pos + 8 + size:
                return self._wait(final)
            if chunk == b"fmt " and size >= 16:
                fmt = struct.unpack_from("<HHIIHH", p, pos + 8)
            pos += 8 + size + (size & 1)
        if fmt is None:
            raise SpeechRTError("the WAV header has no fmt chunk before its data")
        tag, channels, rate, _, _, bits = fmt
        if tag not in (1, 0xFFFE) or bits != 16:
            raise SpeechRTError(
                f"streamed WAV audio must be 16-bit PCM (format {tag}, {bits} bits)"
            )
        if self.given_rate and self.given_rate != rate:
            raise SpeechRTError(
                f"sample_rate_hertz {self.given_rate} differs from the WAV header's {rate} Hz"
            )
        if not RATES[0] <= rate <= RATES[1] or not 1 <= channels <= MAX_CHANNELS:
            raise SpeechRTError(
                f"the WAV file is {rate} Hz, {channels} channels; streams take {RATES[0]}-"
                f"{RATES[1]} Hz, 1-{MAX_CHANNELS} channels"
            )
        if self.given_channels > 1 and self.given_channels != channels:
            raise SpeechRTError(f"audio_channel_count differs from the WAV header's {channels}")
        size = struct.unpack_from("<I", p, pos + 4)[0]
        self.rate, self.channels = rate, channels
        self.pending, self.started = p[pos + 8 :], True
        if size not in (0, 0xFFFFFFFF):  # (0 or ~0: a WAV written as a stream, length unknown)
            self.pending = self.pending[:size]
            self.left = size - len(self.pending)
        return True

    def _wait(self, final: bool) -> bool:
        if final or len(self.pending) > MAX_HEADER:
            raise SpeechRTError(f"no WAV data chunk within the first {MAX_HEADER} bytes")
        return False


def request_id(
    request: rasr.RecognizeRequest | rasr.StreamingRecognizeRequest | rtts.SynthesizeSpeechRequest,
) -> riva_common.RequestId | None:
    """The request's id, for its responses (None: it has none)."""
    return request.id if request.HasField("id") else None


def is_file(data: bytes) -> bool:
    return data[:4] in FILE_MAGIC and (data[:4] != b"RIFF" or data[8:12] == b"WAVE")


async def offline_audio(srv: Server, data: bytes, h: Hearing) -> Audio:
    """Recognize's audio -> (N,) float32 at the recogniser's rate, within the limits."""
    assert srv.asr is not None
    if h.encoding in FILES and not is_file(data):
        raise SpeechRTError(f"{AudioEncoding.Name(h.encoding)} audio must be a whole file")
    if is_file(data) and h.encoding not in G711:
        if h.rate and h.encoding != AudioEncoding.OGGOPUS:  # (Opus decodes at 48 kHz)
            import io

            import soundfile as sf

            try:
                rate = sf.info(io.BytesIO(data)).samplerate
            except (sf.LibsndfileError, RuntimeError) as e:
                raise SpeechRTError(f"audio: not a readable audio file ({e})") from None
            if rate != h.rate:
                raise SpeechRTError(f"sample_rate_hertz {h.rate} differs from the file's {rate} Hz")
        return await srv.asr.decode(data)
    raw = RawAudio(h)
    pcm = np.concatenate((raw.push(data), raw.end()))
    return await srv.asr.prepare(pcm, raw.rate)  # resampled on the upload threads


def result_of(transcript: Transcript, words: bool) -> rasr.SpeechRecognitionAlternative:
    """A Transcript -> Riva's alternative (and word times in ms, where asked)."""
    alt = rasr.SpeechRecognitionAlternative(transcript=transcript.text, language_code=[LANGUAGE])
    if words:
        for w in transcript.words:
            alt.words.add(
                word=w.word,
                start_time=round(float(w.start) * 1000),
                end_time=round(float(w.end) * 1000),
                language_code=LANGUAGE,
            )
    return alt


class RivaASR(rasr_grpc.RivaSpeechRecognitionServicer):
    def __init__(self, server: Server) -> None:
        assert server.asr is not None
        self.srv, self.asr = server, server.asr

    @unary
    async def Recognize(
        self, request: rasr.RecognizeRequest, context: grpc.aio.ServicerContext
    ) -> rasr.RecognizeResponse:
        h = hearing(request.config, self.srv, stream=False)
        async with self.srv.metrics.track("asr"):
            audio = await offline_audio(self.srv, request.audio, h)
            (t,) = await self.asr.transcribe([audio])
        result = rasr.SpeechRecognitionResult(
            alternatives=[result_of(t, h.words)], audio_processed=float(t.duration)
        )
        return rasr.RecognizeResponse(results=[result], id=request_id(request))

    @streaming
    async def StreamingRecognize(
        self,
        requests: AsyncIterator[rasr.StreamingRecognizeRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[rasr.StreamingRecognizeResponse]:
        it = aiter(requests)
        first = await anext(it, None)
        if first is None:
            return
        if not first.HasField("streaming_config"):
            raise SpeechRTError("the first request of a stream carries streaming_config")
        h = hearing(first.streaming_config.config, self.srv, stream=True)
        interim = first.streaming_config.interim_results
        t0 = time.perf_counter()
        failure: str | None = "CANCELED"
        try:
            async for response in self._stream(first, it, h, interim):
                yield response
            failure = None
        except Exception as e:
            failure = failure_reason(e)
            raise
        finally:
            self.srv.metrics.record_request("asr", time.perf_counter() - t0, failure)

    async def _stream(
        self,
        first: rasr.StreamingRecognizeRequest,
        it: AsyncIterator[rasr.StreamingRecognizeRequest],
        h: Hearing,
        interim: bool,
    ) -> AsyncIterator[rasr.StreamingRecognizeResponse]:
        raw, stream, said = RawAudio(h), None, ""
        limit = self.srv.config.limits.max_audio_seconds
        ended = False
        while not ended:
            request = await anext(it, None)
            if request is None:
                ended, pcm = True, raw.end()
            elif request.HasField("streaming_config") or request.runtime_config:
                raise SpeechRTError(
                    "streaming_config comes once, first; runtime_config is not supported"
                )
            else:
                pcm = raw.push(request.audio_content)
            if pcm.size == 0:
                continue
            if stream is None:
                stream = RecognitionStream(self.srv, raw.rate, partials=interim)
            if (stream.samples + pcm.size) / raw.rate > limit:
                raise SpeechRTError(f"the stream's audio exceeds the limit of {limit:g} s")
            await stream.push(pcm)
            if interim and stream.partial != said:
                said = stream.partial
                part = rasr.StreamingRecognitionResult(
                    alternatives=[rasr.SpeechRecognitionAlternative(transcript=said)],
                    is_final=False,
                    audio_processed=stream.seconds,
                )
                yield rasr.StreamingRecognizeResponse(results=[part], id=request_id(first))
        if stream is None:
            return  # no audio: nothing to recognise
        await stream.finish()
        t = stream.transcript
        assert t is not None  # finish() sets it
        final = rasr.StreamingRecognitionResult(
            alternatives=[result_of(t, h.words)], is_final=True, audio_processed=stream.seconds
        )
        yield rasr.StreamingRecognizeResponse(results=[final], id=request_id(first))

    @unary
    async def GetRivaSpeechRecognitionConfig(
        self, request: rasr.RivaSpeechRecognitionConfigRequest, context: grpc.aio.ServicerContext
    ) -> rasr.RivaSpeechRecognitionConfigResponse:
        if request.model_name and request.model_name != "asr":
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no model {request.model_name[:60]!r}")
        asr = self.asr.asr
        params = {
            "language_code": LANGUAGE,
            "sample_rate_hz": str(self.asr.sampling_rate),
            "decoder": str(getattr(asr, "decoder", "greedy")),
            "punctuation": str(punctuates(asr)).lower(),
        }
        Config = rasr.RivaSpeechRecognitionConfigResponse.Config
        return rasr.RivaSpeechRecognitionConfigResponse(
            model_config=[
                Config(model_name="asr", parameters={**params, "type": kind})
                for kind in ("offline", "online")
            ]
        )


def add_service(grpc_server: grpc.aio.Server, server: Server) -> str:
    rasr_grpc.add_RivaSpeechRecognitionServicer_to_server(RivaASR(server), grpc_server)
    return "nvidia.riva.asr.RivaSpeechRecognition"
