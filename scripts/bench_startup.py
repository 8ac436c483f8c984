"""Start-up of the CLI on this machine: wall time of whole commands, median of N after a warm run.

    python scripts/bench_startup.py [--runs 5] [--steady-runs 15] [--startup-only]
                                    [--asr DIR ...] [--out docs/bench/startup.json]

Times, as a user sees them (a fresh process each run, in a scratch directory):
    speechrt --help
    speechrt synthesize "Hello world." -o hello.wav
    speechrt transcribe speech.wav          (3 s of the bundled voice, written first)
    speechrt transcribe --model DIR speech.wav   (each --asr DIR; also with
                                            SPEECHRT_ONNX_CACHE=off: no graph cache)
    speechrt serve [--backend eager]        (start to /v2/health/ready answering 200; the
                                            two take turns, so a busy machine slows them alike)
and (unless --startup-only), in one process, the bundled voice's steady-state synthesis of a
~7 s sentence on the onnx and eager backends (median of N after a warm-up), and its two graphs
under onnxruntime session options (graph optimisation level, intra-op threads, spinning; the
options of each round run in turn, so a busy machine slows them alike). Prints tables stamped
with the CPU model, core count, commit and versions; --out writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from speechrt.bench.machine import cpu_model, git_commit

SPEECH = "Speech recognition works well on this small machine."  # about 3 s
LONG = (
    "The quick brown fox jumps over the lazy dog, while the laptop on the desk hums quietly "
    "and renders speech from text."
)
COMMANDS = {
    "--help": ["--help"],
    "synthesize": ["synthesize", "Hello world.", "-o", "hello.wav"],
    "transcribe": ["transcribe", "speech.wav"],
}


def wall(argv: list[str], cwd: str, env: dict[str, str] | None = None) -> float:
    """Seconds from start to exit of `speechrt ARGV` (failing loudly); `env`: variables added."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "speechrt.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"speechrt {' '.join(argv)} failed:\n{done.stderr}")
    return seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE = {"serve": [], "serve --backend eager": ["--backend", "eager"]}  # name -> extra args


def serve_ready(cwd: str, extra: list[str]) -> float:
    """Seconds from starting `speechrt serve EXTRA` (the bundled models) until
    /v2/health/ready answers 200, polled every 10 ms; the server is then stopped."""
    port = free_port()
    argv = [sys.executable, "-m", "speechrt.cli", "serve", "--port", str(port), *extra]
    start = time.perf_counter()
    server = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            if server.poll() is not None:
                _, err = server.communicate()
                raise SystemExit(f"speechrt serve failed:\n{err.decode()}")
            try:
                url = f"http://127.0.0.1:{port}/v2/health/ready"
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.01)
    finally:
        server.terminate()
        server.wait()


def steady_state(runs: int) -> dict[str, dict[str, float]]:
    """The bundled voice synthesising LONG: median seconds and RTF per backend, the backends
    taking turns each round."""
    from speechrt.tts import TTS

    voices = {backend: TTS(device="cpu", backend=backend) for backend in ("onnx", "eager")}
    times: dict[str, list[float]] = {backend: [] for backend in voices}
    samples = {backend: len(tts.synthesize([LONG])[0]) for backend, tts in voices.items()}
    for _ in range(runs):
        for backend, tts in voices.items():
            start = time.perf_counter()
            tts.synthesize([LONG])
            times[backend].append(time.perf_counter() - start)
    out = {}
    for backend, tts in voices.items():
        seconds = statistics.median(times[backend])
        duration = samples[backend] / tts.sampling_rate
        out[backend] = {"seconds": seconds, "audio_seconds": duration, "rtf": duration / seconds}
    return out


SESSIONS = {  # name -> (graph optimisation level, intra-op threads (0: one per core), spinning)
    "all, 0 threads, spin (default)": ("ORT_ENABLE_ALL", 0, "1"),
    "all, 0 threads, no spin": ("ORT_ENABLE_ALL", 0, "0"),
    "all, 1 thread": ("ORT_ENABLE_ALL", 1, "1"),
    "extended, 0 threads, spin": ("ORT_ENABLE_EXTENDED", 0, "1"),
    "basic, 0 threads, spin": ("ORT_ENABLE_BASIC", 0, "1"),
}


