"""Cut long input into pieces a model can read in one go (one utterance each).

Acoustic models are trained on single sentences (LJSpeech: < 11 s); Tacotron2 also stops after a
fixed number of decoder steps. So long text is cut at sentence ends first, and a sentence that is
still too long at a comma, colon or space. Runs in linear time (100 000 characters in well under a
second) and works on raw text: cleaning happens afterwards, piece by piece.

Cleaning can make a piece several times longer ("1234" -> "one thousand two hundred and thirty
four"), so `split_ids` bounds what the model reads: it cuts a piece's symbol ids at spaces.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from speechrt.errors import SpeechRTError

DEFAULT_MAX_CHARS = 300  # ~20 s of speech at LJSpeech's pace, within Tacotron2's 2000 decoder steps

# terminators (+ closing quotes/brackets) followed by whitespace or the end; or a newline. A run
# is matched from its first mark only and never given back (possessive): searched from every
# mark of a long run "....x", the plain form took quadratic time (2 s for 9,000 dots)
_BOUNDARY = re.compile(r"""(?<![.!?;…])[.!?;…]++["'”’)\]]*+(?=\s|$)|\n""")
# words that end in "." without ending a sentence ("Dr. Smith", "Jan. 5th"); single letters too
# ("J. R. R. Tolkien", "e.g.", "U.S.")
_NO_BREAK_TEXT = """mr mrs ms dr st jr sr prof rev gen lt sgt capt col maj hon esq sen gov mt ft
    no vs jan feb mar apr jun jul aug sep sept oct nov dec"""
_NO_BREAK_AFTER = frozenset(_NO_BREAK_TEXT.split())
_SPEECH_CHAR = re.compile(r"[^\W_]")  # a letter or digit
_SPAN = re.compile(r"\{[^{}]*\}")  # an ARPAbet span: never cut inside one
_SOFT_BREAKS = (", ", ": ", "; ", ") ")


