"""API keys and rate limits: a real `speechrt serve --api-key ...` with the bundled recogniser
and voice, driven by the openai client, a WebSocket client, riva.client and tritonclient.grpc;
the flags' errors; the token bucket on a fake clock."""

from __future__ import annotations

import json
import re
import socket

import httpx
import pytest

from speechrt.cli import main
from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, default_model
from speechrt.serving.auth import Access, TokenBucket, bearer, check_keys

bundled = pytest.mark.skipif(
    default_model(ASR_MODEL) is None or default_model(VOICE_ACOUSTIC) is None,
    reason="no default models bundled",
)
KEY, FILE_KEY, WRONG = "sk-first-0123456789", "sk-from-a-file-abcdef", "sk-wrong-0123456789"
OPEN = ("/health", "/v2/health/live", "/v2/health/ready")


def grpc_port(proc) -> str:
    found = re.search(r"gRPC on 127\.0\.0\.1:(\d+)", proc.log.read_text())
    assert found is not None, proc.log.read_text()
    return f"127.0.0.1:{found.group(1)}"


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory) -> tuple[str, str, object]:
    """(HTTP URL, gRPC address, process) of a server taking KEY and FILE_KEY."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# the second key\n\n{FILE_KEY}\n")
    url, proc = start_server(
        *("--device", "cpu", "--grpc-port", "0", "--api-key", KEY, "--api-key-file", str(keys))
    )
    return url, grpc_port(proc), proc


@bundled
def test_http_needs_a_key_except_health(server):
    url = server[0]
    for path in OPEN:
        assert httpx.get(f"{url}{path}").status_code == 200
    for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": KEY}):
        r = httpx.get(f"{url}/v1/models", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        error = r.json()["error"]  # OpenAI's shape
        assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
        assert KEY not in r.text and WRONG not in r.text
    assert httpx.get(f"{url}/v2/models/asr").json() == {"error": r.json()["error"]["message"]}
    assert httpx.get(f"{url}/metrics").status_code == 401
    for key in (KEY, FILE_KEY):
        r = httpx.get(f"{url}/v2/models/asr", headers={"authorization": f"bearer {key}"})
        assert r.status_code == 200


@bundled
def test_the_openai_client_sends_its_key(server):
    import openai

    good = openai.OpenAI(base_url=f"{server[0]}/v1", api_key=KEY, max_retries=0)
    speech = good.audio.speech.create(
        model="tts-1", voice="alloy", input="Hi.", response_format="wav"
    )
    assert speech.content[:4] == b"RIFF"
    bad = openai.OpenAI(base_url=f"{server[0]}/v1", api_key=WRONG, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@bundled
def test_the_realtime_websocket_takes_a_header_or_a_browsers_subprotocol(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = server[0].replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    with pytest.raises(InvalidStatus) as e:
        connect(ws_url)
    assert e.value.response.status_code == 401
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(ws.recv(10))["type"] == "session.created"
    offered = ["realtime", f"openai-insecure-api-key.{FILE_KEY}"]  # as OpenAI's browser clients
    with connect(ws_url, subprotocols=offered) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv(10))["type"] == "session.created"


@bundled
def test_grpc_needs_the_key_in_metadata(server):
    import grpc
    import riva.client
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    address = server[1]
    anonymous = riva.client.SpeechSynthesisService(riva.client.Auth(uri=address))
    with pytest.raises(grpc.RpcError) as e:
        anonymous.synthesize("Hello.")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and KEY not in e.value.details()
    metadata = [["authorization", f"Bearer {KEY}"]]  # riva's --metadata authorization "Bearer KEY"
    keyed = riva.client.SpeechSynthesisService(
        riva.client.Auth(uri=address, metadata_args=metadata)
    )
    assert len(keyed.synthesize("Hello.").audio) > 0

    triton = tc.InferenceServerClient(address)
    assert triton.is_server_live() and triton.is_server_ready()  # health checks stay open
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        triton.get_model_metadata("asr")
    headers = {"authorization": f"Bearer {FILE_KEY}"}
    assert triton.get_model_metadata("asr", headers=headers).name == "asr"


@bundled
def test_keys_are_never_logged(server):
    httpx.get(f"{server[0]}/v1/models", headers={"Authorization": f"Bearer {WRONG}"})
    log = server[2].log.read_text()
    assert "gRPC on" in log and KEY not in log and FILE_KEY not in log and WRONG not in log


@bundled
def test_a_key_past_its_rate_limit_is_429_and_resource_exhausted(start_server):
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    # one request per 1000 s: each key's first request passes, its next is refused
    url, proc = start_server(
        *("--asr", str(default_model(ASR_MODEL)), "--device", "cpu", "--grpc-port", "0"),
        *("--api-key", KEY, "--api-key", FILE_KEY, "--rate-limit", "0.001/s"),
    )
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 200
    r = httpx.get(f"{url}/v1/models", headers=headers)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200  # health is not counted
    triton = tc.InferenceServerClient(grpc_port(proc))
    grpc_headers = {"authorization": f"Bearer {FILE_KEY}"}  # the other key has its own bucket
    assert triton.get_server_metadata(headers=grpc_headers).name == "speechrt"
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED"):
        triton.get_server_metadata(headers=grpc_headers)


# -- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rate-limit", "5/s"], "--rate-limit is per API key"),
        (["--api-key", KEY, "--rate-limit", "fast"], "give requests per second"),
        (["--api-key", KEY, "--rate-limit", "0/s"], "must be positive"),
        (["--api-key", "has space"], "API key 1 is empty or holds spaces"),
        (["--api-key-file", "/nonexistent/keys"], "cannot read it"),
        (["--grpc-port", "70000"], "--grpc-port must be within"),
        (["--grpc-port", "0", "--ray"], "not served under --ray"),
        (["--grpc-port", "BUSY"], "Address already in use"),
    ],
)
def test_bad_access_flags_are_one_line(flags, message, capsys, monkeypatch):
    monkeypatch.delenv("SPEECHRT_API_KEYS", raising=False)
    with socket.socket() as busy:  # a port another process listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert main(["serve", *(port if f == "BUSY" else f for f in flags)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "has space" not in err


def test_keys_come_from_flags_the_environment_and_a_file(tmp_path, monkeypatch):
    import argparse

    from speechrt.cli.serve import add_arguments
    from speechrt.cli.serve_access import api_keys

    keys = tmp_path / "keys"
    keys.write_text("k-file\n# not a key\n  \nk-flag\n")
    monkeypatch.setenv("SPEECHRT_API_KEYS", "k-env-1, k-env-2,")
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--api-key", "k-flag", "--api-key-file", str(keys)])
    assert api_keys(args) == ("k-flag", "k-env-1", "k-env-2", "k-file")


# -- the pieces ----------------------------------------------------------------------------------


def test_token_bucket_refills_at_its_rate():
    now = [0.0]
    bucket = TokenBucket(2.0, clock=lambda: now[0])  # 2 per second, holding 2
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5  # one token back
    assert bucket.take() == 0.0 and bucket.take() == 0.5
    now[0] = 100.0  # never more than it holds
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.5]
    slow = TokenBucket(0.5, clock=lambda: now[0])  # one per 2 s, holding one
    assert slow.take() == 0.0 and slow.take() == 2.0


def test_access_finds_the_key_among_all():
    access = Access(["a-key", "b-key", "a-key"])
    assert access.keys == [b"a-key", b"b-key"]  # the same key twice is one key
    assert access.key_of("b-key") == 1 and access.key_of("a-key") == 0
    assert access.key_of("b-ke") is None and access.key_of("") is None
    assert access.check(["nope", "b-key"]) is None  # any of the offered tokens
    assert access.check([]).status == 401
    assert bearer("Bearer  tok ") == ["tok"] and bearer("Basic tok") == [] and bearer(None) == []
    with pytest.raises(Exception, match="key 2"):
        check_keys(["fine", "not\tfine"])
