"""What hostile requests cost a running `speechrt serve`: per case, the server's peak RSS growth
(VmHWM, reset before each case through /proc/PID/clear_refs), its RSS after the case (VmRSS),
its CPU seconds (utime + stime of /proc/PID/stat), the answers' status codes, and how long a
"Hi." sent behind the case waited.

    python scripts/hostile_rss.py [--url http://127.0.0.1:8000 --pid PID] [--cases a,b] \
        [--stop-mb 6000] [--out table.md]

Without --url it starts `python -m speechrt.cli serve --device cpu` (the bundled models) on a
free port and stops it at the end. A watchdog kills the server when its RSS passes --stop-mb
(the case then reads "killed"), so that a case cannot take the machine's memory. Linux only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

TICK = os.sysconf("SC_CLK_TCK")
SENTENCE = (
    "The quick brown fox jumps over the lazy dog near the river bank today, while three small "
    "birds sing in the tall green trees and an old man walks slowly along the dusty road towards "
    "the quiet village where his daughter has lived for many long years with her two children."
)  # 290 characters
BINARY = "Inference-Header-Content-Length"


def status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def infer(c: httpx.Client, model: str, feeds: dict[str, np.ndarray]) -> httpx.Response:
    kinds = {"int64": "INT64", "float32": "FP32"}
    inputs, blobs = [], []
    for name, x in feeds.items():
        blobs.append(x.tobytes())
        inputs.append(
            {
                "name": name,
                "datatype": kinds[str(x.dtype)],
                "shape": list(x.shape),
                "parameters": {"binary_data_size": len(blobs[-1])},
            }
        )
    head = json.dumps({"inputs": inputs}).encode()
    return c.post(
        f"/v2/models/{model}/infer",
        content=head + b"".join(blobs),
        headers={BINARY: str(len(head))},
    )


def speak(c: httpx.Client, text: str, speed: float = 1.0) -> httpx.Response:
    body = {"model": "tts-1", "voice": "0", "input": text, "response_format": "pcm"}
    return c.post("/v1/audio/speech", json={**body, "speed": speed})


def flac_bomb(seconds: int, sr: int, channels: int) -> bytes:
    """Silence as FLAC, written ten seconds at a time; cached in /tmp."""
    import soundfile as sf

    path = Path(f"/tmp/speechrt-bomb-{seconds}s-{sr}-{channels}ch.flac")
    if path.is_file():
        return path.read_bytes()
    buf = io.BytesIO()
    block = np.zeros((10 * sr, channels), dtype=np.int16)
    with sf.SoundFile(buf, "w", sr, channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds // 10):
            f.write(block)
        f.write(block[: (seconds % 10) * sr])
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def transcribe(c: httpx.Client, data: bytes, stream: bool = False) -> httpx.Response:
    fields = {"model": "whisper-1", "stream": "true" if stream else "false"}
    return c.post("/v1/audio/transcriptions", data=fields, files={"file": ("a.flac", data)})


# -- the cases: each returns its answers' status codes, in order ---------------------------------


def prosody_speech(c: httpx.Client) -> list[int]:
    ssml = f'<speak><prosody rate="0.4">{SENTENCE} {SENTENCE}</prosody></speak>'
    return [speak(c, ssml, speed=0.25).status_code]


def fastpitch_pace(c: httpx.Client) -> list[int]:
    feeds = {
        "ids": np.full((1, 320), 5, dtype=np.int64),
        "lengths": np.full(1, 320, dtype=np.int64),
        "pace": np.full(1, 0.1, dtype=np.float32),
    }
    return [infer(c, "fastpitch", feeds).status_code]


def fastpitch_batches(c: httpx.Client) -> list[int]:
    feeds = {"ids": np.full((8, 1024), 5, dtype=np.int64), "lengths": np.full(8, 1024)}
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: infer(c, "fastpitch", feeds).status_code, range(2)))


def hifigan_mel(c: httpx.Client) -> list[int]:
    feeds = {
        "mel": np.full((8, 80, 2584), -5.0, dtype=np.float32),
        "mel_lengths": np.full(8, 2584, dtype=np.int64),
    }
    return [infer(c, "hifigan", feeds).status_code]


def json_infer(
    c: httpx.Client, model: str, name: str, datatype: str, value: str, mb: float = 25
) -> int:
    """A v2 infer body of `mb` MiB of JSON: one input holding `value` repeated (the shape is
    refused by the model's limits only once the body has been parsed)."""
    n = int(mb * 1024 * 1024 - 200) // (len(value) + 1)
    head = f'{{"inputs": [{{"name": "{name}", "datatype": "{datatype}", "shape": [{n}], "data": ['
    body = head.encode() + ",".join([value] * n).encode() + b"]}]}"
    return c.post(f"/v2/models/{model}/infer", content=body).status_code


def json_floats(c: httpx.Client) -> list[int]:
    return [json_infer(c, "hifigan", "mel", "FP32", "0.5")]


def json_ints(c: httpx.Client) -> list[int]:
    return [json_infer(c, "fastpitch", "ids", "INT64", "1")]


def json_at_limit(c: httpx.Client) -> list[int]:
    """Just within the limit on a request's JSON (8 MiB): what parsing it may cost."""
    floats = json_infer(c, "hifigan", "mel", "FP32", "0.5", 7.99)
    return [floats, json_infer(c, "fastpitch", "ids", "INT64", "1", 7.99)]


def flac_uploads(c: httpx.Client) -> list[int]:
    bomb = flac_bomb(599, 192_000, 8)
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(transcribe, c, bomb) for _ in range(6)]
        return [f.result().status_code for f in futures]


