"""Ray Serve: the whole server as two replicas behind Ray's proxy, and the split TTS pipeline.

One local Ray cluster for the module (2 CPUs, loopback only, no dashboard), shut down at its end.
Token authentication stays on, as Ray turns it on for a new local cluster; the token is given in
RAY_AUTH_TOKEN (Ray's first token source), so the user's ~/.ray is neither read nor written.
These tests run in CI (the `dev` extra installs ray); locally: pytest -m "not ray".
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from speechrt.cli import build_parser
from speechrt.cli.serve import check_ray_flags
from speechrt.cli.serve_ray import parse_autoscale, parse_split, ray_options
from speechrt.client import parse_metrics
from speechrt.defaults import VOICE_ACOUSTIC, VOICE_VOCODER, default_model
from speechrt.errors import SpeechRTError

TEXTS = ["Hello from the first replica. And a second sentence.", "Ray Serve speaks too."]
# Float32 audio of the split pipeline against TTS.synthesize in one process: the same graphs on
# the same pieces and seeds, batched differently (onnxruntime's kernels may sum in another order
# for another batch shape). Measured: at most 8e-6 apart; the bound is 1e-4, about 3 steps of
# 16-bit audio, in any sample.
SPLIT_ATOL = 1e-4


def serve_args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- flags (no cluster) ------------------------------------------------------------------------


def test_ray_flags_need_ray_and_are_checked() -> None:
    with pytest.raises(SpeechRTError, match="--replicas need --ray"):
        check_ray_flags(serve_args("--replicas", "2"))
    assert parse_autoscale("1,4") == (1, 4)
    for bad in ("4", "3,1", "a,b", "0,0"):
        with pytest.raises(SpeechRTError, match="--autoscale"):
            parse_autoscale(bad)
    with pytest.raises(SpeechRTError, match="give one of"):
        ray_options(serve_args("--ray", "--replicas", "2", "--autoscale", "1,2"))
    with pytest.raises(SpeechRTError, match="give one of"):
        ray_options(serve_args("--ray", "--replicas", "2", "--split-tts", "1,2"))
    assert parse_split("1,2") == (1, 2)
    with pytest.raises(SpeechRTError, match="--split-tts"):
        parse_split("0,1")
    options = ray_options(serve_args("--ray", "--autoscale", "1,3", "--max-batch-size", "16"))
    assert options["autoscale"] == (1, 3) and options["max_batch_size"] == 16


def test_replicas_take_what_their_engine_holds() -> None:
    """Ray's default max_ongoing_requests (5) would cap the engine's batches below
    --max-batch-size, and any cap below the engine's queue leaves requests in Ray's router."""
    from speechrt.serving.ray_app import replica_options

    opts = replica_options(replicas=2, max_batch_size=16, max_queue_size=300)
    assert opts["max_ongoing_requests"] == 316 and opts["num_replicas"] == 2
    auto = replica_options(autoscale=(1, 4), max_batch_size=8)
    assert auto["autoscaling_config"]["max_replicas"] == 4 and "num_replicas" not in auto


def test_replicas_run_the_app_on_their_main_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's second event loop per replica is turned off (ray_app.REPLICA_ENV), unless the
    environment of `speechrt serve --ray` says otherwise."""
    from speechrt.serving.ray_app import replica_env, replica_options

    flag = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
    monkeypatch.delenv(flag, raising=False)
    assert replica_env() == {flag: "0"}
    opts = replica_options(env={"PROMETHEUS_MULTIPROC_DIR": "/tmp/m"})
    env = opts["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == {flag: "0", "PROMETHEUS_MULTIPROC_DIR": "/tmp/m"}
    monkeypatch.setenv(flag, "1")
    assert replica_env() == {flag: "1"}


# -- on a local cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """The proxy's base URL; the environment variables Ray sets are restored at the end."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
    mp.delenv("RAY_AUTH_MODE", raising=False)  # Ray sets it to "token" for the new cluster
    mp.delenv("RAY_ADDRESS", raising=False)
    mp.delenv("PYTHONBREAKPOINT", raising=False)  # ray.init points it at Ray's debugger
    import ray
    from ray import serve

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        mp.undo()


@pytest.mark.ray
def test_two_replicas_serve_and_metrics_count_every_request(cluster: str, tmp_path: Path) -> None:
    """16 concurrent OpenAI-client requests through Ray's proxy: all answered, by both replicas,
    and /metrics (answered by either) counts all 16."""
    import openai
    from ray import serve

    from speechrt.cli.serve import load_server
    from speechrt.serving.ray_app import REPLICA_HEADER, server_app

    args = serve_args("--backend", "onnx", "--max-batch-size", "8")
    load = functools.partial(load_server, args)
    app = server_app(load, str(tmp_path / "metrics"), replicas=2, cpus=0.5, max_batch_size=8)
    serve.run(app, name="speechrt", route_prefix="/")
    try:
        client = openai.OpenAI(base_url=f"{cluster}/v1", api_key="none", max_retries=0)

        def speak(i: int) -> tuple[int, str, bytes]:
            r = client.audio.speech.with_raw_response.create(
                model="tts-1", voice="alloy", input=f"Request number {i}.", response_format="wav"
            )
            return r.status_code, r.headers[REPLICA_HEADER], r.content

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(speak, range(16)))
        assert all(status == 200 and wav[:4] == b"RIFF" for status, _, wav in answers)
        replicas = {replica for _, replica, _ in answers}
        assert len(replicas) == 2, replicas
        assert httpx.get(f"{cluster}/v2/health/ready").status_code == 200
        assert httpx.get(f"{cluster}/v2/models/tts").json()["name"] == "tts"
        m = parse_metrics(httpx.get(f"{cluster}/metrics").text)
        tts = 'model="tts",version="1"'
        assert m[f"nv_inference_request_success{{{tts}}}"] == 16
        assert m[f"speechrt_request_duration_seconds_count{{{tts}}}"] == 16
        assert m[f'speechrt_request_duration_seconds_bucket{{{tts},le="+Inf"}}'] == 16
        assert m[f"nv_inference_count{{{tts}}}"] == 16  # one sentence each
        assert len(list((tmp_path / "metrics").glob("counter_*.db"))) == 2  # one per replica
    finally:
        serve.delete("speechrt")
    # stopped replicas leave the pending-items gauge; their counters stay
    assert not list((tmp_path / "metrics").glob("gauge_livesum_*.db"))
    assert len(list((tmp_path / "metrics").glob("counter_*.db"))) == 2


