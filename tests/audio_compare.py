"""Comparing decoded responses with the audio they encode: any response format back to samples,
and lossy formats (MP3, Opus) by log-spectral distance after aligning for the encoder's delay."""

from __future__ import annotations

import numpy as np

from speechrt.audio.io import read_audio

# Lossy formats are compared by log-spectral distance: the mean |dB| difference of band energies
# (16 bands from 100 Hz to 8 kHz, 1024-sample frames every 256, frames within 40 dB of the
# loudest). Opus codes the tiny voice's noise-like waveform by its spectrum, not sample by
# sample (waveform SNR ~0.4 dB, MP3's ~25 dB), so a waveform SNR would not hold it to
# anything. Measured: mp3 0.53 dB, opus 0.51 dB; the same audio 300 samples late: 5.9 dB,
# at half the gain: 6.0 dB, noise of the same level: 34 dB.
MAX_LSD_DB = 2.0
MAX_DELAY = 2400  # samples: LAME's encoder delay (1,105) and a streamed MP3's Info frame (576)
EDGE = 1200  # samples at each end left out: codec start-up and flush transients


def decode(data: bytes, fmt: str, sr: int) -> np.ndarray:
    """Any response -> float samples at `sr` (Opus comes back to the voice's rate)."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    return read_audio(data, sr)[0]


def band_energies(x: np.ndarray, sr: int) -> np.ndarray:
    """x (N,) -> (frames, 16) energies of 16 log-spaced bands from 100 Hz to 8 kHz."""
    n, hop = 1024, 256
    frames = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), n)[::hop]
    power = np.abs(np.fft.rfft(frames * np.hanning(n), axis=1)) ** 2  # (frames, n // 2 + 1)
    freqs = np.fft.rfftfreq(n, 1 / sr)
    edges = np.geomspace(100, 8000, 17)
    masks = [(freqs >= lo) & (freqs < hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    return np.stack([power[:, m].sum(axis=1) for m in masks], axis=1)


def aligned_lsd(got: np.ndarray, want: np.ndarray, sr: int) -> tuple[int, float]:
    """(delay of `got` behind `want` in samples: the cross-correlation's peak in
    [0, MAX_DELAY]; log-spectral distance in dB of `got` against `want` at that delay)."""
    n = len(want) - 2 * EDGE
    assert len(got) >= n + EDGE, (len(got), len(want))
    ref = want[EDGE : EDGE + n].astype(np.float64)
    delays = range(0, min(MAX_DELAY, len(got) - EDGE - n) + 1)
    scores = [float(np.dot(got[EDGE + d : EDGE + d + n], ref)) for d in delays]
    delay = delays[int(np.argmax(scores))]
    g, w = band_energies(got[EDGE + delay : EDGE + delay + n], sr), band_energies(ref, sr)
    loud = w.sum(axis=1) >= w.sum(axis=1).max() * 1e-4
    tiny = 1e-12  # keeps the log finite in digital silence
    lsd = float(np.mean(np.abs(10 * np.log10((g[loud] + tiny) / (w[loud] + tiny)))))
    return delay, lsd
