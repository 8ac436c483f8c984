"""The server's surface tells the truth: KServe v2 inputs have size limits that the metadata shows,
Triton's repository index works, /openapi.json describes the real bodies and error codes, and the
small error messages say what is wrong.

The size limits run in-process (Starlette's TestClient) on the tiny voice and ASR model with small
limits; tritonclient goes to the shared `speechrt serve` subprocess (conftest.speech_server). A
64 KB ids tensor and the malformed infer requests (400s, never 500s, on a kept connection) go to
the bundled models' server in tests/test_hostile_input.py."""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from fastapi.testclient import TestClient

from serving_inputs import ids, infer, mel
from speechrt.asr import ASR
from speechrt.cli import main
from speechrt.convert.checkpoints import load_checkpoint
from speechrt.errors import SpeechRTError
from speechrt.serving import BatchConfig, Limits, ServeConfig, Server, create_app
from speechrt.tts import TTS

MAX_SYMBOLS, SECONDS, BATCH = 40, 0.5, 3


@pytest.fixture(scope="module")
def pipes(tiny_voice, tiny_asr) -> tuple[TTS, ASR]:
    return TTS(*tiny_voice, device="cpu"), ASR(tiny_asr, device="cpu")


@pytest.fixture(scope="module")
def client(pipes):
    limits = Limits(max_symbols=MAX_SYMBOLS, max_component_seconds=SECONDS, max_audio_seconds=2)
    config = ServeConfig(batch=BatchConfig(max_batch_size=BATCH), limits=limits)
    with TestClient(create_app(Server(*pipes, config=config))) as c:
        yield c


# -- size limits ---------------------------------------------------------------------------------


def test_every_input_axis_has_a_limit_shown_in_the_metadata(client, pipes) -> None:
    tts, asr = pipes
    frames = int(np.ceil(SECONDS * tts.sampling_rate / tts.mel.hop_length))
    want = {
        ("fastpitch", "ids"): [BATCH, MAX_SYMBOLS],
        ("hifigan", "mel"): [BATCH, 80, frames],
        ("hifigan.denoiser", "audio"): [BATCH, int(np.ceil(SECONDS * tts.sampling_rate))],
        ("asr", "AUDIO"): [BATCH, 2 * asr.sample_rate],
        ("tts", "TEXT"): [BATCH],
    }
    models = client.get("/health").json()["models"]
    for name in models:
        meta = client.get(f"/v2/models/{name}").json()
        config = client.get(f"/v2/models/{name}/config").json()
        assert config["max_batch_size"] == BATCH
        for t, c in zip(meta["inputs"], config["input"], strict=True):
            assert len(t["max_shape"]) == len(t["shape"]), (name, t)
            assert all(m > 0 for m in t["max_shape"]) and t["max_shape"][0] == BATCH
            fixed = [d for d, m in zip(t["shape"], t["max_shape"], strict=True) if d >= 0]
            assert fixed == [m for d, m in zip(t["shape"], t["max_shape"], strict=True) if d >= 0]
            assert c["max_dims"] == (t["max_shape"][1:] or [1])
            if (name, t["name"]) in want:
                assert t["max_shape"] == want.pop((name, t["name"])), (name, t)
    assert not want, want  # every expected model and input was served
    feature_frames = client.get("/v2/models/quartznet").json()["inputs"][0]["max_shape"][2]
    assert SECONDS * 100 < feature_frames <= SECONDS * 100 + 32  # 10 ms hop, padded to 16


def frames_limit(client) -> int:
    return client.get("/v2/models/hifigan").json()["inputs"][0]["max_shape"][2]


@pytest.mark.parametrize(
    ("model", "axis", "dim", "build"),
    [
        ("fastpitch", "'symbols' of input 'ids'", 1, lambda n: ids(1, n)),
        ("fastpitch", "'batch' of input 'ids'", 0, lambda n: ids(n, 4)),
        ("hifigan", "'frames' of input 'mel'", 2, lambda n: mel(1, n)),
        ("asr", "'samples' of input 'AUDIO'", 1, lambda n: {"AUDIO": np.zeros((1, n), np.float32)}),
    ],
    ids=["symbols", "batch", "frames", "asr samples"],
)
def test_an_axis_over_its_limit_is_a_400_naming_input_and_limit(client, model, axis, dim, build):
    limit = client.get(f"/v2/models/{model}").json()["inputs"][0]["max_shape"][dim]
    r = infer(client, model, build(limit + 1))
    assert r.status_code == 400, r.text
    assert r.json()["error"] == f"model {model!r}: axis {axis} is {limit + 1}; the limit is {limit}"