@pytest.mark.ray
def test_split_pipeline_equals_in_process_synthesis(cluster: str) -> None:
    """Front end in the ingress, acoustic model and vocoder as deployments: the audio of every
    text equals TTS.synthesize's (same seeds) within SPLIT_ATOL, over a handle and over HTTP."""
    import openai
    from ray import serve

    from speechrt.audio import codecs
    from speechrt.options import SynthesisOptions
    from speechrt.serving import Limits
    from speechrt.serving.ray_tts import split_tts_app
    from speechrt.tts import TTS

    acoustic, vocoder = default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)
    assert acoustic is not None and vocoder is not None
    limits = Limits(max_text_chars=200)
    app = split_tts_app(str(acoustic), str(vocoder), backend="onnx", cpus=0.5, limits=limits)
    handle = serve.run(app, name="split", route_prefix="/split")
    try:
        options = SynthesisOptions(pace=1.1)
        # SSML too: its break and prosody applied by the stages as in-process
        texts = [
            *TEXTS,
            '<speak>One. <break time="300ms"/><prosody rate="1.3">Two.</prosody></speak>',
        ]
        got = handle.synthesize.remote(texts, options, [3, 4, 5]).result()
        tts = TTS(acoustic, vocoder, backend="onnx")
        want = tts.synthesize(texts, options, seeds=[3, 4, 5])
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == np.float32
            assert np.abs(g - w).max() <= SPLIT_ATOL
            assert np.abs(w).max() > 0.05  # speech, not silence
        client = openai.OpenAI(base_url=f"{cluster}/split/v1", api_key="none", max_retries=0)
        r = client.audio.speech.with_raw_response.create(
            model="tts-1", voice="alloy", input=TEXTS[1], response_format="pcm", speed=1.1
        )
        pcm = np.frombuffer(r.content, dtype=np.int16)
        (ref,) = tts.synthesize([TEXTS[1]], options, seeds=[0])
        expected = np.frombuffer(codecs.encode(ref, tts.sampling_rate, "pcm"), dtype=np.int16)
        assert pcm.shape == expected.shape
        assert np.abs(pcm.astype(np.int32) - expected).max() <= 4  # SPLIT_ATOL, and rounding
        bad = httpx.post(
            f"{cluster}/split/v1/audio/speech",
            json={"model": "tts-1", "voice": "nobody", "input": "Hi."},
        )
        assert bad.status_code == 400 and "voice" in bad.json()["error"]["message"]
        # refused by the vocoder stage (the bundled voice has no denoiser.onnx): still a 400
        body = {"model": "tts-1", "voice": "alloy", "input": "Hi.", "denoise": 0.01}
        bad = httpx.post(f"{cluster}/split/v1/audio/speech", json=body)
        assert bad.status_code == 400 and "denoiser" in bad.json()["error"]["message"], bad.text
        body = {"model": "tts-1", "voice": "alloy", "input": "Long. " * 50}
        bad = httpx.post(f"{cluster}/split/v1/audio/speech", json=body)
        assert bad.status_code == 400 and "limit is 200" in bad.json()["error"]["message"]
    finally:
        serve.delete("split")


