"""Greedy CTC decoding: per-frame argmax, repeats collapsed, blanks dropped, words timed.

A label's time span is the run of frames on which it was the argmax; a word spans from its first
label's first frame to its last label's last frame. Frame f covers
    [offset + f * frame_duration, offset + (f + 1) * frame_duration)  seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Word:
    word: str
    start: float  # seconds
    end: float  # seconds

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


@dataclass(frozen=True)
class Decoded:
    """One item's greedy CTC result."""

    text: str  # words joined by single spaces
    words: tuple[Word, ...]


def collapse(ids: Sequence[int], blank: int) -> list[tuple[int, int, int]]:
    """Frame-wise ids -> (label, first frame, last frame) per emitted label (repeats merged)."""
    out: list[tuple[int, int, int]] = []
    prev = None
    for f, i in enumerate(ids):
        if i == prev:
            if i != blank:
                lab, first, _ = out[-1]
                out[-1] = (lab, first, f)
            continue
        prev = i
        if i != blank:
            out.append((i, f, f))
    return out


def tokens_to_words(
    tokens: Sequence[tuple[int, int, int]],
    labels: Sequence[str],
    frame_duration: float,
    offset: float = 0.0,
    clip: tuple[float, float] | None = None,
) -> Decoded:
    """Emitted (label, first, last) tokens -> text and words split at the space label.

    `clip` = (lo, hi) clamps word times into the audio (padding frames lie outside it).
    """
    words: list[Word] = []
    chars: list[str] = []
    first = last = 0
    for lab, f0, f1 in [*tokens, (-1, 0, 0)]:  # sentinel flushes the last word
        ch = labels[lab] if lab >= 0 else " "
        if ch.isspace():
            if chars:
                start = offset + first * frame_duration
                end = offset + (last + 1) * frame_duration
                if clip is not None:
                    start = min(max(start, clip[0]), clip[1])
                    end = min(max(end, start), clip[1])
                words.append(Word("".join(chars), round(start, 4), round(end, 4)))
                chars = []
            continue
        if not chars:
            first = f0
        chars.append(ch)
        last = f1
    return Decoded(" ".join(w.word for w in words), tuple(words))


def greedy_ids(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """log_probs: (B, T, V), lengths: (B,) frames to decode -> per-item argmax ids."""
    best = log_probs.argmax(dim=-1).cpu()
    return [best[i, : int(n)].tolist() for i, n in enumerate(lengths.cpu().tolist())]


def greedy_decode(
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
    labels: Sequence[str],
    frame_duration: float,
    offset: float = 0.0,
) -> list[Decoded]:
    """log_probs: (B, T, len(labels) + 1) with the blank last; lengths: (B,) frames to decode."""
    blank = len(labels)
    if log_probs.shape[-1] != blank + 1:
        raise ValueError(f"{log_probs.shape[-1]} classes for {len(labels)} labels + blank")
    return [
        tokens_to_words(collapse(ids, blank), labels, frame_duration, offset)
        for ids in greedy_ids(log_probs, lengths)
    ]