def flac_stream(c: httpx.Client) -> list[int]:
    return [transcribe(c, flac_bomb(599, 192_000, 8), stream=True).status_code]


def flac_uploads_at_limit(c: httpx.Client) -> list[int]:
    bomb = flac_bomb(37, 192_000, 8)  # 56.8 M samples: just within the decoding bound
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(transcribe, c, bomb) for _ in range(6)]
        return [f.result().status_code for f in futures]


def speechlike_wav(seconds: int) -> bytes:
    """Tone bursts and near-silence at 16 kHz as a WAV; cached in /tmp."""
    import soundfile as sf

    path = Path(f"/tmp/speechrt-speechlike-{seconds}s.wav")
    if not path.is_file():
        rng = np.random.default_rng(0)
        parts, total, sr = [], seconds * 16000, 16000
        while sum(map(len, parts)) < total:
            n = int(rng.uniform(0.05, 0.4) * sr)
            tone = np.sin(2 * np.pi * rng.uniform(100, 3000) * np.arange(n) / sr) * np.hanning(n)
            parts.append(0.3 * tone if rng.random() < 0.7 else 0.003 * rng.standard_normal(n))
        sf.write(path, np.concatenate(parts)[:total].astype(np.float32), sr, subtype="PCM_16")
    return path.read_bytes()


def wav_offline(c: httpx.Client) -> list[int]:
    return [transcribe(c, speechlike_wav(599)).status_code]


def wav_stream(c: httpx.Client) -> list[int]:
    return [transcribe(c, speechlike_wav(599), stream=True).status_code]


def slow_headers(c: httpx.Client) -> list[int]:
    """200 connections that send a header line every 2 s for 40 s, then a 228 KB header."""
    host, port = c.base_url.host, c.base_url.port
    socks = []
    for _ in range(200):
        s = socket.create_connection((host, port))
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    closed = 0
    for k in range(20):
        time.sleep(2)
        for s in socks:
            try:
                s.sendall(f"X-Slow-{k}: 1\r\n".encode())
            except OSError:
                closed += 1
    open_ = len(socks) - sum(_closed(s) for s in socks)
    for s in socks:
        s.close()
    big = c.get("/v2/health/ready", headers={f"X-Big-{i}": "y" * 1000 for i in range(228)})
    return [f"{open_} open", big.status_code]


def _closed(s: socket.socket) -> bool:
    """Whether the server answered (a 408) or closed the connection."""
    s.setblocking(False)
    try:
        s.recv(1)  # b"": closed; b"H": an answer, then closed
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