# What a hostile or careless client sends to /v1/audio/speech, and the limits both servers run
# with: each body is answered by the split pipeline exactly as by `speechrt serve`.
LIMIT_FLAGS = ("--max-text-chars", "2000", "--max-text-symbols", "1000")
HOSTILE = {
    "too long": {"input": "Long. " * 400},  # 2,400 characters
    "digits": {"input": "1234567890" * 150},  # 1,500 characters that read as ~6,000 symbols
    "telephone": {
        "input": '<speak><say-as interpret-as="telephone">' + "5" * 600 + "</say-as></speak>"
    },
    "pieces": {"input": "Hi. " * 300},  # 300 sentences
    "malformed ssml": {"input": "<speak>Hi <s>there</speak>"},
    "huge year": {
        "input": '<speak><say-as interpret-as="date">1/5/' + "9" * 20 + "</say-as></speak>"
    },
    "empty": {"input": "   "},
    "unknown voice": {"voice": "nobody"},
    "speed": {"speed": 10.0},
    "aac": {"response_format": "aac"},
    "unknown model": {"model": "gpt-5"},
    "missing input": {"input": None},
    "denoise": {"denoise": 0.5},  # the bundled voice ships no denoiser graph (onnx backend)
}


@pytest.mark.ray
def test_split_pipeline_refuses_what_the_server_refuses(cluster: str, start_server) -> None:
    """The split pipeline's ingress runs the server's own checks (openai_api.speech_options,
    pipelines.SpeechFrontEnd, which TTSService runs too): every hostile body gets the same
    status and the same JSON error from both, and none reaches a model."""
    from ray import serve

    from speechrt.cli.serve import serve_config
    from speechrt.serving.ray_tts import split_tts_app

    acoustic, vocoder = default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)
    assert acoustic is not None and vocoder is not None
    server, _ = start_server("--device", "cpu", "--no-components", *LIMIT_FLAGS)
    limits = serve_config(serve_args(*LIMIT_FLAGS)).limits
    assert limits.max_text_symbols == 1000
    app = split_tts_app(str(acoustic), str(vocoder), backend="onnx", cpus=0.5, limits=limits)
    serve.run(app, name="hostile", route_prefix="/hostile")
    try:
        base = {"model": "tts-1", "voice": "default", "input": "Hi.", "response_format": "pcm"}
        for case, fields in HOSTILE.items():
            body = {k: v for k, v in {**base, **fields}.items() if v is not None}
            want = httpx.post(f"{server}/v1/audio/speech", json=body, timeout=120)
            got = httpx.post(f"{cluster}/hostile/v1/audio/speech", json=body, timeout=120)
            assert 400 <= want.status_code < 500, (case, want.text)
            assert (got.status_code, got.json()) == (want.status_code, want.json()), case
        m = parse_metrics(httpx.get(f"{server}/metrics").text)
        assert m.get('nv_inference_count{model="tts",version="1"}', 0.0) == 0  # no model ran
        for url in (server, f"{cluster}/hostile"):  # and a fair request is served by both
            r = httpx.post(f"{url}/v1/audio/speech", json=base, timeout=120)
            assert r.status_code == 200 and len(r.content) > 1000, r.text
    finally:
        serve.delete("hostile")


