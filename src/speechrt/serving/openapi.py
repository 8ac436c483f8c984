"""`/openapi.json` as the server really answers: bodies, error codes and the served model names.

FastAPI derives the schema from the routes: a body a route takes as a pydantic model from its
signature; a body a route reads itself (multipart transcription, KServe infer and repository
index) from the route's `openapi_extra`, which names the `Body` declared beside its parser
(speechrt.serving.bodies; BODIES here adds their schemas). The responses, built by hand, are
described here. `describe` rewrites FastAPI's schema:
- responses: every route's success body and the error codes it uses, with the /v1 (OpenAI) or
  /v2 (KServe) error body; FastAPI's 422 goes, as validation errors are answered with 400;
- model names: enums of the models this server serves (path parameters and `model` fields).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from speechrt.audio import codecs
from speechrt.serving.bodies import Body, Json, Schema
from speechrt.serving.kserve import REPOSITORY_INDEX
from speechrt.serving.metrics import VERSION
from speechrt.serving.openai_api import TRANSCRIPTION_FORM
from speechrt.serving.v2codec import INFER_REQUEST
from speechrt.serving.v2metadata import NUMPY_DTYPES

if TYPE_CHECKING:
    from speechrt.serving.server import Server

DESCRIPTION = (
    "Speech synthesis and recognition: the OpenAI audio API under /v1, KServe v2 (Triton's HTTP "
    "protocol, with its binary tensor extension) under /v2, Prometheus metrics at /metrics."
)

# -- bodies ----------------------------------------------------------------------------------------
# A field whose value is any JSON is typed `object`: pydantic cannot build a schema from the
# recursive bodies.Json alias, and `object` gives any JSON's schema (`{}`, or an object's
# `additionalProperties: true`).


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """Every /v1 error (OpenAI's shape)."""

    error: ErrorDetail


class KServeError(BaseModel):
    """Every /v2 error (Triton's shape: tritonclient raises it as its message)."""

    error: str


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class OpenAIModelList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIModel]


class Transcription(BaseModel):
    """response_format json: `text` only; verbose_json adds task, language, duration, segments
    and (with timestamp_granularities[] word) words."""

    text: str
    task: str | None = None
    language: str | None = None
    duration: float | None = None
    segments: list[dict[str, object]] | None = None
    words: list[dict[str, object]] | None = None


if TYPE_CHECKING:
    Datatype = str
else:
    Datatype = Literal[tuple(NUMPY_DTYPES)]  # the KServe v2 datatype names


class InferOutput(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    data: list[object] | None = None
    parameters: dict[str, object] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[InferOutput]


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int] = Field(description="-1 for a dynamic axis")
    max_shape: list[int] | None = Field(None, description="inputs: the largest accepted shape")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelConfig(BaseModel):
    """Triton's model configuration (inputs carry speechrt's `max_dims` and `optional`)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    input: list[dict[str, object]]
    output: list[dict[str, object]]
    dynamic_batching: dict[str, object]


class RepositoryModel(BaseModel):
    name: str
    version: str
    state: Literal["READY", "UNAVAILABLE"]
    reason: str


class Voice(BaseModel):
    """One speaker of the loaded voice: `voice` takes its id or any of its aliases."""

    id: str
    speaker: int
    aliases: list[str]


class VoiceList(BaseModel):
    object: Literal["list"]
    voices: list[Voice]


class CaptionedWord(BaseModel):
    word: str
    start: float  # seconds from the start of the audio
    end: float


class CaptionedSpeech(BaseModel):
    """/v1/audio/speech/captioned: the audio file, base64, and its words' times."""

    audio: str
    format: str
    sample_rate: int
    words: list[CaptionedWord]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    models: list[str]


# the bodies that routes read themselves (their routes' openapi_extra names them)
BODIES: tuple[Body, ...] = (TRANSCRIPTION_FORM, INFER_REQUEST, REPOSITORY_INDEX)
MODELS: list[type[BaseModel]] = [
    OpenAIError,
    KServeError,
    OpenAIModel,
    OpenAIModelList,
    VoiceList,
    CaptionedSpeech,
    Transcription,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    ModelConfig,
    RepositoryModel,
    Health,
]

# -- what each route answers ----------------------------------------------------------------------

ERRORS = {
    400: "bad input",
    404: "unknown model, version or route",
    413: "request body over the limit",
    415: "unsupported content type or encoding",
    503: "not ready, shutting down, or the queue is full (see Retry-After)",
    504: "not finished within the request timeout",
}
RETRY_AFTER: Schema = {
    "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
}
INFERENCE = (400, 404, 413, 503, 504)

