"""`speechrt bench tts|asr --url NAME=URL ...`: perf_analyzer-style load against running servers.

Closed loop (--concurrency 1,2,4,...): N clients each send the next request as soon as the last
returns, spread over processes of at most CLIENTS_PER_PROCESS clients each (--client-processes),
so that the load generator is not what limits a level: one asyncio httpx client is slower per
request the more it runs at once (encode/httpx#3215). Open loop (--rates 5,10,...): requests
arrive as a Poisson process at R per second, whatever the server does. Per level: throughput,
latency percentiles, and the server's own queue and compute time per request and mean batch
size, read from /metrics before and after; and on a machine with nvidia-smi, how busy each GPU
was over the level (GpuBusy).
"""

from __future__ import annotations

import asyncio
import io
import math
import multiprocessing
import os
import re
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import httpx
import numpy as np

from speechrt.bench.stats import summarize

CLIENTS_PER_PROCESS = 8
METRIC = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)$")


def parse_metrics(text: str, model: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over series of `model`}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = METRIC.match(line.strip())
        if m and f'model="{model}"' in m.group(2) and "le=" not in m.group(2):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def make_request(task: str, text: str, audio_wav: bytes | None) -> Callable:
    """The one request a load level repeats: speech synthesis or a transcription upload."""

    async def tts(client: httpx.AsyncClient) -> None:
        body = {"model": "tts", "input": text, "voice": "0", "response_format": "pcm"}
        r = await client.post("/v1/audio/speech", json=body)
        r.raise_for_status()

    async def asr(client: httpx.AsyncClient) -> None:
        assert audio_wav is not None, "a transcription load needs audio"
        files = {"file": ("bench.wav", audio_wav, "audio/wav")}
        r = await client.post("/v1/audio/transcriptions", data={"model": "asr"}, files=files)
        r.raise_for_status()

    return tts if task == "tts" else asr


async def _timed(send: Callable, client: httpx.AsyncClient, lat: list, errors: list) -> None:
    t0 = time.perf_counter()
    try:
        await send(client)
        lat.append(time.perf_counter() - t0)
    except (httpx.HTTPError, OSError) as e:
        errors.append(str(e) or type(e).__name__)


async def closed_loop(send, client, concurrency: int, seconds: float) -> tuple[list, list, float]:
    """Latencies, errors and the wall seconds of `concurrency` clients for `seconds`."""
    lat: list[float] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    end = t0 + seconds

    async def worker() -> None:
        while time.perf_counter() < end:
            await _timed(send, client, lat, errors)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, errors, time.perf_counter() - t0


async def open_loop(
    send, client, rate: float, seconds: float, seed: int = 0
) -> tuple[list, list, float]:
    lat: list[float] = []
    errors: list[str] = []
    rng = np.random.default_rng(seed)
    tasks, t = [], 0.0
    start = time.perf_counter()
    while True:
        t += rng.exponential(1.0 / rate)
        if t >= seconds:
            break
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.create_task(_timed(send, client, lat, errors)))
    await asyncio.gather(*tasks)
    return lat, errors, time.perf_counter() - start


def client_processes(concurrency: int, flag: int | None = None) -> int:
    """How many processes run `concurrency` closed-loop clients: `flag`, else one per
    CLIENTS_PER_PROCESS clients, at most one per core."""
    if flag is not None:
        return max(1, min(flag, concurrency))
    return max(1, min(math.ceil(concurrency / CLIENTS_PER_PROCESS), os.cpu_count() or 1))


def _closed_loop_process(
    url: str, task: str, text: str, audio_wav: bytes | None, concurrency: int, seconds: float,
    start_at: float,
) -> tuple[list, list, float]:  # fmt: skip
    """One client process: `concurrency` closed-loop clients from wall time `start_at` on."""
    send = make_request(task, text, audio_wav)

    async def run() -> tuple[list, list, float]:
        async with httpx.AsyncClient(base_url=url, timeout=300.0) as client:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return await closed_loop(send, client, concurrency, seconds)

    return asyncio.run(run())


def spread_closed_loop(
    url: str, task: str, text: str, audio_wav: bytes | None, concurrency: int, seconds: float,
    processes: int,
) -> Callable[[httpx.AsyncClient], Awaitable[tuple[list, list, float]]]:  # fmt: skip
    """A level's `run`: the clients split over `processes` processes that start together (the
    wall time is the longest process's)."""

    async def run(_: httpx.AsyncClient) -> tuple[list, list, float]:
        shares = [concurrency // processes + (i < concurrency % processes)
                  for i in range(processes)]  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
            start_at = time.time() + 3.0  # the processes start and import in the meantime
            futures = [pool.submit(_closed_loop_process, url, task, text, audio_wav, n,
                                   seconds, start_at) for n in shares]  # fmt: skip
            parts = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        lat = [x for part in parts for x in part[0]]
        return lat, [e for part in parts for e in part[1]], max(part[2] for part in parts)

    return run


