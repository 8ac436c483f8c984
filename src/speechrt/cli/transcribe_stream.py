"""`speechrt transcribe --stream FILE... [--realtime] [--chunk-ms MS] [--url URL]`: each file fed
as a microphone would, `--chunk-ms` of audio at a time (paced in real time with --realtime, else
as fast as it is recognised), partial text shown as it comes, then the final text.

Partials go to stderr: rewritten in place on a terminal, one line each (`partial<TAB>seconds
<TAB>text`) otherwise. The final text goes to stdout (`FILE<TAB>text`, or JSON with --json).
Without --url the streaming recogniser runs here (speechrt.asr.streaming), and the final text is
the offline transcription of the file; with --url the file goes over the server's realtime
WebSocket.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    from speechrt.asr.decoding import DecoderOptions

REALTIME_RATE = 24000  # what goes over the WebSocket (OpenAI's pcm16 rate) ...
SESSION_RATES = (8000, 48000)  # ... for a file outside the rates a session takes (realtime.RATES)


class PartialLine:
    """Partial text on stderr: one line rewritten in place on a terminal, else a line each."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out if out is not None else sys.stderr  # the stream of the moment, not import's
        self.tty = self.out.isatty()
        self.shown = False

    def show(self, seconds: float | None, text: str) -> None:
        """seconds: of audio recognised so far, where known."""
        if self.tty:
            width = shutil.get_terminal_size((80, 24)).columns - 10
            tail = text if len(text) <= width else "…" + text[-width + 1 :]
            stamp = f"{seconds:6.1f}s " if seconds is not None else ""
            self.out.write(f"\r\x1b[2K\x1b[2m{stamp}\x1b[0m{tail}")
            self.shown = True
        else:
            stamp = f"{seconds:.2f}" if seconds is not None else ""
            self.out.write(f"partial\t{stamp}\t{text}\n")
        self.out.flush()

    def clear(self) -> None:
        if self.tty and self.shown:
            self.out.write("\r\x1b[2K")
            self.out.flush()
            self.shown = False


def chunks_of(audio: np.ndarray, size: int, rate: int, realtime: bool) -> Iterator[np.ndarray]:
    """(N,) -> pieces of `size` samples; with realtime, each when its audio would be over."""
    t0 = time.monotonic()
    for start in range(0, audio.shape[0], size):
        if realtime:
            time.sleep(max(0.0, t0 + start / rate - time.monotonic()))
        yield audio[start : start + size]


def run_stream(args: argparse.Namespace, decoding: DecoderOptions) -> int:
    if args.chunk_ms <= 0:
        raise SpeechRTError("--chunk-ms must be positive")
    line = PartialLine()
    failed = 0
    asr = None
    if args.url is None:
        from speechrt.asr import ASR

        asr = ASR(args.model, device=args.device, precision=args.precision,
                  backend=args.backend, **decoding)  # fmt: skip
    for path in args.files:
        try:
            if asr is not None:
                text, seconds = _local(asr, path, args, line)
            else:
                text, seconds = _remote(args.url, path, args, line)
        except SpeechRTError as e:
            line.clear()
            print(f"speechrt transcribe: error: {e}", file=sys.stderr)
            failed += 1
            continue
        line.clear()
        if args.json:
            print(json.dumps({"file": path, "text": text, "duration": round(seconds, 4)}))
        else:
            print(f"{path}\t{text}", flush=True)
    return 2 if failed else 0


def _local(asr: Any, path: str, args: argparse.Namespace, line: PartialLine) -> tuple[str, float]:
    from speechrt.asr.chunked import recognizer

    audio = asr.load_audio(path)
    rec = recognizer(asr)
    size = max(1, round(args.chunk_ms / 1000 * asr.sample_rate))
    for chunk in chunks_of(audio, size, asr.sample_rate, args.realtime):
        partial = rec.push(chunk)
        if partial is not None:
            line.show(partial.seconds, partial.text)
    final = rec.finish()
    return final.text, final.seconds


def _remote(url: str, path: str, args: argparse.Namespace, line: PartialLine) -> tuple[str, float]:
    from speechrt.audio.io import read_audio, resample
    from speechrt.client import Client

    audio, rate = read_audio(path)  # at its own rate: the server hears a narrowband file as such
    if not SESSION_RATES[0] <= rate <= SESSION_RATES[1]:
        audio, rate = resample(audio, rate, REALTIME_RATE), REALTIME_RATE
    size = max(1, round(args.chunk_ms / 1000 * rate))
    text = ""
    with Client(url) as client:
        chunks = chunks_of(audio, size, rate, False)  # the client paces them
        for event in client.transcribe_realtime(chunks, rate, realtime=args.realtime):
            if event.kind == "done":
                return event.text, audio.shape[0] / rate
            text += event.text
            line.show(None, text)
    raise SpeechRTError(f"{path}: the server ended the session without a transcript")
