"""Streaming recognition for Parakeet (FastConformer; CTC, RNN-T or TDT head): chunked inference
with left and right context, as NeMo's buffered streaming inference does it.

    samples -> every `chunk` seconds, one window of the newest audio:
        [left context | frames not yet committed | right context (the lookahead)]
    -> features and encoder on the window alone (ASR.log_probs: the offline path on one item)
    -> committed frames: those with `right` seconds of audio after them, decoded from the
       carried decoding state and appended to the committed tokens
    -> lookahead frames: decoded from a copy of that state: the partial's tentative tail

Why windows and not exact frames (as speechrt.asr.streaming does for Jasper/QuartzNet): the
encoder's self-attention lets every output frame depend on every input frame, so no window short
of the whole utterance reproduces offline frames. Each window is featurised on its own audio
(NeMo's per-feature normalisation over the window), so it is exactly what offline recognition
of that audio computes. A frame is committed by the first window that holds `right` seconds of
audio after it and up to `left` seconds before the oldest frame not yet committed; committed
tokens are never revised, so the committed text only grows (at its end a word may still grow
by the next pieces: "hel" -> "hello").

Decoding carries across windows. Transducer: the greedy decoder's Cursor (speechrt.asr.
transducer: frame, prediction-network output and LSTM state, tokens on the last frame), so the
committed tokens continue one sequence, a TDT skip over a window's end included. CTC: the
argmax of the last committed frame, so a repeat across the boundary merges as in one pass.

`finish` recognises the last window. When that window holds the whole utterance, it decodes
all of it from the start (the committed tokens of earlier windows are set aside): exactly
offline recognition of the same audio. With `final_pass` and the audio kept (up to
`keep_seconds`), the final text is the offline transcription, as for the CTC models.

Compute per chunk: one encoder pass over at most left + chunk + right seconds (defaults 10 + 0.5
+ 2 s), whatever the length of the stream; the audio kept for windows is bounded likewise.

`recognizer(asr)` picks this or speechrt.asr.streaming.StreamingRecognizer for a model: the CLI
and the server stream through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from speechrt.asr.ctc import host
from speechrt.asr.decoding import Heard, Segment, Transcript
from speechrt.asr.streaming import (
    CHUNK_SECONDS,
    KEEP_SECONDS,
    Final,
    Partial,
    StreamingRecognizer,
    Token,
    extend_tokens,
)
from speechrt.asr.vad import TurnDetector
from speechrt.errors import SpeechRTError

# (first output frame of a window, its audio (N,)) -> its frames (T', C), valid frames
Encode = Callable[[int, np.ndarray], tuple[np.ndarray, int]]

LEFT_SECONDS = 10.0  # context before the oldest frame not yet committed (NeMo's default)
RIGHT_SECONDS = 2.0  # audio after a frame before it is committed: the lookahead


class ChunkedRecognizer:
    """One utterance of streamed audio on a Parakeet ASR (speechrt.asr.ASR).

    push(samples) -> Partial | None (one per `chunk` seconds of audio); finish() -> Final.
    The same interface as speechrt.asr.streaming.StreamingRecognizer. `left` and `right`:
    seconds of context (`left` at least one frame); `encode` overrides how a window is
    computed (default: the ASR's offline path on this thread)."""

    def __init__(
        self,
        asr: Any,
        chunk: float = CHUNK_SECONDS,
        keep_seconds: float = KEEP_SECONDS,
        left: float = LEFT_SECONDS,
        right: float = RIGHT_SECONDS,
        encode: Encode | None = None,
    ) -> None:
        if chunk <= 0:
            raise SpeechRTError(f"chunk must be > 0 s, got {chunk}")
        if left < 0 or right < 0:
            raise SpeechRTError(f"left and right context must be >= 0 s, got {left}, {right}")
        if asr.pad_leading:
            raise SpeechRTError("chunked streaming takes features without leading padding")
        from speechrt.asr.head import time_stride

        self.asr = asr
        sr = asr.sample_rate
        # samples per output frame (80 ms: 8 hops); windows start on a frame's first sample
        self.frame = asr.features.hop_length * time_stride(asr.info.dims)
        # frames; at least one, so that every window holds a frame's audio (> min_samples)
        self.left = max(1, math.ceil(left * sr / self.frame))
        self.right = round(right * sr)  # samples
        self.chunk_samples = max(1, round(chunk * sr))
        self.keep_samples = round(keep_seconds * sr)
        self.kept: list[np.ndarray] | None = []  # the utterance's audio for the final pass
        self.audio = np.zeros(0, dtype=np.float32)  # samples from `base` on
        self.base = 0  # absolute sample of audio[0]: a multiple of self.frame
        self.samples = 0  # samples pushed
        self.since = 0  # samples since the last partial
        self.committed = 0  # output frames committed
        self.tokens: list[Token] = []  # committed (label, first frame, last frame), absolute
        self.tentative: list[Token] = []  # from the lookahead frames of the last window
        self.transducer = bool(asr.transducer)
        self.blank = len(asr.labels)
        self.last_id = -1  # CTC: the argmax of the last committed frame
        self.steps: Any = None
        self.cursor: Any = None  # transducer: where decoding stands, frames from `committed`
        if self.transducer:
            from speechrt.asr.transducer import CudaSteps, make_steps

            # the host loop: its Cursor carries over (on cuda the device loop decodes offline)
            self.steps = asr.steps
            if isinstance(self.steps, CudaSteps):
                self.steps = make_steps(asr, asr.precision, device_loop=False)
            self.cursor = self._start()
        self.encode = encode or self._encode
        self.detector = None if asr.vad is None else TurnDetector(sr, options=asr.vad)
        self.heard = self.detector is None
        self.done = False

    @property
    def seconds(self) -> float:
        return self.samples / self.asr.sample_rate

    def push(self, audio: np.ndarray) -> Partial | None:
        """audio (N,) float32 at the model's rate -> a Partial when a chunk is complete."""
        if self.done:
            raise SpeechRTError("the stream is finished")
        audio = np.asarray(audio, dtype=np.float32)
        if self.kept is not None:
            if self.samples + audio.size > self.keep_samples:
                self.kept = None  # too long to keep: the streaming text is final
            else:
                self.kept.append(audio)
        self.audio = np.concatenate((self.audio, audio))
        self.samples += audio.size
        if self.detector is not None and self.detector.push(audio):
            self.heard, self.detector = True, None  # a start: no need to listen further
        self.since += audio.size
        if self.since < self.chunk_samples or self.samples < self.asr.features.min_samples:
            return None
        self.since = 0
        self._step(final=False)
        return self.partial()

    def partial(self) -> Partial:
        if not self.heard:  # silence or steady noise so far: no words
            return Partial("", "", self.seconds)
        text = self._decoded(self.tokens + self.tentative).text
        return Partial(text, self._decoded(self.tokens).text, self.seconds)

    def finish(self, final_pass: bool = True) -> Final:
        """The end of the utterance: the last window commits every frame; the final text (the
        offline pass when the audio was kept and final_pass, else the streaming path's)."""
        if self.samples < self.asr.features.min_samples:
            need = self.asr.features.min_samples / self.asr.sample_rate * 1000
            raise SpeechRTError(
                f"audio too short ({self.seconds * 1000:.1f} ms; need at least {need:.0f} ms)"
            )
        if not self.done:
            self._step(final=True)
            self.done = True
        if final_pass and self.kept is not None:
            (t,) = self.asr.transcribe([np.concatenate(self.kept)])
            return Final(t.text, list(t.words), self.seconds, True)
        dec = self._decoded(self.tokens)
        return Final(dec.text, list(dec.words), self.seconds, False)

    def _step(self, final: bool) -> None:
        """One window: commit what has its right context (everything when final), decode the
        rest as the tentative tail, drop the audio no later window needs."""
        start = max(0, self.committed - self.left)  # the window's first output frame
        audio = self.audio[start * self.frame - self.base :]
        head, n_out = self.encode(start, audio)  # (T', C): its frames, T' >= n_out valid
        if final:
            commit_to = start + n_out
        else:  # frame j ends at sample (j + 1) * frame; `right` samples must follow it
            ready = min((self.samples - self.right) // self.frame, start + n_out)
            commit_to = max(self.committed, ready)
        valid = head[:n_out]
        if final and start == 0:  # the window is the utterance: decode it as offline does
            self.committed, self.last_id, self.tokens = 0, -1, []
            if self.transducer:
                self.cursor = self._start()
        done = valid[self.committed - start : commit_to - start]
        rest = valid[commit_to - start :]
        if self.transducer:
            tokens, self.cursor = self._resume(done, self.cursor)
            self.tokens += [(lab, t + self.committed, e + self.committed) for lab, t, e in tokens]
            cursor = self.cursor.shifted(commit_to - self.committed)
            tail, _ = self._resume(rest, cursor)
            self.cursor = cursor
            self.tentative = [(lab, t + commit_to, e + commit_to) for lab, t, e in tail]
        else:
            ids = done.argmax(-1).tolist()
            self.tokens, self.last_id = extend_tokens(
                self.tokens, self.last_id, ids, self.committed, self.blank
            )
            self.tentative, _ = extend_tokens(
                [], self.last_id, rest.argmax(-1).tolist(), commit_to, self.blank
            )
        self.committed = commit_to
        keep_from = max(0, self.committed - self.left) * self.frame  # the next window's start
        if keep_from > self.base:
            self.audio = self.audio[keep_from - self.base :]
            self.base = keep_from

    def _encode(self, start: int, audio: np.ndarray) -> tuple[np.ndarray, int]:
        """The window's audio (N,), from output frame `start`'s first sample to the newest ->
        its frames (T', C) float32 (log-probs, or a transducer's joint-projected frames) and
        how many are valid, as offline recognition of that audio computes them."""
        seg = Segment(0, audio, 0.0, (-np.inf, np.inf), self.asr.seed)
        out, lengths = self.asr.log_probs([seg])
        return host(out)[0].astype(np.float32, copy=False), int(host(lengths)[0])

    def _start(self) -> Any:
        from speechrt.asr.transducer import start

        return start(1, self.steps.predict, self.steps.spec)

    def _resume(self, frames: np.ndarray, cursor: Any) -> tuple[list[Token], Any]:
        """Transducer frames (T, J) from `cursor` on -> (label, first, last frame) tokens,
        frames counted from frames[0] (a token spans the frames it skips, as Steps.decode
        times it), and the cursor after the last frame."""
        from speechrt.asr.transducer import resume

        steps = self.steps
        lengths = np.array([frames.shape[0]], dtype=np.int64)
        if frames.shape[0] == 0:
            return [], cursor
        (tokens,), cursor = resume(frames[None], lengths, steps.predict, steps.joint,
                                   steps.spec, cursor)  # fmt: skip
        return [(lab, t, t + d - 1) for lab, t, d in tokens], cursor

    def _decoded(self, tokens: list[Token]) -> Transcript:
        """Tokens -> text and words, as the recogniser's decoder makes them for one window
        holding the audio so far."""
        n = self.samples
        seg = Segment(0, np.zeros(0, np.float32), 0.0, (-np.inf, np.inf), samples=n)
        seg.tokens = tokens
        return self.asr.decoding.finish(Heard(self.seconds, [seg]))


def recognizer(
    asr: Any, chunk: float = CHUNK_SECONDS, keep_seconds: float = KEEP_SECONDS
) -> StreamingRecognizer | ChunkedRecognizer:
    """The streaming recogniser for an ASR's model (what the CLI and the server stream with):
    ChunkedRecognizer for Parakeet (self-attention has no finite receptive field), the exact
    committed frames of speechrt.asr.streaming.StreamingRecognizer for the convolutional CTC
    models."""
    if "subsampling_layers" in asr.info.dims:  # a FastConformer
        return ChunkedRecognizer(asr, chunk=chunk, keep_seconds=keep_seconds)
    return StreamingRecognizer(asr, chunk=chunk, keep_seconds=keep_seconds)


__all__ = ["ChunkedRecognizer", "LEFT_SECONDS", "RIGHT_SECONDS", "recognizer"]
