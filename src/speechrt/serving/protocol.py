"""uvicorn's HTTP protocol with bounds on how long and how large a request's head may be, and
how long its body may take.

uvicorn closes idle keep-alive connections, but a connection that sends the head of a request
(request line and headers) a byte at a time is held for ever, and httptools parses a header block
of any size: 200 connections trickling headers stayed open, and a 228 KB header block was read.
A body trickled a byte at a time held its connection (and its request) for ever too.
Here a request's head must arrive within `header_timeout` seconds of its first byte (of the
connection, for its first request), and may hold at most MAX_HEAD_BYTES; its body must arrive
within `body_timeout` seconds of its head (not counting time the server itself stops reading:
a pipelined request, an app slow to take the body). Otherwise the connection is answered 408 or
431 (where no answer has started yet) and closed. Body sizes are bounded in the app
(speechrt.serving.app.BodyLimit).

Closing a socket with input still unread makes the kernel answer with a reset, which can reach
the client before the status line and discard it. So a refused connection closes only our side
at first, drops what the client still sends, and closes once the client does or LINGER_S later.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("speechrt.serving")

MAX_HEAD_BYTES = 64 * 1024  # request line and headers (nginx reads at most 32 KB, Node 16 KB)
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 120.0  # 25 MB (the upload limit) at 1.7 Mbit/s
LINGER_S = 2.0  # how long a refused connection's remaining input is read and dropped


class GuardedHttpTools(HttpToolsProtocol):
    """HttpToolsProtocol whose request heads are bounded in time and size, bodies in time."""

    header_timeout = HEADER_TIMEOUT_S  # a subclass per server sets its own (guarded_protocol)
    body_timeout = BODY_TIMEOUT_S
    # a connection's state, from these defaults (immutable: each connection assigns its own)
    head_bytes = 0
    reading_head = False  # between a request's first byte and its headers' end
    head_timer: asyncio.TimerHandle | None = None
    body_timer: asyncio.TimerHandle | None = None  # between a head and its body's end
    lingering = False  # refused: the rest of the input is dropped (_refuse)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head()
        self._stop_body()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
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
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not before:  # a request (not a WebSocket upgrade): its body follows
            self._start_body()

    def on_message_complete(self) -> None:
        self._stop_body()
        super().on_message_complete()

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

    def _start_body(self) -> None:
        self._stop_body()
        self.body_timer = self.loop.call_later(self.body_timeout, self._body_timed_out)

    def _stop_body(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def _body_timed_out(self) -> None:
        self.body_timer = None
        if self.cycle is None or not self.cycle.more_body:
            return
        if self.flow.read_paused:  # the server, not the client, holds the body back: wait on
            self._start_body()
        elif self.cycle.response_started:  # (answered before its body was read: 401, 413)
            log.info("closing a connection: its request body is late (%s)", self.client)
            self.transport.close()
        else:
            self._refuse(408, "Request Timeout")

    def _refuse(self, status: int, reason: str) -> None:
        self._stop_head()
        self._stop_body()
        if self.transport.is_closing():
            return
        log.info("closing a connection: %d %s (%s)", status, reason, self.client)
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode()
        )
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's request (if any) sees the client gone
            self.cycle.message_event.set()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.lingering = True  # until the client closes (eof_received) or LINGER_S pass
        self.transport.write_eof()
        self.transport.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)


def guarded_protocol(
    header_timeout: float, body_timeout: float = BODY_TIMEOUT_S
) -> type[GuardedHttpTools]:
    """The protocol class for uvicorn.run(http=...): request heads within `header_timeout`
    seconds and MAX_HEAD_BYTES, bodies within `body_timeout` seconds of their heads."""
    bounds = {"header_timeout": header_timeout, "body_timeout": body_timeout}
    return type("GuardedHttpTools", (GuardedHttpTools,), bounds)
