"""Greedy CTC decoding: per-frame argmax, repeats collapsed, blanks dropped, words timed; and
the forced alignment that times the words of any other decoder's text (speechrt.asr.beam).

A label's time span is the run of frames on which it was the argmax (or, aligned, the run the best
path spends on it); a word spans from its first label's first frame to its last label's last
frame. Frame f covers
    [offset + f * frame_duration, offset + (f + 1) * frame_duration)  seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
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
    """One item's CTC result (greedy or beam search)."""

    text: str  # words joined by single spaces
    words: tuple[Word, ...]


def collapse(ids: Sequence[int] | np.ndarray, blank: int) -> list[tuple[int, int, int]]:
    """Frame-wise ids (T,) -> (label, first frame, last frame) per emitted label (repeats
    merged): runs found by numpy, so the cost follows the tokens, not the frames."""
    a = np.asarray(ids, dtype=np.int64)
    return collapse_rows(a[None], np.array([a.size]), blank)[0]


def tokens_to_words(
    tokens: Sequence[tuple[int, int, int]],
    labels: Sequence[str],
    frame_duration: float,
    offset: float = 0.0,
    clip: tuple[float, float] | None = None,
) -> Decoded:
    """Emitted (label, first, last) tokens -> text and words split at whitespace.

    A label is the text it reads as: one character ("a", " "), or a SentencePiece piece's
    surface (" Hello", ",", " ⁇ " for the unknown piece), whose spaces split words as a
    space label does. `clip` = (lo, hi) clamps word times into the audio (padding frames lie
    outside it).
    """
    words: list[Word] = []
    chars: list[str] = []
    first = last = 0

    def flush() -> None:
        start = offset + first * frame_duration
        end = offset + (last + 1) * frame_duration
        if clip is not None:
            start = min(max(start, clip[0]), clip[1])
            end = min(max(end, start), clip[1])
        words.append(Word("".join(chars), round(start, 4), round(end, 4)))
        chars.clear()

    for lab, f0, f1 in [*tokens, (-1, 0, 0)]:  # sentinel flushes the last word
        for ch in labels[lab] if lab >= 0 else " ":
            if ch.isspace():
                if chars:
                    flush()
                continue
            if not chars:
                first = f0
            chars.append(ch)
            last = f1
    return Decoded(" ".join(w.word for w in words), tuple(words))


def greedy_tokens(
    log_probs: torch.Tensor | np.ndarray, lengths: Any, blank: int
) -> list[list[tuple[int, int, int]]]:
    """log_probs: (B, T, V), lengths: (B,) frames to decode (torch or numpy) -> per item the
    (label, first, last frame) tokens of its argmax path (one copy to the host)."""
    return collapse_rows(host(log_probs.argmax(-1)), host(lengths), blank)


