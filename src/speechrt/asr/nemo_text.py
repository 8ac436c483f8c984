"""Words and their times from a Parakeet's tokens, by NeMo's rules (nemo_toolkit 3.0).

A converted .nemo transcribes as NeMo does, timestamps included, so its token and word
offsets (in encoder frames of 80 ms) follow NeMo's conventions, odd ones too:
    CTC    token i spans [frame of token i-1, its own first frame]; token 0 starts one frame
           before its own; a punctuation token (not the first) ends where it starts
    RNN-T  [frame, frame + 1]
    TDT    [frame, frame + duration]; a punctuation token (not the first) sits at the end of
           the token before it, with no length
A word starts at a piece that begins with "▁" unless the piece is punctuation; punctuation
joins the word before it (losing the space before it). The vocabulary's punctuation is every
Unicode punctuation character in its pieces, special pieces ("<unk>", "▁...") aside.
Imports no torch.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

SPACE = "\u2581"  # SentencePiece's word boundary


@dataclass(frozen=True)
class Offset:
    label: int
    start: int  # encoder frames
    end: int


def punctuation_of(pieces: Sequence[str]) -> frozenset[str]:
    """NeMo's extract_punctuation_from_vocab: punctuation characters of the ordinary pieces."""

    def special(p: str) -> bool:
        return (
            (p.startswith("[") and p.endswith("]"))
            or (p.startswith("<") and p.endswith(">"))
            or p.startswith(("##", SPACE))
            or not p.strip()
        )

    return frozenset(
        c for p in pieces if not special(p) for c in p if unicodedata.category(c).startswith("P")
    )


@dataclass(frozen=True)
class NemoText:
    """What forming words needs of a Parakeet: its pieces, how each reads, its punctuation."""

    pieces: tuple[str, ...]
    surfaces: tuple[str, ...]  # how each piece reads in text (model.json labels)
    punctuation: frozenset[str]

    @classmethod
    def of(cls, pieces: Sequence[str], surfaces: Sequence[str]) -> NemoText:
        return cls(tuple(pieces), tuple(surfaces), punctuation_of(pieces))

    def text_of(self, label: int) -> str:
        """A piece decoded alone: SentencePiece drops the space a "▁" piece starts with (the
        unknown piece keeps its " ⁇ ")."""
        text = self.surfaces[label]
        return text[1:] if self.pieces[label].startswith(SPACE) else text

    def starts_word(self, label: int) -> bool:
        """NeMo's word start: a piece that reads otherwise than it is written ("▁the",
        "<unk>")."""
        return self.pieces[label] != self.text_of(label)

    def starts_punctuated(self, label: int) -> bool:
        """Its text starts with punctuation (NeMo's rule for moving a token's time)."""
        text = self.text_of(label)
        return bool(text) and text[0] in self.punctuation

    def is_punctuation(self, label: int) -> bool:
        """Its text is one punctuation mark (NeMo's rule for joining the word before)."""
        return self.text_of(label) in self.punctuation

    def offsets(self, head: str, tokens: Sequence[tuple[int, int, int]]) -> list[Offset]:
        """tokens -> their offsets. head "ctc": (label, first, last frame of its run);
        "rnnt" / "tdt": (label, frame, frame + duration - 1), as speechrt decodes them."""
        out: list[Offset] = []
        for i, (label, first, last) in enumerate(tokens):
            if head == "ctc":
                start = tokens[i - 1][1] if i else max(0, first - 1)
                end = start if i and self.starts_punctuated(label) else first
            elif head == "rnnt":
                start, end = first, first + 1
            else:  # tdt
                start, end = first, last + 1
                if i and self.starts_punctuated(label):
                    start = end = out[-1].end
            out.append(Offset(label, start, end))
        return out

    def words(self, offsets: Sequence[Offset]) -> list[tuple[str, int, int]]:
        """(word, start, end frame offset) per word, as NeMo's get_words_offsets forms them: a
        word runs from the token that started it (even one dropped from its text, a bare "▁"
        before punctuation) to the token before the next word's."""
        words: list[tuple[str, int, int]] = []
        built: list[int] = []  # labels of the word being built
        first = 0  # index of the token that started it
        for i, o in enumerate(offsets):
            punct = self.is_punctuation(o.label)
            if self.starts_word(o.label) and not punct:
                if built:
                    words.append((self.join(built), offsets[first].start, offsets[i - 1].end))
                built = []
                if self.text_of(o.label) != " ":
                    built, first = [o.label], i
            elif punct and not built and words:
                text, start, _ = words[-1]
                words[-1] = (text.removesuffix(" ") + self.text_of(o.label), start, o.end)
            elif punct and built:  # joins the word being built, minus a bare "▁" before it
                if self.pieces[built[-1]] in (" ", "_", SPACE):
                    built.pop()
                built.append(o.label)
            else:
                if not built:
                    first = i
                built.append(o.label)
        if built:
            words.append((self.join(built), offsets[first].start, offsets[-1].end))
        if words:  # the first word starts with the first token
            words[0] = (words[0][0], offsets[0].start, words[0][2])
        return words

    def text(self, labels: Sequence[int]) -> str:
        """NeMo's transcript text: the pieces decoded together (SentencePiece: the unknown
        piece reads " ⁇ ", the first piece's "▁" is dropped), then the one space before each
        punctuation mark removed."""
        if not labels:
            return ""
        text = "".join(self.surfaces[k] for k in labels)
        if self.pieces[labels[0]].startswith(SPACE):
            text = text.removeprefix(" ")
        if self.punctuation:
            marks = "|".join(re.escape(p) for p in sorted(self.punctuation))
            text = re.sub(rf"\s({marks})", r"\1", text)
        return text

    def join(self, labels: Sequence[int]) -> str:
        """A word's pieces decoded together (as `text`, without the punctuation rule)."""
        text = "".join(self.surfaces[k] for k in labels)
        return text[1:] if labels and self.pieces[labels[0]].startswith(SPACE) else text
