"""CTC decoding apart from the acoustic model: what a recogniser needs to turn its windows'
log-probs into timed words, and a pool of worker processes that does it.

The beam search with the word LM is Python and NumPy: about 1 % of real time on one core, which
on a GPU is many times the acoustic model's share. A server decodes off its device thread
(speechrt.serving.pipelines); with `--decode-workers N` it decodes in N processes, each holding
its own copy of the LM, so the search scales over the CPU's cores instead of sharing one
interpreter's lock. Imports no torch.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from speechrt.asr.beam import BeamOptions, beam_tokens
from speechrt.asr.ctc import Word, greedy_tokens, host, tokens_to_words
from speechrt.asr.lm import NGramLM
from speechrt.asr.nemo_text import NemoText

if TYPE_CHECKING:
    from speechrt.asr.vad import VadOptions


class DecoderOptions(TypedDict, total=False):
    """ASR's decoder keywords (see ASR), as the CLI and the server pass them on."""

    decoder: str
    lm: str | Path | None
    beam_size: int | None
    alpha: float | None
    beta: float | None
    vad: bool | VadOptions | None


@dataclass
class Segment:
    """A window of item `item`: audio[start : start + len(audio)] (seconds from `offset`)."""

    item: int
    audio: np.ndarray  # (N,) float32 at the model's sample rate; a view into the item's audio
    offset: float  # seconds from the start of the item
    keep: tuple[float, float]  # words (item time) whose centre falls in [lo, hi) are kept
    seed: int = 0  # dither noise of this window
    item_seconds: float = float("inf")  # the item's duration: words are clipped to [0, this)
    words: list[Word] = field(default_factory=list)
    seconds: float = 0.0  # compute time attributed to this window
    log_probs: np.ndarray | None = None  # (T', V) float32 on the host, its frames to decode
    # or, from a transducer, its (label, first frame, last frame) tokens, already decoded
    tokens: list[tuple[int, int, int]] | None = None
    text: str | None = None  # a converted .nemo's window: its text by NeMo's rules
    samples: int = -1  # len(audio), kept when the audio is dropped (Heard.without_audio)

    def __post_init__(self) -> None:
        if self.samples < 0:
            self.samples = int(self.audio.shape[0])


@dataclass
class Heard:
    """One item after the acoustic model (ASR.hear): its windows with their log-probs, in time
    order; Decoder.finish decodes them."""

    duration: float  # seconds of audio
    segments: list[Segment]

    def without_audio(self) -> Heard:
        """The same, minus the windows' audio (what a decoding process needs, and no more)."""
        empty = np.zeros(0, np.float32)
        return Heard(self.duration, [replace(s, audio=empty) for s in self.segments])


@dataclass
class Transcript:
    """One audio item's result."""

    text: str
    words: list[Word]
    duration: float  # seconds of audio
    rtf: float  # real-time factor: seconds of audio per second of compute (> 1 = faster)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "words": [w.to_dict() for w in self.words],
            "duration": round(self.duration, 4),
            "rtf": round(self.rtf, 3),
        }


