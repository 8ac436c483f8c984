"""CPU time the serving code spends per speech request, without a model.

    python scripts/app_cpu.py [--requests 1000] [--clients 16] [--rounds 9] [--samples 140000]

Runs the app of `speechrt serve` in this process (FastAPI through httpx's ASGI transport, so the
client's share is counted too) with a stand-in voice whose batches cost nothing: each item's
audio is a row of one host batch of `--samples` float32 samples, as TTS.to_numpy gives it.
`--clients` concurrent clients POST /v1/audio/speech (the 128-character benchmark sentence, raw
PCM back) for `--rounds` rounds of `--requests`; prints the median, min and max of this
process's CPU milliseconds per request (all threads). A Ray replica or server process runs this
code on the interpreter that also drives the GPU, so this is time its device thread can wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import numpy as np

from speechrt.bench.inputs import TTS_TEXT
from speechrt.serving import BatchConfig, ServeConfig, Server, create_app
from speechrt.tts import Piece


class InstantVoice:
    """What the server asks of speechrt.tts.TTS, at no cost: one piece per text, its audio a
    row view of one (8, samples) host batch."""

    sampling_rate = 22050
    name, n_speakers = "instant", 1

    def __init__(self, samples: int) -> None:
        rng = np.random.default_rng(0)
        self.host = rng.uniform(-0.5, 0.5, (8, samples)).astype(np.float32)

    def text_to_pieces(self, texts: list[str], seeds: list[int]) -> list[Piece]:
        pairs = enumerate(zip(texts, seeds, strict=True))
        return [Piece(i, 0, [ord(c) for c in text], seed) for i, (text, seed) in pairs]

    def ids_to_audio(self, batch: list[Piece], options: object, on_head=None) -> list[np.ndarray]:
        n = self.host.shape[1]
        return [self.host[i, : n - i] for i in range(len(batch))]


async def measure(args: argparse.Namespace) -> list[float]:
    config = ServeConfig(BatchConfig(max_batch_size=8, max_queue_delay_ms=2))
    server = Server(InstantVoice(args.samples), None, config)
    app = create_app(server)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")
    body = {"model": "tts", "voice": "0", "input": TTS_TEXT, "response_format": "pcm"}

    async def one_client(n: int) -> None:
        for _ in range(n):
            (await client.post("/v1/audio/speech", json=body)).raise_for_status()

    per_request = []
    async with app.router.lifespan_context(app), client:
        await asyncio.gather(*(one_client(20) for _ in range(args.clients)))  # warm-up
        for _ in range(args.rounds):
            c0 = time.process_time()
            await asyncio.gather(
                *(one_client(args.requests // args.clients) for _ in range(args.clients))
            )
            per_request.append((time.process_time() - c0) / args.requests * 1e3)
    return sorted(per_request)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--samples", type=int, default=140_000)
    args = ap.parse_args()
    ms = asyncio.run(measure(args))
    print(json.dumps({
        "cpu_ms_per_request": {"median": round(ms[len(ms) // 2], 3),
                               "min": round(ms[0], 3), "max": round(ms[-1], 3)},
        "requests": args.requests, "clients": args.clients, "rounds": args.rounds,
        "samples": args.samples,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
