"""Reading and writing audio: WAV/FLAC/OGG through soundfile, raw 16-bit PCM, resampling.

speechrt.audio.codecs writes these and MP3 and Ogg/Opus (its encode and write_audio).

Resampling is scipy's `resample_poly` (Kaiser-windowed FIR, beta 5, 10 zero crossings per side
at the lower rate) written in numpy: importing scipy.signal takes about a second.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import cache
from math import gcd
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    from speechrt.audio.telephone import BandFilter

FORMATS = ("wav", "flac", "pcm")  # lossless; speechrt.audio.codecs.FORMATS adds mp3, opus


def resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Polyphase resampling (Kaiser-windowed FIR) of a mono float signal (N,)."""
    if orig_sr == target_sr:
        return audio
    if orig_sr <= 0 or target_sr <= 0:
        raise SpeechRTError(f"invalid sample rate: {orig_sr} -> {target_sr}")
    g = gcd(orig_sr, target_sr)
    up, down = target_sr // g, orig_sr // g
    out = resample_poly(audio.astype(np.float64), up, down, lowpass(up, down))
    return out.astype(np.float32)


def lowpass(up: int, down: int) -> np.ndarray:
    """resample_poly's default filter: scipy.signal.firwin(2 * 10 * r + 1, 1 / r,
    window=("kaiser", 5.0)) with r = max(up, down), float64 (n_taps,)."""
    rate = max(up, down)
    n_taps = 2 * 10 * rate + 1
    m = np.arange(n_taps) - 0.5 * (n_taps - 1)
    h = np.sinc(m / rate) / rate * np.kaiser(n_taps, 5.0)
    return h / h.sum()  # unit gain at DC, as firwin scales a low-pass


OUTPUTS_PER_STEP = 1 << 14  # output samples computed at once: a (16384, taps / up) gather


