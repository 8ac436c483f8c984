"""Batch invariance of `speechrt serve`, measured: N concurrent /v1/audio/speech requests, each
compared byte for byte with the same request sent alone, with and without --batch-invariant.

    python scripts/serve_invariance.py [--requests 32] [--out invariance.json] [-- SERVE ARGS]

Serves the bundled voice unless SERVE ARGS name models. Reports per mode: wall time of the
concurrent burst, batches and items dispatched (from /metrics), responses identical to alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch_metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("speechrt_batch_size_") and 'model="tts"' in line and "le=" not in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0].removeprefix("speechrt_batch_size_")] = float(value)
    return out  # count (batches), sum (items)


def measure(serve_args: list[str], texts: list[str]) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--port", str(port), *serve_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        body = {"model": "tts", "voice": "0", "response_format": "pcm"}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=600) as c:
                posts = (c.post(f"{url}/v1/audio/speech", json={**body, "input": t}) for t in texts)
                return await asyncio.gather(*posts)

        before = batch_metrics(url)
        t0 = time.perf_counter()
        together = asyncio.run(burst())
        seconds = time.perf_counter() - t0
        after = batch_metrics(url)
        ok = [r.status_code == 200 for r in together]
        alone = [
            httpx.post(f"{url}/v1/audio/speech", json={**body, "input": t}, timeout=600).content
            for t in texts
        ]
        same = sum(r.content == a for r, a, good in zip(together, alone, ok, strict=True) if good)
        return {
            "serve_args": serve_args,
            "burst_seconds": round(seconds, 2),
            "ok": sum(ok),
            "batches": after["count"] - before["count"],
            "items": after["sum"] - before["sum"],
            "identical_to_alone": same,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--out", default="invariance.json")
    p.add_argument("serve_args", nargs="*", help="after --: arguments for speechrt serve")
    args = p.parse_args()
    fox = "The quick brown fox jumps over the lazy dog. "
    texts = [f"Request number {i}. " + fox * (1 + i % 3) for i in range(args.requests)]
    base = ["--device", "cpu", "--request-timeout", "600", *args.serve_args]
    results = [measure(base, texts), measure([*base, "--batch-invariant"], texts)]
    text = json.dumps({"requests": args.requests, "modes": results}, indent=1)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
