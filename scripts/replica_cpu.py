"""CPU time a server process spends per request: plain `speechrt serve` against a Ray replica.

    python scripts/replica_cpu.py [--ray] [--route /v2/health/ready] [--requests 1000] [SERVE ARGS]
    python scripts/replica_cpu.py --speech [--acoustic DIR --vocoder DIR] [SERVE ARGS]

Starts `speechrt serve` (with `--ray`: one replica behind Ray's proxy) on the bundled voice (or
`--acoustic`/`--vocoder`), on the CPU, waits until it is ready, sends a few warm-up requests, then
`--requests` GET requests to `--route` from 4 keep-alive client threads (`--speech`: POST
/v1/audio/speech with the benchmark's 128-character sentence and raw PCM back, the request of
`speechrt bench tts --url`), and reports the CPU time (user + system, from /proc) of the process
that runs the app: the server itself, or the Ray replica (the process named ServeReplica). One
JSON line; Linux only. A Ray replica's interpreter also drives the GPU, so its CPU time per
request is time the device thread waits for. With a tiny voice, --speech is mostly the serving
code's own time per request: the models' share shrinks with their size.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from speechrt.bench.inputs import TTS_TEXT

DEFAULTS = Path(__file__).resolve().parents[1] / "src" / "speechrt" / "defaults"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def replica_pid() -> int:
    """The newest Ray replica process (Ray names it ray::ServeReplica:...; one of an earlier
    run may still be exiting)."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
                started = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[19])
            except OSError:
                continue
            if b"ServeReplica" in cmd:
                found.append((started, int(d)))
    if not found:
        raise SystemExit("no Ray replica process found")
    return max(found)[1]


SPEECH = "/v1/audio/speech"


def hammer(port: int, route: str, n: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        if route == SPEECH:
            body = {"model": "tts", "input": TTS_TEXT, "voice": "0", "response_format": "pcm"}
            headers = {"Content-Type": "application/json"}
            conn.request("POST", route, json.dumps(body), headers)
        else:
            conn.request("GET", route)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"{route}: HTTP {response.status}")


def load(port: int, route: str, total: int, threads: int = 4) -> float:
    """total requests from `threads` clients -> wall seconds."""
    pool = [
        threading.Thread(target=hammer, args=(port, route, total // threads))
        for _ in range(threads)
    ]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--route", default="/v2/health/ready")
    ap.add_argument("--speech", action="store_true", help=f"POST {SPEECH} instead of --route")
    ap.add_argument("--acoustic", default=str(DEFAULTS / "voice-acoustic"))
    ap.add_argument("--vocoder", default=str(DEFAULTS / "voice-vocoder"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--port", type=int, default=8470)
    args, serve_args = ap.parse_known_args()
    if args.speech:
        args.route = SPEECH
    voice = ["--acoustic", args.acoustic, "--vocoder", args.vocoder]
    cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--port", str(args.port)]
    cmd += ["--device", "cpu", *voice, *(["--ray"] if args.ray else []), *serve_args]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                hammer(args.port, "/v2/health/ready", 1)
                break
            except (OSError, SystemExit):
                time.sleep(1)
        pid = replica_pid() if args.ray else server.pid
        load(args.port, args.route, 200)  # warm-up
        c0 = cpu_s(pid)
        wall = load(args.port, args.route, args.requests)
        used = cpu_s(pid) - c0
        print(json.dumps({
            "ray": args.ray, "route": args.route, "requests": args.requests,
            "serve_args": serve_args, "requests_per_s": round(args.requests / wall, 1),
            "cpu_ms_per_request": round(used / args.requests * 1e3, 3),
        }))  # fmt: skip
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
