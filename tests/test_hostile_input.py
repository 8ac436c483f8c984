"""Hostile input against the real server (`speechrt serve` on the bundled models, CPU).

Every case sends what an attacker (or a careless client) would (FLAC bombs, 5,000 digits, a
64 KB ids tensor, malformed v2 infer bodies, abandoned long requests), and expects its 4xx or its
answer; after each, /v2/health/ready must still answer 200. The server's peak RSS (VmHWM in
/proc) is read after a warm-up and again by the last test, which bounds what the whole module
cost: add new cases above `test_peak_rss_grew_by_at_most_300_mb` (pytest runs a file's tests
in definition order).
"""

from __future__ import annotations

import io
import json
import os
import select
import socket
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import soundfile as sf

from serving_inputs import (
    LONG_TEXT,
    MALFORMED,
    TEXT,
    ids,
    infer,
    infer_body,
    mel,
    poll,
    send_and_keep_open,
    speechlike,
    tts_metrics,
)
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model

pytestmark = pytest.mark.skipif(
    default_model(VOICE_ACOUSTIC) is None or default_model(ASR_MODEL) is None,
    reason="needs the bundled voice and recogniser",
)

RSS_GROWTH_LIMIT_MB = 300


@dataclass
class Served:
    url: str
    pid: int
    peak_kb: int  # VmHWM after the warm-up


