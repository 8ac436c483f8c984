"""Wyoming's framing (speechrt.serving.wyoming_server): events read within their limits.

An event is a JSON header line {type, data?, data_length?, payload_length?}, then
`data_length` bytes of JSON data (merged into the header's), then `payload_length` bytes of
payload. A frame that breaks this, or is over its limits, is a FrameError: the connection
answers with an error event and closes.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from wyoming.event import Event

from speechrt.serving.realtime import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from speechrt.limits import Limits

MAX_PAYLOAD_BYTES = MAX_MESSAGE_BYTES  # one event's binary payload (an audio chunk)


def max_data(limits: Limits) -> int:
    """The most bytes of an event's JSON data: a synthesize event with text at the character
    limit, every character JSON-escaped (12 bytes for a character outside the BMP)."""
    return 64 * 1024 + 12 * limits.max_text_chars


class FrameError(Exception):
    """A frame the connection cannot read: answered with an error event, then closed."""


async def read_event(reader: asyncio.StreamReader, max_data: int) -> Event | None:
    """The next event (None at the end of the stream), its data and payload within limits
    (FrameError otherwise): a JSON header line, then `data_length` bytes of JSON data merged
    into its data, then `payload_length` bytes of payload."""
    try:
        line = await reader.readline()
    except ValueError:  # the line is over the reader's limit
        raise FrameError(f"an event header is over {max_data} bytes") from None
    if not line:
        return None
    try:
        header = json.loads(line)
    except ValueError:
        raise FrameError("an event header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise FrameError("an event header is a JSON object with a string `type`")
    data = header.get("data") or {}
    sizes = [header.get("data_length") or 0, header.get("payload_length") or 0]
    limits = (max_data, MAX_PAYLOAD_BYTES)
    for name, n, limit in zip(("data_length", "payload_length"), sizes, limits, strict=True):
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= limit:
            raise FrameError(f"{name} must be an integer in [0, {limit}], got {str(n)[:20]}")
    if not isinstance(data, dict):
        raise FrameError("an event's data is a JSON object")
    if sizes[0]:
        try:
            more = json.loads(await reader.readexactly(sizes[0]))
        except ValueError:
            raise FrameError("an event's data is not JSON") from None
        if not isinstance(more, dict):
            raise FrameError("an event's data is a JSON object")
        data.update(more)
    payload = await reader.readexactly(sizes[1]) if sizes[1] else None
    return Event(type=header["type"], data=data, payload=payload)