CASES: dict[str, Callable[[httpx.Client], list[int]]] = {
    "speech speed 0.25 + prosody 0.4": prosody_speech,
    "fastpitch ids [1,320] pace 0.1": fastpitch_pace,
    "2 x fastpitch ids [8,1024]": fastpitch_batches,
    "hifigan mel [8,80,2584]": hifigan_mel,
    "6 x FLAC 599 s 192 kHz 8 ch": flac_uploads,
    "FLAC 599 s stream=true": flac_stream,
    "200 slow header conns + 228 KB header": slow_headers,
    "6 x FLAC 37 s 192 kHz 8 ch": flac_uploads_at_limit,
    "WAV 599 s 16 kHz": wav_offline,
    "WAV 599 s 16 kHz stream=true": wav_stream,
    "v2 infer, 25 MB of JSON floats": json_floats,
    "v2 infer, 25 MB of JSON ints": json_ints,
    "v2 infer, 8 MiB of JSON floats, then ints": json_at_limit,
}


def run_case(url: str, pid: int, name: str, stop_mb: float) -> dict[str, Any]:
    reset_peak(pid)
    before, cpu0 = status(pid), cpu_s(pid)
    killed = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            try:
                if status(pid)["VmRSS"] > stop_mb * 1024:
                    os.kill(pid, 9)
                    killed.set()
                    return
            except OSError:
                return

    threading.Thread(target=watch, daemon=True).start()
    hi_s: float | None = None
    codes: list[Any] = []
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=900) as c:

        def hi() -> None:
            nonlocal hi_s
            time.sleep(3)  # the case's work has started
            t = time.perf_counter()
            try:
                r = speak(c, "Hi.")
                hi_s = time.perf_counter() - t if r.status_code == 200 else None
            except httpx.HTTPError:
                pass

        side = threading.Thread(target=hi)
        side.start()
        try:
            codes = CASES[name](c)
        except httpx.HTTPError as e:
            codes = [type(e).__name__]
        side.join()
    wall = time.perf_counter() - t0
    done.set()
    if killed.is_set():
        return {"case": name, "codes": codes, "killed": True, "wall_s": wall}
    time.sleep(1)
    after = status(pid)
    return {
        "case": name,
        "codes": codes,
        "peak_growth_mb": (after["VmHWM"] - before["VmRSS"]) / 1024,
        "rss_before_mb": before["VmRSS"] / 1024,
        "rss_after_mb": after["VmRSS"] / 1024,
        "cpu_s": cpu_s(pid) - cpu0,
        "wall_s": wall,
        "hi_s": hi_s,
    }


def start_server() -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--device", "cpu", "--port", str(port)]
    with open("/tmp/hostile_rss.log", "wb") as log:  # the server's own lines, for a look after
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                with httpx.Client(base_url=url, timeout=120) as c:  # first use of each pipeline
                    speak(c, "Hello there.")
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url")
    p.add_argument("--pid", type=int)
    p.add_argument("--cases", help="comma-separated case numbers (1-based); default: all")
    p.add_argument("--stop-mb", type=float, default=6000.0)
    p.add_argument("--out")
    args = p.parse_args()
    names = list(CASES)
    if args.cases:
        names = [names[int(i) - 1] for i in args.cases.split(",")]
    rows = []
    for name in names:
        proc = None
        if args.url:
            url, pid = args.url, args.pid
        else:  # a fresh server per case: one case's leftovers do not count against the next
            url, proc = start_server()
            pid = proc.pid
        try:
            row = run_case(url, pid, name, args.stop_mb)
        finally:
            if proc is not None:
                proc.kill()  # whatever it still computes for a request that timed out
                proc.wait(60)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    lines = [
        "| case | answers | peak RSS growth MB | RSS before -> after MB | server CPU s | wall s "
        '| "Hi." took s |',
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("killed"):
            lines.append(
                f"| {r['case']} | killed at > {args.stop_mb:.0f} MB RSS | | | | "
                f"{r['wall_s']:.0f} | |"
            )
            continue
        hi = "-" if r["hi_s"] is None else f"{r['hi_s']:.1f}"
        lines.append(
            f"| {r['case']} | {r['codes']} | {r['peak_growth_mb']:.0f} | "
            f"{r['rss_before_mb']:.0f} -> {r['rss_after_mb']:.0f} | {r['cpu_s']:.1f} | "
            f"{r['wall_s']:.1f} | {hi} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
