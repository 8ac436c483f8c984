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
        """A piece decoded alone (SentencePiece drops the space it starts with)."""
        return self.surfaces[label].lstrip(" ")

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
        """(word, start, end frame offset) per word, as NeMo's get_words_offsets forms them."""
        words: list[tuple[str, int, int]] = []
        built: list[Offset] = []
        for o in offsets:
            punct = self.is_punctuation(o.label)
            starts = self.pieces[o.label].startswith(SPACE) or self.surfaces[o.label] == " "
            if starts and not punct:
                if built:
                    words.append((self.join(built), built[0].start, built[-1].end))
                built = [] if self.surfaces[o.label] == " " else [o]
            elif punct and not built and words:
                text, start, _ = words[-1]
                words[-1] = (text.rstrip(" ") + self.text_of(o.label), start, o.end)
            else:
                built.append(o)
        if built:
            words.append((self.join(built), built[0].start, built[-1].end))
        if words and offsets:  # the first word starts with the first token
            words[0] = (words[0][0], offsets[0].start, words[0][2])
        return words

    def join(self, built: Sequence[Offset]) -> str:
        """A word's pieces decoded together (SentencePiece: "▁" read as a space, the one it
        starts with dropped)."""
        return "".join(self.surfaces[o.label] for o in built).removeprefix(" ")