class GpuBusy:
    """nvidia-smi's utilization.gpu (the share of each sample period in which a kernel ran on
    the GPU) sampled every `period_ms` while the block runs: mean percent per GPU index, or
    None where nvidia-smi is missing. The load generator runs on the server's machine, as
    scripts/bench_gpu.sh does."""

    def __init__(self, period_ms: int = 100, command: str = "nvidia-smi") -> None:
        self.period_ms, self.command = period_ms, command
        self.proc: subprocess.Popen[str] | None = None
        self.means: dict[int, float] | None = None

    def __enter__(self) -> GpuBusy:
        exe = shutil.which(self.command)
        if exe is not None:
            query = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]
            self.proc = subprocess.Popen(  # noqa: S603 (a fixed argument list)
                [exe, *query, f"--loop-ms={self.period_ms}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.means = gpu_busy_means(out)


def gpu_busy_means(text: str) -> dict[int, float] | None:
    """nvidia-smi's 'index, utilization' lines -> mean percent per GPU index (None: no lines)."""
    samples: dict[int, list[float]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                samples.setdefault(int(parts[0]), []).append(float(parts[1]))
            except ValueError:  # "[N/A]" and the like
                continue
    return {i: sum(v) / len(v) for i, v in samples.items()} or None


async def _level(
    url: str, model: str, run: Callable[[httpx.AsyncClient], Awaitable[tuple[list, list, float]]]
) -> dict:
    """One level: `run`'s latencies, errors and wall time, the server's metrics before and
    after it, and how busy the GPUs were while it ran."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits) as client:
        before = parse_metrics((await client.get("/metrics")).text, model)
        with GpuBusy() as busy:
            lat, errors, wall = await run(client)
        after = parse_metrics((await client.get("/metrics")).text, model)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    items = d.get("nv_inference_count", 0.0)
    execs = d.get("nv_inference_exec_count", 0.0)
    return {
        "requests": len(lat),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "throughput_rps": len(lat) / wall,
        "latency_s": summarize(lat) if lat else None,
        "server_queue_ms_per_item": d.get("nv_inference_queue_duration_us", 0) / 1e3 / items
        if items
        else None,
        "server_compute_ms_per_item": d.get("nv_inference_compute_infer_duration_us", 0)
        / 1e3
        / items
        if items
        else None,
        "mean_batch_size": items / execs if execs else None,
        "gpu_busy_pct": busy.means,
    }


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def load_sweep(
    targets: dict[str, str],
    task: str,
    concurrencies: list[int],
    rates: list[float],
    seconds: float,
    text: str,
    audio_wav: bytes | None,
    processes: int | None = None,
) -> list[dict]:
    """Every target x every concurrency level (closed) and rate (open): one row each. A closed
    level runs in client_processes(level, processes) processes."""
    send = make_request(task, text, audio_wav)
    rows = []
    for label, url in targets.items():
        for c in concurrencies:
            n = client_processes(c, processes)
            run: Callable[[httpx.AsyncClient], Awaitable[tuple[list, list, float]]]
            if n == 1:
                run = partial(closed_loop, send, concurrency=c, seconds=seconds)
            else:
                run = spread_closed_loop(url, task, text, audio_wav, c, seconds, n)
            res = asyncio.run(_level(url, task, run))
            res["client_processes"] = n
            rows.append({"target": label, "mode": "concurrency", "level": c, **res})
        for r in rates:
            res = asyncio.run(_level(url, task, partial(open_loop, send, rate=r, seconds=seconds)))
            rows.append({"target": label, "mode": "rate", "level": r, **res})
    return rows


def plot_sweep(rows: list[dict], path, title: str) -> None:
    """Seed-style figure: latency bars (p50, p99) and a throughput line against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["mode"] == "concurrency" and r["latency_s"]]
    targets = sorted({r["target"] for r in rows})
    levels = sorted({r["level"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax2 = ax.twinx()
    width = 0.8 / max(1, len(targets))
    x = np.arange(len(levels))
    for i, t in enumerate(targets):
        mine = {r["level"]: r for r in rows if r["target"] == t}
        p50 = [mine[c]["latency_s"]["p50"] * 1e3 if c in mine else 0 for c in levels]
        p99 = [mine[c]["latency_s"]["p99"] * 1e3 if c in mine else 0 for c in levels]
        off = x + (i - (len(targets) - 1) / 2) * width
        color = f"C{i}"  # one colour per target: its bars and its line
        ax.bar(off, p99, width, color=color, alpha=0.35, label=f"{t} p99")
        ax.bar(off, p50, width, color=color, alpha=0.9, label=f"{t} p50")
        ax2.plot(x, [mine[c]["throughput_rps"] if c in mine else 0 for c in levels], marker="o",
                 color=color, label=f"{t} throughput")  # fmt: skip
    ax.set_xticks(x, [str(c) for c in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency (ms)")
    ax2.set_ylabel("throughput (requests/s)")
    ax.set_title(title)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
