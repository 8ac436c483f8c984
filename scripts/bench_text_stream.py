"""Speech for text as it is written: from a sentence's last piece of text to its first audio.

    python scripts/bench_text_stream.py [--repeats 5] [--sentences 5] [--token-ms 0 40]
        [--serve-arg=--max-batch-ms --serve-arg=0] [--ready-timeout S] [--json OUT.json]

Starts a server on the bundled voice (onnx backend on a CPU, `--no-components`; as
scripts/bench_streaming.py does), warms it up, then opens `/v1/audio/speech/stream` sessions
one at a time. Each sends `--sentences` sentences as an LLM writes them (words with their
leading space, punctuation apart), one message per piece, `--token-ms` apart (0: as fast as the
socket takes them), then {"close": true}. A sentence is complete when the piece after its end
arrives (its terminator followed by a space; the close for the last one): the client knows
which message that is by running the server's own SentenceBuffer on what it sends. For each
sentence it takes the time from sending that message to the arrival of the sentence's first
audio byte, and prints the medians over the repeats: the first sentence's, every sentence's and
the 90th percentile (a later sentence's audio follows the audio before it, which plays
meanwhile). `stall_ms`: how long a player that starts at the first audio byte and plays each
sentence once it is there would have waited for audio (median over the sessions). For scale,
the first line also gives the time to the first byte of a streamed POST /v1/audio/speech of the
first sentence alone (the route a client waiting for the whole sentence would call). The line
above the table names the CPU, the cores this process may use, the load average at the start,
and the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_streaming import start_server, text_of, timed  # noqa: E402

from speechrt.bench.machine import cpu_model, git_commit  # noqa: E402
from speechrt.serving.text_stream import SentenceBuffer  # noqa: E402


def pieces_of(text: str) -> list[str]:
    """An LLM's pieces: words with their leading space, final punctuation apart."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        lead = " " if i else ""
        if word[-1:] in ".,!?;:":
            out += [lead + word[:-1], word[-1]]
        else:
            out.append(lead + word)
    return out


def session(url: str, text: str, token_s: float) -> tuple[list[float], float]:
    """One session: (each sentence's seconds from its completing message to its first audio,
    the seconds a player starting at the first audio would have waited for audio after it)."""
    completed: list[float] = []  # when the message completing sentence k was sent
    first: dict[int, float] = {}  # when sentence k's first audio arrived
    seconds: dict[int, float] = {}  # sentence k's audio
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(ws_url, max_size=None) as ws:
        rate = json.loads(ws.recv())["sample_rate"]
        errors: list[str] = []

        def receive() -> None:
            current = None
            while True:
                m = ws.recv(timeout=300)
                if isinstance(m, bytes):
                    if current is not None and current not in first:
                        first[current] = time.perf_counter()
                    continue
                event = json.loads(m)
                if event["type"] == "segment.start":
                    current = event["segment"]
                elif event["type"] == "segment.done":
                    seconds[event["segment"]] = event["samples"] / rate
                elif event["type"] == "done":
                    return
                elif event["type"] in ("error", "segment.failed"):
                    errors.append(m)
                    return

        receiver = threading.Thread(target=receive)
        receiver.start()
        buf = SentenceBuffer()  # the server's own: it completes sentences where the server does
        for piece in pieces_of(text):
            done = buf.push(piece)
            ws.send(json.dumps({"text": piece}))
            completed += [time.perf_counter()] * len(done)
            if token_s:
                time.sleep(token_s)
        ws.send(json.dumps({"close": True}))
        completed += [time.perf_counter()] * len(buf.flush())
        receiver.join()
        if errors:
            raise SystemExit(f"the server refused the stream: {errors[0]}")
    played, stalled = first[0], 0.0  # a player: each sentence once it is there and played
    for k in range(len(completed)):
        stalled += max(0.0, first[k] - played)
        played = max(played, first[k]) + seconds[k]
    return [first[k] - t for k, t in enumerate(completed)], stalled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--repeats", type=int, default=5, help="sessions per pacing (default: 5)")
    p.add_argument("--sentences", type=int, default=5, help="per session (default: 5)")
    p.add_argument("--token-ms", type=float, nargs="+", default=[0.0, 40.0],
                   help="between pieces of text (default: 0 40)")  # fmt: skip
    p.add_argument("--serve-arg", action="append", default=[], help="passed to `serve`")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds (default: 120)")
    p.add_argument("--json", type=Path, default=None, help="also write the medians here")
    args = p.parse_args()

    serve = ["--backend", "onnx", "--no-components", *args.serve_arg]
    url, proc, _ = start_server(serve, ready_timeout=args.ready_timeout)
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        stamp = {"cpu": cpu_model(), "cores": cores, "commit": git_commit(dirty=True),
                 "load": os.getloadavg()[0],
                 "command": " ".join(["python", *sys.argv])}  # fmt: skip
        print(f"# {stamp['cpu']}, {cores} cores, load {stamp['load']:.1f}, "
              f"commit {stamp['commit']}")  # fmt: skip
        text = text_of(args.sentences)
        first_sentence = text_of(1)
        body = {"model": "tts", "voice": "alloy", "response_format": "pcm",
                "input": first_sentence, "stream_format": "audio"}  # fmt: skip
        with httpx.Client(base_url=url, timeout=300) as client:
            for _ in range(2):  # warm up: number rules, batch times, the sentences' shapes
                session(url, text, 0.0)
                timed(client, body)
            post = statistics.median(timed(client, body)[0] for _ in range(args.repeats))
        print(f"streamed POST of the first sentence alone, first byte: {post * 1000:.0f} ms")
        print("token_ms  sessions  sentences  first_ms  median_ms  p90_ms  max_ms  stall_ms")
        rows = []
        for token_ms in args.token_ms:
            runs = [session(url, text, token_ms / 1000) for _ in range(args.repeats)]
            every = sorted(x for run, _ in runs for x in run)
            first = statistics.median(run[0] for run, _ in runs)
            med = statistics.median(every)
            p90 = every[min(len(every) - 1, round(0.9 * (len(every) - 1)))]
            stall = statistics.median(s for _, s in runs)
            print(f"{token_ms:8.0f}  {len(runs):8d}  {args.sentences:9d}  {first * 1000:8.0f}"
                  f"  {med * 1000:9.0f}  {p90 * 1000:6.0f}  {every[-1] * 1000:6.0f}"
                  f"  {stall * 1000:8.0f}")  # fmt: skip
            rows.append({"token_ms": token_ms, "sessions": len(runs), "first_s": first,
                         "median_s": med, "p90_s": p90, "max_s": every[-1],
                         "stall_s": stall})  # fmt: skip
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            out = {"stamp": stamp, "post_first_byte_s": post, "rows": rows}
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
