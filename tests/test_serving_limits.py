"""What one request may cost the server: slow speech cut into bounded pieces.

Against the shared tiny-voice server (cheap models, real HTTP): the pipeline's logic is what is
tested; the bundled models' costs are in tests/test_hostile_input.py.
"""

from __future__ import annotations

import httpx

from speechrt.client import parse_metrics
from speechrt.tts import piece_symbols


def count(url: str, model: str) -> float:
    """Batch items the model has run (nv_inference_count)."""
    m = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    return m.get(f'nv_inference_count{{model="{model}",version="1"}}', 0.0)


# -- speech read slowly: pieces that stay ~30 s long, a budget that counts the pace -------------


def test_slow_speech_is_cut_into_pieces_of_bounded_length(speech_server: str):
    """speed 0.25 x <prosody rate="0.4">: pace 0.1, so a piece holds at most 40 symbols (its
    frames, at ten times a symbol's, stay what a 400-symbol piece's are at pace 1)."""
    assert piece_symbols(0.1) == 40 and piece_symbols(1.0) == piece_symbols(2.0) == 400
    text = "The quick brown fox jumps over the lazy dog near the river bank today."  # 70 chars
    before = count(speech_server, "tts")
    body = {"model": "tts", "voice": "0", "response_format": "pcm", "speed": 0.25}
    ssml = f'<speak><prosody rate="0.4">{text}</prosody></speak>'
    r = httpx.post(f"{speech_server}/v1/audio/speech", json=body | {"input": ssml}, timeout=120)
    assert r.status_code == 200, r.text
    assert count(speech_server, "tts") - before >= 2  # the one sentence ran as several pieces
    plain = body | {"input": text, "speed": 1.0}
    before = count(speech_server, "tts")
    assert httpx.post(f"{speech_server}/v1/audio/speech", json=plain, timeout=60).status_code == 200
    assert count(speech_server, "tts") - before == 1


def test_slow_speech_counts_against_the_symbol_budget(speech_server: str):
    """A symbol read at pace 0.1 decodes ten times the frames and counts ten times: refused
    before any piece runs."""
    text = "The quick brown fox jumps over the lazy dog. " * 40  # ~1,800 characters
    body = {"model": "tts", "voice": "0", "response_format": "pcm", "speed": 0.25}
    ssml = f'<speak><prosody rate="0.4">{text}</prosody></speak>'
    before = count(speech_server, "tts")
    r = httpx.post(f"{speech_server}/v1/audio/speech", json=body | {"input": ssml}, timeout=60)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "at its slow pace" in message and "the limit is 15000 per request at pace 1" in message
    assert count(speech_server, "tts") == before
