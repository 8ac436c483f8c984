"""Word and character error rates (jiwer when installed, else an exact edit-distance fallback).

Corpus rates are total edits / total reference units (not a mean of per-utterance rates). Both
sides are normalised first: lowercase, punctuation except apostrophes removed, spaces collapsed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})


QUOTE_MARK = re.compile(r"(?<!\w)'|'(?!\w)")  # an apostrophe not inside a word: a quotation mark


def normalize_transcript(text: str) -> str:
    """Lowercase; every punctuation or symbol character becomes a space, except the apostrophe
    inside a word ("don't", "o'clock"; a quoting 'it' and the plural possessive "boys'" lose it:
    no one can hear it)."""
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
    kept = (" " if ch != "'" and unicodedata.category(ch)[0] in "PSZC" else ch for ch in text)
    return re.sub(r"\s+", " ", QUOTE_MARK.sub(" ", "".join(kept))).strip()


@dataclass(frozen=True)
class ErrorCounts:
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0
    ref_len: int = 0  # reference words (WER) or characters (CER)

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """errors / ref_len; an empty reference gives 0 without errors and inf with some."""
        if self.ref_len == 0:
            return 0.0 if self.errors == 0 else float("inf")
        return self.errors / self.ref_len

    def __add__(self, other: ErrorCounts) -> ErrorCounts:
        return ErrorCounts(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.ref_len + other.ref_len,
        )


def edit_counts(ref: Sequence[str], hyp: Sequence[str]) -> ErrorCounts:
    """Levenshtein alignment of two token sequences -> (substitutions, deletions, insertions)."""
    # Each cell holds (edits, subs, dels, ins); ties prefer substitution, then deletion.
    prev = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i in range(1, len(ref) + 1):
        cur = [(i, 0, i, 0)]
        for j in range(1, len(hyp) + 1):
            if ref[i - 1] == hyp[j - 1]:
                cur.append(prev[j - 1])
                continue
            e, s, d, n = prev[j - 1]
            best = (e + 1, s + 1, d, n)
            e, s, d, n = prev[j]
            if e + 1 < best[0]:
                best = (e + 1, s, d + 1, n)
            e, s, d, n = cur[j - 1]
            if e + 1 < best[0]:
                best = (e + 1, s, d, n + 1)
            cur.append(best)
        prev = cur
    _, s, d, n = prev[-1]
    return ErrorCounts(s, d, n, len(ref))


def _jiwer() -> ModuleType | None:
    """The optional jiwer module (the `eval` extra), or None."""
    try:
        import jiwer
    except ImportError:
        return None
    return jiwer


def word_errors(ref: str, hyp: str, normalize: bool = True) -> ErrorCounts:
    """Word-level edits between a reference and a hypothesis transcript."""
    if normalize:
        ref, hyp = normalize_transcript(ref), normalize_transcript(hyp)
    r, h = ref.split(), hyp.split()
    jiwer = _jiwer()
    if jiwer is None or not r or not h:
        return edit_counts(r, h)
    o = jiwer.process_words(" ".join(r), " ".join(h))
    return ErrorCounts(o.substitutions, o.deletions, o.insertions, len(r))


def char_errors(ref: str, hyp: str, normalize: bool = True) -> ErrorCounts:
    """Character-level edits (spaces between words count as characters)."""
    if normalize:
        ref, hyp = normalize_transcript(ref), normalize_transcript(hyp)
    r, h = " ".join(ref.split()), " ".join(hyp.split())
    jiwer = _jiwer()
    if jiwer is None or not r or not h:
        return edit_counts(list(r), list(h))
    o = jiwer.process_characters(r, h)
    return ErrorCounts(o.substitutions, o.deletions, o.insertions, len(r))


def _corpus(
    fn: Callable[[str, str], ErrorCounts], refs: Sequence[str], hyps: Sequence[str]
) -> ErrorCounts:
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    total = ErrorCounts()
    for r, h in zip(refs, hyps, strict=True):
        total = total + fn(r, h)
    return total


def wer(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus word error rate: total word edits / total reference words."""
    return _corpus(word_errors, refs, hyps).rate


def cer(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus character error rate: total character edits / total reference characters."""
    return _corpus(char_errors, refs, hyps).rate