# (method, path) -> (success status, its content {media type: schema name}, error statuses); a
# schema name is "binary", "string", "RepositoryIndex" (an array) or a component's name
Content = dict[str, str]
_V2_MODEL = "/v2/models/{name}"
ROUTES: dict[tuple[str, str], tuple[int, Content, tuple[int, ...]]] = {
    ("post", "/v1/audio/speech"): (
        200,
        {media: "binary" for media in codecs.MEDIA_TYPES.values()},
        INFERENCE,
    ),
    ("post", "/v1/audio/transcriptions"): (
        200,
        {
            "application/json": "Transcription",
            "text/plain": "string",
            "text/vtt": "string",
            "text/event-stream": "string",  # stream=true
        },
        (*INFERENCE, 415),
    ),
    ("post", "/v1/audio/speech/captioned"): (
        200,
        {"application/json": "CaptionedSpeech"},
        INFERENCE,
    ),
    ("get", "/v1/audio/voices"): (200, {"application/json": "VoiceList"}, (404,)),
    ("get", "/v1/models"): (200, {"application/json": "OpenAIModelList"}, ()),
    ("get", "/v1/models/{model}"): (200, {"application/json": "OpenAIModel"}, (404,)),
    ("get", "/v2"): (200, {"application/json": "ServerMetadata"}, ()),
    ("get", "/v2/health/live"): (200, {}, ()),
    ("get", "/v2/health/ready"): (200, {}, (503,)),
    ("post", "/v2/repository/index"): (200, {"application/json": "RepositoryIndex"}, (400,)),
    ("get", "/metrics"): (200, {"text/plain": "string"}, ()),
    ("get", "/health"): (200, {"application/json": "Health"}, (503,)),
}
for _prefix in (_V2_MODEL, _V2_MODEL + "/versions/{version}"):
    ROUTES |= {
        ("get", _prefix): (200, {"application/json": "ModelMetadata"}, (404,)),
        ("get", _prefix + "/ready"): (200, {}, (404, 503)),
        ("get", _prefix + "/config"): (200, {"application/json": "ModelConfig"}, (404,)),
        ("post", _prefix + "/infer"): (
            200,
            {"application/json": "InferResponse", "application/octet-stream": "binary"},
            (*INFERENCE, 415),
        ),
    }


def _schema(kind: str) -> Schema:
    if kind == "binary":
        return {"type": "string", "format": "binary"}
    if kind == "string":
        return {"type": "string"}
    if kind == "RepositoryIndex":
        return {"type": "array", "items": {"$ref": "#/components/schemas/RepositoryModel"}}
    return {"$ref": f"#/components/schemas/{kind}"}


def _response(description: str, content: Content) -> Schema:
    out: Schema = {"description": description if content else f"{description} (no body)"}
    if content:
        media_types: Schema = {media: {"schema": _schema(kind)} for media, kind in content.items()}
        out["content"] = media_types
    return out


def _responses(path: str, success: int, content: Content, errors: tuple[int, ...]) -> Schema:
    error = {"application/json": "KServeError" if path.startswith("/v2") else "OpenAIError"}
    out: Schema = {str(success): _response("OK", content)}
    for status in sorted(errors):
        if status == 503 and path.endswith("/ready"):  # readiness: the status alone
            out["503"] = _response("not ready", {})
        elif status == 503 and path == "/health":
            out["503"] = _response("not ready", content)
        else:
            response = _response(ERRORS[status], error)
            if status == 503:
                response["headers"] = RETRY_AFTER
            out[str(status)] = response
    return out


def _object(node: Json) -> Schema:
    """`node`, a JSON object of the document (an operation, a parameter, a schema)."""
    if not isinstance(node, dict):
        raise TypeError(f"OpenAPI document: expected an object, got {node!r}")
    return node


def _array(node: Json) -> list[Json]:
    if not isinstance(node, list):
        raise TypeError(f"OpenAPI document: expected an array, got {node!r}")
    return node


def _names(names: list[str]) -> Schema:
    """A string that is one of `names`."""
    enum: list[Json] = list(names)
    return {"type": "string", "enum": enum}


def _model_names(schema: Schema, server: Server) -> None:
    """Enums of the names this server serves: path parameters and `model` fields."""
    v2 = list(server.v2)
    openai = server.openai_models()
    by_pipeline: dict[str, list[Json]] = {
        p: [n for n in openai if server.pipeline_of(n) == p] for p in ("tts", "asr")
    }
    for path, item in _object(schema["paths"]).items():
        for op in _object(item).values():
            for node in _array(_object(op).get("parameters", [])):
                param = _object(node)
                if param["in"] != "path":
                    continue
                if param["name"] == "name":
                    param["schema"] = _names(v2)
                elif param["name"] == "version":
                    param["schema"] = _names([VERSION])
                elif param["name"] == "model" and path.startswith("/v1/models"):
                    param["schema"] = _names(openai)
    components = _object(_object(schema["components"])["schemas"])
    for body, pipeline in (("SpeechRequest", "tts"), ("TranscriptionForm", "asr")):
        if by_pipeline[pipeline] and body in components:
            model = _object(_object(_object(components[body])["properties"])["model"])
            model["enum"] = by_pipeline[pipeline]


def describe(schema: Schema, server: Server) -> Schema:
    """FastAPI's schema of the app -> what the server really takes and returns (see above)."""
    components = _object(_object(schema.setdefault("components", {})).setdefault("schemas", {}))
    for model in MODELS:
        defs: Schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components |= _object(defs.pop("$defs", {}))
        components[model.__name__] = defs
    for body in BODIES:
        components |= body.components()
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, item in _object(schema["paths"]).items():
        for method, node in _object(item).items():
            op = _object(node)
            if (method, path) in ROUTES:
                op["responses"] = _responses(path, *ROUTES[(method, path)])
            else:  # routes FastAPI describes fully, apart from its 422
                _object(op["responses"]).pop("422", None)
    _model_names(schema, server)
    return schema


def install(app: FastAPI, server: Server) -> None:
    """Serve the described schema at /openapi.json (built once, on first request)."""

    def openapi() -> Schema:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION
            )
            app.openapi_schema = describe(schema, server)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
