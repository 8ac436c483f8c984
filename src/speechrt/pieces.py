"""Sentence pieces: the units a text becomes before the models, and how their audio joins.

A text is split into sentence pieces (speechrt.tts.TTS.text_to_pieces), each one batch item
with its own seed; a piece may carry SSML prosody and breaks (speechrt.text.ssml). Their audio
is joined with the silences the pieces carry (join_pieces), and word captions are timed over
the joined audio (word_times).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions

PAUSE_SECONDS = 0.2  # silence inserted between the pieces of one text

Span = tuple[str, int, int]  # (word, start, end): ids[start:end] speak the word


@dataclass
class Piece:
    """One sentence-sized unit of work: item `item` of the request, piece `index` within it."""

    item: int
    index: int
    ids: list[int]
    seed: int
    # (word, start, end): ids[start:end] speak the word (TextProcessor.word_spans); with words=True
    words: list[Span] | None = None
    # seconds of silence before the piece (None: PAUSE_SECONDS, none before a text's first
    # piece) and after it (SSML <break>s: speechrt.text.ssml)
    before: float | None = None
    after: float = 0.0
    rate: float = 1.0  # SSML <prosody>: multiplies the request's pace ...
    pitch: float = 0.0  # ... and adds to its pitch shift (Hz)

    def options(self, options: SynthesisOptions) -> SynthesisOptions:
        """The request's options as this piece is read (its SSML prosody applied)."""
        if self.rate == 1.0 and self.pitch == 0.0:
            return options
        return replace(
            options, pace=options.pace * self.rate, pitch_shift=options.pitch_shift + self.pitch
        )

    def silence(self, sampling_rate: int) -> tuple[np.ndarray, np.ndarray]:
        """(zeros before, zeros after) the piece's audio, float32."""
        before = self.before if self.before is not None else PAUSE_SECONDS * (self.index > 0)
        n, m = int(round(before * sampling_rate)), int(round(self.after * sampling_rate))
        return np.zeros(n, dtype=np.float32), np.zeros(m, dtype=np.float32)


def join_pieces(
    pieces: Sequence[Piece], audio: Sequence[np.ndarray], sampling_rate: int
) -> np.ndarray:
    """One text's pieces' audio (S_i,) in order, with the silences around them -> (S,). A lone
    piece without silences is its audio itself (no copy)."""
    parts = []
    for p, a in zip(pieces, audio, strict=True):
        before, after = p.silence(sampling_rate)
        parts += [before, a, after]
    if len(pieces) == 1 and len(parts[0]) == len(parts[2]) == 0:
        return parts[1]
    return np.concatenate(parts)


@dataclass
class TimedAudio:
    """A piece's audio (S,) float32 and the mel frames (L,) int64 spent on each of its symbols."""

    audio: np.ndarray
    frames: np.ndarray


def piece_words(ids: list[int], pieces: list[list[int]], spans: list[Span]) -> list[list[Span]]:
    """Each piece's share of `spans` (word spans over `ids`), its positions piece-relative.
    pieces: cut from ids in order (TextProcessor.encode_pieces: cut at spaces, which are
    dropped, and pieces without speech left out)."""
    out, at = [], 0
    for piece in pieces:
        while ids[at : at + len(piece)] != piece:  # skip cut spaces and dropped pieces
            at += 1
            if at >= len(ids):
                raise SpeechRTError("a piece's ids are not within its sentence's ids")
        end = at + len(piece)
        out.append(
            [(w, max(a, at) - at, min(b, end) - at) for w, a, b in spans if a < end and b > at]
        )
        at = end
    return out


def word_times(
    pieces: Sequence[Piece], timed: Sequence[TimedAudio], hop: int, sampling_rate: int
) -> list[dict[str, Any]]:
    """[{word, start, end}] in seconds over one text's audio: its pieces in order, with their
    silences (as join_pieces joins them); a word spans its symbols' frames."""
    out: list[dict[str, Any]] = []
    at = 0  # samples
    for p, t in zip(pieces, timed, strict=True):
        before, after = p.silence(sampling_rate)
        at += len(before)
        bounds = np.concatenate(([0], np.cumsum(t.frames))) * hop  # samples from the piece start
        for word, a, b in p.words or []:
            start, end = (
                (at + int(bounds[a])) / sampling_rate,
                (at + int(bounds[b])) / sampling_rate,
            )
            out.append({"word": word, "start": round(start, 3), "end": round(end, 3)})
        at += len(t.audio) + len(after)
    return out


def piece_seed(item_seed: int, index: int) -> int:
    # Pieces of one text draw independent noise; the same (seed, index) always gives the same draw.
    return (item_seed * 1_000_003 + index) % (2**63 - 1)