def peak_rss_kb(pid: int, field: str = "VmHWM") -> int:
    """The process's peak resident set size (VmHWM; or its `field`, VmRSS: now), in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wav_bytes(audio: np.ndarray, sr: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def flac_bomb(seconds: int, sr: int, channels: int, unknown_length: bool = False) -> bytes:
    """Silence as FLAC, written ten seconds at a time (never whole in memory): 30 minutes of
    48 kHz 8-channel audio is ~0.7 MB. `unknown_length` zeroes STREAMINFO's sample count, as a
    streaming encoder does (the header then does not say how long the audio is)."""
    buf = io.BytesIO()
    block = np.zeros((10 * sr, channels), dtype=np.int16)
    with sf.SoundFile(buf, "w", sr, channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds // 10):
            f.write(block)
    data = bytearray(buf.getvalue())
    if unknown_length:
        # "fLaC", a 4-byte block header, then STREAMINFO: the 36-bit count ends bytes 18..25
        field = int.from_bytes(data[18:26], "big") >> 36 << 36
        data[18:26] = field.to_bytes(8, "big")
    return bytes(data)


@pytest.fixture(scope="module")
def served(start_server) -> Served:
    url, proc = start_server("--device", "cpu", "--header-timeout", "2", "--body-timeout", "2")
    with httpx.Client(base_url=url, timeout=120) as c:  # warm-up: first use of each pipeline
        assert speak(c, "Hello there.").status_code == 200
        tone = (0.3 * np.sin(np.arange(16000) * 0.1)).astype(np.float32)
        assert transcribe(c, wav_bytes(tone, 16000)).status_code == 200
    return Served(url, proc.pid, peak_rss_kb(proc.pid))


@pytest.fixture
def client(served: Served):
    with httpx.Client(base_url=served.url, timeout=120) as c:
        yield c
        assert c.get("/v2/health/ready").status_code == 200  # still serving after the case


def speak(c: httpx.Client, text: str, **fields: object) -> httpx.Response:
    body = {"model": "tts-1", "voice": "0", "input": text, "response_format": "pcm", **fields}
    return c.post("/v1/audio/speech", json=body)


def transcribe(c: httpx.Client, data: bytes, name: str = "a.wav") -> httpx.Response:
    return c.post(
        "/v1/audio/transcriptions", data={"model": "whisper-1"}, files={"file": (name, data)}
    )


def error_of(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


# -- uploads: the header is checked before decoding, decoding stops at the limit ------------------


def test_flac_bomb_is_refused_from_its_header(client):
    bomb = flac_bomb(1800, 48000, 8)  # 30 minutes; 8 channels
    assert len(bomb) < 1_000_000
    r = transcribe(client, bomb, "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == "audio: audio is 1800.0 s long; the limit is 600 s"


def test_flac_without_a_length_is_refused_at_the_limit(client):
    bomb = flac_bomb(700, 16000, 1, unknown_length=True)
    r = transcribe(client, bomb, "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == "audio: audio is longer than the limit of 600 s"


def test_hi_res_multichannel_flac_is_refused_by_its_decoding_cost(client):
    """192 kHz, 8 channels: decoding once cost 51 s of CPU for 599 s of silence. Now what a file
    may cost to decode is bounded too, from its header (or once decoding passes the bound)."""
    r = transcribe(client, flac_bomb(60, 192000, 8), "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == (
        "audio: 60.0 s of 8-channel audio at 192000 Hz: 92160000 samples to decode; the limit "
        "is 57600000 (600 s of 48 kHz stereo)"
    )
    r = transcribe(client, flac_bomb(60, 192000, 8, unknown_length=True), "bomb.flac")
    assert r.status_code == 400
    assert error_of(r) == (
        "audio: 8-channel audio at 192000 Hz: more than 57600000 samples to decode; the limit "
        "is 57600000 (600 s of 48 kHz stereo)"
    )


# -- text: limits count what the model reads, after normalisation -------------------------------


def test_five_thousand_digits_are_refused_by_their_spoken_length(client):
    r = speak(client, "1234567890" * 500)  # 5,000 characters that read as ~21,000 symbols
    assert r.status_code == 400
    assert "symbols after normalisation" in error_of(r) and "the limit is 15000" in error_of(r)


def test_long_unpunctuated_text_is_spoken_in_bounded_pieces(client):
    words = "the quick brown fox jumps over the lazy dog and "
    text = (words * 13).strip()  # ~620 characters, no sentence end: three even pieces
    r = speak(client, text)
    assert r.status_code == 200
    seconds = len(r.content) / 2 / int(r.headers["x-sample-rate"])
    assert 20 < seconds < 80  # all of it was spoken (~117 words: ~39 s)


# -- the CLI's decoder options -------------------------------------------------------------------


def test_huge_beam_size_is_a_one_line_error(tmp_path):
    wav = tmp_path / "a.wav"
    wav.write_bytes(wav_bytes(np.zeros(16000, dtype=np.float32), 16000))
    cmd = [sys.executable, "-m", "speechrt.cli", "transcribe", str(wav), "--beam-size", "100000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr == (
        "speechrt transcribe: error: beam_size must be an integer within [1, 1024], got 100000\n"
    )


# -- KServe v2: inputs are bounded at the edge, malformed bodies are 400s ------------------------


def test_a_64_kb_ids_tensor_is_refused_by_its_shape(client):
    limit = client.get("/v2/models/fastpitch").json()["inputs"][0]["max_shape"][1]
    feeds = ids(1, 8000)  # once asked for 15 GB
    assert 64_000 < len(infer_body(feeds)[0]) < 65_000
    r = infer(client, "fastpitch", feeds)
    assert r.status_code == 400, r.text
    want = f"model 'fastpitch': axis 'symbols' of input 'ids' is 8000; the limit is {limit}"
    assert r.json()["error"] == want


def test_malformed_infer_bodies_are_400s_on_one_kept_connection(client, served: Served):
    for case, body in MALFORMED.items():
        r = client.post("/v2/models/tts/infer", content=body.encode())
        assert r.status_code == 400, (case, r.text)
        assert isinstance(r.json()["error"], str) and r.json()["error"], case
        assert r.headers.get("connection", "") != "close", case
    r = client.post("/v2/models/tts/infer", json={"inputs": [TEXT]})
    assert r.status_code == 200, r.text
    assert "internal error" not in client.get("/metrics").text


def test_a_json_infer_body_over_8_mib_is_refused_before_it_is_parsed(client):
    """25 MB of JSON numbers once took up to 1 GB while parsed (a Python object per number);
    a request's JSON may hold 8 MiB (~100 MB to parse), and larger tensors travel in binary.
    30 s of mel written in full fits."""
    n = 9 * 2**20 // 4  # 9 MiB of "0.5,"
    head = b'{"inputs": [{"name": "mel", "datatype": "FP32", "shape": [1, 80, %d], "data": ['
    body = head % (n // 80) + b",".join([b"0.5"] * (n // 80 * 80)) + b"]}]}"
    r = client.post("/v2/models/hifigan/infer", content=body)
    assert r.status_code == 413, r.text
    assert r.json()["error"].endswith("the limit is 8388608: send large tensors in binary "
                                      "(Triton's binary tensor extension, the "
                                      "Inference-Header-Content-Length header)")  # fmt: skip
    x = np.random.default_rng(0).normal(-5.0, 2.0, (1, 80, 2584)).astype(np.float32)
    inputs = [
        {"name": "mel", "datatype": "FP32", "shape": [1, 80, 2584], "data": x.tolist()},
        {"name": "mel_lengths", "datatype": "INT64", "shape": [1], "data": [2584]},
    ]
    body = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    assert 4_000_000 < len(body) < 8 * 2**20
    r = client.post("/v2/models/hifigan/infer", content=body)
    assert r.status_code == 200, r.text


# -- abandoned work: a client that goes away stops costing the device ---------------------------


def test_abandoned_requests_are_dropped_and_a_short_one_is_served(served: Served):
    """Two 10,000-character requests dropped unanswered: their unstarted pieces are dropped and
    "Hi." waits for at most the pieces already on the device. The metrics count every request
    of the module, so each figure here is taken from a baseline."""
    url, pending, ran = served.url, "nv_inference_pending_request_count", "nv_inference_count"
    base = poll(url, lambda m: m[pending] == 0, "the device idle before the case")
    first = send_and_keep_open(url, LONG_TEXT, 0)
    # A request's pieces are queued all at once: once any are pending, all of them are.
    after_first = poll(url, lambda m: m[pending] > 0, "the first request queued")
    second = send_and_keep_open(url, LONG_TEXT, 1)
    # Until the second is queued, pending only falls (the device finishes pieces).
    queued = poll(url, lambda m: m[pending] > after_first[pending], "the second request queued")
    total = queued[pending] + queued[ran] - base[ran]  # every piece of both requests
    first.close()
    second.close()

    hi = httpx.post(
        f"{url}/v1/audio/speech",
        json={"model": "tts", "voice": "0", "input": "Hi.", "response_format": "wav"},
        timeout=30,  # a hang guard: on a 2-core CPU it answers in under 2 s
    )
    ran_before_hi = tts_metrics(url)[ran] - base[ran] - 1

    assert hi.status_code == 200 and hi.content[:4] == b"RIFF"
    assert ran_before_hi < total / 4  # Hi. did not wait for the abandoned pieces
    done = poll(url, lambda m: m[pending] == 0, "the device idle")
    assert done["canceled"] - base["canceled"] == 2
    # every piece of the abandoned requests either ran or was dropped unstarted, never both
    dropped = done["dropped"] - base["dropped"]
    assert done[ran] - base[ran] + dropped == total + 1
    assert dropped >= total - ran_before_hi - 1
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200


# -- memory goes back after a large request -----------------------------------------------------


def test_memory_goes_back_after_a_long_vocoder_call(client, served: Served):
    """30 s of mel through HiFi-GAN takes ~170 MB: onnxruntime's arena once kept it (and more
    after the next such call); now the arena is shrunk after each run."""
    before = peak_rss_kb(served.pid, "VmRSS")
    r = infer(client, "hifigan", mel(1, 2584), {"binary_data_output": True})
    assert r.status_code == 200, r.text
    kept_mb = (peak_rss_kb(served.pid, "VmRSS") - before) / 1024
    assert kept_mb <= 100, f"RSS grew by {kept_mb:.0f} MB and stayed"


# -- the acoustic model's frames: bounded before its decoder runs, per item and per batch --------


def test_fastpitch_items_over_the_frame_limit_are_refused_before_decoding(client):
    """Once 20,274 frames at pace 0.1 (+7 GB), and 8 x 1,024 symbols (+7 GB): refused from the
    encoder's durations, before the decoder (whose attention grows with the frames squared)
    runs; the module's peak-RSS bound below holds what they cost."""
    want = "mel frames (limit 2584); send fewer symbols or raise the pace"
    for feeds in (ids(1, 320, pace=0.1), ids(8, 1024)):
        r = infer(client, "fastpitch", feeds)
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith("fastpitch: an item would produce ")
        assert r.json()["error"].endswith(want)