def resample_poly(x: np.ndarray, up: int, down: int, h: np.ndarray) -> np.ndarray:
    """scipy.signal.resample_poly(x, up, down, window=h) for 1-D float64 x: upsample by `up`
    (zeros between samples), filter with h * up centred, keep every `down`-th sample;
    ceil(N * up / down) samples out.

    Polyphase: output m sits at upsampled position p = (m + pre) * down and sums
    x[p // up - j] * h'[p % up + j * up] over the taps j, where h' is h behind `pad` zeros
    (resample_poly's alignment); only those products are computed, a block of outputs at a time.
    """
    n_in = x.shape[0]
    half = (h.shape[0] - 1) // 2
    pad = down - half % down
    pre = (half + pad) // down  # outputs resample_poly drops at the start
    n_out = -(-n_in * up // down)
    taps = -(-(h.shape[0] + pad) // up)
    table = np.zeros(taps * up)
    table[pad : pad + h.shape[0]] = h * up
    table = table.reshape(taps, up)  # table[j, phase] = h'[phase + j * up]
    xp = np.concatenate((np.zeros(taps), x, np.zeros(taps + 1)))  # x[i] at xp[i + taps]
    out = np.empty(n_out)
    j = np.arange(taps)
    for start in range(0, n_out, OUTPUTS_PER_STEP):
        pos = (np.arange(start, min(start + OUTPUTS_PER_STEP, n_out)) + pre) * down
        base, phase = pos // up, pos % up
        # inputs past the end read zeros (resample_poly's constant padding)
        idx = np.minimum(base[:, None] - j[None, :], n_in) + taps
        out[start : start + pos.shape[0]] = np.einsum("mj,jm->m", xp[idx], table[:, phase])
    return out


def to_int16(audio: np.ndarray) -> np.ndarray:
    """float in [-1, 1] -> int16 with clipping (32767 for +1.0)."""
    x = np.clip(audio, -1.0, 1.0)  # the one float temporary, worked on in place
    x *= 32767.0
    return np.rint(x, out=x).astype("<i2")


def encode_audio(
    audio: np.ndarray, sampling_rate: int, fmt: str = "wav", sample_format: str = "int16"
) -> bytes:
    """audio: (N,) float in [-1, 1] -> bytes of a WAV, FLAC or raw little-endian PCM file.

    sample_format "int16" (default) or "float32" (WAV and raw PCM only: exact model output).
    """
    if fmt not in FORMATS:
        raise SpeechRTError(f"unknown audio format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if sample_format not in ("int16", "float32"):
        raise SpeechRTError(f"unknown sample format {sample_format!r}; use int16 or float32")
    if sample_format == "float32" and fmt == "flac":
        raise SpeechRTError("FLAC holds integer samples only; use int16 or WAV")
    if fmt == "pcm":
        data = audio.astype("<f4") if sample_format == "float32" else to_int16(audio)
        return data.tobytes()
    import soundfile as sf

    buf = io.BytesIO()
    if sample_format == "float32":
        sf.write(buf, audio.astype(np.float32), sampling_rate, format="WAV", subtype="FLOAT")
    else:
        sf.write(buf, to_int16(audio), sampling_rate, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


# Decoding limits: what a file may claim before a single sample is decoded.
MAX_SAMPLE_RATE = 192_000  # Hz; resampling filters grow with the rate (20 x rate taps at worst)
MAX_CHANNELS = 64
# Samples (all channels) decoded per second of the duration limit: 48 kHz stereo may be as long
# as the limit, 192 kHz 8-channel audio an eighth of it (decoding 599 s of that, a 0.95 MB
# FLAC of silence, took 51 s of CPU)
DECODE_SAMPLES_PER_SECOND = 96_000
BLOCK_SAMPLES = 1 << 20  # samples (all channels together) decoded at a time: 4 MiB of float32
UNKNOWN_FRAMES = 1 << 62  # libsndfile's frame count for a stream of unknown length (SF_COUNT_MAX)


class DecodeStopped(Exception):
    """read_audio's `stop()` said to stop (a deadline passed, the client went away)."""


class StreamResampler:
    """resample_poly applied block by block: push() mono blocks, then flush().

    Output j sits at input time j * down / up, and the filter reaches `context` input samples
    either side of it; so every block is resampled with that much of its neighbours and cut
    at multiples of `down` input samples (where input and output samples line up). The
    concatenated output equals resample_poly on the whole signal up to float rounding, while
    only a block and its context are held.
    """

    def __init__(self, orig_sr: int, target_sr: int) -> None:
        if orig_sr <= 0 or target_sr <= 0:
            raise SpeechRTError(f"invalid sample rate: {orig_sr} -> {target_sr}")
        g = gcd(orig_sr, target_sr)
        self.up, self.down = target_sr // g, orig_sr // g
        max_rate = max(self.up, self.down)
        half_len = 10 * max_rate  # resample_poly's filter, in upsampled samples
        self.filter = lowpass(self.up, self.down)
        reach = half_len // self.up + 2  # input samples the filter spans on each side
        self.context = -(-reach // self.down) * self.down  # rounded up to a multiple of down
        self.buffer = np.zeros(0, dtype=np.float64)  # input from global index `start`
        self.start = 0
        self.done = 0  # input samples (a multiple of down) whose output was returned

    def push(self, block: np.ndarray) -> np.ndarray:
        """block (N,) -> the output samples it completes (M,) float32."""
        self.buffer = np.concatenate((self.buffer, block.astype(np.float64)))
        end = self.start + self.buffer.shape[0]
        upto = (end - self.context) // self.down * self.down
        if upto <= self.done:
            return np.zeros(0, dtype=np.float32)
        return self._emit(upto, upto + self.context)

    def flush(self) -> np.ndarray:
        """The output of everything pushed and not yet returned (M,) float32."""
        end = self.start + self.buffer.shape[0]
        return self._emit(end, end) if end > self.done else np.zeros(0, dtype=np.float32)

    def _emit(self, upto: int, until: int) -> np.ndarray:
        """Output for input [done, upto), filtering input [done - context, until)."""
        first = max(self.start, self.done - self.context)  # a multiple of down (or 0)
        segment = self.buffer[first - self.start : until - self.start]
        out = resample_poly(segment, self.up, self.down, self.filter)
        lo = (self.done - first) * self.up // self.down
        n = -(-(upto - first) * self.up // self.down) - lo  # ceil: resample_poly's length
        keep = max(self.start, upto - self.context)
        self.buffer, self.start = self.buffer[keep - self.start :], keep
        self.done = upto
        return out[lo : lo + n].astype(np.float32)


def read_audio(
    source: str | Path | bytes | BinaryIO,
    target_sr: int | None = None,
    max_seconds: float | None = None,
    band: Callable[[int], BandFilter | None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[np.ndarray, int]:
    """Decode WAV/FLAC/OGG (anything libsndfile reads) to mono float32 (N,), optionally resampled.

    Multi-channel audio is averaged to mono. Returns (audio, sample rate). The header is
    checked before any sample is decoded (rate, channels, and with `max_seconds` the
    duration and the samples to decode: at most max_seconds x DECODE_SAMPLES_PER_SECOND over
    all channels), then the file is decoded in blocks that are mixed to mono and resampled as
    they come, so memory follows the duration at the output rate, not the file's size or
    channel count. A file that decodes to more than those limits (its header said less, or
    did not say) is refused as soon as decoding passes them. `band(file's rate)` may
    return a filter (speechrt.audio.telephone.BandFilter) for the resampled blocks. `stop()`
    is asked before each block: True raises DecodeStopped.
    """
    import soundfile as sf

    name = str(source) if isinstance(source, (str, Path)) else "audio"
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        why = "a directory, not an audio file" if Path(source).is_dir() else "no such file"
        raise SpeechRTError(f"{name}: {why}")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    try:
        with _reader_class()(source) as f:
            return _decode(f, name, target_sr, max_seconds, band, stop)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        reason = str(e).split(": ", 1)[-1] if str(e) else type(e).__name__
        raise SpeechRTError(f"{name}: not a readable audio file ({reason})") from None


@cache
def _reader_class() -> type:
    """soundfile.SoundFile that reads straight on: soundfile re-seeks to its own count of the
    position after every read, and that seek fails at the end of a FLAC stream whose header
    gives no length; libsndfile's reads advance the position by themselves."""
    import soundfile as sf

    class Reader(sf.SoundFile):
        def seekable(self) -> bool:
            return False

    return Reader


def _costly(name: str, sr: int, channels: int, max_seconds: float, frames: int | None) -> str:
    """Why a file costs more to decode than max_seconds x DECODE_SAMPLES_PER_SECOND samples
    (its `frames` per channel, or None: not known, it has decoded past the limit)."""
    limit = int(max_seconds * DECODE_SAMPLES_PER_SECOND)
    audio = f"{channels}-channel audio at {sr} Hz"
    if frames is None:
        audio += f": more than {limit} samples to decode"
    else:
        audio = f"{frames / sr:.1f} s of {audio}: {frames * channels} samples to decode"
    return f"{name}: {audio}; the limit is {limit} ({max_seconds:g} s of 48 kHz stereo)"


def _decode(
    f: Any,
    name: str,
    target_sr: int | None,
    max_seconds: float | None,
    band: Callable[[int], BandFilter | None] | None,
    stop: Callable[[], bool] | None = None,
) -> tuple[np.ndarray, int]:
    """An open soundfile.SoundFile -> mono float32 (N,) at target_sr (else its own rate)."""
    sr, channels, frames = int(f.samplerate), int(f.channels), int(f.frames)
    if not 0 < sr <= MAX_SAMPLE_RATE:
        raise SpeechRTError(f"{name}: sample rate {sr} Hz is outside 1..{MAX_SAMPLE_RATE} Hz")
    if not 0 < channels <= MAX_CHANNELS:
        raise SpeechRTError(f"{name}: {channels} channels; at most {MAX_CHANNELS} are read")
    by_time = by_cost = UNKNOWN_FRAMES  # the most frames the limits allow
    if max_seconds is not None:
        by_time = int(max_seconds * sr)
        by_cost = int(max_seconds * DECODE_SAMPLES_PER_SECOND) // channels  # every channel's
        if by_time < frames < UNKNOWN_FRAMES:
            raise SpeechRTError(
                f"{name}: audio is {frames / sr:.1f} s long; the limit is {max_seconds:g} s"
            )
        if by_cost < frames < UNKNOWN_FRAMES:
            raise SpeechRTError(_costly(name, sr, channels, max_seconds, frames))
    out_sr = target_sr or sr
    resampler = StreamResampler(sr, out_sr) if out_sr != sr else None
    filtered = band(sr) if band is not None else None
    stages = [s for s in (resampler, filtered) if s is not None]  # each block through them
    parts: list[np.ndarray] = []
    decoded = 0
    block = max(1, BLOCK_SAMPLES // channels)
    while True:
        if stop is not None and stop():
            raise DecodeStopped(name)
        data = f.read(block, dtype="float32", always_2d=True)  # (n, channels); n < block: the end
        if data.shape[0] == 0:
            break
        decoded += data.shape[0]
        if decoded > by_time:
            raise SpeechRTError(f"{name}: audio is longer than the limit of {max_seconds:g} s")
        if decoded > by_cost:
            assert max_seconds is not None
            raise SpeechRTError(_costly(name, sr, channels, max_seconds, None))
        mono = data.mean(axis=1) if channels > 1 else data[:, 0].copy()  # (n,)
        for stage in stages:
            mono = stage.push(mono)
        parts.append(mono)
    for i, stage in enumerate(stages):  # what each stage held back, through the stages after it
        tail = stage.flush()
        for later in stages[i + 1 :]:
            tail = later.push(tail)
        parts.append(tail)
    audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return np.ascontiguousarray(audio, dtype=np.float32), out_sr


def as_waveform(audio: np.ndarray, name: str = "audio") -> np.ndarray:
    """An array of samples -> mono float32 (N,); integer PCM scaled to [-1, 1]."""
    a = np.asarray(audio)
    if a.ndim != 1:
        raise SpeechRTError(f"{name}: expected 1-D mono samples, got shape {a.shape}")
    if np.issubdtype(a.dtype, np.unsignedinteger):
        raise SpeechRTError(f"{name}: unsigned samples ({a.dtype}) are not supported")
    if np.issubdtype(a.dtype, np.integer):
        a = a.astype(np.float32) / float(np.iinfo(a.dtype).max + 1)
    elif not np.issubdtype(a.dtype, np.floating):
        raise SpeechRTError(f"{name}: unsupported sample type {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise SpeechRTError(f"{name}: samples contain NaN or infinity")
    return a
