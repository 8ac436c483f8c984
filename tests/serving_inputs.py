"""Inputs shared by the server tests: a sentence, speech-like audio and its WAV bytes."""

from __future__ import annotations

import numpy as np

from speechrt.audio.io import encode_audio

ONE = "Hello there, how are you today?"


def speechlike(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """Tone bursts and near-silence: something for the recogniser to chew on."""
    rng = np.random.default_rng(seed)
    parts, total = [], int(seconds * sr)
    while sum(map(len, parts)) < total:
        n = int(rng.uniform(0.05, 0.4) * sr)
        tone = np.sin(2 * np.pi * rng.uniform(100, 3000) * np.arange(n) / sr) * np.hanning(n)
        parts.append(0.3 * tone if rng.random() < 0.7 else 0.003 * rng.standard_normal(n))
    return np.concatenate(parts)[:total].astype(np.float32)


def wav(audio: np.ndarray, sr: int = 16000) -> bytes:
    return encode_audio(audio, sr, "wav")
