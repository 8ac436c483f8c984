"""The FastAPI application: routes, error bodies, request size limit, metrics, lifecycle.

Startup starts one engine per model; shutdown (uvicorn's graceful shutdown on SIGTERM: stop
accepting, finish in-flight requests) then drains the engines and stops the device thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speechrt import __version__
from speechrt.serving import kserve, openai_api, openapi
from speechrt.serving.errors import HANDLERS, PayloadTooLarge, error_body
from speechrt.serving.server import Server


class BodyLimit:
    """Refuse request bodies over `limit` bytes: at once from Content-Length, else mid-stream."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            e = PayloadTooLarge(self.limit)
            body = error_body(scope["path"], 413, e.message, e.code, None)
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise PayloadTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


def create_app(server: Server) -> FastAPI:
    """The ASGI app serving `server`'s models (started and drained by the app's lifespan)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    app = FastAPI(
        title="speechrt",
        version=__version__,
        lifespan=lifespan,
        exception_handlers=HANDLERS,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.server = server
    app.include_router(openai_api.router)
    app.include_router(kserve.router)
    openapi.install(app, server)
    # Multipart uploads carry some framing around the file itself.
    app.add_middleware(BodyLimit, limit=server.config.limits.max_upload_bytes + 64 * 1024)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/health")
    async def health(request: Request) -> Any:
        ok = server.ready
        body = {"status": "ok" if ok else "unavailable", "models": list(server.v2)}
        return JSONResponse(body, status_code=200 if ok else 503)

    return app
