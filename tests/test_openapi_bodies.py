"""Every field a route takes is in /openapi.json, and the route takes every field the document
shows: the bodies that routes read themselves are declared once (speechrt.serving.bodies, the
tables beside each parser) and the document is written from those declarations.

In-process (Starlette's TestClient) on the tiny voice and ASR model: for each declared body, the
document's schema is the declaration's, every declared name is a documented property, and a
request that sends each field (its declared example, or a value built here for KServe's tensors)
is answered 200."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from serving_inputs import BINARY, speechlike, wav
from speechrt.asr import ASR
from speechrt.serving import Server, create_app
from speechrt.serving.bodies import Body, FormReader
from speechrt.serving.kserve import REPOSITORY_INDEX
from speechrt.serving.openai_api import TRANSCRIPTION_FORM, SpeechRequest
from speechrt.serving.openapi import BODIES
from speechrt.serving.v2codec import (
    INFER_INPUT,
    INFER_OUTPUT,
    INFER_REQUEST,
    INPUT_PARAMETERS,
    OUTPUT_PARAMETERS,
    PARAMETERS,
)
from speechrt.tts import TTS


@pytest.fixture(scope="module")
def client(tiny_voice, tiny_asr):
    server = Server(TTS(*tiny_voice, device="cpu"), ASR(tiny_asr, device="cpu"))
    with TestClient(create_app(server)) as c:
        yield c


@pytest.fixture(scope="module")
def spec(client) -> dict:
    return client.get("/openapi.json").json()


def nested(body: Body) -> list[Body]:
    """`body` and every body declared inside it."""
    out = [body]
    for f in body.fields:
        for inner in (f.body, f.items):
            if isinstance(inner, Body):
                out += nested(inner)
    return out


def refs(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def test_every_declared_field_is_documented(spec) -> None:
    schemas = spec["components"]["schemas"]
    for body in [b for top in BODIES for b in nested(top)]:
        documented = schemas[body.name]["properties"]
        assert set(body.names()) <= set(documented), body.name
        for f in body.fields:
            want, got = f.schema(), documented[f.name]
            if f.name == "model":  # the served names are added as an enum
                got = {k: v for k, v in got.items() if k != "enum"}
            assert got == want, (body.name, f.name)
        required = [f.name for f in body.fields if f.required]
        assert schemas[body.name].get("required", []) == required
    for ref in refs(spec):  # and every schema the document points to is in it
        assert ref.removeprefix("#/components/schemas/") in schemas, ref


def test_each_route_names_its_declared_body(spec) -> None:
    paths = spec["paths"]
    expected = {
        ("/v1/audio/transcriptions", "multipart/form-data"): TRANSCRIPTION_FORM,
        ("/v2/repository/index", "application/json"): REPOSITORY_INDEX,
        ("/v2/models/{name}/infer", "application/json"): INFER_REQUEST,
        ("/v2/models/{name}/versions/{version}/infer", "application/json"): INFER_REQUEST,
    }
    for (path, media), body in expected.items():
        content = paths[path]["post"]["requestBody"]["content"]
        assert content[media]["schema"] == {"$ref": f"#/components/schemas/{body.name}"}
    speech = paths["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]
    assert speech["schema"] == {"$ref": "#/components/schemas/SpeechRequest"}


def test_a_route_cannot_read_an_undeclared_field() -> None:
    with pytest.raises(KeyError, match="declares no field 'nope'"):
        TRANSCRIPTION_FORM.field("nope")
    with pytest.raises(KeyError):
        INFER_REQUEST.get({"nope": 1}, "nope")
    with pytest.raises(KeyError):
        FormReader(None, TRANSCRIPTION_FORM).value("nope")  # type: ignore[arg-type]


# -- the routes take what the document shows ------------------------------------------------------

NEEDS = {"timestamp_granularities[]": {"response_format": "verbose_json"}}


def transcribe(client, fields: dict) -> object:
    data = {k: json.dumps(v) if isinstance(v, bool) else v for k, v in fields.items()}
    files = {"file": ("a.wav", wav(speechlike(1.0, seed=3)))}
    return client.post("/v1/audio/transcriptions", data=data, files=files)


def test_the_transcription_route_takes_every_documented_field(client, spec) -> None:
    documented = spec["components"]["schemas"]["TranscriptionForm"]["properties"]
    base = {"model": documented["model"]["enum"][0]}
    assert transcribe(client, base).status_code == 200
    for f in TRANSCRIPTION_FORM.fields:
        if f.required:  # without it, a 400 that names it
            r = client.post(
                "/v1/audio/transcriptions",
                data={k: v for k, v in base.items() if k != f.name},
                files={"x" if f.name == "file" else "file": ("a.wav", wav(speechlike(1.0, 3)))},
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == f.name, r.text
            continue
        values = list(f.choices) or [f.example]  # each accepted value, or the example
        assert values != [None], f"{f.name}: declare an example the route accepts"
        for name, value in [(n, v) for n in (f.name, *f.aliases) for v in values]:
            r = transcribe(client, {**base, **NEEDS.get(f.name, {}), name: value})
            assert r.status_code == 200, (name, value, r.text)
            if f.name == "stream":
                assert r.headers["content-type"].startswith("text/event-stream")
            if f.name == "timestamp_granularities[]":
                assert f"{value}s" in r.json(), (name, value)


def test_the_speech_route_takes_every_documented_field(client, spec) -> None:
    documented = spec["components"]["schemas"]["SpeechRequest"]["properties"]
    assert set(SpeechRequest.model_fields) <= set(documented)
    model = documented["model"]["enum"][0]
    voice = client.get("/v1/audio/voices").json()["voices"][0]["id"]
    values = {
        "model": model,
        "input": "Hi there.",
        "voice": {"id": voice},
        "response_format": "wav",
        "speed": 1.5,
        "stream_format": "audio",
        "seed": 3,
        "pitch_shift": 0.5,
        "pitch_scale": 1.2,
        "pitch_flatten": True,
        "denoise": 0.01,
    }
    assert set(values) == set(SpeechRequest.model_fields)
    base = {"model": model, "input": "Hi there.", "voice": voice}
    for name, value in values.items():
        r = client.post("/v1/audio/speech", json={**base, name: value})
        assert r.status_code == 200 and r.content, (name, r.text)
    assert documented["response_format"]["enum"] == ["mp3", "opus", "flac", "wav", "pcm"]
    assert (documented["speed"]["minimum"], documented["speed"]["maximum"]) == (0.25, 4.0)


def test_the_infer_route_takes_every_documented_field(client) -> None:
    meta = client.get("/v2/models/fastpitch").json()
    out = meta["outputs"][0]["name"]
    lengths = np.array([4], dtype=np.int64).tobytes()
    sent = {
        INFER_REQUEST.name: {
            "id": "request-7",
            "inputs": [
                {
                    "name": "ids",
                    "datatype": "INT64",
                    "shape": [1, 4],
                    "data": [5, 6, 7, 8],
                    "parameters": {},
                },
                {
                    "name": "lengths",
                    "datatype": "INT64",
                    "shape": [1],
                    "parameters": {"binary_data_size": len(lengths)},
                },
                {"name": "pace", "datatype": "FP32", "shape": [1], "data": [1.0]},
            ],
            "outputs": [{"name": out, "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": False},
        }
    }
    request = sent[INFER_REQUEST.name]
    sent[INFER_INPUT.name] = {k: v for t in request["inputs"] for k, v in t.items()}
    sent[INPUT_PARAMETERS.name] = request["inputs"][1]["parameters"]
    sent[INFER_OUTPUT.name] = request["outputs"][0]
    sent[OUTPUT_PARAMETERS.name] = request["outputs"][0]["parameters"]
    sent[PARAMETERS.name] = request["parameters"]
    for body in nested(INFER_REQUEST):  # every declared field is in the request sent
        assert set(body.names()) <= set(sent[body.name]), body.name
    head = json.dumps(request).encode()
    r = client.post(
        "/v2/models/fastpitch/infer", content=head + lengths, headers={BINARY: str(len(head))}
    )
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["id"] == "request-7" and [o["name"] for o in reply["outputs"]] == [out]


def test_the_repository_index_takes_every_documented_field(client) -> None:
    everything = client.post("/v2/repository/index").json()
    for f in REPOSITORY_INDEX.fields:
        r = client.post("/v2/repository/index", json={f.name: f.example})
        assert r.status_code == 200, r.text
    assert r.json() == [m for m in everything if m["state"] == "READY"]
