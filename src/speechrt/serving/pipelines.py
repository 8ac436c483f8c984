"""The TTS and ASR pipelines behind the batcher: adapters (device side) and services (HTTP side).

A TTS request is split into sentence pieces; every piece is one batch item, so pieces of many
requests share batches and a streaming request can send each sentence as soon as it is done.
Each piece carries its own seed, so its audio is the same whatever it is batched with.

A streaming request's first piece is its lead: it batches only with other streams' leads (so
it never waits for its siblings' compute), and its first mel frames are vocoded and sent on
their own while the rest of it is vocoded (TTS.ids_to_audio's on_head). The other pieces
batch as a whole request's do, so a stream costs what the whole request costs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from speechrt.asr.decoding import DecodePool, Heard, Segment, Transcript
from speechrt.errors import SpeechRTError
from speechrt.limits import Limits
from speechrt.options import SynthesisOptions
from speechrt.pieces import Piece, TimedAudio, join_pieces, word_times
from speechrt.serving.engine import DeadlineExceeded, Engine, Overloaded, wait_all
from speechrt.serving.voices import Audio, TextToPieces, Voice, loaded

if TYPE_CHECKING:
    from speechrt.asr import ASR

T = TypeVar("T")
TTSOut = Audio | TimedAudio  # a piece's audio (S,) float32; a timed piece's, with durations


# -- TTS -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TTSItem:
    piece: Piece  # one sentence: ids + its own seed
    options: SynthesisOptions
    timed: bool = False  # also the frames per symbol (TTS.ids_to_timed_audio): word captions
    # a stream's lead piece: hears its first audio (TTS.ids_to_audio's on_head), on the device
    # thread, before the rest is vocoded
    on_head: Callable[[Audio], None] | None = None


class TTSAdapter:
    """Batches sentence pieces that ask for the same options (seeds travel with the pieces)."""

    def __init__(self, tts: Voice) -> None:
        self.tts = tts
        self.loaded = loaded(tts)  # None: a stand-in, no timed items or two-step batches

    def run_batch(self, items: list[TTSItem]) -> list[Audio | TimedAudio]:
        pieces = [it.piece for it in items]
        if items[0].timed:  # (the key keeps timed, lead and other items apart)
            assert self.loaded is not None  # (TTSService asks for word times of these only)
            return list(self.loaded.ids_to_timed_audio(pieces, items[0].options))
        if items[0].on_head is not None:

            def heard(heads: list[Audio]) -> None:
                for it, head in zip(items, heads, strict=True):
                    assert it.on_head is not None
                    it.on_head(head)

            return list(self.tts.ids_to_audio(pieces, items[0].options, on_head=heard))
        return list(self.tts.ids_to_audio(pieces, items[0].options))

    def launch_batch(self, items: list[TTSItem]) -> Callable[[], list[Audio | TimedAudio]]:
        """run_batch in two steps (the engine's pipelining): plain items are started and their
        audio's copy to the host queued (TTS.ids_to_audio_later); timed and lead items, or a
        stand-in voice, run whole now."""
        if items[0].timed or items[0].on_head is not None or self.loaded is None:
            outputs = self.run_batch(items)
            return lambda: outputs
        later = self.loaded.ids_to_audio_later([it.piece for it in items], items[0].options)
        return lambda: list(later())

    def length(self, item: TTSItem) -> int:
        return len(item.piece.ids)

    def key(self, item: TTSItem) -> Hashable:
        # the seed is per piece, not per batch
        return replace(item.options, seed=0), item.timed, item.on_head is not None


def check_texts(texts: Sequence[str], limits: Limits) -> None:
    """Each text non-empty and within limits.max_text_chars, or SpeechRTError."""
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise SpeechRTError("input text is empty" if len(texts) == 1 else f"text {i} is empty")
        if len(text) > limits.max_text_chars:
            limit = limits.max_text_chars
            raise SpeechRTError(f"input text has {len(text)} characters; the limit is {limit}")


def check_pieces(pieces: Sequence[Piece], n_texts: int, limits: Limits, pace: float = 1.0) -> None:
    """What the model would read, within the request limits, or SpeechRTError. A symbol read
    slower than pace 1 (`pace`, the request's, times its piece's SSML rate) decodes 1 / pace
    times the frames, and counts as much."""
    what = "input text" if n_texts == 1 else f"the {n_texts} texts"
    if len(pieces) > limits.max_pieces:
        raise SpeechRTError(
            f"{what} split into {len(pieces)} sentence pieces; the limit is "
            f"{limits.max_pieces} per request"
        )
    symbols = sum(len(p.ids) for p in pieces)
    weighted = sum(len(p.ids) / min(1.0, pace * p.rate) for p in pieces)
    if weighted > limits.max_text_symbols:
        slow = f" ({weighted:.0f} counting slow speech 1 / pace)" if weighted > symbols else ""
        raise SpeechRTError(
            f"{what} read as {symbols} symbols after normalisation (numbers spelled out)"
            f"{slow}; the limit is {limits.max_text_symbols} per request"
        )


async def read_texts(
    text_to_pieces: TextToPieces,
    texts: Sequence[str],
    seeds: Sequence[int],
    limits: Limits,
    words: bool = False,
    pace: float = 1.0,
) -> list[Piece]:
    """Checked texts read at `pace` -> their sentence pieces within the limits, or
    SpeechRTError: what every speech route runs (this server's, and the Ray split pipeline's
    ingress). `text_to_pieces`: speechrt.front_end.text_to_pieces' signature less the
    TextProcessor; it stops as soon as the texts read as more than max_text_symbols (a symbol
    read slower than pace 1 counting 1 / pace), so a text that expands (digits, SSML) or is
    read slowly costs at most the limit to refuse."""
    check_texts(texts, limits)
    # The text front end is plain Python without torch: run it off the event loop.
    pieces = await asyncio.to_thread(
        text_to_pieces, list(texts), list(seeds), words, limits.max_text_symbols, pace
    )
    check_pieces(pieces, len(texts), limits, pace)
    return pieces


class SpeechFrontEnd:
    """Texts and a request's options -> checked sentence pieces, each with its own options:
    the checks and the text front end of every speech path (TTSService here, and the Ray split
    pipeline's ingress, speechrt.serving.ray_tts), so a limit or a fix lands once.
    `text_to_pieces`: as read_texts takes it; `denoiser_missing`: why the voice cannot denoise
    (speechrt.tts.TTS.denoiser_missing), or None when it can."""

    def __init__(
        self,
        text_to_pieces: TextToPieces,
        limits: Limits,
        denoiser_missing: str | None = None,
    ) -> None:
        self.text_to_pieces = text_to_pieces
        self.limits = limits
        self.denoiser_missing = denoiser_missing

    async def read(
        self,
        texts: Sequence[str],
        options: SynthesisOptions,
        seeds: Sequence[int],
        words: bool = False,
    ) -> tuple[list[Piece], list[SynthesisOptions]]:
        """The texts' pieces within the limits (read_texts) and each piece's options (the
        request's with the piece's SSML prosody; an out-of-range pace is a SpeechRTError), or
        SpeechRTError."""
        if options.denoise > 0 and self.denoiser_missing is not None:
            raise SpeechRTError(f"this server cannot denoise: {self.denoiser_missing}")
        pieces = await read_texts(
            self.text_to_pieces, texts, seeds, self.limits, words, pace=options.pace
        )
        return pieces, [p.options(options) for p in pieces]


class TTSService:
    """Text in, float32 audio out, through the `tts` engine."""

    def __init__(
        self, tts: Voice, engine: Engine[TTSItem, Audio | TimedAudio], limits: Limits
    ) -> None:
        self.tts = tts
        self.loaded = loaded(tts)  # None: a stand-in voice (no denoiser, no word times)
        self.engine = engine
        self.limits = limits
        missing = self.loaded.denoiser_missing if self.loaded is not None else None
        self.front_end = SpeechFrontEnd(tts.text_to_pieces, limits, missing)

    @property
    def sampling_rate(self) -> int:
        return int(self.tts.sampling_rate)

    async def submit(
        self, texts: Sequence[str], options: SynthesisOptions, seeds: Sequence[int]
    ) -> list[list[asyncio.Future[TTSOut]]]:
        """Validate and split the texts, queue every piece; per text, its pieces' futures (of
        their audio, Audio)."""
        return (await self._submit(texts, options, seeds))[1]

    async def _submit(
        self,
        texts: Sequence[str],
        options: SynthesisOptions,
        seeds: Sequence[int],
        words: bool = False,
        on_head: Callable[[Audio], None] | None = None,
    ) -> tuple[list[Piece], list[list[asyncio.Future[TTSOut]]]]:
        """submit(); `words`: the pieces carry their words and the futures give TimedAudio;
        `on_head`: the first piece is a stream's lead (TTSItem.on_head)."""
        pieces, piece_options = await self.front_end.read(texts, options, seeds, words)
        items = [
            TTSItem(p, o, words, on_head if k == 0 else None)
            for k, (p, o) in enumerate(zip(pieces, piece_options, strict=True))
        ]
        futures = self.engine.submit(items)
        per_text: list[list[asyncio.Future[TTSOut]]] = [[] for _ in texts]
        for p, f in zip(pieces, futures, strict=True):
            per_text[p.item].append(f)
        return pieces, per_text

    async def synthesize(
        self, texts: Sequence[str], options: SynthesisOptions, seeds: Sequence[int]
    ) -> list[Audio]:
        """One waveform per text (pieces joined by their silences, as TTS.synthesize does)."""
        pieces, per_text = await self._submit(texts, options, seeds)
        flat = [f for fs in per_text for f in fs]
        audio = _waves(await wait_all(flat, self.limits.request_timeout_s))
        out, k = [], 0
        for fs in per_text:
            out.append(
                join_pieces(pieces[k : k + len(fs)], audio[k : k + len(fs)], self.sampling_rate)
            )
            k += len(fs)
        return out

    async def synthesize_with_words(
        self, text: str, options: SynthesisOptions, seed: int
    ) -> tuple[Audio, list[dict[str, str | float]]]:
        """One waveform, as synthesize gives it, and its words' times (speechrt.tts.word_times)."""
        voice = self.loaded
        if voice is None or not voice.has_durations:
            kind = voice.acoustic_info.kind if voice is not None else type(self.tts).__name__
            raise SpeechRTError(
                "word times need an acoustic model that outputs durations (FastPitch); "
                f"{kind} does not"
            )
        pieces, (futures,) = await self._submit([text], options, [seed], words=True)
        outputs = await wait_all(futures, self.limits.request_timeout_s)
        timed = [t for t in outputs if isinstance(t, TimedAudio)]  # (every one: words=True)
        hop, sr = voice.mel.hop_length, self.sampling_rate
        audio = join_pieces(pieces, [t.audio for t in timed], sr)
        return audio, word_times(pieces, timed, hop, sr)

    async def stream(
        self, text: str, options: SynthesisOptions, seed: int, lead: bool = True
    ) -> AsyncIterator[Audio]:
        """Queue every sentence now (so a full queue fails before any byte is sent), then yield
        the first piece's first frames' audio as soon as they are vocoded, and each sentence's
        audio (the rest of it; preceded by the pause) as soon as it and those before it are
        done. The chunks concatenate to what synthesize() returns, within float rounding where
        the first piece was vocoded in two spans (TTS.ids_to_audio's on_head). `lead` False:
        the first piece is no lead (a text queued behind others, whose first audio is not
        needed early: speechrt.serving.text_stream), so all its pieces batch as a request's."""
        loop = asyncio.get_running_loop()
        head: asyncio.Future[Audio] = loop.create_future()

        def on_head(audio: Audio) -> None:  # on the device thread
            loop.call_soon_threadsafe(_settle_once, head, audio)

        hook = on_head if lead else None
        pieces, (futures,) = await self._submit([text], options, [seed], on_head=hook)
        return self._chunks(pieces, futures, head)

    async def _chunks(
        self,
        pieces: list[Piece],
        futures: list[asyncio.Future[TTSOut]],
        head: asyncio.Future[Audio],
    ) -> AsyncIterator[Audio]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout_s
        try:
            # the head, unless the whole first piece is there as soon (or fails first)
            first: list[asyncio.Future[Audio] | asyncio.Future[TTSOut]] = [head, futures[0]]
            await asyncio.wait(
                first,
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
            sent = 0
            before, _ = pieces[0].silence(self.sampling_rate)
            if head.done() and not futures[0].done():
                sent = len(head.result())
                yield np.concatenate((before, head.result()))
            for j, (p, f) in enumerate(zip(pieces, futures, strict=True)):
                (audio,) = _waves(await wait_all([f], max(0.0, deadline - loop.time())))
                before, after = p.silence(self.sampling_rate)
                if j == 0 and sent:
                    before, audio = before[:0], audio[sent:]
                yield np.concatenate((before, audio, after))
        finally:
            head.cancel()
            for f in futures:
                f.cancel()


def _waves(outputs: Sequence[TTSOut]) -> list[Audio]:
    """Pieces' outputs -> their waveforms (S,) float32."""
    return [o.audio if isinstance(o, TimedAudio) else o for o in outputs]


def _settle_once(future: asyncio.Future[Audio], value: Audio) -> None:
    if not future.done():  # a retried batch may report a head twice; a gone client, never
        future.set_result(value)


# -- ASR -----------------------------------------------------------------------------------------


class ASRAdapter:
    """Batches windows of recordings (speechrt.asr.decoding.Segment: one window is one item)
    through the acoustic model (`asr.hear_windows`: features, log-probs); their decoding
    (`asr.finish`, the beam search) runs off the device thread. A long recording is many
    items, so the requests behind it take turns with its windows (the engine's fair queue)."""

    def __init__(self, asr: ASR) -> None:
        self.asr = asr

    def run_batch(self, items: list[Segment]) -> list[Segment]:
        self.asr.hear_windows(items)
        return items

    def length(self, item: Segment) -> int:
        return item.samples

    def key(self, item: Segment) -> Hashable:
        return None


class ASRService:
    """Encoded audio or waveforms in, transcripts out, through the `asr` engine."""

    def __init__(
        self,
        asr: ASR,
        engine: Engine[Segment, Segment],
        limits: Limits,
        pool: DecodePool | None = None,
    ) -> None:
        self.asr = asr
        self.engine = engine
        self.limits = limits
        self.pool = pool  # None: decode in one thread
        # One thread, not one per item: the search holds Python's lock, so two threads decode
        # slower than one (386 against 283 ms for 8 items on 2 cores)
        self.decoder = ThreadPoolExecutor(1, thread_name_prefix="speechrt-decode")
        # Uploads are decoded and resampled on threads of their own, half the cores: never on
        # the event loop's default threads, which the text front end and the other routes
        # share (six uploads decoding there once kept a "Hi." waiting 266 s)
        threads = max(1, (os.cpu_count() or 2) // 2)
        self.uploads = ThreadPoolExecutor(threads, thread_name_prefix="speechrt-upload")
        self.pending_uploads = 0  # decoding or waiting for a thread

    @property
    def sampling_rate(self) -> int:
        return int(self.asr.sample_rate)

    def check_audio(self, audio: Audio, sampling_rate: int | None = None) -> Audio:
        """A (N,) float32 waveform at `sampling_rate` (default: the model's) -> at the model's
        rate as the model hears it (ASR.from_rate), within the limits, or SpeechRTError. The
        samples are checked once (as_waveform: one channel, finite), then the duration limit
        before any resampling, then the model's minimum length (ASR.check_length)."""
        from speechrt.audio.io import as_waveform

        audio = as_waveform(audio)
        sr = sampling_rate or self.sampling_rate
        if audio.shape[0] == 0:  # (before resampling, which needs samples)
            raise SpeechRTError("audio is empty")
        seconds = audio.shape[0] / sr
        if seconds > self.limits.max_audio_seconds:
            raise SpeechRTError(
                f"audio is {seconds:.1f} s long; the limit is {self.limits.max_audio_seconds:g} s"
            )
        return self.asr.check_length(self.asr.from_rate(audio, sr))

    async def decode(self, data: bytes) -> Audio:
        """An uploaded file (WAV, FLAC, OGG, ...) -> mono float32 at the model's rate.

        The duration limit and the samples decoding may cost (every channel's) are checked on
        the header first and again while decoding (see read_audio), so a small file claiming
        hours of audio costs nothing to refuse. Decoding runs on the upload threads; past
        `max_pending_uploads` a request is refused (Overloaded), and a decode stops at the
        request's deadline (DeadlineExceeded) or when its client goes away."""
        from speechrt.audio.io import DecodeStopped, read_audio

        if not data:
            raise SpeechRTError("the uploaded file is empty")
        limit, timeout = self.limits.max_audio_seconds, self.limits.request_timeout_s
        deadline = time.monotonic() + timeout
        gone = threading.Event()

        def stop() -> bool:
            return gone.is_set() or time.monotonic() > deadline

        def decode() -> Audio:
            audio, _ = read_audio(data, self.sampling_rate, limit, self.asr.band_filter, stop)
            return self.check_audio(audio)

        try:
            return await self._on_upload_thread(decode)
        except DecodeStopped:
            message = f"decoding the upload did not finish within {timeout:g} s"
            raise DeadlineExceeded(message) from None
        finally:
            gone.set()  # a request cancelled meanwhile: its decode stops at the next block

    async def prepare(self, audio: Audio, sampling_rate: int) -> Audio:
        """check_audio on the upload threads (a waveform sent at another rate is resampled)."""
        return await self._on_upload_thread(lambda: self.check_audio(audio, sampling_rate))

    async def _on_upload_thread(self, fn: Callable[[], T]) -> T:
        if self.pending_uploads >= self.limits.max_pending_uploads:
            raise Overloaded(f"asr: {self.pending_uploads} uploads are being decoded; retry later")
        self.pending_uploads += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.uploads, fn)
        finally:
            self.pending_uploads -= 1

    async def transcribe(self, audios: Sequence[Audio]) -> list[Transcript]:
        """Waveforms at the model's rate -> one Transcript each. Each is cut into its windows
        (voice activity detection, on the upload threads), and every window is a batch item
        of its own: 600 s of audio is ~37 windows, and a request behind it waits for one
        batch of them, not for all. The device thread runs the acoustic model only; each
        item's decoding (the beam search with the LM: ~1 % of real time on a core, tens of
        times the GPU's share) runs in the decoding thread, or in the decode pool's
        processes, meanwhile, so the device goes on with the next batch."""
        asr = self.asr

        def cut() -> list[list[Segment]]:  # item i's dither noise from the seed asr.hear gives
            return [asr.speech_segments(i, a, asr.seed + i) for i, a in enumerate(audios)]

        windows = await self._on_upload_thread(cut)
        await self.engine.infer([w for ws in windows for w in ws], self.limits.request_timeout_s)
        sr = self.sampling_rate
        heard = [Heard(a.shape[0] / sr, ws) for a, ws in zip(audios, windows, strict=True)]
        if self.pool is not None:  # in the pool's processes: the search scales over cores
            return await asyncio.gather(*(asyncio.wrap_future(self.pool.submit(h)) for h in heard))
        loop = asyncio.get_running_loop()
        return await asyncio.gather(
            *(loop.run_in_executor(self.decoder, asr.finish, h) for h in heard)
        )
