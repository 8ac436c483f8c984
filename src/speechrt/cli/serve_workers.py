"""`speechrt serve --workers N`: N server processes on one listening socket.

This process binds the socket and starts N workers (spawned, so that none inherits a CUDA
context) running speechrt.cli.serve.worker; each loads the models itself and serves it with its own
uvicorn, batcher and device thread, and the kernel hands each new connection to one of them.
On one GPU the workers take turns on it, as Triton's model instances do: one's kernels run while
another's Python (HTTP, the runner's launches) holds its own interpreter lock. /metrics, whichever
worker answers it, sums all of them (prometheus-client's multi-process mode, as for --ray's
replicas). A worker that exits stops the others and the command, with its exit status: a server
that quietly served with fewer workers than asked would hide the failure.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType

from speechrt.errors import SpeechRTError

POLL_S = 0.2  # how often this process looks for a worker that exited
# a worker's body: (the command line, the listening socket, the supervisor's pid) -> never returns
# until its server stops; a module-level function (the spawned process imports it by name)
Worker = Callable[[list[str], socket.socket, int], None]


def check_workers(args: argparse.Namespace) -> None:
    """--workers N with what N > 1 cannot serve, or SpeechRTError."""
    if args.workers < 1:
        raise SpeechRTError(f"--workers must be >= 1, got {args.workers}")
    if args.workers == 1:
        return
    for flag, given in (
        ("--ray", args.ray),
        ("--grpc-port", args.grpc_port is not None),
        ("--wyoming-port", args.wyoming_port is not None),
    ):
        if given:
            raise SpeechRTError(f"--workers {args.workers} is not served with {flag}")


def run_workers(args: argparse.Namespace, worker: Worker) -> int:
    """Serve with args.workers processes, each running `worker(argv, socket, this pid)`, until
    interrupted or until one of them exits. The flags are checked already."""
    from speechrt.serving.metrics import MULTIPROC_ENV

    sock = listen(args.host, args.port)
    own_dir = MULTIPROC_ENV not in os.environ
    if own_dir:  # set before the workers import prometheus_client (they are spawned fresh)
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="speechrt-metrics-")
    host, port = sock.getsockname()[:2]
    print(f"speechrt serve: {args.workers} workers on http://{host}:{port}", file=sys.stderr)
    spawn = multiprocessing.get_context("spawn")
    workers: list[BaseProcess] = []
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    saved = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in range(args.workers):
            proc = spawn.Process(target=worker, args=(args._argv, sock, os.getpid()))
            proc.start()
            workers.append(proc)
        while not stopping and all(w.is_alive() for w in workers):
            time.sleep(POLL_S)
        exited = [w.exitcode for w in workers if not w.is_alive()]
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()  # SIGTERM: uvicorn drains within --graceful-timeout
        for w in workers:
            w.join(args.graceful_timeout + 10)
            if w.is_alive():
                w.kill()
                w.join()
        for s, handler in saved.items():
            signal.signal(s, handler)
        sock.close()
        if own_dir:
            shutil.rmtree(os.environ.pop(MULTIPROC_ENV), ignore_errors=True)
    if stopping:
        return 0
    code = next((c for c in exited if c), 1)  # a worker that exits, even with 0, is a failure
    print(f"speechrt serve: a worker exited ({code}); stopped the others", file=sys.stderr)
    return code if code > 0 else 1


def listen(host: str, port: int, flag: str = "--port") -> socket.socket:
    """A listening TCP socket that spawned workers can inherit (port 0: any free port), bound
    before any model loads so that a taken port is one line at once; or SpeechRTError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise SpeechRTError(f"{flag}: cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def die_with(parent: int) -> None:
    """Linux: this process gets SIGTERM when `parent` dies, even killed (prctl's
    PR_SET_PDEATHSIG), so that no worker holds a GPU and a port after its supervisor is gone."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before prctl took effect
        sys.exit(1)
