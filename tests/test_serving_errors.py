"""Bad input of every kind gets a 4xx with a JSON error body, and the server stays healthy.

The shared server (conftest.speech_server) limits text to 2000 characters, bodies to 1 MiB and
audio to 30 s.
"""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest

from speechrt.audio.io import encode_audio

GOOD = {"model": "tts-1", "voice": "alloy", "input": "Hello."}
WAV = encode_audio(np.zeros(16000, dtype=np.float32), 16000, "wav")


def speech(**change):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    return {"json": body}


def upload(data=WAV, name="a.wav", **fields):
    return {"files": {"file": (name, data)}, "data": {"model": "whisper-1", **fields}}


def v2(inputs, outputs=None):
    return {"json": {"inputs": inputs, **({"outputs": outputs} if outputs else {})}}


def tensor(name, datatype, shape, data):
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def binary_header(n):
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 9},
                }
            ]
        }  # fmt: skip
    ).encode()
    return {
        "content": head + struct.pack("<I", 5) + b"hello",
        "headers": {"Inference-Header-Content-Length": str(n if n is not None else len(head))},
    }


SPEECH = "/v1/audio/speech"
ASR = "/v1/audio/transcriptions"
CASES = {
    # OpenAI speech
    "empty input": ("POST", SPEECH, speech(input=""), 400),
    "blank input": ("POST", SPEECH, speech(input="   \n "), 400),
    "nothing to speak": ("POST", SPEECH, speech(input="?!"), 400),
    "text over the limit": ("POST", SPEECH, speech(input="a" * 2001), 400),
    "10 MB of text": ("POST", SPEECH, speech(input="hello " * 1_750_000), 413),
    "input not a string": ("POST", SPEECH, speech(input=42), 400),
    "missing input": ("POST", SPEECH, speech(input=None), 400),
    "missing model": ("POST", SPEECH, speech(model=None), 400),
    "missing voice": ("POST", SPEECH, speech(voice=None), 400),
    "unknown model": ("POST", SPEECH, speech(model="tts-9000"), 404),
    "asr model for speech": ("POST", SPEECH, speech(model="whisper-1"), 404),
    "negative speed": ("POST", SPEECH, speech(speed=-1.0), 400),
    "speed too high": ("POST", SPEECH, speech(speed=4.5), 400),
    "aac": ("POST", SPEECH, speech(response_format="aac"), 400),
    "unknown format": ("POST", SPEECH, speech(response_format="xyz"), 400),
    "sse streaming": ("POST", SPEECH, speech(stream_format="sse"), 400),
    "flac streaming": ("POST", SPEECH, speech(stream_format="audio", response_format="flac"), 400),
    "no such speaker": ("POST", SPEECH, speech(voice="7"), 400),
    "bad pitch scale": ("POST", SPEECH, speech(pitch_scale=-3), 400),
    "bad JSON": (
        "POST",
        SPEECH,
        {
            "content": b'{"model": "tts-1", "input": ',
            "headers": {"content-type": "application/json"},
        },
        400,
    ),  # fmt: skip
    "JSON array": ("POST", SPEECH, {"json": [GOOD]}, 400),
    "wrong content type": (
        "POST",
        SPEECH,
        {
            "content": b"model=tts-1&input=hi",
            "headers": {"content-type": "application/x-www-form-urlencoded"},
        },
        400,
    ),  # fmt: skip
    "GET speech": ("GET", SPEECH, {}, 405),
    # OpenAI transcriptions
    "JSON instead of multipart": ("POST", ASR, {"json": {"model": "whisper-1"}}, 415),
    "not audio": ("POST", ASR, upload(b"this is not audio at all" * 10, "a.txt"), 400),
    "empty file": ("POST", ASR, upload(b""), 400),
    "missing file": (
        "POST",
        ASR,
        {"data": {"model": "whisper-1"}, "files": {"x": ("x", b"1")}},
        400,
    ),
    "missing asr model": ("POST", ASR, {"files": {"file": ("a.wav", WAV)}}, 400),
    "tts model for asr": ("POST", ASR, upload(model="tts-1"), 404),
    "unknown transcript format": ("POST", ASR, upload(response_format="docx"), 400),
    "granularity without verbose": (
        "POST",
        ASR,
        upload(**{"timestamp_granularities[]": "word"}),
        400,
    ),
    "unknown granularity": (
        "POST",
        ASR,
        upload(response_format="verbose_json", **{"timestamp_granularities[]": "sentence"}),
        400,
    ),  # fmt: skip
    "audio too long": (
        "POST",
        ASR,
        upload(encode_audio(np.zeros(31 * 8000, np.float32), 8000, "flac")),
        400,
    ),  # fmt: skip
    "audio too short": ("POST", ASR, upload(encode_audio(np.zeros(10, np.float32), 16000)), 400),
    "upload over 1 MiB": ("POST", ASR, upload(b"\0" * (1 << 21)), 413),
    # KServe v2
    "v2 unknown model": (
        "POST",
        "/v2/models/nope/infer",
        v2([tensor("x", "FP32", [1], [1.0])]),
        404,
    ),
    "v2 unknown version": ("GET", "/v2/models/tts/versions/7", {}, 404),
    "v2 bad JSON": ("POST", "/v2/models/tts/infer", {"content": b"{nope"}, 400),
    "v2 TEXT as FP32": (
        "POST",
        "/v2/models/tts/infer",
        v2([tensor("TEXT", "FP32", [1], [1.0])]),
        400,
    ),
    "v2 missing input": (
        "POST",
        "/v2/models/fastpitch/infer",
        v2([tensor("ids", "INT64", [1, 2], [1, 2])]),
        400,
    ),  # fmt: skip
    "v2 unknown input": (
        "POST",
        "/v2/models/tts/infer",
        v2([tensor("TEXT", "BYTES", [1], ["hi"]), tensor("X", "FP32", [1], [1])]),
        400,
    ),  # fmt: skip
    "v2 ids of rank 1": (
        "POST",
        "/v2/models/fastpitch/infer",
        v2([tensor("ids", "INT64", [3], [1, 2, 3]), tensor("lengths", "INT64", [1], [3])]),
        400,
    ),  # fmt: skip
    "v2 ids out of range": (
        "POST",
        "/v2/models/fastpitch/infer",
        v2([tensor("ids", "INT64", [1, 2], [1, 999]), tensor("lengths", "INT64", [1], [2])]),
        400,
    ),  # fmt: skip
    "v2 lengths too long": (
        "POST",
        "/v2/models/fastpitch/infer",
        v2([tensor("ids", "INT64", [1, 2], [1, 9]), tensor("lengths", "INT64", [1], [5])]),
        400,
    ),  # fmt: skip
    "v2 mel with 3 bins": (
        "POST",
        "/v2/models/hifigan/infer",
        v2([tensor("mel", "FP32", [1, 3, 2], [0.0] * 6), tensor("mel_lengths", "INT64", [1], [2])]),
        400,
    ),  # fmt: skip
    "v2 NaN audio": (
        "POST",
        "/v2/models/asr/infer",
        {
            "content": json.dumps(  # NaN: not JSON
                v2([tensor("AUDIO", "FP32", [1, 3], [0.0, float("nan"), 0.0])])["json"]
            )
        },
        400,
    ),  # fmt: skip
    "v2 data count vs shape": (
        "POST",
        "/v2/models/tts/infer",
        v2([tensor("TEXT", "BYTES", [2], ["only one"])]),
        400,
    ),  # fmt: skip
    "v2 unknown output": (
        "POST",
        "/v2/models/tts/infer",
        v2([tensor("TEXT", "BYTES", [1], ["Hi."])], [{"name": "MEL"}]),
        400,
    ),  # fmt: skip
    "v2 empty text": (
        "POST",
        "/v2/models/tts/infer",
        v2([tensor("TEXT", "BYTES", [1], [""])]),
        400,
    ),
    "v2 bad pace parameter": (
        "POST",
        "/v2/models/tts/infer",
        {
            "json": {
                "inputs": [tensor("TEXT", "BYTES", [1], ["Hi."])],
                "parameters": {"pace": "fast"},
            }
        },
        400,
    ),  # fmt: skip
    "v2 header length past body": ("POST", "/v2/models/tts/infer", binary_header(10_000), 400),
    "v2 binary size mismatch": (
        "POST",
        "/v2/models/tts/infer",
        binary_header(None) | {"content": binary_header(None)["content"][:-2]},
        400,
    ),  # fmt: skip
    "no such route": ("GET", "/v3/everything", {}, 404),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_4xx_with_a_json_error(speech_server, case):
    method, path, kw, status = CASES[case]
    r = httpx.request(method, f"{speech_server}{path}", timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    if path.startswith("/v2"):
        assert isinstance(err, str) and err
    else:
        assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_the_server_is_healthy_after_bad_input(speech_server):
    assert len(CASES) >= 15
    assert httpx.post(f"{speech_server}{SPEECH}", json={**GOOD, "input": "?"}).status_code == 400
    assert httpx.get(f"{speech_server}/v2/health/ready").status_code == 200
    r = httpx.post(f"{speech_server}{SPEECH}", json={**GOOD, "response_format": "wav"}, timeout=30)
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    metrics = httpx.get(f"{speech_server}/metrics").text
    assert 'nv_inference_request_failure{model="tts",version="1",reason="REJECTED"}' in metrics
