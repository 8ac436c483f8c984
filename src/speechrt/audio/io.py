"""Reading and writing audio: WAV/FLAC/OGG through soundfile, raw 16-bit PCM, resampling."""

from __future__ import annotations

import io
from math import gcd
from pathlib import Path
from typing import BinaryIO

import numpy as np

from speechrt.errors import SpeechRTError

FORMATS = ("wav", "flac", "pcm")


def resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Polyphase resampling (Kaiser-windowed FIR) of a mono float signal (N,)."""
    if orig_sr == target_sr:
        return audio
    if orig_sr <= 0 or target_sr <= 0:
        raise SpeechRTError(f"invalid sample rate: {orig_sr} -> {target_sr}")
    from scipy.signal import resample_poly

    g = gcd(orig_sr, target_sr)
    out = resample_poly(audio.astype(np.float64), target_sr // g, orig_sr // g)
    return out.astype(np.float32)


def to_int16(audio: np.ndarray) -> np.ndarray:
    """float in [-1, 1] -> int16 with clipping (32767 for +1.0)."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")


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


def write_audio(
    path: str | Path,
    audio: np.ndarray,
    sampling_rate: int,
    fmt: str | None = None,
    sample_format: str = "int16",
) -> None:
    """Write (N,) float audio; format from `fmt`, else the suffix (.wav/.flac/.pcm/.raw)."""
    path = Path(path)
    if fmt is None:
        suffix = path.suffix.lower().lstrip(".")
        fmt = {"raw": "pcm"}.get(suffix, suffix) if suffix else "wav"
    data = encode_audio(audio, sampling_rate, fmt, sample_format)
    try:
        path.write_bytes(data)
    except OSError as e:
        raise SpeechRTError(f"cannot write {path}: {e.strerror or e}") from None


def read_audio(
    source: str | Path | bytes | BinaryIO, target_sr: int | None = None
) -> tuple[np.ndarray, int]:
    """Decode WAV/FLAC/OGG (anything libsndfile reads) to mono float32 (N,), optionally resampled.

    Multi-channel audio is averaged to mono. Returns (audio, sample_rate).
    """
    import soundfile as sf

    name = str(source) if isinstance(source, (str, Path)) else "audio"
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        why = "a directory, not an audio file" if Path(source).is_dir() else "no such file"
        raise SpeechRTError(f"{name}: {why}")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    try:
        data, sr = sf.read(source, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        reason = str(e).split(": ", 1)[-1] if str(e) else type(e).__name__
        raise SpeechRTError(f"{name}: not a readable audio file ({reason})") from None
    audio = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if target_sr is not None and sr != target_sr:
        audio, sr = resample(audio, sr, target_sr), target_sr
    return np.ascontiguousarray(audio, dtype=np.float32), int(sr)