def listening(root: int) -> list[tuple[str, str]]:
    """(process name, local address) of every listening TCP socket of `root` and all its
    descendants, read from /proc."""
    import ipaddress
    import os

    parent = {}
    for d in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # (gone meanwhile)
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree, grew = tree | more, bool(more)
    owner = {}
    for pid in tree:
        try:
            name = (Path(f"/proc/{pid}") / "comm").read_text().strip()
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    owner[link[8:-1]] = name
        except OSError:
            pass
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])  # 32-bit words, each little-endian
            ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
            out.append((owner[fields[9]], str(ip)))
    return out


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.ray
def test_serve_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    """`speechrt serve --ray` on a cluster of its own: Ray's servers (GCS, raylet, workers,
    agents, monitor) and the HTTP proxy listen on loopback. The one exception is the replica's
    inter-deployment gRPC server, which Ray Serve 2.60 binds to [::]:0 (token-guarded)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(16)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "speechrt.cli", "serve", "--ray", "--port", str(port)]
    cmd += ["--cpus-per-replica", "0.5", "--no-components"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "speechrt on Ray Serve" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
        sockets = listening(proc.pid)
        names = {name for name, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets
        exposed = [s for s in sockets if not is_loopback(s[1])]
        assert exposed == [("ray::ServeRepli", "::")], sockets  # (comm: 15 characters)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_replicas_that_cannot_fit_fail_at_once() -> None:
    from speechrt.cli.serve_ray import check_fits

    check_fits({"CPU": 2.0}, 2, 1.0, 0.0)
    with pytest.raises(SpeechRTError, match="need 3 CPUs; the Ray cluster has 2"):
        check_fits({"CPU": 2.0}, 3, 1.0, 0.0)
    with pytest.raises(SpeechRTError, match="--gpus-per-replica"):
        check_fits({"CPU": 8.0}, 2, 1.0, 1.0)


def test_stages_batch_only_pieces_with_equal_options() -> None:
    """A stage batch mixing two speeds runs them as two batches: each mel equals the piece's
    mel computed alone with its own options, and the vocoder's audio likewise (no cluster)."""
    from speechrt.options import SynthesisOptions
    from speechrt.serving.ray_tts import AcousticModel, VocoderModel, _groups
    from speechrt.tts import TTS, Piece

    assert _groups(["a", "b", "a", "c", "b"]) == [[0, 2], [1, 4], [3]]
    acoustic, vocoder = default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)
    stage = (str(acoustic), str(vocoder), "onnx", "cpu", "fp32", 8)
    am, vm = AcousticModel(*stage), VocoderModel(*stage)
    tts = TTS(acoustic, vocoder, backend="onnx")
    ids = [tts.text.text_to_ids(t) for t in ("One more sentence.", "Two.", "And three here.")]
    slow, fast = SynthesisOptions(), SynthesisOptions(pace=1.5)
    options, seeds = [slow, fast, slow], [1, 2, 3]
    mels = am._mels(ids, seeds, options)
    waves = vm._audio(mels, seeds, options)
    for i in range(3):  # a piece run with the other speed would differ in length
        piece = Piece(0, 0, ids[i], seeds[i])
        tokens, lengths, seed_array = tts.batch_to_tensors([piece])
        mel, mel_lengths = tts.ids_to_mel(tokens, lengths, options[i], seed_array)
        assert mels[i].shape == (mel.shape[1], int(mel_lengths[0]))
        assert np.abs(mels[i] - mel[0, :, : int(mel_lengths[0])]).max() <= SPLIT_ATOL
        (wave,) = tts.ids_to_audio([piece], options[i])
        assert wave.shape == waves[i].shape and np.abs(wave - waves[i]).max() <= SPLIT_ATOL