def test_a_batch_of_long_items_runs_in_groups_and_gives_its_memory_back(client, served: Served):
    """4 items of ~1,900 frames: one call would hold ~400 MB of attention scores (and the
    onnxruntime arena would keep them); in groups it costs one item at a time, and the
    memory goes back once the request is answered."""
    feeds = ids(4, 300)
    feeds["ids"] = np.random.default_rng(0).integers(1, 100, (4, 300)).astype(np.int64)
    before = peak_rss_kb(served.pid, "VmRSS")
    r = infer(client, "fastpitch", feeds, {"binary_data_output": True})
    assert r.status_code == 200, r.text
    kept_mb = (peak_rss_kb(served.pid, "VmRSS") - before) / 1024
    assert kept_mb <= 150, f"RSS grew by {kept_mb:.0f} MB and stayed"


# -- streamed transcription of an upload costs what the transcription costs ----------------------


def test_stream_true_costs_what_offline_recognition_costs(client, served: Served):
    """The streaming recogniser run over a whole upload at once recomputed each chunk's
    context many times (a 599 s upload: 312 s of CPU against 51 s offline)."""
    data = wav_bytes(speechlike(60.0, 3), 16000)
    cpu = cpu_seconds(served.pid)
    offline = transcribe(client, data)
    offline_cpu, cpu = cpu_seconds(served.pid) - cpu, cpu_seconds(served.pid)
    fields = {"model": "whisper-1", "stream": "true"}
    r = client.post("/v1/audio/transcriptions", data=fields, files={"file": ("a.wav", data)})
    stream_cpu = cpu_seconds(served.pid) - cpu
    assert offline.status_code == r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    done = httpx.Response(200, content=events[-1]).json()
    assert done == {"type": "transcript.text.done", "text": offline.json()["text"]}
    assert stream_cpu <= 2 * offline_cpu + 2.0, (stream_cpu, offline_cpu)