def test_inputs_at_the_limits_run(client) -> None:
    r = infer(client, "fastpitch", ids(BATCH, MAX_SYMBOLS, pace=2.0))  # 2 frames a symbol
    assert r.status_code == 200, r.text
    r = infer(client, "hifigan", mel(BATCH, frames_limit(client)))
    assert r.status_code == 200, r.text


def test_fastpitch_output_frames_are_bounded_before_decoding(client) -> None:
    """Within the symbol limit, a slow pace would decode more frames than the component may."""
    r = infer(client, "fastpitch", ids(1, MAX_SYMBOLS, pace=0.1))
    assert r.status_code == 400, r.text
    assert f"mel frames (limit {frames_limit(client)})" in r.json()["error"]


# -- repository index, OpenAPI -------------------------------------------------------------------


def test_tritonclient_lists_the_model_repository(speech_server) -> None:
    trt = triton.InferenceServerClient(speech_server.removeprefix("http://"))
    index = trt.get_model_repository_index()
    served = httpx.get(f"{speech_server}/health").json()["models"]
    assert [m["name"] for m in index] == served
    assert all(m["version"] == "1" and m["state"] == "READY" for m in index)
    r = httpx.post(f"{speech_server}/v2/repository/index", json={"ready": True})
    assert r.status_code == 200 and r.json() == index
    r = httpx.post(f"{speech_server}/v2/repository/index", json={"ready": "yes"})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)


def test_openapi_describes_bodies_errors_and_model_names(client) -> None:
    spec = client.get("/openapi.json").json()
    text = json.dumps(spec)
    assert '"422"' not in text and "HTTPValidationError" not in text
    paths = spec["paths"]
    form = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]
    assert form["multipart/form-data"]["schema"] == {
        "$ref": "#/components/schemas/TranscriptionForm"
    }
    schemas = spec["components"]["schemas"]
    assert schemas["TranscriptionForm"]["properties"]["model"]["enum"][0] == "asr"
    assert "tts-1" in schemas["SpeechRequest"]["properties"]["model"]["enum"]
    op = paths["/v2/models/{name}/infer"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert set(op["responses"]) == {"200", "400", "404", "413", "415", "503", "504"}
    assert "Retry-After" in op["responses"]["503"]["headers"]
    name = next(p for p in op["parameters"] if p["name"] == "name")
    assert name["schema"]["enum"] == client.get("/health").json()["models"]
    ready = paths["/v2/health/ready"]["get"]["responses"]
    assert set(ready) == {"200", "503"} and "content" not in ready["200"]
    assert paths["/health"]["get"]["responses"]["503"]["content"]
    speech = paths["/v1/audio/speech"]["post"]["responses"]
    assert "audio/wav" in speech["200"]["content"] and "400" in speech and "413" in speech


# -- small messages ------------------------------------------------------------------------------


def test_speech_without_a_body_says_so(client) -> None:
    r = client.post("/v1/audio/speech")
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "missing request body (a JSON object)"


def test_synthesize_refuses_a_single_string(pipes) -> None:
    with pytest.raises(SpeechRTError, match=r"a list of strings, e.g. synthesize\(\[text\]\)"):
        pipes[0].synthesize("Hello")


class Blocked:
    def __reduce__(self):
        return (os.getcwd, ())


def test_a_malicious_pickle_is_refused_naming_its_global(tmp_path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, "payload": Blocked()}, path)
    with pytest.raises(SpeechRTError, match=r"pickled posix\.getcwd object; refusing"):
        load_checkpoint(path)


def test_transcribe_a_directory_says_it_is_one(tmp_path, tiny_asr, capsys) -> None:
    assert main(["transcribe", str(tmp_path), "--model", str(tiny_asr), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"speechrt transcribe: error: {tmp_path}: a directory, not an audio file"