@dataclass(frozen=True)
class Decoder:
    """What decoding needs of a recogniser: its labels, its LM and beam options (None: greedy),
    the seconds per output frame and the offset of frame 0. Picklable."""

    labels: tuple[str, ...]
    lm: NGramLM | None
    beam: BeamOptions | None
    frame_duration: float
    offset: float  # seconds of output frame 0 (negative: leading padding frames)
    sample_rate: int
    # a converted .nemo: words and times by NeMo's rules, for its head ("ctc", "rnnt", "tdt")
    nemo: NemoText | None = None
    head: str = "ctc"

    def tokens(self, log_probs: Any, lengths: Any) -> list[list[tuple[int, int, int]]]:
        """log_probs (B, T', V), frames (B,) -> per window (label, first, last frame) tokens."""
        if self.lm is None or self.beam is None:
            return greedy_tokens(log_probs, lengths, len(self.labels))
        lp = host(log_probs).astype(np.float32, copy=False)  # (B, T', V)
        return [
            beam_tokens(lp[i, : int(n)], list(self.labels), self.lm, self.beam)
            for i, n in enumerate(host(lengths).tolist())
        ]

    def decode(self, batch: Sequence[Segment], log_probs: Any, lengths: Any) -> None:
        """CTC decoding per window; keeps each window's own words (item time) in seg.words."""
        for seg, tokens in zip(batch, self.tokens(log_probs, lengths), strict=True):
            self.keep_words(seg, tokens)

    def keep_words(self, seg: Segment, tokens: Sequence[tuple[int, int, int]]) -> None:
        """A window's (label, first, last frame) tokens -> its own words (item time)."""
        # a VAD window's context may reach outside the item (zeros): no word lies there
        end = seg.offset + seg.samples / self.sample_rate
        span = (max(seg.offset, 0.0), min(end, seg.item_seconds))
        if self.nemo is not None:
            words = self.nemo_words(seg, tokens, span)
            seg.text = self.nemo.text([t[0] for t in tokens])
        else:
            words = list(
                tokens_to_words(
                    tokens, list(self.labels), self.frame_duration, self.offset + seg.offset, span
                ).words
            )
        lo, hi = seg.keep
        seg.words = [w for w in words if lo <= (w.start + w.end) / 2 < hi]

    def nemo_words(
        self, seg: Segment, tokens: Sequence[tuple[int, int, int]], span: tuple[float, float]
    ) -> list[Word]:
        """NeMo's words and times (speechrt.asr.nemo_text); clipped into the item only where
        voice activity detection cut it (NeMo's own times may pass the end of the audio)."""
        assert self.nemo is not None
        fd, zero = self.frame_duration, self.offset + seg.offset
        words = []
        for text, start, end in self.nemo.words(self.nemo.offsets(self.head, tokens)):
            t0, t1 = zero + start * fd, zero + end * fd
            if seg.item_seconds != float("inf"):
                t0 = min(max(t0, span[0]), span[1])
                t1 = min(max(t1, t0), span[1])
            words.append(Word(text, round(t0, 4), round(t1, 4)))
        return words

    def finish(self, heard: Heard, compute: float = 0.0) -> Transcript:
        """One item's windows decoded and joined into its Transcript; `compute`: seconds spent
        on it beside its windows' (the RTF counts both)."""
        import time

        t0 = time.perf_counter()
        for seg in heard.segments:
            if seg.tokens is not None:  # a transducer's, decoded with the model
                self.keep_words(seg, seg.tokens)
                continue
            assert seg.log_probs is not None, "finish takes what hear returned"
            self.decode([seg], seg.log_probs[None], np.array([seg.log_probs.shape[0]]))
            seg.log_probs = None  # decoded: the words are kept, the frames dropped
        words = [word for s in heard.segments for word in s.words]
        spent = sum(s.seconds for s in heard.segments) + time.perf_counter() - t0 + compute
        rtf = heard.duration / spent if spent > 0 else float("inf")
        text = " ".join(x.word for x in words)
        one = heard.segments[0] if len(heard.segments) == 1 else None
        if one is not None and one.text is not None:  # a .nemo's one window: NeMo's text
            text = one.text
        return Transcript(text, words, heard.duration, rtf)


_WORKER: Decoder | None = None  # the decoder of this worker process


def _start_worker(decoder: Decoder) -> None:
    global _WORKER
    _WORKER = decoder


def _ping() -> bool:
    import time

    time.sleep(0.05)  # held a moment, so that each of a pool's pings starts its own worker
    return _WORKER is not None


def _finish_in_worker(heard: Heard) -> Transcript:
    assert _WORKER is not None
    return _WORKER.finish(heard)


class DecodePool:
    """Decoder.finish in `workers` spawned processes, each given the decoder (its LM) once."""

    def __init__(self, decoder: Decoder, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"a decode pool needs >= 1 worker, got {workers}")
        # spawn: a fork of a process holding CUDA or a device thread is not safe
        self.executor = ProcessPoolExecutor(
            workers, multiprocessing.get_context("spawn"), _start_worker, (decoder,)
        )
        self.workers = workers

    def warm(self) -> None:
        """Start every worker (each loads the decoder) before the first item needs one."""
        for f in [self.executor.submit(_ping) for _ in range(self.workers)]:
            f.result()

    def submit(self, heard: Heard) -> Future[Transcript]:
        return self.executor.submit(_finish_in_worker, heard.without_audio())

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
