"""KServe v2 inference requests and responses: JSON tensors and Triton's binary tensor extension.

Binary extension: the body is a JSON header of `Inference-Header-Content-Length` bytes followed by
the raw tensors of the inputs whose parameters carry `binary_data_size`, in input order. Outputs
are sent the same way when asked for (`binary_data` per output, or `binary_data_output` for the
request). Raw BYTES tensors are, per element, a 4-byte little-endian length and the bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from speechrt.errors import SpeechRTError
from speechrt.serving.bodies import Body, Field, Json
from speechrt.serving.v2metadata import NUMPY_DTYPES, HostArray, datatype_of

HEADER = "Inference-Header-Content-Length"
MAX_RANK = 8  # dimensions of a request tensor (no contract has more than 3, plus [B, 1] TEXT)
MAX_ELEMENTS = 2**40  # product of a shape's dimensions, zeros counted as 1 (bodies are far smaller)
# The JSON of a request (all of the body, or its JSON header with the binary extension): its
# numbers become Python objects while parsed, ~32 bytes per float and ~16 per small int, so 25 MB
# of them once took up to 1 GB. 8 MiB holds 30 s of mel ([1, 80, 2584] floats written in full,
# ~4 MB) and costs at most ~100 MB to parse; bigger tensors travel in binary.
MAX_JSON_BYTES = 8 * 1024 * 1024


# The JSON of an infer request, as parse_request reads it and /openapi.json shows it
INPUT_PARAMETERS = Body(
    "InferInputParameters",
    "",
    (
        Field(
            "binary_data_size",
            "integer",
            "the tensor is this many bytes of the binary part of the body",
            minimum=0,
        ),
    ),
)
INFER_INPUT = Body(
    "InferInput",
    "",
    (
        Field("name", "string", required=True),
        Field("datatype", "string", required=True, choices=tuple(NUMPY_DTYPES)),
        Field("shape", "array", required=True, items="integer", minimum=0, max_items=MAX_RANK),
        Field("data", "array", "flat, or nested as the shape"),
        Field("parameters", "object", body=INPUT_PARAMETERS),
    ),
)
OUTPUT_PARAMETERS = Body(
    "InferOutputParameters",
    "",
    (Field("binary_data", "boolean", "this output in the binary part of the reply"),),
)
INFER_OUTPUT = Body(
    "InferRequestedOutput",
    "",
    (
        Field("name", "string", required=True),
        Field("parameters", "object", body=OUTPUT_PARAMETERS),
    ),
)
PARAMETERS = Body(
    "InferParameters",
    "binary_data_output and, for the tts model, SynthesisOptions fields (pace, seed, ...), for "
    "the asr model sample_rate",
    (Field("binary_data_output", "boolean", "every output in binary", default=False),),
)
INFER_REQUEST = Body(
    "InferRequest",
    "KServe v2 inference request",
    (
        Field("id", "string", "echoed in the response", nullable=True),
        Field("inputs", "array", required=True, items=INFER_INPUT, min_items=1),
        Field("outputs", "array", "the outputs to send (all without it)", items=INFER_OUTPUT),
        Field("parameters", "object", body=PARAMETERS),
    ),
)


class JsonTooLarge(SpeechRTError):
    """A request's JSON over MAX_JSON_BYTES (HTTP 413)."""


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, HostArray]
    datatypes: dict[str, str]
    outputs: list[tuple[str, bool | None]] | None  # requested (name, binary?); None = all
    parameters: dict[str, object] = field(default_factory=dict)  # the request's, as JSON

    @property
    def binary_default(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))


def check_shape(value: object, name: str) -> tuple[int, ...]:
    """A request's shape for input `name`: non-negative ints, at most MAX_RANK of them."""
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise SpeechRTError(f"input {name!r}: shape must be a list of non-negative integers")
    if len(value) > MAX_RANK:
        raise SpeechRTError(
            f"input {name!r}: shape has {len(value)} dimensions; at most {MAX_RANK}"
        )
    if math.prod(max(d, 1) for d in value) > MAX_ELEMENTS:  # numpy refuses such shapes, even empty
        raise SpeechRTError(f"input {name!r}: shape {value} is too large")
    return tuple(value)


