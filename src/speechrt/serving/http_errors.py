"""HTTP errors: one exception type for the routes, two body styles for the two APIs.

/v1 (OpenAI):  {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
/v2 (KServe):  {"error": "..."}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from speechrt.errors import SpeechRTError
from speechrt.serving.engine import DeadlineExceeded, InferenceError, Overloaded

log = logging.getLogger("speechrt.serving")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "server_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """An HTTP error with a message for the client."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class PayloadTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes", "payload_too_large")


def error_body(
    path: str, status: int, message: str, code: str | None, param: str | None
) -> dict[str, str] | dict[str, dict[str, str | None]]:
    if path.startswith("/v2"):
        return {"error": message}
    err_type = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    request: Request,
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = error_body(request.url.path, status, message, code, param)
    return JSONResponse(body, status_code=status, headers=headers)


async def on_api_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, ApiError)
    return error_response(request, e.status, e.message, e.code, e.param)


async def on_speechrt_error(request: Request, e: Exception) -> JSONResponse:
    return error_response(request, 400, str(e), "invalid_input")


async def on_overloaded(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, Overloaded)
    retry = str(max(1, round(e.retry_after)))
    return error_response(request, 503, str(e), "overloaded", headers={"Retry-After": retry})


async def on_deadline(request: Request, e: Exception) -> JSONResponse:
    return error_response(request, 504, str(e), "timeout")


async def on_inference_error(request: Request, e: Exception) -> JSONResponse:
    return error_response(request, 500, str(e), "inference_failed")


async def on_validation(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    errors = e.errors()
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path", "form")]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        msg, param = "request body is not valid JSON", None
    elif first.get("type") == "missing" and param is None:
        msg = "missing request body (a JSON object)"
    elif first.get("type") == "missing":
        msg = f"missing required parameter {param!r}"
    elif param:
        msg = f"{param}: {msg}"
    return error_response(request, 400, msg, "invalid_request", param)


async def on_http_error(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, HTTPException)
    message = e.detail if isinstance(e.detail, str) else str(e.detail)
    if e.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    return error_response(request, e.status_code, message, headers=e.headers)


async def on_internal(request: Request, e: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=e)
    return error_response(request, 500, f"internal error: {type(e).__name__}: {e}", "internal")


# FastAPI's exception_handlers (pass a dict() of it: FastAPI's own value type names Any)
Handler = Callable[[Request, Exception], Coroutine[object, None, JSONResponse]]
HANDLERS: Mapping[int | type[Exception], Handler] = {
    ApiError: on_api_error,
    SpeechRTError: on_speechrt_error,
    Overloaded: on_overloaded,
    DeadlineExceeded: on_deadline,
    InferenceError: on_inference_error,
    RequestValidationError: on_validation,
    HTTPException: on_http_error,
    Exception: on_internal,
}
