"""KServe v2 / Triton HTTP routes: health, server and model metadata, model config, infer.

Every model has the single version "1". Errors are {"error": "..."} as Triton sends them, so
`tritonclient.http` raises InferenceServerException with the message.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from speechrt import __version__
from speechrt.contracts import TensorSpec
from speechrt.errors import SpeechRTError
from speechrt.serving.bodies import Body, Field, Json, request_body
from speechrt.serving.http_errors import ApiError
from speechrt.serving.metrics import VERSION
from speechrt.serving.v2codec import (
    HEADER,
    INFER_REQUEST,
    JsonTooLarge,
    encode_response_parts,
    parse_request,
)
from speechrt.serving.v2metadata import KSERVE_DATATYPES, tensor_metadata

if TYPE_CHECKING:
    from speechrt.serving.engine import BatchConfig
    from speechrt.serving.server import Server
    from speechrt.serving.v2models import ContractModel

router = APIRouter(prefix="/v2")


def server_of(request: Request) -> Server:
    return request.app.state.server


def model_of(request: Request, name: str, version: str | None = None) -> ContractModel:
    return find_model(server_of(request), name, version)


def find_model(srv: Server, name: str, version: str | None = None) -> ContractModel:
    """The served model `name` (version "1", or none given), else an ApiError 404."""
    if name in srv.unserved:
        raise ApiError(404, f"model {name!r} is not served: {srv.unserved[name]}")
    if name not in srv.v2:
        raise ApiError(404, f"unknown model {name!r}; models: {', '.join(srv.v2)}")
    if version not in (None, "", VERSION):
        raise ApiError(404, f"model {name!r} has no version {version!r} (only {VERSION})")
    return srv.v2[name]


SERVER_METADATA: dict[str, object] = {
    "name": "speechrt",
    "version": __version__,
    "extensions": ["binary_tensor_data", "model_configuration"],
}


@router.get("")
async def server_metadata() -> dict[str, object]:
    return SERVER_METADATA


@router.get("/health/live")
async def live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if server_of(request).ready else 503)


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def model_metadata(name: str, request: Request, version: str | None = None) -> object:
    return model_of(request, name, version).metadata()


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
    m = model_of(request, name, version)
    return Response(status_code=200 if is_ready(server_of(request), m.name) else 503)


def is_ready(srv: Server, name: str) -> bool:
    engine = srv.engines.get(name)
    return srv.ready and (engine is None or engine.running)


@router.get("/models/{name}/config")
@router.get("/models/{name}/versions/{version}/config")
async def model_config(name: str, request: Request, version: str | None = None) -> object:
    """Triton's model configuration (enough for perf_analyzer and tritonclient)."""
    return config_of(model_of(request, name, version), server_of(request).config.batch)


def config_of(m: ContractModel, batch: BatchConfig) -> dict[str, object]:
    """A model's Triton configuration, as JSON (the ModelConfig protobuf's JSON form)."""

    def dims(t: TensorSpec) -> dict[str, object]:
        shape = tensor_metadata(t)["shape"][1:] or [1]  # without the batch axis
        datatype = KSERVE_DATATYPES[t.dtype].replace("BYTES", "STRING")
        return {"name": t.name, "data_type": f"TYPE_{datatype}", "dims": shape}

    def input_dims(t: TensorSpec) -> dict[str, object]:
        # max_dims (speechrt's): the largest size of each dim, without the batch axis
        limits = {"optional": m.is_optional(t.name), "max_dims": m.max_shape(t)[1:] or [1]}
        return {**dims(t), **limits}

    return {
        "name": m.name,
        "platform": m.platform,
        "backend": m.backend,  # the runtime backend: eager, cuda or onnx
        "max_batch_size": m.max_sizes["batch"],
        "input": [input_dims(t) for t in m.contract.inputs],
        "output": [dims(t) for t in m.contract.outputs],
        "dynamic_batching": {
            "max_queue_delay_microseconds": int(batch.max_queue_delay_ms * 1000),
            "default_queue_policy": {"max_queue_size": batch.max_queue_size},
        },
    }


REPOSITORY_INDEX = Body(
    "RepositoryIndexRequest",
    "",
    (Field("ready", "boolean", "list only the models ready now", default=False, example=True),),
)


@router.post(
    "/repository/index", openapi_extra=request_body(REPOSITORY_INDEX, "application/json", False)
)
async def repository_index(request: Request) -> list[dict[str, str]]:
    """Triton's model repository index: every served model, version "1", READY or UNAVAILABLE,
    then each component graph the server does not serve, UNAVAILABLE with the reason. The
    optional body {"ready": true} lists only the models ready now."""
    body = await request.body()
    try:
        query = json.loads(body) if body.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise SpeechRTError("the repository index request is not valid JSON") from None
    ready = REPOSITORY_INDEX.get(query, "ready") if isinstance(query, dict) else None
    if not isinstance(ready, bool):
        raise SpeechRTError('the repository index request is {"ready": true|false} or empty')
    return repository(server_of(request), ready)


def repository(srv: Server, ready_only: bool) -> list[dict[str, str]]:
    """The repository index's entries (see repository_index)."""
    out = []
    for name in srv.v2:
        ready = is_ready(srv, name)
        if ready or not ready_only:
            state = "READY" if ready else "UNAVAILABLE"
            out.append({"name": name, "version": VERSION, "state": state, "reason": ""})
    if not ready_only:
        out += [
            {"name": name, "version": VERSION, "state": "UNAVAILABLE", "reason": why}
            for name, why in srv.unserved.items()
        ]
    return out


def _decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    if encoding in (None, "", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}")
    d = zlib.decompressobj(zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise SpeechRTError(f"cannot decompress the {encoding} body ({e})") from None
    if len(out) > limit:
        raise ApiError(413, f"decompressed body exceeds {limit} bytes")
    return out


def _infer_openapi() -> dict[str, Json]:
    """The infer body: INFER_REQUEST as JSON, or Triton's binary extension (a JSON header of
    `Inference-Header-Content-Length` bytes, then the raw tensors)."""
    extra = request_body(INFER_REQUEST, "application/json", raw="application/octet-stream")
    header: Json = {
        "name": HEADER,
        "in": "header",
        "required": False,
        "description": "binary extension: length of the JSON header that starts the body",
        "schema": {"type": "integer", "minimum": 1},
    }
    return extra | {"parameters": [header]}


@router.post("/models/{name}/infer", openapi_extra=_infer_openapi())
@router.post("/models/{name}/versions/{version}/infer", openapi_extra=_infer_openapi())
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    srv = server_of(request)
    m = model_of(request, name, version)
    async with srv.metrics.track(name):
        body = await request.body()
        body = _decompress(
            body, request.headers.get("content-encoding"), srv.config.limits.max_upload_bytes
        )
        try:
            req = parse_request(body, request.headers.get(HEADER))
        except JsonTooLarge as e:
            raise ApiError(413, str(e), "payload_too_large") from None
        inputs = m.check(req.inputs, req.datatypes)
        outputs = await m.infer(inputs, req.parameters)
        # off the event loop (5.3 M floats as JSON take seconds), sent part by part
        parts, headers = await asyncio.to_thread(
            encode_response_parts, m.name, VERSION, req, outputs
        )
    headers["Content-Length"] = str(sum(map(len, parts)))
    return StreamingResponse(iter(parts), headers=headers)
