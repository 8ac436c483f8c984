"""API keys and per-key rate limits, the same for every protocol the server speaks.

A server started with keys (`--api-key`, SPEECHRT_API_KEYS, `--api-key-file`) answers a request
only when it carries one, as OpenAI's API takes it: `Authorization: Bearer KEY` on HTTP, the
realtime WebSocket's handshake and gRPC (metadata "authorization"). A browser cannot set a
WebSocket's headers; it offers the key as a subprotocol, `openai-insecure-api-key.KEY`, as
OpenAI's realtime API takes it (a `?api_key=` query would be written to the server's log with
the path). The health routes and `/` (OPEN_PATHS) and Triton's ServerLive/ServerReady stay open.

A token is compared with every key by hmac.compare_digest, all of them whatever matched, so the
time taken says nothing of which key came close. Keys are never logged nor echoed.

With a rate limit of N per second, each key has a token bucket of N tokens (at least one) that
refills at N per second; a request, a WebSocket session or a gRPC call takes one token, and one
that finds none is refused (HTTP 429 with Retry-After, gRPC RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from speechrt.errors import SpeechRTError
from speechrt.serving.http_errors import error_body

OPEN_PATHS = frozenset({"/", "/health", "/v2/health/live", "/v2/health/ready"})
SUBPROTOCOL = "openai-insecure-api-key."  # a browser's WebSocket key, as OpenAI's realtime API


def check_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """Keys as given -> the distinct keys, each printable ASCII without spaces (what an HTTP
    header and gRPC metadata carry as they are); a bad one is a SpeechRTError that does not
    show it."""
    out: list[str] = []
    for i, key in enumerate(keys):
        if not key or not all(33 <= ord(c) <= 126 for c in key):
            raise SpeechRTError(
                f"API key {i + 1} is empty or holds spaces or characters outside printable ASCII"
            )
        if key not in out:
            out.append(key)
    return tuple(out)


class Denied(NamedTuple):
    """Why a request is refused: HTTP status (401 or 429), message, seconds to wait (429)."""

    status: int
    message: str
    retry_after: float | None = None


class TokenBucket:
    """`rate` tokens per second, holding at most max(1, rate)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.capacity, self.clock = rate, max(1.0, rate), clock
        self.tokens, self.last = self.capacity, clock()

    def take(self) -> float:
        """Take a token: 0.0, or else the seconds until one is there (nothing taken)."""
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Access:
    """The keys a server accepts and, with a rate limit, each key's bucket."""

    def __init__(
        self,
        keys: Sequence[str],
        rate: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not keys:
            raise SpeechRTError("no API key given")
        if rate is not None and not rate > 0:
            raise SpeechRTError(f"the rate limit must be positive, got {rate}")
        self.keys = [k.encode("ascii") for k in check_keys(keys)]
        self.buckets = [TokenBucket(rate, clock) for _ in self.keys] if rate else None

    def key_of(self, token: str) -> int | None:
        """The index of the key `token` is, else None; every key is compared."""
        given = token.encode("utf-8", "replace")
        found = None
        for i, key in enumerate(self.keys):
            if hmac.compare_digest(given, key) and found is None:
                found = i
        return found

    def check(self, tokens: Iterable[str]) -> Denied | None:
        """None when one of the tokens offered is a key and its bucket has a token; else why
        not (a 401, or a 429 with the seconds to wait)."""
        found = None
        for token in tokens:
            found = self.key_of(token) if found is None else found
        if found is None:
            return Denied(401, "a valid API key is required (Authorization: Bearer KEY)")
        wait = self.buckets[found].take() if self.buckets is not None else 0.0
        if wait > 0:
            return Denied(429, "rate limit exceeded for this API key; retry later", wait)
        return None


def bearer(value: str | None) -> list[str]:
    """An Authorization header's bearer token (as a list: none, or one)."""
    scheme, _, token = (value or "").strip().partition(" ")
    return [token.strip()] if scheme.lower() == "bearer" and token.strip() else []


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


class RequireKey:
    """ASGI middleware: HTTP requests and WebSocket handshakes outside OPEN_PATHS need a key.

    A refused handshake gets the same JSON answer as HTTP where the server can send one (the
    ASGI websocket.http.response extension, which uvicorn has), else it is closed (HTTP 403)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        tokens = bearer(headers.get(b"authorization", b"").decode("latin-1"))
        if scope["type"] == "websocket":
            offered = scope.get("subprotocols") or []
            tokens += [p[len(SUBPROTOCOL) :] for p in offered if p.startswith(SUBPROTOCOL)]
        denied = self.access.check(tokens)
        if denied is None:
            await self.app(scope, receive, send)
            return
        code = "invalid_api_key" if denied.status == 401 else "rate_limit_exceeded"
        body = error_body(scope["path"], denied.status, denied.message, code, None)
        extra = {"WWW-Authenticate": "Bearer"} if denied.status == 401 else {}
        if denied.retry_after is not None:
            extra["Retry-After"] = retry_after(denied.retry_after)
        if scope["type"] == "websocket" and "websocket.http.response" not in scope.get(
            "extensions", {}
        ):
            await send({"type": "websocket.close", "code": 1008})
            return
        await JSONResponse(body, status_code=denied.status, headers=extra)(scope, receive, send)
