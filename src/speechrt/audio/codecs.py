"""Encoding speech for the wire: WAV, FLAC, raw PCM, MP3 and Ogg/Opus, whole or as a stream.

MP3 (LAME) and Opus (libopus in an Ogg container) come from the libsndfile inside the soundfile
wheel. MP3 is constant bitrate: a stream's length is then known to every decoder without the
LAME/Info frame that libsndfile rewrites at the start once it is done, which a stream cannot
take back (a streamed MP3 keeps its first, provisional Info frame, so decoders play LAME's
encoder delay, about 1,100 samples of silence, before the speech). Opus runs at 48 kHz, the
rate its decoders output, so audio is resampled to 48 kHz first (StreamResampler: a stream
resamples block by block). AAC is not offered: libsndfile has no AAC encoder, and the
maintained one within reach (FFmpeg's, through PyAV) would add FFmpeg's native libraries to a
runtime that otherwise needs numpy and onnxruntime.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.audio.io import StreamResampler, encode_audio, to_int16
from speechrt.errors import SpeechRTError

MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FORMATS = tuple(MEDIA_TYPES)  # OpenAI's order; its aac is the one missing (see above)
STREAMED = ("mp3", "opus", "wav", "pcm")  # FLAC's header is rewritten at the end: not streamed
LOSSY = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}  # libsndfile's names
OPUS_RATE = 48_000
# libsndfile's 0 (best) .. 1 (smallest): MP3 at 0.2 is LAME's CBR at ~128 kb/s for 22.05 kHz,
# Opus at 0.2 ~ 100 kb/s; speech needs less, but a bitrate this high keeps the decoded
# waveform close to the original (what tests can check, and what users compare by ear)
COMPRESSION_LEVEL = 0.2


def output_rate(fmt: str, sampling_rate: int) -> int:
    """The sampling rate a `fmt` file of audio at `sampling_rate` carries."""
    return OPUS_RATE if fmt == "opus" else sampling_rate


def check_format(fmt: str, streamed: bool = False) -> None:
    allowed = STREAMED if streamed else FORMATS
    if fmt not in allowed:
        how = "streamed " if streamed else ""
        raise SpeechRTError(
            f"unknown {how}audio format {fmt!r}; choose one of {', '.join(allowed)}"
        )


def wav_stream_header(sampling_rate: int) -> bytes:
    """A 16-bit mono WAV header whose RIFF and data sizes say "unknown" (0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sampling_rate, sampling_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", unknown)
    )


class _Sink:
    """The file libsndfile writes into: bytes kept in memory, the new ones taken by `take()`.

    A write before what was taken (LAME's Info frame, rewritten on close) changes the buffer,
    so the whole file is right, but not what a stream already sent.
    """

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0
        self.taken = 0

    def write(self, b: Any) -> int:
        b = bytes(b)
        self.data[self.pos : self.pos + len(b)] = b
        self.pos += len(b)
        return len(b)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, len(self.data))[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:  # soundfile's virtual IO asks for it; never used
        return b""

    def take(self) -> bytes:
        new = bytes(self.data[self.taken :])
        self.taken = len(self.data)
        return new


class StreamEncoder:
    """Float audio in, file bytes out as they are ready: push() blocks (N,), then finish().

    The concatenated output is a `fmt` file at output_rate(fmt, sampling_rate): WAV with a
    header of unknown length, raw 16-bit PCM, MP3 or Ogg/Opus (libsndfile's encoders buffer a
    frame or an Ogg page, so a push may give nothing yet).
    """

    def __init__(self, fmt: str, sampling_rate: int) -> None:
        check_format(fmt, streamed=True)
        self.fmt = fmt
        self.sampling_rate = sampling_rate
        self.started = False
        self.file: Any = None
        self.resampler: StreamResampler | None = None
        self.sink = _Sink()
        if fmt in LOSSY:
            import soundfile as sf

            rate = output_rate(fmt, sampling_rate)
            if rate != sampling_rate:
                self.resampler = StreamResampler(sampling_rate, rate)
            container, subtype = LOSSY[fmt]
            extra = {"bitrate_mode": "CONSTANT"} if fmt == "mp3" else {}
            self.file = sf.SoundFile(
                self.sink,
                "w",
                samplerate=rate,
                channels=1,
                format=container,
                subtype=subtype,
                compression_level=COMPRESSION_LEVEL,
                **extra,
            )

    def push(self, audio: np.ndarray) -> bytes:
        """audio (N,) float in [-1, 1] -> the bytes that are ready."""
        head = b""
        if not self.started and self.fmt == "wav":
            head = wav_stream_header(self.sampling_rate)
        self.started = True
        if self.file is None:
            return head + to_int16(audio).tobytes()
        if self.resampler is not None:
            audio = self.resampler.push(audio)
        self._write(audio)
        return self.sink.take()

    def finish(self) -> bytes:
        """The remaining bytes: the encoder's last frames and the container's end."""
        if self.file is None:
            return b"" if self.started or self.fmt != "wav" else self.push(np.zeros(0))
        if self.resampler is not None:
            self._write(self.resampler.flush())
        self.file.close()
        return self.sink.take()

    def whole(self) -> bytes:
        """After finish(): the complete file, with what libsndfile rewrote at its start."""
        return bytes(self.sink.data)

    def _write(self, audio: np.ndarray) -> None:
        if audio.shape[0]:
            self.file.write(np.clip(audio, -1.0, 1.0).astype(np.float32))


def encode_lossy(audio: np.ndarray, sampling_rate: int, fmt: str) -> bytes:
    """audio (N,) float in [-1, 1] at `sampling_rate` -> a whole MP3 or Ogg/Opus file."""
    if fmt not in LOSSY:
        raise SpeechRTError(f"{fmt!r} is not a lossy format; choose one of {', '.join(LOSSY)}")
    enc = StreamEncoder(fmt, sampling_rate)
    enc.push(audio)
    enc.finish()
    return enc.whole()


def encode(
    audio: np.ndarray, sampling_rate: int, fmt: str = "wav", sample_format: str = "int16"
) -> bytes:
    """audio (N,) float in [-1, 1] -> a whole `fmt` file (Opus at output_rate: 48 kHz).
    sample_format "float32": WAV and raw PCM only (speechrt.audio.io.encode_audio)."""
    check_format(fmt)
    if fmt not in LOSSY:
        return encode_audio(audio, sampling_rate, fmt, sample_format)
    if sample_format != "int16":
        raise SpeechRTError(f"{fmt} is encoded from the audio itself: use sample format int16")
    return encode_lossy(audio, sampling_rate, fmt)


def write_audio(
    path: str | Path,
    audio: np.ndarray,
    sampling_rate: int,
    fmt: str | None = None,
    sample_format: str = "int16",
) -> None:
    """Write (N,) float audio; format from `fmt`, else the suffix (.wav/.flac/.pcm/.raw/.mp3/
    .opus)."""
    path = Path(path)
    if fmt is None:
        suffix = path.suffix.lower().lstrip(".")
        fmt = {"raw": "pcm"}.get(suffix, suffix) if suffix else "wav"
    data = encode(audio, sampling_rate, fmt, sample_format)
    try:
        path.write_bytes(data)
    except OSError as e:
        raise SpeechRTError(f"cannot write {path}: {e.strerror or e}") from None
