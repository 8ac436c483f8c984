"""What one request may cost the server: slow speech cut into bounded pieces, component requests
cut into bounded batch items, uploads decoded on threads of their own.

Against the shared tiny-voice server (cheap models, real HTTP) where the pipeline's logic is what
is tested, in-process where a decode must be held still; the bundled models' costs are in
tests/test_hostile_input.py.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from serving_inputs import infer, mel, speechlike, wav
from speechrt.audio.io import DecodeStopped, read_audio
from speechrt.client import parse_metrics
from speechrt.errors import SpeechRTError
from speechrt.pieces import Piece
from speechrt.serving.engine import Overloaded
from speechrt.serving.pipelines import ASRService, Limits, check_pieces
from speechrt.text import TextProcessor
from speechrt.tts import piece_symbols, text_to_pieces


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
    assert "slow speech counted 1 / pace" in message and "the limit is 15000 per" in message
    assert count(speech_server, "tts") == before


def test_slow_speech_is_counted_by_its_pace_wherever_texts_are_read():
    """The front end's early stop and the pieces' check (every speech route's, the Ray split
    pipeline's too: pipelines.read_texts) count a symbol read at pace p < 1 as 1 / p."""
    front = TextProcessor("english_basic", "english_cleaners_v2")
    text = ["word " * 30]  # 150 symbols
    assert len(text_to_pieces(front, text, [0], max_symbols=200)) == 1
    with pytest.raises(SpeechRTError, match="slow speech counted 1 / pace"):
        text_to_pieces(front, text, [0], max_symbols=200, pace=0.5)
    piece = Piece(0, 0, [5] * 60, 0)
    piece.rate = 0.5  # <prosody rate="0.5">
    check_pieces([piece], 1, Limits(max_text_symbols=130), pace=2.0)  # 60 at pace 1
    with pytest.raises(SpeechRTError, match=r"60 symbols .* \(120 counting slow speech"):
        check_pieces([piece], 1, Limits(max_text_symbols=100))


# -- KServe v2 components: a request holds at most one item's worth of each axis per batch item --


def test_a_batch_of_long_mels_runs_as_bounded_items(speech_server: str):
    """4 mels of 700 frames: 2,800 frames, more than one item of 30 s (2,584 frames) holds, so
    the request is two batch items (3 rows, then 1) that other requests can go between; each
    row's audio is what it is alone."""
    feeds = mel(4, 700)
    feeds["mel"] = np.random.default_rng(0).normal(-5, 1, feeds["mel"].shape).astype(np.float32)
    feeds["mel_lengths"] = np.array([700, 650, 700, 300])
    before = count(speech_server, "hifigan")
    with httpx.Client(base_url=speech_server, timeout=120) as c:
        r = infer(c, "hifigan", feeds, {"binary_data_output": True})
        assert r.status_code == 200, r.text
        assert count(speech_server, "hifigan") - before == 2
        whole = decode_binary(r)
        assert whole["audio"].shape == (4, 700 * 256)
        alone = decode_binary(infer(c, "hifigan", {k: v[3:] for k, v in feeds.items()},
                                    {"binary_data_output": True}))  # fmt: skip
    n = 300 * 256
    assert np.abs(whole["audio"][3, :n] - alone["audio"][0, :n]).max() <= 1e-4
    assert whole["audio_lengths"].tolist() == [700 * 256, 650 * 256, 700 * 256, n]


def decode_binary(r: httpx.Response) -> dict[str, np.ndarray]:
    """The outputs of a binary-extension infer response."""
    import json

    head = int(r.headers["Inference-Header-Content-Length"])
    meta, raw, pos, out = json.loads(r.content[:head]), r.content[head:], 0, {}
    for o in meta["outputs"]:
        size = o["parameters"]["binary_data_size"]
        dtype = {"FP32": np.float32, "INT64": np.int64}[o["datatype"]]
        out[o["name"]] = np.frombuffer(raw[pos : pos + size], dtype).reshape(o["shape"])
        pos += size
    return out


def test_component_calls_hold_at_most_one_item_of_each_axis():
    """ComponentAdapter runs a batch in calls of rows that each hold at most one item at the
    axis limit, and joins their outputs as one call gives them."""
    from speechrt.contracts import F32, B, Contract, lengths, tensor
    from speechrt.serving.v2models import ComponentAdapter

    c = Contract(
        "echo",
        (tensor("x", F32, B, 2, "frames"), lengths("x_lengths", "frames")),
        (tensor("y", F32, B, 2, "frames"), lengths("y_lengths", "frames")),
    )

    class Echo:
        backend, contract, calls = "onnx", c, []

        def run(self, feeds):
            self.calls.append(feeds["x"].shape)
            return {"y": feeds["x"] * 2, "y_lengths": feeds["x_lengths"]}

    echo = Echo()
    adapter = ComponentAdapter(echo, max_sizes={"batch": 8, "frames": 100})  # type: ignore[arg-type]
    x = np.arange(5 * 2 * 30, dtype=np.float32).reshape(5, 2, 30)
    item = {"x": x, "x_lengths": np.full(5, 30)}
    (out,) = adapter.run_batch([item])
    assert echo.calls == [(3, 2, 30), (2, 2, 30)]  # 3 x 30 frames <= 100 < 4 x 30
    np.testing.assert_array_equal(out["y"], x * 2)
    assert adapter.length(item) == 5 * 30


# -- uploads: their own threads, a bound on how many wait -----------------------------------------


class HeldASR:
    """What ASRService.decode needs of a recogniser; every decode waits for `release`."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def band_filter(self, rate: int):
        self.entered.release()
        assert self.release.wait(60), "the test never released the decodes"
        return None

    def from_rate(self, audio, rate):
        return audio

    def check_length(self, audio):
        return audio


def test_uploads_decode_on_their_own_threads_and_wait_in_a_bounded_line():
    """Decodes held on the upload threads leave the event loop's default threads free (the text
    front end runs there), and past max_pending_uploads a new upload is a 503."""
    asr = HeldASR()
    service = ASRService(asr, engine=None, limits=Limits(max_pending_uploads=3))  # type: ignore[arg-type]
    data = wav(speechlike(0.5, 0))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))  # one default thread: easily starved
        held = [asyncio.create_task(service.decode(data)) for _ in range(3)]
        await asyncio.to_thread(asr.entered.acquire)  # (on the one default thread: not starved)
        with pytest.raises(Overloaded, match="3 uploads are being decoded"):
            await service.decode(data)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 30) == 42
        asr.release.set()
        for audio in await asyncio.gather(*held):
            assert audio.shape == (8000,)

    try:
        asyncio.run(main())
    finally:
        asr.release.set()
        service.uploads.shutdown(wait=False)


def test_an_upload_past_its_deadline_stops_decoding():
    data = wav(speechlike(3.0, 1))
    with pytest.raises(DecodeStopped):
        read_audio(data, 16000, 600.0, stop=lambda: True)
    audio, _ = read_audio(data, 16000, 600.0, stop=lambda: False)
    assert audio.shape == (48000,)
    with pytest.raises(SpeechRTError, match="samples to decode; the limit is 9600 "):
        read_audio(wav(np.zeros(16000, np.float32), 192000), 16000, 0.1)
