"""The KServe v2 codec: binary-extension and JSON requests, malformed requests, binary
responses."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from speechrt.errors import SpeechRTError
from speechrt.serving.v2codec import HEADER, InferRequest, encode_response, parse_request


def binary_request(inputs, outputs=None):
    """(name, datatype, array) -> body, header length; every input as raw binary."""
    heads, blobs = [], []
    for name, datatype, arr in inputs:
        if datatype == "BYTES":
            raw = b"".join(struct.pack("<I", len(b)) + b for b in arr.reshape(-1))
        else:
            raw = arr.tobytes()
        heads.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    head = json.dumps({"inputs": heads, **({"outputs": outputs} if outputs else {})}).encode()
    return head + b"".join(blobs), str(len(head))


def test_v2_binary_and_json_requests_decode_alike():
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    text = np.array([b"hello", "w\u00f6rld".encode()], dtype=object)
    body, n = binary_request([("ids", "INT64", ids), ("TEXT", "BYTES", text)])
    req = parse_request(body, n)
    assert np.array_equal(req.inputs["ids"], ids) and list(req.inputs["TEXT"]) == list(text)
    js = {
        "inputs": [
            {"name": "ids", "datatype": "INT64", "shape": [2, 3], "data": [[0, 1, 2], [3, 4, 5]]},
            {"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["hello", "w\u00f6rld"]},
        ]
    }
    req2 = parse_request(json.dumps(js).encode(), None)
    assert np.array_equal(req2.inputs["ids"], ids) and list(req2.inputs["TEXT"]) == list(text)


@pytest.mark.parametrize(
    "body, header, match",
    [
        (b"{not json", None, "not valid JSON"),
        (b'{"inputs": []}', None, "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}', None, "2"),
        (b'{"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}', None, "FP8"),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1.5]}]}',
            None,
            "integers",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}]}',
            None,
            "non-negative",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],'
            b' "parameters": {"binary_data_size": 8}}]}1234',
            "88",
            "binary_data_size",
        ),
        (b'{"inputs": [{"name": "x"}]}xx', "abc", "integer"),
        (b'{"inputs": [{"name": "x"}]}', "999", "does not fit"),
    ],
)
def test_v2_malformed_requests_are_speechrt_errors(body, header, match):
    if header == "88":
        header = str(body.index(b"1234"))
    with pytest.raises(SpeechRTError, match=match):
        parse_request(body, header)


def test_v2_response_binary_where_asked():
    req = InferRequest(None, {}, {}, [("A", True), ("T", None)], {})
    outs = {
        "A": np.array([[0.5, -1.0]], dtype=np.float32),
        "T": np.array([b"hi"], dtype=object),
    }
    body, headers = encode_response("m", "1", req, outs)
    n = int(headers[HEADER])
    head = json.loads(body[:n])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert head["outputs"][1]["data"] == ["hi"]
    assert np.array_equal(np.frombuffer(body[n:], "<f4"), outs["A"].reshape(-1))
    req = InferRequest("7", {}, {}, [("nope", None)], {})
    with pytest.raises(SpeechRTError, match="no output"):
        encode_response("m", "1", req, outs)
