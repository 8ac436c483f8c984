"""One utterance of streaming recognition on the server, shared by the realtime WebSocket and
`stream=true` transcriptions: audio at any rate in, text deltas out, then the final text.

The streaming steps (speechrt.asr.streaming) run on the device thread between batches, a chunk
at a time; the final text is the offline transcription of the whole utterance through the
recogniser's batcher, so it equals what /v1/audio/transcriptions returns for the same samples.

Deltas are append-only, as OpenAI's are: every chunk, the words of the newest partial that are
followed by another word (the last may still be growing) and were not sent yet; a word already
sent is never taken back, so the deltas can differ from the final text where a partial changed
its mind. The last delta completes the final text when what was sent is a prefix of it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from speechrt.asr.chunked import recognizer
from speechrt.asr.decoding import Transcript
from speechrt.asr.streaming import CHUNK_SECONDS
from speechrt.audio.io import StreamResampler
from speechrt.serving.voices import Audio

if TYPE_CHECKING:
    from speechrt.serving.server import Server


class RecognitionStream:
    """Audio (float32 at `rate`) pushed in pieces of any size; deltas out per chunk."""

    def __init__(
        self, srv: Server, rate: int, chunk: float = CHUNK_SECONDS, partials: bool = True
    ) -> None:
        assert srv.asr is not None
        self.srv, self.rate = srv, rate
        self.partials = partials  # False: only the final text is wanted, no streaming steps
        self.asr = srv.asr.asr  # speechrt.asr.ASR
        sr = self.asr.sample_rate
        self.resampler = StreamResampler(rate, sr) if rate != sr else None
        self.band = self.asr.band_filter(rate)  # a narrowband stream: heard through its band
        # the server keeps the utterance itself (for the final pass at its own rate)
        self.recognizer = recognizer(self.asr, chunk=chunk, keep_seconds=0.0)
        self.chunk = self.recognizer.chunk_samples
        self.pending = np.zeros(0, dtype=np.float32)  # model-rate samples short of a chunk
        self.parts: list[Audio] = []  # the utterance at `rate`
        self.samples = 0
        self.sent = ""  # the deltas so far, joined
        self.words_sent = 0
        self.partial = ""  # the newest partial transcript, whole (Riva's interim results)
        self.transcript: Transcript | None = (
            None  # finish()'s: the utterance's Transcript (words and times)
        )

    @property
    def seconds(self) -> float:
        return self.samples / self.rate

    async def push(self, audio: Audio) -> list[str]:
        """audio (N,) float32 at `rate` -> the deltas of every chunk it completes."""
        self.parts.append(audio)
        self.samples += audio.size
        if not self.partials:
            return []
        x = self.resampler.push(audio) if self.resampler is not None else audio
        x = self.band.push(x) if self.band is not None else x
        self.pending = np.concatenate((self.pending, x))
        deltas = []
        while self.pending.size >= self.chunk:
            piece, self.pending = self.pending[: self.chunk], self.pending[self.chunk :]
            delta = await self._step(piece)
            if delta:
                deltas.append(delta)
        return deltas

    async def _step(self, piece: Audio) -> str:
        worker = self.srv.worker
        async with worker.turn():
            partial = await worker.run(functools.partial(self.recognizer.push, piece))
        if partial is None:
            return ""
        self.partial = partial.text
        words = partial.text.split()
        new = words[self.words_sent : len(words) - 1]
        if not new:
            return ""
        self.words_sent += len(new)
        delta = (" " if self.sent else "") + " ".join(new)
        self.sent += delta
        return delta

    def audio(self) -> Audio:
        """The utterance so far at `rate` (N,) float32."""
        return np.concatenate(self.parts) if self.parts else np.zeros(0, dtype=np.float32)

    async def finish(self) -> tuple[str, str]:
        """-> (the last delta, the final text): the offline transcription of the utterance."""
        assert self.srv.asr is not None
        audio = await self.srv.asr.prepare(self.audio(), self.rate)
        (result,) = await self.srv.asr.transcribe([audio])
        self.transcript = result
        text = str(result.text)
        last = ""
        if text.startswith(self.sent):
            last = text[len(self.sent) :]
        return last, text