# -- slow clients: a request's head arrives within --header-timeout and holds at most 64 KB ------


def test_request_heads_that_trickle_in_are_cut_off(served: Served):
    """50 connections that send a header line every 0.25 s (the server runs with
    --header-timeout 2) are closed: once, 200 such connections stayed open for ever."""
    where = urlsplit(served.url)
    socks = [socket.create_connection((where.hostname, where.port)) for _ in range(50)]
    waiting = set(socks)
    for s in socks:
        s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
    answers: list[bytes] = []
    for _ in range(240):  # a hang guard: ~60 s
        if not waiting:
            break
        for s in list(waiting):
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:  # closed already
                waiting.discard(s)
        readable, _, _ = select.select(list(waiting), [], [], 0.25)
        for s in readable:
            try:
                answers.append(s.recv(1024))
            except OSError:
                answers.append(b"")
            waiting.discard(s)
    for s in socks:
        s.close()
    assert not waiting, f"{len(waiting)} of 50 trickling connections still open"
    assert answers and all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:3]
    assert httpx.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200


def test_a_228_kb_header_block_is_refused(client):
    small = {f"X-Small-{i}": "y" * 100 for i in range(40)}  # 4 KB: fine
    assert client.get("/v2/health/ready", headers=small).status_code == 200
    big = {f"X-Big-{i}": "y" * 1000 for i in range(228)}
    # the server drops the rest of the head it refused, so the client reads the status
    assert client.get("/v2/health/ready", headers=big).status_code == 431


# -- slow clients: a request's body arrives within --body-timeout of its head ---------------------


TRICKLED = {  # a head, and a body within the limits that would take ~2 minutes at 4 bytes/s
    "speech": (
        b"POST /v1/audio/speech HTTP/1.1\r\nContent-Type: application/json\r\n",
        b'{"model": "tts-1", "voice": "0", "input": "' + b"a" * 400 + b'"}',
    ),
    "transcriptions": (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n",
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
        + b"\0" * 400
        + b"\r\n--b--\r\n",
    ),
    "infer": (
        b"POST /v2/models/tts/infer HTTP/1.1\r\nContent-Type: application/json\r\n",
        b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["'
        + b"a" * 400
        + b'"]}]}',
    ),
}


@pytest.mark.parametrize("route", list(TRICKLED))
def test_request_bodies_that_trickle_in_are_cut_off(served: Served, route: str):
    """A body sent a byte every 0.25 s (the server runs with --body-timeout 2) is answered 408
    and its connection closed: once, such a body held its connection and its request for ever."""
    head, body = TRICKLED[route]
    where = urlsplit(served.url)
    with socket.create_connection((where.hostname, where.port)) as s:
        s.sendall(head + b"Host: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        answer, closed = b"", False
        for k in range(120):  # a hang guard: ~30 s, a quarter of the body
            try:
                s.sendall(body[k : k + 1])
            except OSError:  # closed already
                closed = True
                break
            if select.select([s], [], [], 0.25)[0]:
                try:
                    chunk = s.recv(4096)
                except OSError:  # reset: the server closed it under a byte still coming
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                answer += chunk
    assert closed, f"the trickling body's connection is still open; answer: {answer[:80]!r}"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert httpx.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200


# -- keep last: what the whole module cost the server --------------------------------------------


def test_peak_rss_grew_by_at_most_300_mb(served: Served):
    grown_mb = (peak_rss_kb(served.pid) - served.peak_kb) / 1024
    message = f"peak RSS grew by {grown_mb:.0f} MB (from {served.peak_kb / 1024:.0f} MB)"
    print(message)  # shown with `pytest -rP`: the margin left under the bound
    assert grown_mb <= RSS_GROWTH_LIMIT_MB, message
    assert httpx.get(f"{served.url}/v2/health/ready", timeout=10).status_code == 200
