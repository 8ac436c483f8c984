"""Wyoming, Home Assistant's voice protocol: `speechrt serve --wyoming-port PORT` (the `wyoming`
extra; docs/streaming-protocols.md).

A TCP server in the HTTP server's event loop, answering through the same services (the
batchers, limits and checks of the HTTP routes):
  describe                                     -> info (the recogniser, the voice and speakers)
  transcribe?, audio-start?, audio-chunk..., audio-stop  -> transcript (offline transcription)
  synthesize                                   -> audio-start, audio-chunk..., audio-stop
  synthesize-start, synthesize-chunk..., synthesize-stop
      -> per sentence, as soon as it is ready: audio-start, audio-chunk..., audio-stop;
         then synthesize-stopped (a `synthesize` inside the stream is the client's copy of the
         whole text for servers without streaming, and is not spoken twice)
  ping                                         -> pong
Audio in may be any rate in RATES, 8, 16, 24 or 32-bit signed PCM (8-bit: unsigned, as WAV),
any channels (averaged to mono); it is heard as a file at that rate is (resampled, and through
the telephone band where the recogniser has one). Audio out is 16-bit mono at the voice's rate.

A request the server cannot follow (unknown voice, text over the limits, bad audio format, a
request while one is being answered) gets an `error` event {text, code} and the connection goes
on; a frame it cannot read (not JSON, data or payload over their limits) gets an `error` event
and the connection is closed. A connection that goes away (or sends nothing for
--realtime-idle-seconds while nothing is being answered) is closed and its queued work
cancelled. The server closes its side first, and the socket once the client has closed its own
(or after LINGER_S): what the client sent meanwhile is read and dropped, so that no reset
overtakes the last event. Other event types are dropped, as Wyoming asks of servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Coroutine
from typing import TYPE_CHECKING, TypedDict

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import (
    AsrModel,
    AsrProgram,
    Attribution,
    Describe,
    Info,
    TtsProgram,
    TtsVoice,
    TtsVoiceSpeaker,
)
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from speechrt import __version__
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.serving.engine import DeadlineExceeded, InferenceError, Overloaded
from speechrt.serving.http_errors import ApiError
from speechrt.serving.openai_api import speaker_of, voices_of
from speechrt.serving.speech_socket import error_code
from speechrt.serving.text_stream import SpeechStream
from speechrt.serving.wyoming_audio import AudioOut, RequestError, Utterance
from speechrt.serving.wyoming_frames import FrameError, max_data, read_event

if TYPE_CHECKING:
    from speechrt.serving.server import Server

log = logging.getLogger("speechrt.serving")

PROGRAM = "speechrt"  # the asr and tts programs' name (select-program)
LANGUAGES = ["en"]  # the models read and hear English
LINGER_S = 2.0  # at most this long, a closing connection's input is read and dropped (close)
ATTRIBUTION = Attribution(name="speechrt", url="")


class Artifact(TypedDict):
    """What every model and voice of the info event says of where it comes from."""

    attribution: Attribution
    installed: bool
    version: str


ARTIFACT = Artifact(attribution=ATTRIBUTION, installed=True, version=__version__)


def describe(srv: Server) -> Info:
    """The info event: one asr program with the recogniser, one tts program with the voice."""
    asr, tts = [], []
    if srv.asr is not None:
        recogniser = srv.asr.asr
        model = AsrModel(
            name="asr",
            attribution=ATTRIBUTION,
            installed=True,
            description=f"{recogniser.info.kind} ({recogniser.model_dir.name}), "
            f"{recogniser.decoder} decoding",
            version=None,
            languages=LANGUAGES,
        )
        program = AsrProgram(name=PROGRAM, description="speechrt speech recognition",
                             models=[model], **ARTIFACT)  # fmt: skip
        asr.append(program)
    if srv.tts is not None:
        voice = srv.tts.tts
        ids = [v["id"] for v in voices_of(voice.name, voice.n_speakers)]
        loaded = srv.tts.loaded  # (None: a stand-in voice, no model kinds to name)
        kinds = f"{loaded.acoustic_info.kind} + {loaded.vocoder_info.kind}, " if loaded else ""
        entry = TtsVoice(
            name=voice.name,
            attribution=ATTRIBUTION,
            installed=True,
            description=f"{voice.name} ({kinds}{srv.tts.sampling_rate} Hz)",
            version=None,
            languages=LANGUAGES,
            speakers=[TtsVoiceSpeaker(name=i) for i in ids] if len(ids) > 1 else None,
        )
        tts.append(
            TtsProgram(
                name=PROGRAM,
                description="speechrt speech synthesis",
                voices=[entry],
                supports_synthesize_streaming=True,
                **ARTIFACT,
            )
        )
    return Info(asr=asr, tts=tts)


class Connection:
    """One client: reads events while answering; one request answered at a time."""

    def __init__(self, srv: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.srv, self.reader, self.writer = srv, reader, writer
        self.max_data = max_data(srv.config.limits)
        self.answer: asyncio.Task[None] | None = None  # the request being answered
        self.utterance: Utterance | None = None
        self.failed = False  # the current transcription was refused: drop its audio quietly
        self.stream: SpeechStream | None = None  # an open streaming synthesis

    async def write(self, event: Event) -> None:
        await async_write_event(event, self.writer)

    async def error(self, text: str, code: str) -> None:
        with contextlib.suppress(ConnectionError):  # a client that went away is told nothing
            await self.write(Error(text=text, code=code).event())

    async def run(self) -> None:
        idle = self.srv.config.limits.realtime_idle_s
        reading: asyncio.Future[Event | None] | None = None
        cancelled = False
        try:
            while True:
                reading = asyncio.ensure_future(read_event(self.reader, self.max_data))
                while not (await asyncio.wait([reading], timeout=idle))[0]:
                    if not self.busy:  # nothing asked and nothing answered for `idle` s
                        await self.error(f"no event for {idle:g} s: closing", "idle_timeout")
                        return
                event = reading.result()
                if event is None:
                    return
                try:
                    await self.handle(event)
                except RequestError as e:
                    await self.error(e.text, e.code)
        except asyncio.CancelledError:
            cancelled = True  # the server is stopping: it waits for no client
            raise
        except FrameError as e:
            await self.error(str(e), "bad_frame")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except Exception as e:  # never the server's end: say so, and close this connection
            log.exception("wyoming: internal error")
            await self.error(f"internal error: {type(e).__name__}: {e}", "internal")
        finally:
            await self.close(reading, linger=not cancelled)

    @property
    def busy(self) -> bool:
        streaming = self.stream is not None and not self.stream.idle
        return streaming or (self.answer is not None and not self.answer.done())

    async def close(self, reading: asyncio.Future[Event | None] | None, linger: bool) -> None:
        """Cancel whatever is queued or being answered (first, before the answer runs on) and
        the event being read, and close the socket: with `linger`, first our side (after the
        last event), then the socket once the client has closed its side or LINGER_S have
        passed. A socket closed with input unread answers with a reset, which can overtake the
        last event on its way: a client that sent a 400 KB header line could read `connection
        reset`, not the error event."""
        if self.answer is not None:
            self.answer.cancel()
        if reading is not None:  # (its read ends before the rest is read below)
            reading.cancel()
            await asyncio.wait([reading])
        if self.answer is not None:
            await asyncio.wait([self.answer])
        if self.stream is not None:
            await self.stream.close()
        if linger:
            with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
                await self.writer.drain()
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                await asyncio.wait_for(self._drop_input(), LINGER_S)
        self.writer.close()

    async def _drop_input(self) -> None:
        """Read until the client closes its side, dropping what it sends, 64 KB at a time."""
        while await self.reader.read(64 * 1024):
            pass

    # -- events ----------------------------------------------------------------------------------

    async def handle(self, event: Event) -> None:
        kind = event.type
        try:
            if Describe.is_type(kind):
                await self.write(describe(self.srv).event())
            elif Ping.is_type(kind):
                await self.write(Pong(text=Ping.from_event(event).text).event())
            elif kind == "select-program":  # (wyoming 1.10's SelectProgram)
                name = event.data["name"]
                if name != PROGRAM:
                    raise RequestError(
                        f"no program {str(name)[:60]!r}; use {PROGRAM!r}", "bad_program"
                    )
            elif Transcribe.is_type(kind):
                self.transcribe(Transcribe.from_event(event))
            elif AudioStart.is_type(kind):
                start = AudioStart.from_event(event)
                self.start_audio(start.rate, start.width, start.channels)
            elif AudioChunk.is_type(kind):
                self.add_audio(AudioChunk.from_event(event))
            elif AudioStop.is_type(kind):
                self.stop_audio()
            elif Synthesize.is_type(kind):
                if self.stream is None:  # inside a stream: the client's copy, already spoken
                    self.synthesize(Synthesize.from_event(event))
            elif SynthesizeStart.is_type(kind):
                self.start_stream(SynthesizeStart.from_event(event))
            elif SynthesizeChunk.is_type(kind):
                await self.push(SynthesizeChunk.from_event(event).text)
            elif SynthesizeStop.is_type(kind):
                self.stop_stream()
        except (KeyError, TypeError, AttributeError) as e:
            raise RequestError(f"malformed {kind[:40]} event ({type(e).__name__}: {e})"[:300],
                               "bad_event") from None  # fmt: skip

    def _begin(self, work: Coroutine[object, None, None]) -> None:
        """Answer a request in its own task (the connection goes on reading, so that a client
        that goes away cancels it)."""
        if self.answer is not None and not self.answer.done():
            work.close()
            raise RequestError("a request is being answered on this connection", "busy")
        self.answer = asyncio.create_task(self._answer(work))

    async def _answer(self, work: Coroutine[object, None, None]) -> None:
        try:
            await work
        except RequestError as e:
            await self.error(e.text, e.code)
        except (SpeechRTError, Overloaded, DeadlineExceeded, InferenceError) as e:
            await self.error(str(e), error_code(e))
        except ConnectionError:
            pass  # the client went away: the reader sees it and closes the connection
        except Exception as e:  # never the server's end: say so and go on
            log.exception("wyoming: internal error")
            await self.error(f"internal error: {type(e).__name__}: {e}", "internal")

    # -- transcription ---------------------------------------------------------------------------

    def _recogniser(self) -> None:
        if self.srv.asr is None:
            raise RequestError("this server has no speech recognition model", "no_asr")

    def transcribe(self, request: Transcribe) -> None:
        """A new transcription request (its audio follows)."""
        self._recogniser()
        self.utterance, self.failed = None, False
        if request.name is not None and self.srv.pipeline_of(str(request.name)) != "asr":
            raise self._fail(f"no recogniser {str(request.name)[:60]!r}; use 'asr'", "bad_model")
        if request.language is not None and not _english(request.language):
            raise self._fail(
                f"language {str(request.language)[:20]!r} is not heard here; use en", "bad_language"
            )

    def _fail(self, text: str, code: str) -> RequestError:
        """Refuse the current transcription: its audio, up to its audio-stop, is dropped
        without more errors."""
        self.utterance, self.failed = None, True
        return RequestError(text, code)

    def start_audio(self, rate: object, width: object, channels: object) -> None:
        self._recogniser()
        if self.failed:
            return
        try:
            self.utterance = Utterance(
                rate, width, channels, self.srv.config.limits.max_audio_seconds
            )
        except RequestError as e:
            raise self._fail(e.text, e.code) from None

    def add_audio(self, chunk: AudioChunk) -> None:
        if self.utterance is None:  # no audio-start: the first chunk says the format
            self.start_audio(chunk.rate, chunk.width, chunk.channels)
        if self.failed:
            return
        assert self.utterance is not None
        try:
            self.utterance.add(chunk)
        except RequestError as e:
            raise self._fail(e.text, e.code) from None

    def stop_audio(self) -> None:
        self._recogniser()
        utterance, self.utterance = self.utterance, None
        if self.failed:  # the end of a refused transcription
            self.failed = False
            return
        if utterance is None or not utterance.samples:
            raise RequestError("audio-stop without audio", "no_audio")
        self._begin(self._transcribe(utterance))

    async def _transcribe(self, utterance: Utterance) -> None:
        assert self.srv.asr is not None
        async with self.srv.metrics.track("asr"):
            rate = utterance.format[0]
            # resampled on the upload threads, beside the HTTP routes' uploads
            audio = await self.srv.asr.prepare(utterance.audio(), rate)
            (result,) = await self.srv.asr.transcribe([audio])
        await self.write(Transcript(text=str(result.text), language=LANGUAGES[0]).event())

    # -- synthesis -------------------------------------------------------------------------------

    def _options(self, voice: SynthesizeVoice | None, text_format: object) -> SynthesisOptions:
        tts = self.srv.tts
        if tts is None:
            raise RequestError("this server has no speech synthesis model", "no_tts")
        if text_format not in (None, "text", "ssml"):
            raise RequestError(f"text_format {str(text_format)[:20]!r}: use text or ssml",
                               "bad_text_format")  # fmt: skip
        speaker = 0
        if voice is not None and voice.name is None and voice.language is not None:
            if not _english(voice.language):
                raise RequestError(f"no voice speaks {str(voice.language)[:20]!r}; use en",
                                   "bad_language")  # fmt: skip
        elif voice is not None and voice.name is not None:
            try:
                speaker = speaker_of(str(voice.name), tts.tts.name, tts.tts.n_speakers)
                if voice.speaker is not None:
                    speaker = speaker_of(str(voice.speaker), tts.tts.name, tts.tts.n_speakers)
            except ApiError as e:
                raise RequestError(e.message, "unknown_voice") from None
        return SynthesisOptions(speaker=speaker)

    def synthesize(self, request: Synthesize) -> None:
        options = self._options(request.voice, request.text_format)
        text = request.text
        if not isinstance(text, str):
            raise RequestError("synthesize: `text` must be a string", "bad_event")
        from speechrt.text.ssml import is_ssml

        if request.text_format == "ssml" and not is_ssml(text):
            raise RequestError("text_format ssml: the text must be a <speak> document", "bad_ssml")
        self._begin(self._synthesize(text, options))

    async def _synthesize(self, text: str, options: SynthesisOptions) -> None:
        assert self.srv.tts is not None
        out = AudioOut(self.write, self.srv.tts.sampling_rate)
        async with self.srv.metrics.track("tts"):
            chunks = await self.srv.tts.stream(text, options, 0)
            await out.start(None)
            async for audio in chunks:
                await out.audio(None, audio)
            await out.done(None)

    def start_stream(self, request: SynthesizeStart) -> None:
        if self.stream is not None:
            raise RequestError("a streaming synthesis is already open", "busy")
        if self.answer is not None and not self.answer.done():
            raise RequestError("a request is being answered on this connection", "busy")
        options = self._options(request.voice, request.text_format)
        if request.text_format == "ssml":
            raise RequestError("streaming synthesis takes plain text", "bad_text_format")
        assert self.srv.tts is not None
        metrics = self.srv.metrics
        self.stream = SpeechStream(
            self.srv.tts,
            options,
            0,
            AudioOut(self.write, self.srv.tts.sampling_rate),
            lambda seconds, failure: metrics.record_request("tts", seconds, failure),
        )

    async def push(self, text: object) -> None:
        if self.stream is None:
            raise RequestError("synthesize-chunk outside synthesize-start/stop", "no_stream")
        if not isinstance(text, str):
            raise RequestError("synthesize-chunk: `text` must be a string", "bad_event")
        try:
            await self.stream.push(text)
        except (SpeechRTError, Overloaded) as e:
            raise RequestError(str(e), error_code(e)) from None

    def stop_stream(self) -> None:
        if self.stream is None:
            raise RequestError("synthesize-stop without synthesize-start", "no_stream")
        stream, self.stream = self.stream, None
        self._begin(self._finish_stream(stream))

    async def _finish_stream(self, stream: SpeechStream) -> None:
        try:
            await stream.finish()
        finally:
            await stream.close()
        await self.write(SynthesizeStopped().event())


def _english(language: object) -> bool:
    """ "en", "en-US", "en_GB", ... (Home Assistant sends the pipeline's language)."""
    return isinstance(language, str) and language.lower().replace("_", "-").split("-")[0] == "en"


class WyomingListener:
    """The Wyoming server on a bound socket (see bind), started and stopped with the app."""

    def __init__(self, srv: Server, sock: socket.socket) -> None:
        self.srv, self.sock = srv, sock
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"tcp://{host}:{port}"

    async def start(self) -> None:
        limit = max_data(self.srv.config.limits) + 2  # a header line, with its data inline
        self.server = await asyncio.start_server(self._connected, sock=self.sock, limit=limit)
        log.info("wyoming at %s", self.address)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await Connection(self.srv, reader, writer).run()
        finally:
            self.connections.discard(task)

    async def stop(self) -> None:
        """Stop accepting; cancel every connection (and so its queued work)."""
        if self.server is None:
            return
        self.server.close()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.wait(list(self.connections))
        await self.server.wait_closed()
