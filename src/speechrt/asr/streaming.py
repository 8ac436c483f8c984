"""Streaming recognition for the convolutional CTC models (Jasper, QuartzNet): audio in chunks ->
partial text every chunk -> final text equal to offline transcription. (Parakeet streams in
windows with left and right context: speechrt.asr.chunked, whose `recognizer` picks the
streaming recogniser for a model.)

    samples -> StreamingFrontEnd (log-mel frames as soon as their STFT window is complete,
    running per-feature mean/std) -> windows of features -> the acoustic model -> log-probs
    -> committed frames (exact) + tentative frames (the newest, right context missing)
    -> greedy CTC -> partial text

Exact committed frames. Every output frame of these models depends on a finite span of input
frames: `receptive_field` input frames each side (every conv's (kernel // 2) * dilation, scaled
by the strides before it; QuartzNet 5x5: 1468 frames, 14.7 s). A frame is committed once a
window holds its whole span (or the span reaches the utterance's start or end, where offline
sees the same zero padding); its log-probs then equal what the model gives the same features
offline, to float rounding (tests: max |diff| < 1e-3 on the bundled model). Frames newer than
that are tentative: recomputed with more right context every chunk, so the text of the partials
stabilises from the left. Windows start `receptive_field` frames before the oldest uncommitted
frame, so memory and compute per chunk are bounded, whatever the length of the audio.

Features. Offline features are normalised with the mean and std of the whole utterance, which a
stream cannot know. The streaming path normalises with the running mean and std of the frames
seen so far, so committed frames are exact with respect to the features they were computed on,
not to offline ones. `finish` therefore transcribes the utterance's audio once more, offline
(`ASR.transcribe`: the same windows, normalisation and decoder), and that is the final text: it
equals offline transcription of the same audio by construction. Utterances longer than
`keep_seconds` are not kept; their final text is the streaming path's (greedy) text instead.

Partials always decode greedily; the final pass decodes as the recogniser was configured (beam
search with the word LM for the bundled model), so the last partial can differ from the final.
On the onnx backend nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from speechrt.asr.ctc import Word, host, tokens_to_words
from speechrt.asr.vad import TurnDetector
from speechrt.audio.stream_features import StreamingFrontEnd
from speechrt.errors import SpeechRTError

CHUNK_SECONDS = 0.5  # a partial per this much audio
COMMIT_SECONDS = 2.0  # a full (committing) window per this much audio ...
PARTIAL_SECONDS = 4.0  # ... and between them windows of this many seconds of the newest audio
PARTIAL_MARGIN = 100  # feature frames at the start of a partial window whose frames are not used
KEEP_SECONDS = 600.0  # audio kept for the final offline pass (at most 38 MB at 16 kHz)

Token = tuple[int, int, int]  # (label, first frame, last frame), absolute output frames


def receptive_field(dims: dict[str, Any]) -> int:
    """Input feature frames on each side of an output frame's centre that it depends on."""
    half, scale = 0, 1
    for k, s, dil, r in zip(
        dims["kernels"], dims["strides"], dims["dilations"], dims["repeats"], strict=True
    ):
        for _ in range(r):
            half += (k // 2) * dil * scale
            scale *= s
    return half


@dataclass(frozen=True)
class Window:
    """One run of the acoustic model: input frames [start, stop) of which `length` are valid;
    output frames [start // stride + i] for its i; commit the outputs [commit_from, commit_to),
    the rest after commit_to are tentative."""

    start: int
    stop: int
    length: int
    commit_from: int
    commit_to: int


def plan_window(
    committed: int, available: int, rf: int, stride: int, final: int | None = None
) -> Window:
    """The window that commits what the features [0, available) allow, given `committed`
    output frames already. final: the padded frame count at the end of the utterance (then
    `available` is the valid count and every output frame is committed)."""
    start = max(0, committed * stride - rf)
    start -= start % stride
    if final is not None:
        n_out = -(-final // stride)  # the model's ceil(T / stride) output frames
        return Window(start, final, available - start, committed, n_out)
    # output j needs input frames up to j * stride + rf
    last = (available - 1 - rf) // stride
    return Window(start, available, available - start, committed, max(committed, last + 1))


def committed_log_probs(
    run: Callable[[np.ndarray, int], np.ndarray],
    feats: np.ndarray,
    valid: int,
    rf: int,
    stride: int,
    step: int,
) -> np.ndarray:
    """The streaming path on fixed features: feats (F, T_padded) of which `valid` frames are
    speech, revealed `step` frames at a time; each window commits what it can and the last
    commits the rest. -> the committed log-probs of every output frame (T', V), which equal the
    offline log-probs of `feats` (the parity the tests check)."""
    out: list[np.ndarray] = []
    committed = 0
    for available in [*range(step, valid, step), None]:
        if available is None:
            w = plan_window(committed, valid, rf, stride, feats.shape[1])
        else:
            w = plan_window(committed, available, rf, stride)
        window = feats[:, w.start : w.stop].copy()
        window[:, w.length :] = 0.0  # nothing past the window's valid frames is known yet
        lp = run(window, w.length)  # (T', V)
        first = w.start // stride
        out.append(lp[w.commit_from - first : w.commit_to - first])
        committed = w.commit_to
    return np.concatenate(out)


@dataclass
class Partial:
    """What the stream has recognised so far."""

    text: str  # committed + tentative, greedy
    committed: str  # the text of the committed frames only: it never changes
    seconds: float  # audio received


@dataclass
class Final:
    text: str
    words: list[Word]
    seconds: float
    offline: bool  # the text is the offline pass's (else the streaming path's, greedy)


class StreamingRecognizer:
    """One utterance of streamed audio on an ASR (speechrt.asr.ASR).

    push(samples) -> Partial | None (one per `chunk` seconds of audio); finish() -> Final.
    `run` overrides how a window is computed (default: the ASR's runner on this thread).

    Every `commit_every` seconds of audio a full window (the receptive field on both sides of
    the frames it commits) commits frames and recomputes every tentative one. Between them, a
    partial window of the newest `partial_window` seconds refreshes the newest tentative frames
    only (all but its first PARTIAL_MARGIN frames, which lack left context): that is a quarter
    of a full window's compute for QuartzNet 5x5. partial_window None: every chunk a full
    window.
    """

    def __init__(
        self,
        asr: Any,
        chunk: float = CHUNK_SECONDS,
        keep_seconds: float = KEEP_SECONDS,
        run: Callable[[np.ndarray, int], np.ndarray] | None = None,
        commit_every: float = COMMIT_SECONDS,
        partial_window: float | None = PARTIAL_SECONDS,
    ) -> None:
        if chunk <= 0:
            raise SpeechRTError(f"chunk must be > 0 s, got {chunk}")
        hop = asr.features.hop_length
        self.partial_frames = None  # feature frames of a partial window
        if partial_window is not None:
            self.partial_frames = round(partial_window * asr.sample_rate / hop)
            if self.partial_frames <= 2 * PARTIAL_MARGIN:
                raise SpeechRTError(
                    f"partial_window must exceed {2 * PARTIAL_MARGIN} feature frames "
                    f"({2 * PARTIAL_MARGIN * hop / asr.sample_rate:g} s), got {partial_window} s"
                )
        self.asr = asr
        dims = asr.info.dims
        self.rf = receptive_field(dims)
        # output frames per input frame: every strided sub-block
        pairs = zip(dims["strides"], dims["repeats"], strict=True)
        self.stride = math.prod(int(s) ** int(r) for s, r in pairs)
        self.blank = len(asr.labels)
        self.front = StreamingFrontEnd(asr.features, asr.seed)
        self.pad = int(asr.pad_leading)  # zero frames before the first (Jasper: 16)
        self.chunk_samples = max(1, round(chunk * asr.sample_rate))
        self.keep_samples = round(keep_seconds * asr.sample_rate)
        self.kept: list[np.ndarray] | None = []  # the utterance's audio for the final pass
        self.since = 0  # samples since the last partial
        self.committed = 0  # output frames committed
        self.tokens: list[Token] = []  # committed tokens
        self.last_id = -1  # the last committed frame's argmax (repeats merge across steps)
        self.tentative: list[Token] = []
        self.ids: list[int] = []  # argmax of the tentative frames, from frame `committed` on
        self.run = run or self._run
        self.commit_samples = round(commit_every * asr.sample_rate)
        self.since_commit = 0
        # partials stay empty until the offline pass's voice activity detector hears speech
        self.detector = None if asr.vad is None else TurnDetector(asr.sample_rate, options=asr.vad)
        self.heard = self.detector is None

    @property
    def seconds(self) -> float:
        return self.front.samples / self.asr.sample_rate

    def push(self, audio: np.ndarray) -> Partial | None:
        """audio (N,) float32 at the model's rate -> a Partial when a chunk is complete."""
        audio = np.asarray(audio, dtype=np.float32)
        if self.kept is not None:
            if self.front.samples + audio.size > self.keep_samples:
                self.kept = None  # too long to keep: the streaming text is final
            else:
                self.kept.append(audio)
        self.front.push(audio)
        if self.detector is not None and self.detector.push(audio):
            self.heard, self.detector = True, None  # a start: no need to listen further
        self.since += audio.size
        self.since_commit += audio.size
        if self.since < self.chunk_samples or self.front.n_frames == 0:
            return None
        self.since = 0
        if self.partial_frames is None or self.since_commit >= self.commit_samples:
            self.since_commit = 0
            self._step(final=False)
        else:
            self._refresh()
        return self.partial()

    def partial(self) -> Partial:
        if not self.heard:  # silence or steady noise so far: no words
            return Partial("", "", self.seconds)
        text = self._text(self.tokens + self.tentative)
        return Partial(text, self._text(self.tokens), self.seconds)

    def finish(self, final_pass: bool = True) -> Final:
        """The end of the utterance: commit everything; the final text (offline pass when the
        audio was kept and final_pass, else the streaming path's)."""
        self.front.finish()
        self._step(final=True)
        if final_pass and self.kept is not None:
            audio = np.concatenate(self.kept)
            (t,) = self.asr.transcribe([audio])
            return Final(t.text, list(t.words), self.seconds, True)
        dec = self._decoded(self.tokens)
        return Final(dec.text, list(dec.words), self.seconds, False)

    def _step(self, final: bool) -> None:
        fe = self.front
        n_valid = fe.n_frames + self.pad
        padded = None
        if final:
            padded = self.asr.features.padded_frames(fe.samples) + self.pad
            n_valid = self.asr.features.valid_frames(fe.samples) + self.pad
        w = plan_window(self.committed, n_valid, self.rf, self.stride, padded)
        feats = self._window_features(w)  # (F, T)
        log_probs = self.run(feats, w.length)  # (T', V)
        first = w.start // self.stride  # the window's first output frame
        ids = log_probs.argmax(-1)
        done = ids[w.commit_from - first : w.commit_to - first].tolist()
        self.tokens, self.last_id = extend_tokens(
            self.tokens, self.last_id, done, w.commit_from, self.blank
        )
        self.ids = ids[w.commit_to - first :].tolist()
        self.tentative, _ = extend_tokens([], self.last_id, self.ids, w.commit_to, self.blank)
        self.committed = w.commit_to
        fe.drop(max(0, self.committed * self.stride - self.rf) - self.pad)

    def _refresh(self) -> None:
        """A partial window over the newest frames: new argmaxes for the tentative frames it
        has left context for; older tentative frames keep those of earlier windows."""
        assert self.partial_frames is not None
        n_valid = self.front.n_frames + self.pad
        start = max(0, n_valid - self.partial_frames)
        start -= start % self.stride
        full = plan_window(self.committed, n_valid, self.rf, self.stride)
        if start <= full.start:  # no smaller than a full window: take the full one
            self._step(final=False)
            return
        w = Window(start, n_valid, n_valid - start, self.committed, self.committed)
        ids = self.run(self._window_features(w), w.length).argmax(-1).tolist()  # (T',)
        first = start // self.stride  # the window's first output frame
        use = max(first + PARTIAL_MARGIN // self.stride, self.committed)
        self.ids = self.ids[: use - self.committed] + ids[use - first :]
        self.tentative, _ = extend_tokens([], self.last_id, self.ids, self.committed, self.blank)

    def _window_features(self, w: Window) -> np.ndarray:
        """Input frames [w.start, w.stop) in stream coordinates (pad_leading zeros first)."""
        fe, pad = self.front, self.pad
        out = np.zeros((self.asr.features.n_mels, w.stop - w.start), dtype=np.float32)
        lo, hi = max(w.start, pad), min(w.stop, fe.n_frames + pad)
        if hi > lo:
            out[:, lo - w.start : hi - w.start] = fe.features(lo - pad, hi - pad)
        return out

    def _run(self, feats: np.ndarray, length: int) -> np.ndarray:
        return window_log_probs(self.asr, feats, length)

    def _text(self, tokens: list[Token]) -> str:
        return self._decoded(tokens).text

    def _decoded(self, tokens: list[Token]) -> Any:
        offset = -self.pad * self.asr.features.frame_shift
        span = (0.0, self.seconds)
        return tokens_to_words(tokens, self.asr.labels, self.asr.frame_duration, offset, span)


def extend_tokens(
    tokens: list[Token], last_id: int, ids: list[int], first: int, blank: int
) -> tuple[list[Token], int]:
    """Tokens + the collapsed ids of frames first, first + 1, ... (a repeat of last_id across
    the boundary extends the last token instead of starting one)."""
    out = list(tokens)
    for f, i in enumerate(ids, start=first):
        if i == last_id:
            if i != blank and out:
                lab, f0, _ = out[-1]
                out[-1] = (lab, f0, f)
        elif i != blank:
            out.append((i, f, f))
        last_id = i
    return out, last_id


def window_log_probs(asr: Any, feats: np.ndarray, length: int) -> np.ndarray:
    """features (F, T) of which `length` frames are valid -> log-probs (T', V) float32 (numpy
    in and out; torch only on the eager and cuda backends)."""
    lengths = np.array([length], dtype=np.int64)
    x = feats[None]  # (1, F, T)
    if asr.numpy:
        out = asr.runner.run({"features": x, "feature_lengths": lengths})
        return host(out["log_probs"])[0]
    import torch

    with torch.inference_mode():
        inputs = {
            "features": torch.from_numpy(x).to(asr.device),
            "feature_lengths": torch.from_numpy(lengths).to(asr.device),
        }
        out = asr.runner.run(inputs)
        return host(out["log_probs"].float())[0]


__all__ = [
    "CHUNK_SECONDS",
    "Final",
    "committed_log_probs",
    "Partial",
    "StreamingRecognizer",
    "plan_window",
    "receptive_field",
    "extend_tokens",
    "window_log_probs",
]
