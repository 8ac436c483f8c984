"""Hostile input against the real server (`speechrt serve` on the bundled models, CPU).

Every case sends what an attacker (or a careless client) would, and expects its 4xx or its
answer; after each, /v2/health/ready must still answer 200. The server's peak RSS (VmHWM in
/proc) is read after a warm-up and again by the last test, which bounds what the whole module
cost: add new cases above `test_peak_rss_grew_by_at_most_300_mb` (pytest runs a file's tests
in definition order).
"""

from __future__ import annotations

import io
import subprocess
import sys
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import soundfile as sf

from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None or default_model(ASR_MODEL) is None,
    reason="needs the bundled voice and recogniser",
)

RSS_GROWTH_LIMIT_MB = 300


@dataclass
class Served:
    url: str
    pid: int
    peak_kb: int  # VmHWM after the warm-up


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def wav_bytes(audio: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def flac_bomb(seconds: int, sr: int, channels: int, unknown_length: bool = False) -> bytes:
    """Silence as FLAC, written ten seconds at a time (never whole in memory): 30 minutes of
    48 kHz 8-channel audio is ~0.7 MB. `unknown_length` zeroes STREAMINFO's sample count, as a
    streaming encoder does (the header then does not say how long the audio is)."""
    buf = io.BytesIO()
    block = np.zeros((10 * sr, channels), dtype=np.int16)
    with sf.SoundFile(buf, "w", sr, channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds // 10):
            f.write(block)
    data = bytearray(buf.getvalue())
    if unknown_length:
        # "fLaC", a 4-byte block header, then STREAMINFO: the 36-bit count ends bytes 18..25
        field = int.from_bytes(data[18:26], "big") >> 36 << 36
        data[18:26] = field.to_bytes(8, "big")
    return bytes(data)


@pytest.fixture(scope="module")
def served(start_server) -> Served:
    url, proc = start_server("--device", "cpu")
    with httpx.Client(base_url=url, timeout=120) as c:  # warm-up: first use of each pipeline
        assert speak(c, "Hello there.").status_code == 200
        tone = (0.3 * np.sin(np.arange(16000) * 0.1)).astype(np.float32)
        assert transcribe(c, wav_bytes(tone, 16000)).status_code == 200
    return Served(url, proc.pid, peak_rss_kb(proc.pid))


@pytest.fixture
def client(served: Served):
    with httpx.Client(base_url=served.url, timeout=120) as c:
        yield c
        assert c.get("/v2/health/ready").status_code == 200  # still serving after the case


def speak(c: httpx.Client, text: str, **fields: object) -> httpx.Response:
    body = {"model": "tts-1", "voice": "0", "input": text, "response_format": "pcm", **fields}
    return c.post("/v1/audio/speech", json=body)


def transcribe(c: httpx.Client, data: bytes, name: str = "a.wav") -> httpx.Response:
    return c.post(
        "/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"file": (name, data)}
    )


def error_of(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


# -- uploads: the header is checked before decoding, decoding stops at the limit ------------------


def test_flac_bomb_is_refused_from_its_header(client):
    bomb = flac_bomb(1800, 48000, 8)  # 30 minutes; 8 channels
    assert len(bomb) < 1_000_000
    r = transcribe(client, bomb, "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == "audio: audio is 1800.0 s long; the limit is 600 s"


def test_flac_without_a_length_is_refused_at_the_limit(client):
    bomb = flac_bomb(700, 48000, 8, unknown_length=True)
    r = transcribe(client, bomb, "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == "audio: audio is longer than the limit of 600 s"


# -- text: limits count what the model reads, after normalisation -------------------------------


def test_five_thousand_digits_are_refused_by_their_spoken_length(client):
    r = speak(client, "1234567890" * 500)  # 5,000 characters that read as ~21,000 symbols
    assert r.status_code == 400
    assert "symbols after normalisation" in error_of(r) and "the limit is 15000" in error_of(r)


def test_long_unpunctuated_text_is_spoken_in_bounded_pieces(client):
    words = "the quick brown fox jumps over the lazy dog and "
    text = (words * 13).strip()  # ~620 characters, no sentence end: three even pieces
    # At speed 4 the audio is a quarter as long: the vocoder's memory follows the audio's
    # length (~120 kB per mel frame of a batch), which this case is not about.
    r = speak(client, text, speed=4.0)
    assert r.status_code == 200
    seconds = len(r.content) / 2 / int(r.headers["x-sample-rate"])
    assert 5 < seconds < 30  # all of it was spoken (~117 words, ~40 s at speed 1)


# -- the CLI's decoder options -------------------------------------------------------------------


def test_huge_beam_size_is_a_one_line_error(tmp_path):
    wav = tmp_path / "a.wav"
    wav.write_bytes(wav_bytes(np.zeros(16000, dtype=np.float32), 16000))
    cmd = [sys.executable, "-m", "speechrt.cli", "transcribe", str(wav), "--beam-size", "100000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr == (
        "speechrt transcribe: error: beam_size must be an integer within [1, 1024], got 100000\n"
    )


# -- keep last: what the whole module cost the server --------------------------------------------


def test_peak_rss_grew_by_at_most_300_mb(served: Served):
    grown_mb = (peak_rss_kb(served.pid) - served.peak_kb) / 1024
    assert grown_mb <= RSS_GROWTH_LIMIT_MB, f"peak RSS grew by {grown_mb:.0f} MB"
    assert httpx.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200
