"""Speech for text that arrives as it is written (an LLM's tokens): the mechanism shared by the
text-streaming WebSocket (speechrt.serving.speech_socket), Wyoming's streaming synthesis
(speechrt.serving.wyoming_server) and Riva's SynthesizeOnline (speechrt.serving.grpc_riva_tts).

`SentenceBuffer` cuts the text into sentences with the text front end's own splitter
(speechrt.text.split_sentences), giving each one out as soon as it is complete: its terminator
is followed by whitespace ("Dr. " and "3.14" are not ends), or it ends at a newline, or a flush
ends it. A sentence still open past MAX_PIECE_CHARS gives out its clauses (cut at ", " / ": " or
a space, as the splitter cuts long sentences), so speech never waits for an endless sentence.

`SpeechStream` queues each complete sentence on the TTS engine at once, through
TTSService.stream (the same checks, limits and batcher as a streamed /v1/audio/speech), and
hands its audio to a `Sink` in sentence order, each sentence as soon as it and those before it
are ready. A sentence with nothing queued ahead of it is a lead (its first frames are vocoded
and sent on their own); one queued behind others batches as a request's sentences do.
`cancel()` drops everything queued at once (barge-in): the sentences' batch items are cancelled
unstarted and no audio of theirs reaches the sink after.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from speechrt.errors import SpeechRTError
from speechrt.front_end import MAX_PIECE_CHARS
from speechrt.options import SynthesisOptions
from speechrt.pieces import PAUSE_SECONDS
from speechrt.serving.metrics import failure_reason
from speechrt.serving.voices import Audio
from speechrt.text import split_sentences

if TYPE_CHECKING:
    from speechrt.serving.pipelines import TTSService

# A letter appended to the buffer when splitting it: the sentences before the one holding it
# are complete (a terminator at the very end may still be "3." of "3.14"; followed by a space
# and a letter, it is an end unless the splitter calls it an abbreviation)
_PROBE = "X"


class SentenceBuffer:
    """Text pushed in pieces of any size -> its sentences, each once it is complete."""

    def __init__(self, max_chars: int = MAX_PIECE_CHARS) -> None:
        self.max_chars = max_chars
        self.text = ""  # what is not given out yet (whitespace collapsed, as the splitter does)

    def push(self, text: str) -> list[str]:
        """Append `text`; the sentences (or clauses of a long one) it completes."""
        self.text += text
        if not self.text.strip():
            return []
        *done, rest = split_sentences(self.text + _PROBE, self.max_chars)
        # the last piece ends with the probe; what precedes it (trailing space included) stays
        self.text = rest[: -len(_PROBE)]
        return done

    def flush(self) -> list[str]:
        """Everything held, as sentences: the end of the text, or a flush."""
        text, self.text = self.text, ""
        return split_sentences(text, self.max_chars) if text.strip() else []

    def clear(self) -> None:
        self.text = ""


@dataclass
class Segment:
    """One sentence of a stream: its place, its text and the samples sent so far."""

    index: int  # 0, 1, ... over the stream's life (cancelled ones included)
    text: str
    samples: int = 0


class Sink(Protocol):
    """Where a SpeechStream's audio goes, in order: start, audio..., done (or failed)."""

    async def start(self, segment: Segment) -> None: ...

    async def audio(self, segment: Segment, audio: Audio) -> None:
        """audio: (N,) float32 at the voice's rate."""

    async def done(self, segment: Segment) -> None: ...

    async def failed(self, segment: Segment, error: Exception) -> None: ...


_END = object()  # a segment's queue: no more audio


class _Queued:
    """A sentence on the engine: a task drives its chunk iterator (TTSService.stream) into
    `out`, so that cancelling the task cancels its batch items whether or not its audio was
    asked for yet."""

    def __init__(self, segment: Segment, chunks: AsyncIterator[Audio]) -> None:
        self.segment = segment
        self.out: asyncio.Queue[object] = asyncio.Queue()
        self.error: Exception | None = None
        self.task = asyncio.create_task(self._pump(chunks))

    async def _pump(self, chunks: AsyncIterator[Audio]) -> None:
        try:
            async for audio in chunks:
                self.out.put_nowait(audio)
            self.out.put_nowait(_END)
        except Exception as e:  # the sender reports it in order
            self.error = e
            self.out.put_nowait(e)


