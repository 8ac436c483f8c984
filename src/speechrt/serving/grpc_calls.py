"""What every gRPC call goes through: the API key check and the mapping of errors to statuses.

Errors map to status codes as the HTTP routes map them to statuses: bad input INVALID_ARGUMENT,
unknown model NOT_FOUND, full queue or shutdown UNAVAILABLE, request timeout DEADLINE_EXCEEDED,
a failed model INTERNAL; with API keys (speechrt.serving.auth) a missing or wrong key is
UNAUTHENTICATED and a key past its rate limit RESOURCE_EXHAUSTED (trailing metadata
`retry-after`: seconds). Triton's health checks (OPEN_METHODS) need no key, as the HTTP health
routes need none.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from speechrt.errors import SpeechRTError
from speechrt.serving.auth import Access, bearer, retry_after
from speechrt.serving.engine import DeadlineExceeded, InferenceError, Overloaded
from speechrt.serving.http_errors import ApiError

log = logging.getLogger("speechrt.serving")

# Triton's health checks, open without a key as the HTTP health routes are
OPEN_METHODS = frozenset(
    {"/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady"}
)
R = TypeVar("R")  # a handler's response message
S = TypeVar("S")  # its servicer
Q = TypeVar("Q")  # its request message


class Refused(Exception):
    """A call refused with a gRPC status code of its own (not one mapped from an error)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def status_of(e: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message an error raised by a service answers with."""
    if isinstance(e, Refused):
        return e.code, e.message
    if isinstance(e, ApiError):
        if e.status == 404:
            return grpc.StatusCode.NOT_FOUND, e.message
        if e.status == 503:
            return grpc.StatusCode.UNAVAILABLE, e.message
        code = grpc.StatusCode.INVALID_ARGUMENT if e.status < 500 else grpc.StatusCode.INTERNAL
        return code, e.message
    if isinstance(e, SpeechRTError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(e)
    if isinstance(e, Overloaded):  # a full queue, or the server shutting down: retry later
        return grpc.StatusCode.UNAVAILABLE, str(e)
    if isinstance(e, DeadlineExceeded):
        return grpc.StatusCode.DEADLINE_EXCEEDED, str(e)
    if isinstance(e, InferenceError):
        return grpc.StatusCode.INTERNAL, str(e)
    log.error("internal error in a gRPC call", exc_info=e)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}: {e}"


async def abort(context: grpc.aio.ServicerContext, e: Exception) -> None:
    code, message = status_of(e)
    await context.abort(code, message)


def unary(
    fn: Callable[[S, Q, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[S, Q, grpc.aio.ServicerContext], Awaitable[R]]:
    """A unary handler whose errors become status codes (status_of)."""

    @functools.wraps(fn)
    async def handler(self: S, request: Q, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await abort(context, e)
            raise AssertionError("context.abort returned") from e

    return handler


def streaming(
    fn: Callable[[S, Q, grpc.aio.ServicerContext], AsyncIterator[R]],
) -> Callable[[S, Q, grpc.aio.ServicerContext], AsyncIterator[R]]:
    """A handler that yields its responses, whose errors become status codes (status_of)."""

    @functools.wraps(fn)
    async def handler(self: S, request: Q, context: grpc.aio.ServicerContext) -> AsyncIterator[R]:
        try:
            async for response in fn(self, request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as e:
            await abort(context, e)

    return handler


class RequireKey(grpc.aio.ServerInterceptor):
    """Every method but OPEN_METHODS needs `authorization: Bearer KEY` in the call's metadata."""

    def __init__(self, access: Access) -> None:
        self.access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        metadata = details.invocation_metadata or ()
        tokens = [t for k, v in metadata if k == "authorization" for t in bearer(str(v))]
        denied = self.access.check(tokens)
        if denied is None:
            return handler
        trailer: tuple[tuple[str, str], ...] = ()
        if denied.status == 401:
            code = grpc.StatusCode.UNAUTHENTICATED
        else:
            assert denied.retry_after is not None
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
            trailer = (("retry-after", retry_after(denied.retry_after)),)
        return _refusing(handler, code, denied.message, trailer)


def _refusing(
    handler: grpc.RpcMethodHandler,
    code: grpc.StatusCode,
    message: str,
    trailer: tuple[tuple[str, str], ...],
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts every call with `code`."""

    async def refuse(request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message, trailing_metadata=trailer)

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
