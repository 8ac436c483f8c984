"""Cleaners: named text-normalisation pipelines, as selected by a model's `cleaners` setting.

    english_cleaners_v2   FastPitch (DLE `common/text`): ASCII -> times -> letters+numbers ->
                          numbers -> abbreviations -> acronyms spelled -> lower -> whitespace -> "/"
    english_cleaners      Tacotron2 (DLE `tacotron2/text`, keithito): ASCII -> lower -> numbers ->
                          abbreviations -> whitespace
    transliteration_cleaners  ASCII -> lower -> whitespace
    basic_cleaners        lower -> whitespace

Note: DLE's FastPitch tree has an `english_cleaners` of its own (its v2 number rules without the
rest); no published model uses it, and the name here means Tacotron2's, which one does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from speechrt.errors import SpeechRTError
from speechrt.text.numbers import normalize_numbers_v1, normalize_numbers_v2
from speechrt.text.rules import (
    expand_abbreviations_v1,
    expand_abbreviations_v2,
    expand_letters_and_numbers,
    expand_times,
    spell_acronyms,
    to_ascii,
)

_WHITESPACE = re.compile(r"\s+")
_SLASHES = re.compile(r"/+")


def collapse_whitespace(text: str) -> str:
    """Every whitespace run becomes one space (leading/trailing ones are kept, as in DLE)."""
    return _WHITESPACE.sub(" ", text)


def basic_cleaners(text: str) -> str:
    return collapse_whitespace(text.lower())


def transliteration_cleaners(text: str) -> str:
    return collapse_whitespace(to_ascii(text).lower())


def english_cleaners(text: str) -> str:
    text = to_ascii(text).lower()
    text = normalize_numbers_v1(text)
    text = expand_abbreviations_v1(text)
    return collapse_whitespace(text)


def english_cleaners_v2(text: str) -> str:
    text = to_ascii(text)
    text = expand_times(text)
    text = expand_letters_and_numbers(text)
    text = normalize_numbers_v2(text)
    text = expand_abbreviations_v2(text)
    text = spell_acronyms(text)
    text = collapse_whitespace(text.lower())
    return _SLASHES.sub(" ", text)  # "/" is not in english_basic


CLEANERS: dict[str, Callable[[str], str]] = {
    "english_cleaners_v2": english_cleaners_v2,
    "english_cleaners": english_cleaners,
    "transliteration_cleaners": transliteration_cleaners,
    "basic_cleaners": basic_cleaners,
}


def resolve_cleaners(names: str | Sequence[str]) -> tuple[str, ...]:
    """Validate cleaner names: one name or a list (DLE stores a list) -> tuple of names."""
    names = (names,) if isinstance(names, str) else tuple(names)
    if not names:
        raise SpeechRTError("no text cleaners given")
    for name in names:
        if name not in CLEANERS:
            raise SpeechRTError(f"unknown text cleaner {name!r}; known: {', '.join(CLEANERS)}")
    return names


def clean_text(text: str, names: str | Sequence[str] = "english_cleaners_v2") -> str:
    """Run the named cleaners over `text` in order."""
    for name in resolve_cleaners(names):
        text = CLEANERS[name](text)
    return text