def _flatten(data: object, rank: int, name: str) -> list[object]:
    """JSON tensor data, flat or nested at most `rank` lists deep -> its elements in order (a
    flat list as it is: no copy)."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[object] = []
    # iterative, one iterator per level (data from a client may be nested deep enough to
    # overflow a recursion), and nothing held per element but the element itself
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if not isinstance(item, list):
                out.append(item)
            elif len(stack) >= max(rank, 1):
                raise SpeechRTError(f"input {name!r}: data is nested deeper than its shape")
            else:
                stack.append(iter(item))
                break
        else:
            stack.pop()
    return out


def decode_bytes(raw: bytes, count: int, name: str) -> HostArray:
    """Length-prefixed BYTES elements -> object array of `count` bytes objects."""
    out, pos = [], 0
    for _ in range(count):
        if pos + 4 > len(raw):
            raise SpeechRTError(f"input {name!r}: truncated BYTES data")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise SpeechRTError(f"input {name!r}: truncated BYTES data")
        out.append(raw[pos : pos + n])
        pos += n
    if pos != len(raw):
        raise SpeechRTError(f"input {name!r}: BYTES data holds more than {count} elements")
    return np.array(out, dtype=object).reshape(-1)


def encode_bytes(values: HostArray) -> bytes:
    parts = []
    for v in values.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode("utf-8")
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)


def _from_json(data: object, datatype: str, shape: tuple[int, ...], name: str) -> HostArray:
    flat = _flatten(data, len(shape), name)
    if len(flat) != math.prod(shape):
        raise SpeechRTError(
            f"input {name!r}: shape {list(shape)} needs {math.prod(shape)} values, got {len(flat)}"
        )
    if datatype == "BYTES":
        texts = [x for x in flat if isinstance(x, str)]
        if len(texts) != len(flat):
            raise SpeechRTError(f"input {name!r}: BYTES data must be strings in JSON")
        return np.array([x.encode("utf-8") for x in texts], dtype=object).reshape(shape)
    if any(isinstance(x, (str, dict, type(None))) for x in flat):
        raise SpeechRTError(f"input {name!r}: {datatype} data must be numbers")
    if datatype == "BOOL":
        if not all(isinstance(x, bool) for x in flat):
            raise SpeechRTError(f"input {name!r}: BOOL data must be true/false")
    elif datatype[0] in "IU" and not all(isinstance(x, int) for x in flat):
        raise SpeechRTError(f"input {name!r}: {datatype} data must be integers")
    try:
        return np.array(flat, dtype=NUMPY_DTYPES[datatype]).reshape(shape)
    except OverflowError:
        raise SpeechRTError(f"input {name!r}: a value does not fit {datatype}") from None


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """Decode an infer request body; every problem is a SpeechRTError (HTTP 400)."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise SpeechRTError(f"{HEADER} must be an integer, got {header_length!r}") from None
        if not 0 < n <= len(body):
            raise SpeechRTError(f"{HEADER} {n} does not fit the {len(body)}-byte body")
        head, raw = body[:n], body[n:]
    else:
        head, raw = body, b""
    if len(head) > MAX_JSON_BYTES:
        raise JsonTooLarge(
            f"the request's JSON is {len(head)} bytes; the limit is {MAX_JSON_BYTES}: send large "
            f"tensors in binary (Triton's binary tensor extension, the {HEADER} header)"
        )
    try:
        req = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpeechRTError(f"request is not valid JSON ({e})") from None
    except RecursionError:  # the parser recurses once per nested list or object
        raise SpeechRTError("request JSON is nested too deeply") from None
    return _read_request(req, raw)


def _read_request(req: Json, raw: bytes) -> InferRequest:
    """The parsed JSON of a request (its binary part `raw`), read as INFER_REQUEST declares."""
    tensors = INFER_REQUEST.get(req, "inputs") if isinstance(req, dict) else None
    if not isinstance(req, dict) or not isinstance(tensors, list) or not tensors:
        raise SpeechRTError("request must be a JSON object with a non-empty 'inputs' list")
    params = INFER_REQUEST.get(req, "parameters")
    if not isinstance(params, dict):
        raise SpeechRTError("'parameters' must be an object")
    inputs: dict[str, HostArray] = {}
    datatypes: dict[str, str] = {}
    pos = 0
    for t in tensors:
        name, datatype, array, pos = _read_input(t, raw, pos, inputs)
        inputs[name], datatypes[name] = array, datatype
    if pos != len(raw):
        raise SpeechRTError(f"{len(raw) - pos} bytes of binary data belong to no input")
    outputs = _read_outputs(INFER_REQUEST.get(req, "outputs")) if "outputs" in req else None
    rid = INFER_REQUEST.get(req, "id")
    if not isinstance(PARAMETERS.get(params, "binary_data_output"), bool):
        raise SpeechRTError("parameter 'binary_data_output' must be true or false")
    parameters: dict[str, object] = dict(params)
    return InferRequest(
        str(rid) if rid is not None else None, inputs, datatypes, outputs, parameters
    )


