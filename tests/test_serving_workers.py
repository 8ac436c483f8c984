"""`speechrt serve --workers N`: N processes on one port, one /metrics over all of them, and a
worker that dies stops the command (it never goes on quietly with fewer)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from speechrt.cli import build_parser, main
from speechrt.cli.serve_workers import check_workers
from speechrt.errors import SpeechRTError


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_workers_flag_is_checked(capsys):
    parse = build_parser().parse_args
    check_workers(parse(["serve", "--workers", "3"]))
    for argv, message in (
        (["--workers", "0"], "--workers must be >= 1"),
        (["--workers", "2", "--ray"], "is not served with --ray"),
        (["--workers", "2", "--grpc-port", "0"], "is not served with --grpc-port"),
        (["--workers", "2", "--wyoming-port", "0"], "is not served with --wyoming-port"),
    ):
        with pytest.raises(SpeechRTError, match=message):
            check_workers(parse(["serve", *argv]))
    assert main(["serve", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workers must be >= 1" in err
    # a missing model folder: one line from the command, before any worker starts
    assert main(["serve", "--workers", "2", "--asr", "/nonexistent/asr"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/nonexistent/asr: not a model directory" in err


def workers_of(pid: int) -> list[int]:
    """The server processes `pid` spawned (not multiprocessing's resource tracker)."""
    return [p for p in children(pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_two_workers_serve_one_port_and_stop_together(start_server, tiny_voice):
    acoustic, vocoder = tiny_voice
    voice = ["--acoustic", str(acoustic), "--vocoder", str(vocoder)]
    url, proc = start_server(*voice, "--workers", "2")  # ready: one worker answers
    body = {"model": "tts", "input": "Hello there.", "voice": "0", "response_format": "pcm"}
    with httpx.Client(base_url=url, timeout=60) as client:
        replies = [client.post("/v1/audio/speech", json=body) for _ in range(6)]
        assert [r.status_code for r in replies] == [200] * 6
        assert len({r.content for r in replies}) == 1  # the same speech whichever worker spoke
        metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("nv_inference_request_success{"))
    assert line.endswith(" 6"), line  # summed over the workers, whichever answered /metrics

    servers = workers_of(proc.pid)
    assert len(servers) == 2, servers
    os.kill(servers[0], signal.SIGKILL)  # one worker dies: the command stops, and says so
    assert proc.wait(60) == 1
    assert "a worker exited" in proc.log.read_text()
    assert not Path(f"/proc/{servers[1]}").exists()  # stopped and reaped


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_workers_stop_when_their_supervisor_is_killed(start_server, tiny_voice):
    acoustic, vocoder = tiny_voice
    _, proc = start_server("--acoustic", str(acoustic), "--vocoder", str(vocoder), "--workers", "2")
    servers = workers_of(proc.pid)
    assert len(servers) == 2, servers
    proc.kill()  # SIGKILL: no chance to stop them itself
    proc.wait(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(p) for p in servers):
        time.sleep(0.1)
    assert not any(alive(p) for p in servers)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except FileNotFoundError:
        return False
