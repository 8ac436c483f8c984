"""The telephone band (speechrt.audio.telephone) and where the ASR front end applies it: sources
at 8 kHz or less, for a model whose features ask for it."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from speechrt.audio.features import FeatureConfig
from speechrt.audio.io import read_audio
from speechrt.audio.telephone import TAPS, BandFilter, band_limit, fir, response
from speechrt.errors import SpeechRTError

SR = 16000


def db(x: np.ndarray) -> np.ndarray:
    return 20 * np.log10(np.maximum(np.abs(x), 1e-12))


def test_fir_follows_the_response() -> None:
    n = 1 << 16
    f = np.fft.rfftfreq(n, 1 / SR)
    got = db(np.fft.rfft(fir(SR), n))
    passband = (f > 350) & (f < 3300)
    assert np.abs(got[passband] - db(response(f[passband]))).max() < 0.1
    for edge in (300, 3400):  # both edges 3 dB down, as the response says
        assert got[np.argmin(np.abs(f - edge))] == pytest.approx(-3.0, abs=0.2)
    assert got[f >= 4100].max() < -60  # nothing of what a 16 kHz file holds above 4 kHz
    low = (f >= 80) & (f <= 300)  # the 2nd-order roll-off below the band ...
    assert np.abs(got[low] - db(response(f[low]))).max() < 1.0
    assert got[(f >= 50) & (f <= 60)].max() < -25  # ... takes mains hum 25 dB down


@pytest.mark.parametrize("n", [1, 100, TAPS // 2, TAPS, 5000, 40000])
def test_streaming_equals_the_whole(n: int) -> None:
    """Blocks of any size give the delay-compensated convolution of the whole, as long as it."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    want = np.convolve(x, fir(SR))[TAPS // 2 : TAPS // 2 + n]
    whole = band_limit(x, SR)
    assert whole.shape == (n,) and whole.dtype == np.float32
    np.testing.assert_allclose(whole, want, atol=1e-5)
    stream, parts, i = BandFilter(SR), [], 0
    while i < n:
        size = int(rng.integers(1, 3000))
        parts.append(stream.push(x[i : i + size]))
        i += size
    parts.append(stream.flush())
    np.testing.assert_allclose(np.concatenate(parts), want, atol=1e-5)


def test_only_known_bands() -> None:
    assert FeatureConfig.from_dict({"narrowband": "telephone"}).narrowband == "telephone"
    with pytest.raises(SpeechRTError, match="narrowband"):
        FeatureConfig(narrowband="radio")


def tones(rate: int, *hz: float) -> np.ndarray:
    t = np.arange(rate) / rate  # 1 s
    return (0.2 * sum(np.sin(2 * np.pi * f * t) for f in hz)).astype(np.float32)


def level(audio: np.ndarray, hz: float) -> float:
    """dB of the `hz` component of 1 s of 16 kHz audio (its middle half)."""
    mid = audio[SR // 4 : 3 * SR // 4]
    spec = np.abs(np.fft.rfft(mid * np.hanning(mid.size)))
    return float(db(spec[round(hz * mid.size / SR)]))


class FrontEnd:
    """The ASR front end's rate handling (band_filter, from_rate, load_audio) on a config."""

    from speechrt.asr.pipeline import ASR

    band_filter = ASR.band_filter
    from_rate = ASR.from_rate

    def __init__(self, narrowband: str | None) -> None:
        self.features = FeatureConfig(narrowband=narrowband)
        self.sample_rate = SR


def wav(audio: np.ndarray, rate: int, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.stack([audio] * channels, 1), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.mark.parametrize("channels", [1, 2])
def test_narrowband_sources_are_heard_through_the_band(channels: int) -> None:
    phone, plain = FrontEnd("telephone"), FrontEnd(None)
    assert phone.band_filter(16000) is None and phone.band_filter(11025) is None
    assert plain.band_filter(8000) is None  # DLE's models: as resampled
    at_8k = tones(8000, 1000, 3800)
    for heard in (
        read_audio(wav(at_8k, 8000, channels), SR, band=phone.band_filter)[0],
        phone.from_rate(at_8k, 8000),
    ):
        as_resampled = plain.from_rate(at_8k, 8000)
        assert heard.shape == as_resampled.shape == (SR,)
        assert level(heard, 1000) == pytest.approx(level(as_resampled, 1000), abs=0.1)
        assert level(heard, 3800) < level(as_resampled, 3800) - 9  # past the band's edge
    # the same tones at 16 kHz pass as they are
    at_16k = tones(SR, 1000, 3800)
    np.testing.assert_array_equal(phone.from_rate(at_16k, SR), at_16k)
    assert level(read_audio(wav(at_16k, SR), SR, band=phone.band_filter)[0], 3800) > -1 + level(
        at_16k, 3800
    )


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_g711_decodes_every_code_as_libsndfile_does(law: str) -> None:
    from speechrt.audio.telephone import g711_decode

    codes = bytes(range(256))
    want, _ = sf.read(
        io.BytesIO(codes), samplerate=8000, channels=1, format="RAW", subtype=law.upper(),
        dtype="int16",
    )  # fmt: skip
    got = g711_decode(codes, law)
    assert got.dtype == np.float32 and got.shape == (256,)
    np.testing.assert_array_equal(np.round(got * 32768).astype(np.int16), want)