def _read_input(
    t: Json, raw: bytes, pos: int, seen: dict[str, HostArray]
) -> tuple[str, str, HostArray, int]:
    """One of `inputs` (its data in JSON, or the `raw` binary part from `pos` on) -> (name,
    datatype, array, where the next binary tensor starts)."""
    name = INFER_INPUT.get(t, "name") if isinstance(t, dict) else None
    if not isinstance(t, dict) or not isinstance(name, str):
        raise SpeechRTError("every input needs a 'name'")
    if name in seen:
        raise SpeechRTError(f"input {name!r} given twice")
    datatype = INFER_INPUT.get(t, "datatype")
    if not isinstance(datatype, str) or datatype not in INFER_INPUT.field("datatype").choices:
        raise SpeechRTError(f"input {name!r}: unsupported datatype {_brief(datatype)}")
    shape = check_shape(INFER_INPUT.get(t, "shape"), name)
    tparams = INFER_INPUT.get(t, "parameters")
    if not isinstance(tparams, dict):
        raise SpeechRTError(f"input {name!r}: 'parameters' must be an object")
    size = INPUT_PARAMETERS.get(tparams, "binary_data_size")
    if size is None:
        if "data" not in t:
            raise SpeechRTError(f"input {name!r} has neither 'data' nor binary_data_size")
        return name, datatype, _from_json(INFER_INPUT.get(t, "data"), datatype, shape, name), pos
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= len(raw) - pos:
        raise SpeechRTError(f"input {name!r}: binary_data_size {_brief(size)} exceeds the body")
    return name, datatype, from_raw(raw[pos : pos + size], datatype, shape, name), pos + size


def _read_outputs(requested: Json) -> list[tuple[str, bool | None]]:
    """`outputs` -> [(name, binary: true, false or None for the request's default)]."""
    if not isinstance(requested, list):
        raise SpeechRTError("'outputs' must be a list")
    outputs: list[tuple[str, bool | None]] = []
    for o in requested:
        name = INFER_OUTPUT.get(o, "name") if isinstance(o, dict) else None
        if not isinstance(o, dict) or not isinstance(name, str):
            raise SpeechRTError("every requested output needs a 'name'")
        op = INFER_OUTPUT.get(o, "parameters")
        if not isinstance(op, dict):
            raise SpeechRTError(f"output {name!r}: 'parameters' must be an object")
        if op.get("classification"):  # Triton's extension, refused (so not declared)
            raise SpeechRTError("the classification extension is not supported")
        binary = OUTPUT_PARAMETERS.get(op, "binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise SpeechRTError(f"output {name!r}: 'binary_data' must be true or false")
        outputs.append((name, binary))
    return outputs


def _brief(value: object) -> str:
    """A client's value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def from_raw(chunk: bytes, datatype: str, shape: tuple[int, ...], name: str) -> HostArray:
    """A raw (little-endian, or length-prefixed BYTES) tensor -> its array, or SpeechRTError."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return decode_bytes(chunk, count, name).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if len(chunk) != count * dtype.itemsize:
        raise SpeechRTError(
            f"input {name!r}: {len(chunk)} bytes do not hold shape {list(shape)} of {datatype}"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


# Numbers of a JSON output are written this many at a time: a Python list of 5.3 M floats (a
# [8, 661504] HiFi-GAN output) held ~170 MB before the text was made, the text ~100 MB more
JSON_CHUNK = 1 << 16


def encode_response(
    model: str, version: str, request: InferRequest, outputs: dict[str, HostArray]
) -> tuple[bytes, dict[str, str]]:
    """Response body and headers; requested outputs only, binary where asked."""
    parts, headers = encode_response_parts(model, version, request, outputs)
    return b"".join(parts), headers


def encode_response_parts(
    model: str, version: str, request: InferRequest, outputs: dict[str, HostArray]
) -> tuple[list[bytes], dict[str, str]]:
    """encode_response's body as the parts it joins: the numbers of a JSON output are written
    JSON_CHUNK at a time, so that no list of them and no second copy of the text is held."""
    wanted = request.outputs or [(name, None) for name in outputs]
    for name, _ in wanted:
        if name not in outputs:
            raise SpeechRTError(f"model {model!r} has no output {name!r}")
    entries, blobs = [], []
    numbers: list[HostArray] = []  # the JSON outputs' values, flat
    for name, binary in wanted:
        arr = outputs[name]
        entry: dict[str, object] = {
            "name": name,
            "datatype": datatype_of(arr),
            "shape": list(arr.shape),
        }
        if binary if binary is not None else request.binary_default:
            if arr.dtype == object:
                blob = encode_bytes(arr)
            else:
                blob = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif arr.dtype == object:
            entry["data"] = [
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                for v in arr.reshape(-1)
            ]
        else:  # written into the text below, in place of this marker
            entry["data"] = f"\0data {len(numbers)}\0"
            numbers.append(arr.reshape(-1))
        entries.append(entry)
    resp: dict[str, object] = {"model_name": model, "model_version": version, "outputs": entries}
    if request.id is not None:
        resp["id"] = request.id
    text = json.dumps(resp, separators=(",", ":"))
    head: list[bytes] = []
    for i, values in enumerate(numbers):
        before, text = text.split(json.dumps(f"\0data {i}\0"), 1)
        head += [before.encode(), b"["]
        for a in range(0, len(values), JSON_CHUNK):
            chunk = json.dumps(values[a : a + JSON_CHUNK].tolist(), separators=(",", ":"))
            head.append((b"," if a else b"") + chunk[1:-1].encode())
        head.append(b"]")
    head.append(text.encode())
    if not blobs:
        return head, {"Content-Type": "application/json"}
    headers = {"Content-Type": "application/octet-stream", HEADER: str(sum(map(len, head)))}
    return head + blobs, headers
