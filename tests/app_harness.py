"""The app in-process: stand-in pipelines (a voice that says its ids, with a gate to hold the
device), and three ways to call it: through httpx (run_app), straight through ASGI message by
message (run_raw, call), and `until`, an "eventually" condition of the event loop's state."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np

from speechrt.serving import Server, create_app
from speechrt.tts import Piece


class Text:
    """The text front end's one check that SpeechStream makes (Riva's SynthesizeOnline)."""

    def has_speech(self, text: str) -> bool:
        return bool(text.strip())


class SlowTTS:
    """text_to_pieces / ids_to_audio like speechrt.tts.TTS: one piece per '|'-separated part,
    audio = the ids as samples; "boom" anywhere in a batch raises, as a broken kernel would.
    With a `gate`, the first batch waits for it (`entered` is set once it does)."""

    sampling_rate = 1000
    name, n_speakers = "slow", 1
    text = Text()

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.entered = threading.Event()
        self.batches: list[int] = []

    def text_to_pieces(self, texts, seeds, words=False, max_symbols=None, pace=1.0):
        return [
            Piece(i, j, [ord(c) for c in part], seed)
            for i, (text, seed) in enumerate(zip(texts, seeds, strict=True))
            for j, part in enumerate(text.split("|"))
        ]

    def ids_to_audio(self, batch, options, on_head=None):  # (never a head: pieces this short)
        self.batches.append(len(batch))
        if self.gate is not None and not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        if any(p.ids == [ord(c) for c in "boom"] for p in batch):
            raise RuntimeError("kernel exploded")
        return [np.array(p.ids, dtype=np.float32) / 1000.0 for p in batch]

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30), "the first batch never started"


def run_app(tts, config, body):
    async def main():
        server = Server(tts, None, config)
        app = create_app(server)
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://t")
        async with app.router.lifespan_context(app), client:
            return await asyncio.wait_for(body(client, server), 60)  # a hang guard

    return asyncio.run(main())


def speak(client, text, **kw):
    body = {"model": "tts", "voice": "0", "input": text, "response_format": "pcm", **kw}
    return client.post("/v1/audio/speech", json=body)


async def until(condition) -> None:
    """Poll an "eventually" condition of the event loop's state (bounded by run_app's guard)."""
    while not condition():
        await asyncio.sleep(0.001)


async def call(
    app, path: str, payload: dict, hang_up: asyncio.Event, sent: list[dict] | None = None
) -> list[dict]:
    """One request straight through ASGI, as uvicorn makes it: the body, then http.disconnect
    once `hang_up` is set. Returns the messages the app sent, appended to `sent` (when given)
    as they are sent."""
    body = json.dumps(payload).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"t")],
        "client": ("127.0.0.1", 1234),
        "server": ("t", 80),
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = [] if sent is None else sent

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def run_raw(tts, config, body):
    async def main():
        server = Server(tts, None, config)
        app = create_app(server)
        async with app.router.lifespan_context(app):
            return await asyncio.wait_for(body(app, server), 60)  # a hang guard

    return asyncio.run(main())
