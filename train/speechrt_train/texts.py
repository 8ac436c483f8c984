"""The text side of the corpus: English sentences from Debian's `fortunes` files, split in two.

    fortune files -> entries (between "%" lines) -> attribution lines dropped -> sentences
    (speechrt's own splitter, as inference cuts text) -> filtered (length, characters)
    -> de-duplicated -> ordered by hash -> held-out (3 %) / train

The split depends on each sentence's text alone (its SHA-1), so it is the same on every machine,
for every voice, whatever files are present: no model ever trains on a held-out sentence.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from speechrt.text import split_sentences

FORTUNES_DIR = (
    "usr/share/games/fortunes"  # inside a Debian root (/ here, the unpacked prefix there)
)
EXCLUDED_FILES = frozenset({"art", "ascii-art", "perl", "translate-me", "debian"})  # pictures, code
HELDOUT_PERCENT = 3
MIN_WORDS, MAX_WORDS = 3, 24
MAX_CHARS = 160

_ATTRIBUTION = re.compile(r"^\s*(--|-- |~~|\(c\))")  # "-- Mark Twain" and what follows it
_NUMBERING = re.compile(r"^\s*(\(\d+\)|\d+[.)]|[QA]:)\s*")  # "(1) ", "2. ", "Q: "
_ALLOWED = re.compile(r"""[A-Za-z0-9 .,;:!?'"()$%-]+""")
_WORD = re.compile(r"[A-Za-z']+")
_LONG_CAPS = re.compile(r"\b[A-Z]{5,}\b")  # shouting or acronyms: read unpredictably
_DIGITS = re.compile(r"\d")


@dataclass(frozen=True)
class Sentence:
    """One line of the corpus text; `key` (SHA-1 of the text) names it everywhere."""

    key: str
    text: str

    @property
    def heldout(self) -> bool:
        return is_heldout(self.text)


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def hash64(key: str) -> int:
    """A 64-bit number drawn from `key` (SHA-1): the same on every machine, for choices that
    must not depend on a random seed (which voice variant, codec or span an item gets)."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "little")


def is_heldout(text: str) -> bool:
    """True for the ~3 % of sentences that no model may train on (a function of the text)."""
    return int(text_key(text)[:8], 16) % 100 < HELDOUT_PERCENT


def fortune_files(root: str | Path = "/") -> list[Path]:
    """The fortune text files under a Debian root, sorted; [] when the package is absent."""
    folder = Path(root) / FORTUNES_DIR
    if not folder.is_dir():
        return []
    names = (p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    return sorted(p for p in names if p.suffix == "" and p.name not in EXCLUDED_FILES)


def entries(text: str) -> Iterator[str]:
    """The fortunes of one file: blocks between lines holding a single "%"."""
    block: list[str] = []
    for line in text.splitlines():
        if line.strip() == "%":
            if block:
                yield "\n".join(block)
            block = []
        else:
            block.append(line)
    if block:
        yield "\n".join(block)


def entry_text(entry: str) -> str:
    """An entry's prose: attribution and everything after it dropped, numbering removed."""
    lines = []
    for line in entry.splitlines():
        if _ATTRIBUTION.match(line):
            break
        lines.append(_NUMBERING.sub("", line))
    return " ".join(" ".join(lines).split())


def acceptable(sentence: str) -> bool:
    """Plain prose a synthesizer reads predictably: 3-24 words, no markup, few digits."""
    if len(sentence) > MAX_CHARS or not _ALLOWED.fullmatch(sentence):
        return False
    if not sentence[0].isupper() and sentence[0] not in "\"'(":
        return False
    if sentence[-1] not in ".!?\"')":
        return False  # a fragment cut out of a longer line
    words = _WORD.findall(sentence)
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return False
    letters = sum(c.isalpha() for c in sentence)
    if letters < 0.7 * len(sentence) or len(_DIGITS.findall(sentence)) > 6:
        return False
    if _LONG_CAPS.search(sentence) or "--" in sentence or "''" in sentence:
        return False
    return sentence.count('"') % 2 == 0 and sentence.count("(") == sentence.count(")")


def sentences_of(texts: Iterable[str]) -> list[Sentence]:
    """Acceptable, de-duplicated sentences of some fortune files' contents, in hash order."""
    seen: dict[str, Sentence] = {}
    for text in texts:
        for entry in entries(text):
            prose = entry_text(entry)
            if not prose:
                continue
            for s in split_sentences(prose, max_chars=MAX_CHARS * 2):
                folded = s.lower()
                if acceptable(s) and folded not in seen:
                    seen[folded] = Sentence(text_key(s), s)
    return sorted(seen.values(), key=lambda s: s.key)


def load_sentences(root: str | Path = "/") -> list[Sentence]:
    """Every usable fortune sentence under a Debian root (see `fortune_files`)."""
    files = fortune_files(root)
    return sentences_of(p.read_text(encoding="utf-8", errors="replace") for p in files)


def split(sentences: Iterable[Sentence]) -> tuple[list[Sentence], list[Sentence]]:
    """(train, heldout), each in the input order."""
    train, heldout = [], []
    for s in sentences:
        (heldout if s.heldout else train).append(s)
    return train, heldout
