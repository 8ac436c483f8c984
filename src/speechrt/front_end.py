"""The text front end: texts -> sentence pieces of symbol ids, within a request's symbol budget.

split_sentences -> encode (numbers spelled out, SSML expanded) -> pieces of at most
piece_symbols(pace) ids, each with its own seed. Loads no model and imports no torch: the
server's speech routes and the Ray split pipeline's ingress (speechrt.serving.ray_tts) run it
with the voice's TextProcessor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from speechrt.errors import SpeechRTError
from speechrt.pieces import PAUSE_SECONDS, Piece, Span, piece_seed, piece_words

if TYPE_CHECKING:
    from speechrt.text import TextProcessor

MAX_PIECE_CHARS = 300  # long input is split at sentence boundaries into pieces of at most this
# ... and a piece whose normalised form is longer ("12345" reads as 40 symbols) is cut at spaces
# into pieces of at most this many symbol ids: about 30 s of speech, what the model reads at once
# (the bundled voice: 4.8-6.2 frames per symbol, 2,000-2,500 frames); read slower than pace 1,
# a piece holds proportionally fewer (piece_symbols), so that it stays about 30 s long
MAX_PIECE_SYMBOLS = 400


def piece_symbols(pace: float) -> int:
    """The most symbol ids a piece read at `pace` holds: MAX_PIECE_SYMBOLS at pace 1 or faster,
    proportionally fewer when slower (its frames grow as 1 / pace)."""
    return max(1, int(MAX_PIECE_SYMBOLS * min(1.0, pace)))


def text_to_pieces(
    text: TextProcessor,
    texts: Sequence[str],
    seeds: Sequence[int],
    words: bool = False,
    max_symbols: int | None = None,
    pace: float = 1.0,
) -> list[Piece]:
    """Split each text into sentence pieces and encode them to symbol ids: every piece has
    at most piece_symbols(its pace) ids, however much normalisation lengthened its text (its
    pace: `pace`, the request's, times its SSML prosody rate).
    A text starting with "<speak" or "<?xml" is SSML (speechrt.text.ssml): its segments are
    split alike, and carry their prosody and breaks. `words`: each piece also gets its words'
    spans (Piece.words). `max_symbols`: a SpeechRTError as soon as the texts together read as
    more symbols (SSML expansion and encoding stop there: the work is bounded by the limit,
    not by what the text would expand to). Loads no model: a front end apart from the models
    (speechrt.serving.ray_tts) calls it with the voice's TextProcessor."""
    from speechrt.text import ssml

    budget = _Budget(max_symbols, len(texts))
    pieces = []
    for item, (t, seed) in enumerate(zip(texts, seeds, strict=True)):
        if not isinstance(t, str) or not t.strip():
            raise SpeechRTError(f"text {item + 1} is empty")
        plain = ssml.Script((ssml.Segment(t),))
        script = ssml.parse(t, max_symbols) if ssml.is_ssml(t) else plain
        mine: list[Piece] = []
        for seg in script.segments:
            first = len(mine)
            for ids, span in encode_text(text, seg.text, words, budget, pace * seg.rate):
                mine.append(Piece(item, len(mine), ids, piece_seed(seed, len(mine)), span))
                mine[-1].rate, mine[-1].pitch = seg.rate, seg.pitch
            if len(mine) > first and (seg.before or not seg.sentence):
                # a break's silence, and no sentence pause inside a sentence cut by markup
                pause = PAUSE_SECONDS if seg.sentence and first else 0.0
                mine[first].before = pause + seg.before
        if not mine:
            raise SpeechRTError(f"text {item + 1} has nothing to speak: {t[:40]!r}")
        mine[-1].after = script.after
        pieces += mine
    return pieces


class _Budget:
    """Symbols a request may still read (text_to_pieces' max_symbols; None: no limit)."""

    def __init__(self, limit: int | None, n_texts: int) -> None:
        self.limit, self.n_texts, self.used, self.slow = limit, n_texts, 0.0, False

    def spend(self, n: int, pace: float = 1.0) -> None:
        """n symbols read at `pace`: slower than 1, each decodes 1 / pace times the frames and
        counts as much."""
        self.used += n / min(1.0, pace)
        self.slow = self.slow or pace < 1.0
        if self.limit is not None and self.used > self.limit:
            what = "input text" if self.n_texts == 1 else f"the {self.n_texts} texts"
            slow = ", slow speech counted 1 / pace" if self.slow else ""
            raise SpeechRTError(
                f"{what} read as more than {self.limit} symbols after normalisation (numbers "
                f"spelled out, SSML expanded{slow}); the limit is {self.limit} per request"
            )


def encode_text(
    text: TextProcessor, s: str, words: bool, budget: _Budget | None = None, pace: float = 1.0
) -> list[tuple[list[int], list[Span] | None]]:
    """s read at `pace` -> its sentence pieces' (ids, at most piece_symbols(pace) each; word
    spans if `words`), sentence by sentence, each sentence's symbols spent from `budget`."""
    from speechrt.text import split_sentences

    parts = [p for p in split_sentences(s, MAX_PIECE_CHARS) if text.has_speech(p)]
    encoded: list[list[int]] = []
    spans: list[list[Span]] = []
    for p in parts:
        cut = text.encode_pieces(p, piece_symbols(pace))
        if budget is not None:
            budget.spend(sum(map(len, cut)), pace)
        encoded += cut
        if words:
            spans += piece_words(text.text_to_ids(p), cut, text.word_spans(p))
    return [(ids, spans[j] if words else None) for j, ids in enumerate(encoded)]