def split_sentences(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Sentences of `text`, each at most `max_chars` long, whitespace collapsed, none empty.

    Cuts at ".", "!", "?", ";" (followed by a space) and at newlines, not after titles or
    initials ("Dr.", "J."). A piece with no letter or digit ("...", "?!") is joined to its
    neighbour. A sentence over `max_chars` is cut at the last ", " / ": " in its window (when
    that leaves at least a third of the window), else at the space nearest an even share of
    what is left (so 620 characters become three pieces of ~207, not 300 + 300 + 20), else
    (one word longer than `max_chars`) mid-word. `{ARPAbet}` spans are never cut. Joining the
    pieces with " " gives back the whitespace-collapsed text, except where a word had to be cut
    (or a run of punctuation found no room next to a sentence: it is dropped, having nothing
    to say).
    """
    if not isinstance(text, str):
        raise SpeechRTError(f"text must be a string, got {type(text).__name__}")
    if max_chars < 1:
        raise SpeechRTError(f"max_chars must be positive, got {max_chars}")
    sentences: list[str] = []
    pending = ""  # leading pieces with nothing to speak, waiting for a sentence
    start = 0
    for m in _BOUNDARY.finditer(text):
        if m.group(0) == "." and _is_abbreviation(text, m.start()):
            continue
        pending = _add(sentences, text[start : m.end()], pending)
        start = m.end()
    pending = _add(sentences, text[start:], pending)
    if pending:  # the whole input has nothing to speak: keep it, encode() will say so
        sentences.append(pending)
    out: list[str] = []
    for sentence in sentences:
        out.extend(_split_long(sentence, max_chars) if len(sentence) > max_chars else [sentence])
    return _merge_silent(out, max_chars) if len(out) > 1 else out


def _merge_silent(pieces: list[str], max_chars: int) -> list[str]:
    """Pieces with nothing to speak left by long cuts join the piece before them if it has
    room, and are dropped otherwise (unless nothing at all is speakable)."""
    if not any(_SPEECH_CHAR.search(p) for p in pieces):
        return pieces
    out: list[str] = []
    for piece in pieces:
        if _SPEECH_CHAR.search(piece):
            out.append(piece)
        elif out and len(out[-1]) + 1 + len(piece) <= max_chars:
            out[-1] += " " + piece
    return out


def _add(sentences: list[str], piece: str, pending: str) -> str:
    """Append `piece` (collapsed) to `sentences`; returns the text still pending."""
    piece = " ".join(piece.split())
    if not piece:
        return pending
    if not _SPEECH_CHAR.search(piece):
        if sentences:  # trailing punctuation belongs to the sentence before it
            sentences[-1] += " " + piece
            return pending
        return f"{pending} {piece}" if pending else piece
    sentences.append(f"{pending} {piece}" if pending else piece)
    return ""


def _is_abbreviation(text: str, dot: int) -> bool:
    """Is the word ending just before text[dot] == "." a title, a month or an initial?"""
    begin = dot
    while begin > 0 and dot - begin < 6 and text[begin - 1].isalpha():
        begin -= 1
    word = text[begin:dot]
    if not word or (begin > 0 and text[begin - 1].isalpha()):
        return False
    return len(word) == 1 or word.lower() in _NO_BREAK_AFTER


def _split_long(sentence: str, max_chars: int) -> list[str]:
    spans = [(m.start(), m.end()) for m in _SPAN.finditer(sentence)]
    span_starts = [s for s, _ in spans]
    pieces: list[str] = []
    start, n = 0, len(sentence)
    while n - start > max_chars:
        end = start + max_chars  # the piece is sentence[start:cut] with cut <= end
        cut = max(sentence.rfind(b, start, end + 1) for b in _SOFT_BREAKS)
        if cut >= start + max_chars // 3:
            cut += 1  # keep the comma with the left piece
        else:  # the space nearest an even share of what is left: no short tail piece
            rest = n - start
            target = start + -(-rest // -(-rest // max_chars))  # <= end
            spaces: tuple[int, ...] = (
                sentence.rfind(" ", start + 1, target + 1),
                sentence.find(" ", target, end + 1),
            )
            spaces = tuple(c for c in spaces if c > start)
            cut = min(spaces, key=lambda c: abs(c - target)) if spaces else end  # else: one word
        # move a cut that falls inside an {ARPAbet} span to the span's start (or its end)
        i = bisect.bisect_right(span_starts, cut - 1) - 1
        if i >= 0 and spans[i][0] < cut < spans[i][1]:
            cut = spans[i][0] if spans[i][0] > start else spans[i][1]
        pieces.append(sentence[start:cut].strip())
        start = cut
        while start < n and sentence[start] == " ":
            start += 1
    if start < n:
        pieces.append(sentence[start:])
    return [p for p in pieces if p]


def split_ids(ids: Sequence[int], max_len: int, space: int) -> list[list[int]]:
    """Symbol ids cut into pieces of at most `max_len`, at `space` ids (dropped at the cuts).

    A sequence over `max_len` is cut into as many pieces as it needs, each cut at the space
    nearest to an even share of what is left, so no piece is a short tail; a stretch with no
    space within `max_len` (one very long word) is cut inside. Empty pieces are dropped.
    """
    if max_len < 1:
        raise SpeechRTError(f"max_len must be positive, got {max_len}")
    spaces = [i for i, x in enumerate(ids) if x == space]
    pieces: list[list[int]] = []
    start, n = 0, len(ids)
    while n - start > max_len:
        rest = n - start
        target = start + -(-rest // -(-rest // max_len))  # ceil(rest / ceil(rest / max_len))
        lo = bisect.bisect_right(spaces, start)  # spaces within (start, start + max_len]
        hi = bisect.bisect_right(spaces, start + max_len)
        if lo == hi:
            pieces.append(list(ids[start : start + max_len]))
            start += max_len
            continue
        k = bisect.bisect_right(spaces, target, lo, hi)  # spaces[lo:k] <= target < spaces[k:hi]
        near = spaces[max(lo, k - 1) : min(hi, k + 1)]
        cut = min(near, key=lambda s: abs(s - target))
        pieces.append(list(ids[start:cut]))
        start = cut + 1
    pieces.append(list(ids[start:]))
    return [p for p in pieces if p]