def collapse_rows(
    best: np.ndarray, lengths: np.ndarray, blank: int
) -> list[list[tuple[int, int, int]]]:
    """collapse() of each row's first lengths[i] ids, the runs found over the whole batch at
    once (at 128 x 125 frames about 7x faster than row by row). best (B, T), lengths (B,)."""
    B, T = best.shape
    n = np.clip(lengths.astype(np.int64).reshape(B), 0, T)
    # (B, T + 1): a run starts at t (t < n), or t == n closes the row's last run
    start = np.zeros((B, T + 1), dtype=bool)
    start[:, 0] = True
    np.not_equal(best[:, 1:], best[:, :-1], out=start[:, 1:T])
    t = np.arange(T + 1)
    start &= t[None, :] <= n[:, None]
    start[np.arange(B), n] = True
    flat = np.flatnonzero(start)  # row-major: each row's starts, then its end marker
    row, col = np.divmod(flat, T + 1)
    token = col < n[row]  # not an end marker; every token is followed by its row's next start
    first, last = col[token], flat[1:][token[:-1]] - row[token] * (T + 1) - 1
    row, label = row[token], best[row[token], first]
    keep = label != blank
    row, out = row[keep], list(zip(label[keep].tolist(), first[keep].tolist(),
                                   last[keep].tolist(), strict=True))  # fmt: skip
    ends = np.cumsum(np.bincount(row, minlength=B)).tolist()
    return [out[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def host(x: Any) -> np.ndarray:
    """A torch tensor (any device) or numpy array -> numpy array."""
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


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
        tokens_to_words(tokens, labels, frame_duration, offset)
        for tokens in greedy_tokens(log_probs, lengths, blank)
    ]


def align_tokens(
    log_probs: np.ndarray, text: str, labels: Sequence[str]
) -> list[tuple[int, int, int]]:
    """The most likely CTC path that spells `text` -> its (label, first, last frame) tokens.

    log_probs: (T, len(labels) + 1), blank last. Viterbi over the text's non-space characters in
    CTC's topology (a gap state between characters, required between equal ones), where a gap
    frame may be blank or space: so a path that greedy decoding would take is the best one
    whenever it spells `text`, and the words get greedy's times. A space token (frames of the
    first character after it) is put between words, as `tokens_to_words` expects.
    """
    blank = len(labels)
    index = {c: i for i, c in enumerate(labels)}
    words = text.split()
    chars = [index[c] for w in words for c in w]
    if not chars:
        return []
    lp = np.asarray(log_probs, dtype=np.float64)
    n_frames, n_states = lp.shape[0], 2 * len(chars) + 1
    if n_frames < len(chars):
        raise ValueError(f"{len(chars)} characters cannot be aligned to {n_frames} frames")
    gap = lp[:, blank]
    if " " in index:
        gap = np.maximum(gap, lp[:, index[" "]])
    emit = np.empty((n_frames, n_states))  # (T, S): even states gaps, odd states characters
    emit[:, 0::2] = gap[:, None]
    emit[:, 1::2] = lp[:, chars]
    # from state s - 2: only into a character that differs from the one before it
    skip = np.zeros(n_states, dtype=bool)
    skip[3::2] = np.asarray(chars[1:]) != np.asarray(chars[:-1])
    dp = np.full(n_states, -np.inf)
    dp[:2] = emit[0, :2]
    back = np.zeros((n_frames, n_states), dtype=np.int8)  # 0 stay, 1 from s - 1, 2 from s - 2
    moves = np.full((3, n_states), -np.inf)
    for t in range(1, n_frames):
        moves[0] = dp
        moves[1, 1:] = dp[:-1]
        moves[2, 2:] = np.where(skip[2:], dp[:-2], -np.inf)
        back[t] = moves.argmax(axis=0)
        dp = moves[back[t], np.arange(n_states)] + emit[t]
    s = n_states - 1 if dp[-1] >= dp[-2] else n_states - 2
    path = np.empty(n_frames, dtype=np.int64)
    for t in range(n_frames - 1, -1, -1):
        path[t] = s
        s -= int(back[t, s])
    tokens: list[tuple[int, int, int]] = []
    ends = set(np.cumsum([len(w) for w in words]).tolist())
    for k in range(len(chars)):
        frames = np.flatnonzero(path == 2 * k + 1)
        if k and k in ends:  # the first character of a word after the first
            tokens.append((index.get(" ", -1), int(frames[0]), int(frames[0])))
        tokens.append((chars[k], int(frames[0]), int(frames[-1])))
    return tokens


def surfaces(labels: Sequence[str]) -> list[str]:
    """The text each label adds to a beam's prefix: its surface without trailing spaces (the
    unknown piece reads " ⁇ "), a space label as it is, a control piece nothing."""
    return [label.rstrip(" ") or label[:1] for label in labels]


def align_pieces(
    log_probs: np.ndarray, text: str, labels: Sequence[str]
) -> list[tuple[int, int, int]]:
    """The most likely CTC path that spells `text` in word pieces -> its (label, first, last
    frame) tokens.

    log_probs: (T, len(labels) + 1), blank last. Viterbi over every segmentation of
    " " + text into the labels' surfaces (a piece's leading space may also fall on a space the
    text already has), in CTC's topology: a state per (piece, place in the text) and a gap state
    per place, which a frame of blank (or of a lone space label) keeps; equal pieces in a row
    need a gap between them. The leading space is optional, as the beam search drops it.
    """
    blank = len(labels)
    if not text.split():
        return []
    s = " " + " ".join(text.split())
    by_surface: dict[str, list[int]] = {}
    for i, surface in enumerate(surfaces(labels)):
        by_surface.setdefault(surface, []).append(i)
    longest = max(len(k) for k in by_surface)
    edges: list[tuple[int, int, int]] = []  # (start, end, label): the surface spells s[start:end]
    for a in range(len(s)):
        for b in range(a + 1, min(len(s), a + longest) + 1):
            piece = s[a:b]
            edges += [(a, b, lab) for lab in by_surface.get(piece, ())]
            if a and s[a - 1] == " " and piece[0] != " ":  # its space on the one before
                edges += [(a, b, lab) for lab in by_surface.get(" " + piece, ())]
    n_nodes, n_states = len(s) + 1, len(s) + 1 + len(edges)
    lp = np.asarray(log_probs, dtype=np.float64)
    n_frames = lp.shape[0]
    # sources of each state (itself first): gap j <- pieces ending at j; piece (a, b, lab) <-
    # gap a, pieces ending at a with another label, and gap 0 for a piece from 1 (no space)
    sources: list[list[int]] = [[q] for q in range(n_states)]
    sources[1].append(0)  # the leading space skipped: gap 0 -> gap 1
    ending: list[list[int]] = [[] for _ in range(n_nodes)]  # pieces by the place they end
    for k, (_, b, _) in enumerate(edges):
        ending[b].append(k)
    for k, (a, b, lab) in enumerate(edges):
        q = n_nodes + k
        sources[b].append(q)
        sources[q] += [a, 0] if a == 1 else [a]
        sources[q] += [n_nodes + k2 for k2 in ending[a] if edges[k2][2] != lab]
    width = max(map(len, sources))
    table = np.full((n_states, width), n_states)  # n_states: a state that is never reached
    for q, src in enumerate(sources):
        table[q, : len(src)] = src
    gap = lp[:, blank]
    if " " in labels:
        gap = np.maximum(gap, lp[:, labels.index(" ")])
    emit = np.empty((n_frames, n_states))
    emit[:, :n_nodes] = gap[:, None]
    emit[:, n_nodes:] = lp[:, [lab for _, _, lab in edges]]
    score = np.full(n_states + 1, -np.inf)
    starts = [0, 1] + [n_nodes + k for k, (a, _, _) in enumerate(edges) if a <= 1]
    score[starts] = emit[0, starts]
    back = np.zeros((n_frames, n_states), dtype=np.int64)
    rows = np.arange(n_states)
    for t in range(1, n_frames):
        cand = score[table]  # (n_states, width)
        best = cand.argmax(axis=1)
        back[t] = table[rows, best]
        score[:n_states] = cand[rows, best] + emit[t]
    ends = [n_nodes - 1] + [n_nodes + k for k, (_, b, _) in enumerate(edges) if b == len(s)]
    q = ends[int(np.argmax(score[ends]))]
    if not np.isfinite(score[q]):
        raise ValueError(f"{text!r} cannot be aligned to {n_frames} frames in these pieces")
    path = np.empty(n_frames, dtype=np.int64)
    for t in range(n_frames - 1, -1, -1):
        path[t] = q
        q = int(back[t, q])
    tokens: list[tuple[int, int, int]] = []
    for t, q in enumerate(path.tolist()):
        if q < n_nodes:
            continue
        if t and path[t - 1] == q:
            tokens[-1] = (tokens[-1][0], tokens[-1][1], t)
        else:
            tokens.append((edges[q - n_nodes][2], t, t))
    return tokens
