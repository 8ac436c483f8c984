"""uvicorn's HTTP protocol with bounds on request heads: how long and how large they may be.

uvicorn closes idle keep-alive connections, but a connection that sends the head of a request
(request line and headers) a byte at a time is held for ever, and httptools parses a header block
of any size: 200 connections trickling headers stayed open, and a 228 KB header block was read.
Here a request's head must arrive within `header_timeout` seconds of its first byte (of the
connection, for its first request), and may hold at most MAX_HEAD_BYTES; otherwise the connection
is answered 408 or 431 and closed. Bodies are bounded elsewhere (speechrt.serving.app.BodyLimit).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("speechrt.serving")

MAX_HEAD_BYTES = 64 * 1024  # request line and headers (nginx reads at most 32 KB, Node 16 KB)
HEADER_TIMEOUT_S = 10.0


class GuardedHttpTools(HttpToolsProtocol):
    """HttpToolsProtocol whose request heads are bounded in time and size."""

    header_timeout = HEADER_TIMEOUT_S  # a subclass per server sets its own (guarded_protocol)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_bytes = 0
        self.reading_head = False  # between a request's first byte and its headers' end
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # parses: may end the head (on_headers_complete)
        if self.reading_head:  # all of `data` belongs to the head
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, "Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self.reading_head:  # the next request of a kept-alive connection
            self._start_head()

    def on_headers_complete(self) -> None:
        self._stop_head()
        super().on_headers_complete()

    def _start_head(self) -> None:
        self.reading_head, self.head_bytes = True, 0
        if self.head_timer is None:
            self.head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head(self) -> None:
        self.reading_head = False
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.reading_head:
            self._refuse(408, "Request Timeout")

    def _refuse(self, status: int, reason: str) -> None:
        self._stop_head()
        if self.transport.is_closing():
            return
        log.info("closing a connection: %d %s (%s)", status, reason, self.client)
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
        )
        self.transport.close()


def guarded_protocol(header_timeout: float) -> type[GuardedHttpTools]:
    """The protocol class for uvicorn.run(http=...): request heads within `header_timeout`
    seconds and MAX_HEAD_BYTES."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"header_timeout": header_timeout})
