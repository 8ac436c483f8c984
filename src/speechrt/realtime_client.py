"""Streaming transcription against a running `speechrt serve`, for `Client`:

- `sse_events`: POST /v1/audio/transcriptions with stream=true; the whole file goes up at once and
  the server-sent events come back as `TranscriptEvent`s.
- `realtime_events`: the realtime WebSocket (/v1/realtime?intent=transcription): audio goes up a
  chunk at a time, as from a microphone (optionally paced in real time), deltas come back while
  it is sent, and the completed transcript after the commit.

Both yield TranscriptEvent("delta", text) for each piece of new text and one
TranscriptEvent("done", text) with the final text; an `error` event from the server raises
ServerError. Needs the `serve` extra (httpx, websockets).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from speechrt.errors import ServerError, SpeechRTError

RECV_TIMEOUT_S = 120.0  # the longest wait for the server's next event


@dataclass(frozen=True)
class TranscriptEvent:
    kind: str  # "delta" | "done"
    text: str  # the new text (delta) or the whole transcript (done)


def sse_events(lines: Iterable[str]) -> Iterator[TranscriptEvent]:
    """The text lines of a stream=true response -> its events."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:].strip())
        kind = event.get("type")
        if kind == "transcript.text.delta":
            yield TranscriptEvent("delta", event["delta"])
        elif kind == "transcript.text.done":
            yield TranscriptEvent("done", event["text"])
            return
        elif kind == "error":
            raise ServerError(500, str(event.get("error")))


def realtime_events(
    url: str,
    chunks: Iterable[np.ndarray],
    sampling_rate: int,
    model: str = "asr",
    realtime: bool = False,
) -> Iterator[TranscriptEvent]:
    """chunks: float32 (N,) pieces at `sampling_rate` (8-48 kHz), sent as 16-bit PCM; realtime:
    each chunk is sent when its audio would have been spoken. Deltas arrive while it sends."""
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    from speechrt.audio.io import to_int16

    ws_url = url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    ws_url = f"{ws_url.rstrip('/')}/v1/realtime?intent=transcription&model={model}"
    try:
        conn = connect(ws_url, max_size=None, open_timeout=30).__enter__()
    except (OSError, WebSocketException) as e:
        raise SpeechRTError(f"cannot reach the server at {url} ({e})") from None
    failure: list[BaseException] = []

    def send_all() -> None:
        try:
            fmt = {"type": "audio/pcm", "rate": sampling_rate}
            audio_in: dict[str, Any] = {"format": fmt, "turn_detection": None}
            session = {"type": "transcription", "audio": {"input": audio_in}}
            conn.send(json.dumps({"type": "session.update", "session": session}))
            t0, sent = time.monotonic(), 0
            for chunk in chunks:
                if realtime:  # as a microphone would: this chunk's audio is over only now
                    time.sleep(max(0.0, t0 + sent / sampling_rate - time.monotonic()))
                data = base64.b64encode(to_int16(chunk).tobytes()).decode("ascii")
                conn.send(json.dumps({"type": "input_audio_buffer.append", "audio": data}))
                sent += chunk.shape[0]
            conn.send(json.dumps({"type": "input_audio_buffer.commit"}))
        except BaseException as e:  # reported by the receiving side
            failure.append(e)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    try:
        while True:
            try:
                event: dict[str, Any] = json.loads(conn.recv(timeout=RECV_TIMEOUT_S))
            except (TimeoutError, WebSocketException) as e:
                why = failure[0] if failure else e
                raise SpeechRTError(f"realtime session ended: {why}") from None
            kind = event.get("type")
            if kind == "conversation.item.input_audio_transcription.delta":
                yield TranscriptEvent("delta", event.get("delta") or "")
            elif kind == "conversation.item.input_audio_transcription.completed":
                yield TranscriptEvent("done", event["transcript"])
                return
            elif kind in ("error", "conversation.item.input_audio_transcription.failed"):
                raise ServerError(400, str(event["error"].get("message")))
    finally:
        conn.close()
        sender.join(timeout=5)
