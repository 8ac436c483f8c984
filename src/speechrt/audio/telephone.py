"""The telephone band: what a recogniser trained on telephone audio heard of it.

A telephone line passes about 300-3400 Hz. The bundled recogniser learnt telephone audio through
`response` (speechrt_train.asr_data.channel_batch draws it for a share of its training items):
flat from 300 Hz to 3.4 kHz, a 12th-order roll-off above that and nothing from 4 kHz, a
2nd-order roll-off below 300 Hz. Audio recorded at 8 kHz and resampled to 16 kHz holds 0-4 kHz
instead, a band the recogniser never heard; a model whose features say `narrowband="telephone"`
(speechrt.audio.features.FeatureConfig) has such audio filtered to its band first.

The filter is a linear-phase FIR (`TAPS` taps, the response sampled and windowed), run block by
block (`BandFilter`) so that hours of audio or a live stream cost one block of memory; its
output is delay-compensated and as long as its input. `g711_decode` reads the telephone
network's own sample format (ITU-T G.711 mu-law and A-law, 8 kHz). Numpy only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

NARROWBAND_RATE = 8000  # a source sampled at this rate or less is narrowband
BANDS = ("telephone",)  # the values of FeatureConfig.narrowband
TAPS = 513  # 32 ms at 16 kHz: the 4 kHz edge within ~130 Hz
BLOCK = 16384  # samples filtered per FFT


def response(f: np.ndarray) -> np.ndarray:
    """Magnitude response of the telephone band at frequencies f (Hz), any shape."""
    f = np.asarray(f, dtype=np.float64)
    band = 1 / np.sqrt((1 + (f / 3400) ** 24) * (1 + (300 / np.maximum(f, 1.0)) ** 4))
    return band * (f < 4000)


@lru_cache(maxsize=4)
def fir(sample_rate: int, taps: int = TAPS) -> np.ndarray:
    """(taps,) linear-phase FIR of `response` at `sample_rate` (odd taps: the delay is whole)."""
    n = 1 << (8 * taps - 1).bit_length()  # a fine grid: the sampled response's own ripple is small
    h = np.fft.irfft(response(np.fft.rfftfreq(n, 1 / sample_rate)), n)
    h = np.roll(h, taps // 2)[:taps] * np.kaiser(taps, 8.0)
    h.flags.writeable = False
    return h


class BandFilter:
    """The telephone band on audio that arrives in blocks: push() blocks at `sample_rate`, then
    flush(). The outputs joined equal `band_limit` on the whole audio (float rounding aside):
    the first TAPS // 2 samples come out late, and flush() emits them."""

    def __init__(self, sample_rate: int) -> None:
        self.h = fir(sample_rate)
        self.history = np.zeros(self.h.size - 1)  # the last inputs (zeros before the start)
        self.delay = self.h.size // 2  # outputs still to drop (the filter's centre)
        self.n_fft = 1 << (BLOCK + self.h.size - 2).bit_length()
        self.H = np.fft.rfft(self.h, self.n_fft)

    def push(self, block: np.ndarray) -> np.ndarray:
        """block (N,) -> the filtered samples it completes (float32)."""
        out = []
        block = np.asarray(block, dtype=np.float64)
        for i in range(0, block.size, BLOCK):
            x = np.concatenate((self.history, block[i : i + BLOCK]))  # overlap-save
            y = np.fft.irfft(np.fft.rfft(x, self.n_fft) * self.H, self.n_fft)
            y = y[self.h.size - 1 : x.size]  # the full convolution's outputs for this piece
            self.history = x[x.size - self.history.size :]
            skip = min(self.delay, y.size)
            self.delay -= skip
            out.append(y[skip:])
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The samples held back (the last TAPS // 2), as if zeros followed the audio."""
        return self.push(np.zeros(self.h.size // 2))

    def whole(self, audio: np.ndarray) -> np.ndarray:
        """A fresh filter's output for all of `audio`: (N,) -> (N,) float32."""
        return np.concatenate((self.push(audio), self.flush()))


def band_limit(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """audio (N,) -> (N,) float32 filtered to the telephone band."""
    return BandFilter(sample_rate).whole(audio)


G711_RATE = 8000


def _g711_table(law: str) -> np.ndarray:
    """(256,) float32: each G.711 code's linear value in [-1, 1) (ITU-T G.711's expansion)."""
    code = np.arange(256)
    if law == "ulaw":
        u = ~code & 0xFF
        exponent, mantissa = (u >> 4) & 7, u & 0x0F
        magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
        linear = np.where(u & 0x80, -magnitude, magnitude)
    elif law == "alaw":
        a = code ^ 0x55
        exponent, mantissa = (a >> 4) & 7, a & 0x0F
        magnitude = np.where(
            exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << (exponent - 1).clip(0)
        )
        linear = np.where(a & 0x80, magnitude, -magnitude)
    else:
        raise ValueError(f"G.711 law must be 'ulaw' or 'alaw', not {law!r}")
    return (linear / 32768.0).astype(np.float32)


G711 = {law: _g711_table(law) for law in ("ulaw", "alaw")}


def g711_decode(data: bytes, law: str) -> np.ndarray:
    """G.711 bytes (one 8 kHz sample each) -> (N,) float32 in [-1, 1)."""
    return G711[law][np.frombuffer(data, dtype=np.uint8)]