class SpeechStream:
    """Sentences in (push/flush), their audio out to `sink` in order, each as soon as it is ready.

    Every sentence is its own TTSService.stream request, recorded as one tts request (via
    `record`). What a stream holds unsent (its buffer and the text of the sentences not yet
    fully sent) is bounded by the server's max_text_chars: text past it is refused with a
    SpeechRTError, so one stream takes what one request may. Calls (push, flush, finish,
    cancel, close) are made one at a time.
    """

    def __init__(
        self,
        tts: TTSService,
        options: SynthesisOptions,
        seed: int,
        sink: Sink,
        record: Callable[[float, str | None], None] | None = None,
    ) -> None:
        self.tts, self.options, self.seed, self.sink = tts, options, seed, sink
        self.record = record
        self.buffer = SentenceBuffer()
        self.queued: list[_Queued] = []  # in sentence order; the first is being sent
        self.count = 0  # segments so far
        self.pause = False  # whether the next sentence follows one (PAUSE_SECONDS before it)
        self.more = asyncio.Event()  # a sentence was queued
        self.drained = asyncio.Event()  # the last queued sentence was sent
        self.sender = asyncio.create_task(self._send())

    @property
    def held_chars(self) -> int:
        return len(self.buffer.text) + sum(len(q.segment.text) for q in self.queued)

    @property
    def idle(self) -> bool:
        """Nothing queued nor being sent."""
        return not self.queued

    async def push(self, text: str) -> None:
        """Text as it is written; complete sentences are queued at once."""
        if not isinstance(text, str):
            raise SpeechRTError(f"text must be a string, got {type(text).__name__}")
        limit = self.tts.limits.max_text_chars
        if self.held_chars + len(text) > limit:
            raise SpeechRTError(
                f"the stream would hold {self.held_chars + len(text)} characters not yet spoken; "
                f"the limit is {limit} (wait for its audio, or cancel)"
            )
        for sentence in self.buffer.push(text):
            await self._queue(sentence)

    async def flush(self) -> None:
        """End the current sentence: queue whatever is held."""
        for sentence in self.buffer.flush():
            await self._queue(sentence)

    async def _queue(self, sentence: str) -> None:
        if not self.tts.tts.text.has_speech(sentence):
            return  # "**", "---": nothing to say, not an error in a stream of tokens
        t0 = time.perf_counter()
        # only a sentence that nothing is ahead of needs its first audio at once: one queued
        # behind others batches as a request's sentences do (not with the leads of other
        # streams, nor delaying this stream's own lead by riding in its batch)
        lead = not self.queued
        try:
            chunks = await self.tts.stream(sentence, self.options, self.seed, lead)
        except Exception as e:
            self._record(t0, e)
            raise
        queued = _Queued(Segment(self.count, sentence), chunks)
        self.count += 1

        def done(task: asyncio.Task[None]) -> None:
            self._record(t0, asyncio.CancelledError() if task.cancelled() else queued.error)

        queued.task.add_done_callback(done)
        self.queued.append(queued)
        self.more.set()

    def _record(self, t0: float, error: BaseException | None) -> None:
        if self.record is not None:
            self.record(time.perf_counter() - t0, None if error is None else failure_reason(error))

    async def _send(self) -> None:
        """The sender: each queued sentence's audio to the sink, in order."""
        while True:
            while not self.queued:
                self.more.clear()
                await self.more.wait()
            await self._send_one(self.queued[0])
            self.pause = True
            self.queued.pop(0)
            if not self.queued:
                self.drained.set()

    async def _send_one(self, q: _Queued) -> None:
        await self.sink.start(q.segment)
        first = True
        while (item := await q.out.get()) is not _END:
            if isinstance(item, Exception):
                await self.sink.failed(q.segment, item)
                return
            assert isinstance(item, np.ndarray)
            if first and self.pause:  # the pause between sentences goes with real audio only
                gap = np.zeros(round(PAUSE_SECONDS * self.tts.sampling_rate), np.float32)
                item = np.concatenate((gap, item))
            first = False
            q.segment.samples += item.size
            await self.sink.audio(q.segment, item)
        await self.sink.done(q.segment)

    async def finish(self) -> None:
        """Flush, then wait until every queued sentence's audio went to the sink. An error of
        the sink's own (a closed connection) is raised; a cancel() meanwhile ends the wait."""
        await self.flush()
        sender = self.sender
        while self.queued and not sender.done():
            self.drained.clear()
            waiter = asyncio.ensure_future(self.drained.wait())
            try:
                await asyncio.wait([waiter, sender], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if sender.done() and not sender.cancelled():
            sender.result()

    async def cancel(self) -> list[Segment]:
        """Drop the buffer and every queued sentence at once; the dropped segments (the one
        being sent included). No audio of theirs reaches the sink after this returns."""
        self.buffer.clear()
        dropped = [q.segment for q in self.queued]
        await self._stop_sender()
        for q in self.queued:
            q.task.cancel()
        await asyncio.gather(*(q.task for q in self.queued), return_exceptions=True)
        self.queued.clear()
        self.pause = False  # what follows starts a new utterance
        self.sender = asyncio.create_task(self._send())
        return dropped

    async def close(self) -> None:
        """Cancel everything and stop (the client went away, or the stream ended)."""
        await self.cancel()
        await self._stop_sender()

    async def _stop_sender(self) -> None:
        self.sender.cancel()
        await asyncio.wait([self.sender])  # (the caller's own cancellation still goes through)
        if not self.sender.cancelled():
            self.sender.exception()  # the sink's error, if any, was the caller's to see
