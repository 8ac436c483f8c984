"""Wyoming's audio, both ways (speechrt.serving.wyoming_server): PCM of any rate, width and
channels in, as a file of that format is heard; 16-bit mono at the voice's rate out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeGuard

import numpy as np
import numpy.typing as npt
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event

from speechrt.audio import codecs
from speechrt.serving.speech_socket import error_code
from speechrt.serving.text_stream import Segment

RATES = (8000, 48000)  # audio-in rates, as the realtime WebSocket's
WIDTHS = (1, 2, 3, 4)  # bytes per sample
MAX_CHANNELS = 8
SAMPLES_PER_CHUNK = 1024  # audio-chunk events out (wyoming-piper's size)


class RequestError(Exception):
    """A request the connection cannot follow: answered with an error event {text, code}."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.text, self.code = text, code


def whole(v: object) -> TypeGuard[int]:
    """An int that is not a bool (an event's field, as JSON gave it)."""
    return isinstance(v, int) and not isinstance(v, bool)


def to_mono(data: bytes, width: int, channels: int) -> npt.NDArray[np.float32]:
    """Interleaved little-endian PCM -> (N,) float32 in [-1, 1), channels averaged."""
    if width == 1:  # unsigned, as WAV and audioop's 8-bit
        x = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:  # three bytes: placed high in an int32, so the sign carries
        b = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) / 2.0**31).astype(np.float32)
    else:
        ints = np.frombuffer(data, "<i2" if width == 2 else "<i4")
        x = (ints / float(2 ** (8 * width - 1))).astype(np.float32)
    return x.reshape(-1, channels).mean(axis=1, dtype=np.float32)


class Utterance:
    """Audio of one transcription, as it arrives: float32 mono at its own rate."""

    def __init__(self, rate: object, width: object, channels: object, max_seconds: float) -> None:
        if (
            not (whole(rate) and whole(width) and whole(channels))
            or not RATES[0] <= rate <= RATES[1]
        ):
            raise RequestError(
                f"audio rate must be an integer in [{RATES[0]}, {RATES[1]}] Hz, got {rate!r}"[:200],
                "unsupported_audio_format",
            )
        if width not in WIDTHS or not 1 <= channels <= MAX_CHANNELS:
            raise RequestError(
                f"audio must be {', '.join(map(str, WIDTHS))}-byte samples in 1 to "
                f"{MAX_CHANNELS} channels, got width {width!r}, channels {channels!r}"[:200],
                "unsupported_audio_format",
            )
        self.format = (rate, width, channels)
        self.max_samples = int(max_seconds * rate)
        self.max_seconds = max_seconds
        self.parts: list[npt.NDArray[np.float32]] = []
        self.samples = 0

    def add(self, chunk: AudioChunk) -> None:
        rate, width, channels = self.format
        if (chunk.rate, chunk.width, chunk.channels) != self.format:
            raise RequestError(
                "an audio-chunk's rate, width and channels must be those of the audio-start",
                "unsupported_audio_format",
            )
        frame = width * channels
        if len(chunk.audio) % frame:
            raise RequestError(
                f"an audio-chunk of {len(chunk.audio)} bytes is not whole {frame}-byte frames",
                "invalid_audio",
            )
        n = len(chunk.audio) // frame
        if self.samples + n > self.max_samples:
            raise RequestError(f"the audio would exceed {self.max_seconds:g} s", "audio_too_long")
        self.parts.append(to_mono(chunk.audio, width, channels))
        self.samples += n

    def audio(self) -> npt.NDArray[np.float32]:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.float32)


class AudioOut:
    """Audio to the client as audio-start, audio-chunk... (16-bit mono), audio-stop: one
    segment of a SpeechStream (a Sink), or a whole synthesis (segment None)."""

    def __init__(self, write: Callable[[Event], Awaitable[None]], rate: int) -> None:
        self.write, self.rate = write, rate
        self.encoder = codecs.StreamEncoder("pcm", rate)

    async def start(self, segment: Segment | None) -> None:
        await self.write(AudioStart(rate=self.rate, width=2, channels=1).event())

    async def audio(self, segment: Segment | None, audio: npt.NDArray[np.float32]) -> None:
        data = self.encoder.push(audio)
        step = 2 * SAMPLES_PER_CHUNK
        for i in range(0, len(data), step):
            chunk = AudioChunk(rate=self.rate, width=2, channels=1, audio=data[i : i + step])
            await self.write(chunk.event())

    async def done(self, segment: Segment | None) -> None:
        await self.write(AudioStop().event())

    async def failed(self, segment: Segment | None, error: Exception) -> None:
        await self.write(AudioStop().event())
        await self.write(Error(text=str(error), code=error_code(error)).event())
