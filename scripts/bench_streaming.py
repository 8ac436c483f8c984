"""Streamed vs whole speech through a real `speechrt serve`: first byte and last byte.

    python scripts/bench_streaming.py [--format pcm] [--repeats 5] [--sentences 3 20]
        [--compare NAME=SRC_DIR ...] [--serve-arg=--max-batch-ms --serve-arg=0]
        [--ready-timeout S] [--json OUT.json]

Starts a server on the bundled voice (onnx backend on a CPU, `--no-components`), warms it up,
then for each sentence count sends, `repeats` times in turn, one whole request and one
`stream_format: "audio"` request of the same text, one at a time, and prints the medians:
the whole request's time to its last byte, the streamed one's time to its first and its last
byte, the streamed first byte as a fraction of the whole request's time, and the seconds of
audio (pcm: 2 bytes a sample at --sample-rate). Every time is
from sending the request to the byte's arrival at this client. `--compare NAME=SRC_DIR` also
starts a server from another tree's `src` (e.g. `git archive REV src | tar -x -C DIR`), and
the servers take turns request by request, so a machine's changing load weighs on all alike.
On a GPU: `--serve-arg=--backend=cuda --serve-arg=--warmup --ready-timeout 900` (the warm-up
compiles before the server is ready; the script's own warm-up then sends every measured size).
The server's CPU seconds per request (user + system, from /proc) say what each kind of request
costs. The line above the table names the CPU, the cores this process may use, and the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from speechrt.bench.machine import cpu_model, git_commit

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A second sentence follows the first one closely.",
    "Streaming sends each sentence as soon as it is ready.",
    "Is this the fourth one, or the fifth?",
    "Numbers such as 42 are read out in words.",
)


def text_of(n: int) -> str:
    return " ".join(SENTENCES[i % len(SENTENCES)] for i in range(n))


def start_server(
    extra: list[str], src: Path = ROOT / "src", ready_timeout: float = 120.0
) -> tuple[str, subprocess.Popen[bytes], Path]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path(tempfile.mkstemp(prefix="bench-streaming-", suffix=".log")[1])
    path = os.environ.get("PYTHONPATH")  # kept after src: packages may come from there
    env = {**os.environ, "PYTHONPATH": str(src) + (os.pathsep + path if path else "")}
    cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--port", str(port), *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return url, proc, log
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"server not ready after {ready_timeout:.0f} s:\n{log.read_text()}")


def timed(client: httpx.Client, body: dict[str, object]) -> tuple[float, float, int]:
    """(seconds to the first body byte, seconds to the last, bytes) of one request."""
    t0 = time.perf_counter()
    first, size = None, 0
    with client.stream("POST", "/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"HTTP {r.status_code}: {r.read().decode(errors='replace')}")
        for chunk in r.iter_raw():
            if chunk and first is None:
                first = time.perf_counter() - t0
            size += len(chunk)
    last = time.perf_counter() - t0
    return (last if first is None else first), last, size


def gpu_name() -> str | None:
    """The first GPU's name (nvidia-smi), None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far (0 where /proc cannot say)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--format", default="pcm", help="response_format (default: pcm)")
    p.add_argument("--repeats", type=int, default=5, help="requests of each kind (default: 5)")
    p.add_argument("--sentences", type=int, nargs="+", default=[3, 20])
    p.add_argument("--compare", action="append", default=[], metavar="NAME=SRC_DIR")
    p.add_argument("--serve-arg", action="append", default=[], help="passed to `serve`")
    p.add_argument("--ready-timeout", type=float, default=120.0, help="seconds (default: 120)")
    p.add_argument("--sample-rate", type=int, default=22050, help="pcm rate (default: 22050)")
    p.add_argument("--json", type=Path, default=None, help="also write the medians here")
    args = p.parse_args()

    trees = {"this": ROOT / "src"}
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees[name] = Path(src)
    serve = ["--backend", "onnx", "--no-components", *args.serve_arg]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    clients: dict[str, httpx.Client] = {}
    try:
        for name, src in trees.items():
            url, procs[name], _ = start_server(serve, src, args.ready_timeout)
            clients[name] = httpx.Client(base_url=url, timeout=300)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        stamp = {
            "cpu": cpu_model(),
            "cores": cores,
            "gpu": gpu_name(),
            "commit": git_commit(dirty=True),
            "command": " ".join(["python", *sys.argv]),
        }
        print(f"# {stamp['cpu']}, {cores} cores, {stamp['gpu'] or 'no GPU'}, commit "
              f"{stamp['commit']}, format {args.format}")  # fmt: skip
        base = {"model": "tts", "voice": "alloy", "response_format": args.format}
        for client in clients.values():
            # warm up: the first calls load the number rules, learn batch times and (on a GPU)
            # meet each size's shapes
            for n in sorted({5, *args.sentences}):
                for _ in range(2):
                    timed(client, {**base, "input": text_of(n)})
                    timed(client, {**base, "input": text_of(n), "stream_format": "audio"})
        print(
            "server  sentences  audio_s  whole_last_s  stream_first_s  stream_last_s"
            "  first/whole  whole_cpu_s  stream_cpu_s"
        )
        results = []
        for n in args.sentences:
            body = {**base, "input": text_of(n)}
            runs: dict[str, list[tuple[float, ...]]] = {t: [] for t in trees}
            for _ in range(args.repeats):
                for name, client in clients.items():  # the servers take turns
                    pid = procs[name].pid
                    c0 = cpu_seconds(pid)
                    _, whole, size = timed(client, body)
                    c1 = cpu_seconds(pid)
                    first, last, _ = timed(client, {**body, "stream_format": "audio"})
                    cs = cpu_seconds(pid) - c1
                    runs[name].append((size, whole, first, last, c1 - c0, cs))
            for name, rows in runs.items():
                sz, w, f, lt, cw, cs = (statistics.median(c) for c in zip(*rows, strict=True))
                audio_s = sz / 2 / args.sample_rate if args.format == "pcm" else float("nan")
                print(
                    f"{name:6s}  {n:9d}  {audio_s:7.2f}  {w:12.4f}  {f:14.4f}  {lt:13.4f}"
                    f"  {f / w:11.2f}  {cw:11.2f}  {cs:12.2f}"
                )
                results.append({
                    "server": name, "sentences": n, "audio_s": audio_s, "whole_last_s": w,
                    "stream_first_s": f, "stream_last_s": lt, "whole_cpu_s": cw,
                    "stream_cpu_s": cs, "repeats": args.repeats,
                })  # fmt: skip
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"stamp": stamp, "rows": results}, indent=1) + "\n")
    finally:
        for client in clients.values():
            client.close()
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
