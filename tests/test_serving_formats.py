"""Every speech format through a real server and the openai client, whole and streamed: each
decodes to the wav response's samples (whole lossless formats exactly; streamed wav and pcm
exactly where this CPU's kernels are batch-invariant, else within 2 int16 steps; MP3 and Opus
within a stated log-spectral distance after aligning for the encoder's delay)."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from speechrt.audio import codecs
from speechrt.audio.io import read_audio
from speechrt.device import batch_invariance_holds

THREE = "The first sentence is here. Then a second, longer one follows it! Is this the third?"
# Lossy formats are compared by log-spectral distance: the mean |dB| difference of band energies
# (16 bands from 100 Hz to 8 kHz, 1024-sample frames every 256, frames within 40 dB of the
# loudest). Opus codes the tiny voice's noise-like waveform by its spectrum, not sample by
# sample (waveform SNR ~0.4 dB, MP3's ~25 dB), so a waveform SNR would not hold it to
# anything. Measured: mp3 0.53 dB, opus 0.51 dB; the same audio 300 samples late: 5.9 dB,
# at half the gain: 6.0 dB, noise of the same level: 34 dB.
MAX_LSD_DB = 2.0
STREAM_LSB = 2  # streamed vs whole samples (the first sentence is vocoded in two spans)
MAX_DELAY = 2400  # samples: LAME's encoder delay (1,105) and a streamed MP3's Info frame (576)
EDGE = 1200  # samples at each end left out: codec start-up and flush transients


@pytest.fixture(scope="module")
def oai(speech_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{speech_server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(oai) -> tuple[np.ndarray, int]:
    """The wav response's samples (float, int16 steps) and rate."""
    wav = oai.audio.speech.create(model="tts", voice="0", input=THREE, response_format="wav")
    return read_audio(wav.content)


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


@pytest.mark.parametrize("fmt", codecs.FORMATS)
def test_every_format_decodes_to_the_wav_samples(oai, reference, fmt):
    want, sr = reference
    r = oai.audio.speech.create(model="tts", voice="0", input=THREE, response_format=fmt)
    assert r.response.headers["content-type"] == codecs.MEDIA_TYPES[fmt]
    assert int(r.response.headers["x-sample-rate"]) == codecs.output_rate(fmt, sr)
    got = decode(r.content, fmt, sr)
    if fmt in codecs.LOSSY:
        assert abs(len(got) - len(want)) <= 1  # whole files carry their length (gapless)
        delay, lsd = aligned_lsd(got, want, sr)
        assert delay == 0 and lsd <= MAX_LSD_DB, (delay, lsd)
    else:
        assert np.array_equal(np.round(got * 32768), np.round(want * 32768))


def test_mp3_is_the_default_as_openai_s(speech_server, reference):
    body = {"model": "tts-1", "voice": "alloy", "input": THREE}
    r = httpx.post(f"{speech_server}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    want, sr = reference
    delay, lsd = aligned_lsd(decode(r.content, "mp3", sr), want, sr)
    assert delay == 0 and lsd <= MAX_LSD_DB, (delay, lsd)


@pytest.mark.parametrize("fmt", codecs.STREAMED)
def test_streamed_formats_decode_to_the_wav_samples(oai, reference, fmt):
    want, sr = reference
    with oai.audio.speech.with_streaming_response.create(
        model="tts", voice="0", input=THREE, response_format=fmt, stream_format="audio"
    ) as r:
        assert r.headers["content-type"] == codecs.MEDIA_TYPES[fmt]
        chunks = list(r.iter_bytes())
    got = decode(b"".join(chunks), fmt, sr)
    if fmt in codecs.LOSSY:
        delay, lsd = aligned_lsd(got, want, sr)
        assert lsd <= MAX_LSD_DB, (delay, lsd)
        # an Opus stream keeps its pre-skip; an MP3 stream cannot rewrite its Info frame
        assert (delay == 0) if fmt == "opus" else (0 < delay <= MAX_DELAY)
    else:  # bitwise only where batch-invariant kernels prove it (the server runs the mode)
        lsb = 0 if batch_invariance_holds() else STREAM_LSB
        assert got.shape == want.shape
        assert np.abs(np.round(got * 32768) - np.round(want * 32768)).max() <= lsb


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "aac"}, "response_format"),
        ({"response_format": "ogg"}, "response_format"),
        ({"response_format": "flac", "stream_format": "audio"}, "stream_format"),
    ],
)
def test_unsupported_formats_are_400_naming_the_supported(speech_server, fields, param):
    body = {"model": "tts", "voice": "0", "input": "Hi.", **fields}
    r = httpx.post(f"{speech_server}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "mp3" in error["message"] and "pcm" in error["message"]
    if fields["response_format"] == "aac":  # refused on purpose, saying why (README)
        assert "has no AAC encoder" in error["message"]
