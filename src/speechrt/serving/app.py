"""The FastAPI application: routes, error bodies, request size limit, metrics, lifecycle.

Startup starts one engine per model; shutdown (uvicorn's graceful shutdown on SIGTERM: stop
accepting, finish in-flight requests) then drains the engines and stops the device thread.
A request whose client goes away is cancelled, and so are its queued batch items; a request
still running when the graceful shutdown's time is up is answered 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speechrt import __version__
from speechrt.serving import kserve, openai_api, openapi, realtime, speech_socket
from speechrt.serving.auth import Access, RequireKey
from speechrt.serving.http_errors import HANDLERS, PayloadTooLarge, error_body
from speechrt.serving.server import Server

log = logging.getLogger("speechrt.serving")


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


class CancelOnDisconnect:
    """Cancel a request's handler when its client goes away; answer 503 when the server cancels it.

    Once the app has read the whole request body, a watcher waits on the ASGI receive channel
    for http.disconnect. If it comes before the response is complete, the handler's task is
    cancelled, which cancels the futures of its queued batch items (engine.wait_all), so they are
    dropped unstarted. The app's own later receive() calls get the disconnect from the watcher.
    Any other cancellation of a request is the server's (uvicorn's graceful shutdown timing out):
    it gets a JSON 503 with Retry-After where no response has started yet.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.Event()
        started = complete = False
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not complete:
                task.cancel("the client disconnected")

        async def app_receive() -> Message:
            nonlocal watcher
            if watcher is not None:  # the body has been read: only a disconnect can come
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.create_task(watch())
            return message

        async def app_send(message: Message) -> None:
            nonlocal started, complete
            started = started or message["type"] == "http.response.start"
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        try:
            await self.app(scope, app_receive, app_send)
        except asyncio.CancelledError:
            if sys.version_info >= (3, 11):
                task.uncancel()  # handled here: the request ends now, nobody else waits on it
            if gone.is_set():
                return  # nobody to answer
            log.warning("%s %s cancelled by the server's shutdown", scope["method"], scope["path"])
            if not started:
                await _shutting_down(scope, send)
        finally:
            if watcher is not None:
                watcher.cancel()


async def _shutting_down(scope: Scope, send: Send) -> None:
    message = "the server is shutting down; retry later"
    body = error_body(scope["path"], 503, message, "shutting_down", None)
    response = JSONResponse(body, status_code=503, headers={"Retry-After": "1"})

    async def no_receive() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_receive, send)


class Listener(Protocol):
    """Another protocol's server in the same event loop (speechrt.serving.wyoming_server)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def create_app(server: Server, listeners: Sequence[Listener] = ()) -> FastAPI:
    """The ASGI app serving `server`'s models (started and drained by the app's lifespan);
    `listeners` start once the models are ready and stop before they are drained."""

    config = server.config
    access = Access(config.api_keys, config.rate_limit) if config.api_keys else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await server.start()
        rpc = None
        started: list[Listener] = []
        try:
            if config.grpc_address is not None:  # Riva and Triton gRPC, in this event loop
                from speechrt.serving.grpc_app import start_grpc

                rpc, _ = await start_grpc(server, config.grpc_address, access)
            for listener in listeners:
                await listener.start()
                started.append(listener)
            yield
        finally:
            for listener in started:
                await listener.stop()
            if rpc is not None:  # its calls finish as HTTP requests do, within their timeout
                await rpc.stop(config.limits.request_timeout_s)
            await server.stop()

    app = FastAPI(
        title="speechrt",
        version=__version__,
        lifespan=lifespan,
        exception_handlers=dict(HANDLERS),
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.server = server
    app.include_router(openai_api.router)
    app.include_router(kserve.router)
    app.include_router(realtime.router)
    app.include_router(speech_socket.router)
    openapi.install(app, server)
    # Multipart uploads carry some framing around the file itself.
    app.add_middleware(BodyLimit, limit=server.config.limits.max_upload_bytes + 64 * 1024)
    app.add_middleware(CancelOnDisconnect)  # sees the client's own receive channel
    if access is not None:  # outermost: a request without a key costs nothing more
        app.add_middleware(RequireKey, access=access)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    page = (files("speechrt.serving") / "web" / "index.html").read_text("utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        """The web page (docs/web-page.md): open without a key; its API calls send the key."""
        return HTMLResponse(page)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        ok = server.ready
        body = {"status": "ok" if ok else "unavailable", "models": list(server.v2)}
        return JSONResponse(body, status_code=200 if ok else 503)

    return app