def session_sweep(runs: int) -> dict[str, dict[str, float]]:
    """Median ms of the bundled FastPitch (120 symbols) and HiFi-GAN (560 frames) graphs per
    session option set, rounds interleaved."""
    import numpy as np
    import onnxruntime as ort

    from speechrt.defaults import VOICE_ACOUSTIC, VOICE_VOCODER, default_model

    rng = np.random.default_rng(0)
    feeds = {
        VOICE_ACOUSTIC: {
            "ids": rng.integers(1, 140, (1, 120)),
            "lengths": np.array([120]),
            "pace": np.ones(1, np.float32),
            "pitch_shift": np.zeros(1, np.float32),
            "pitch_scale": np.ones(1, np.float32),
        },
        VOICE_VOCODER: {
            "mel": (rng.standard_normal((1, 80, 560)) - 5).astype(np.float32),
            "mel_lengths": np.array([560]),
        },
    }
    sessions = {}
    for name, (level, threads, spin) in SESSIONS.items():
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        for model in feeds:
            path = str(default_model(model) / "model.onnx")  # type: ignore[operator]
            sessions[name, model] = ort.InferenceSession(path, options, ["CPUExecutionProvider"])
    times: dict[tuple[str, str], list[float]] = {k: [] for k in sessions}
    for key, session in sessions.items():
        session.run(None, feeds[key[1]])
    for _ in range(runs):
        for key, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds[key[1]])
            times[key].append(time.perf_counter() - start)
    return {
        name: {model: 1000 * statistics.median(times[name, model]) for model in feeds}
        for name in SESSIONS
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="timed runs after one warm run")
    p.add_argument(
        "--steady-runs", type=int, default=15, help="rounds of the steady-state comparisons"
    )
    p.add_argument("--startup-only", action="store_true", help="only the commands' start-up times")
    p.add_argument(
        "--asr",
        action="append",
        default=[],
        metavar="DIR",
        help="also `transcribe --model DIR`, with onnxruntime's graph cache and without",
    )
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        wall(["synthesize", SPEECH, "-o", "speech.wav"], scratch)
        info = subprocess.run(
            [sys.executable, "-c", "import soundfile as sf; print(sf.info('speech.wav').duration)"],
            cwd=scratch,
            capture_output=True,
            text=True,
        )
        speech_seconds = float(info.stdout)
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            name: (argv, {}) for name, argv in COMMANDS.items()
        }
        for asr in args.asr:
            argv = ["transcribe", "--model", str(Path(asr).resolve()), "speech.wav"]
            commands[f"transcribe --model {asr}"] = (argv, {})
            commands[f"transcribe --model {asr}, no graph cache"] = (
                argv,
                {"SPEECHRT_ONNX_CACHE": "off"},
            )
        results = {}
        for name, (argv, env) in commands.items():
            wall(argv, scratch, env)  # warm: page cache, bytecode, onnxruntime's graph cache
            times = [wall(argv, scratch, env) for _ in range(args.runs)]
            results[name] = {"median_s": statistics.median(times), "runs_s": times}
        served: dict[str, list[float]] = {name: [] for name in SERVE}
        for extra in SERVE.values():
            serve_ready(scratch, extra)  # warm
        for _ in range(args.runs):
            for name, extra in SERVE.items():
                served[name].append(serve_ready(scratch, extra))
        for name, times in served.items():
            results[name] = {"median_s": statistics.median(times), "runs_s": times}
    stamp = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "commit": git_commit(dirty=True),
        "python": platform.python_version(),
        "command": " ".join(["python", *sys.argv]),
        "speech_wav_seconds": speech_seconds,
    }
    steady = {} if args.startup_only else steady_state(args.steady_runs)
    sweep = {} if args.startup_only else session_sweep(args.steady_runs)
    print(f"{stamp['cpu']}, {stamp['cores']} cores, commit {stamp['commit']}")
    print(f"speech.wav: {speech_seconds:.2f} s")
    print(f"{'command':<40} {'median':>8}  runs")
    for name, r in results.items():
        ready = " (ready)" if name in SERVE else ""
        label = "speechrt " + (" ".join(COMMANDS[name]) if name in COMMANDS else name + ready)
        runs = " ".join(f"{t:.2f}" for t in r["runs_s"])
        print(f"{label:<40} {r['median_s']:>7.2f}s  {runs}")
    for backend, r in steady.items():
        print(
            f"steady state, {backend:<5}: {r['seconds'] * 1000:.0f} ms for "
            f"{r['audio_seconds']:.1f} s of audio (RTF {r['rtf']:.1f})"
        )
    if sweep:
        print(f"{'onnxruntime session':<34} {'FastPitch':>10} {'HiFi-GAN':>10}")
    for name, ms in sweep.items():
        acoustic, vocoder = ms.values()
        print(f"{name:<34} {acoustic:>8.0f}ms {vocoder:>8.0f}ms")
    if args.out:
        everything = {**stamp, "startup": results, "steady_state": steady, "sessions_ms": sweep}
        Path(args.out).write_text(json.dumps(everything, indent=1) + "\n")


if __name__ == "__main__":
    main()
