"""TextProcessor: raw text -> normalised text -> symbol ids, exactly as the DLE model was trained.

Two front ends, picked from the cleaners unless named:
  "fastpitch"  (DLE `common/text/text_processing.py`, any cleaners but english_cleaners):
      1. currency amounts are expanded on the raw text ("$3.50" -> "three dollars, fifty cents");
      2. the text is cut into `{...}` spans and whitespace-free runs; each run is cleaned on its
         own (so "10:30am" becomes "ten thirty a.m." but "10:30 am" becomes "ten:thirty am"),
         spans are kept; the pieces are joined with spaces and whitespace is collapsed;
      3. with probability p_arpabet each word is replaced by its `{ARPAbet}` (see cmudict.py);
      4. characters map to ids, `{A B}` spans to "@A" "@B"; unknown symbols are dropped (a literal
         "_" is kept: it is the pad id 0, as in DLE).
  "tacotron2"  (DLE `tacotron2/text/__init__.py`, cleaners english_cleaners): the text between
      `{...}` spans is cleaned as a whole, spans map to ARPAbet ids, "_" and "~" are dropped,
      and there is no ARPAbet lookup.

Nothing speakable: DLE turns "?!" into ids for "?" and "!", and "" or "€€" into no ids at all;
a model fed either produces noise or fails. `text_to_ids` keeps DLE's result; `encode` (what the
pipeline calls) raises SpeechRTError unless at least one letter or ARPAbet symbol results, and
`has_speech` says whether it would.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from speechrt.errors import SpeechRTError
from speechrt.text.cleaners import CLEANERS, collapse_whitespace, resolve_cleaners
from speechrt.text.cmudict import CMUDict, load_dictionary, word_to_arpabet
from speechrt.text.numbers import CURRENCY_RE, expand_currency
from speechrt.text.symbols import ARPABET_PREFIX, get_symbols, is_speech_symbol

FRONTENDS = ("fastpitch", "tacotron2")

_TOKEN = re.compile(r"{[^}]+}|\S+")  # a {...} span (only where a run starts with "{") or a run
_FIRST_SPAN = re.compile(r"(.*?)\{(.+?)\}(.*)")  # text before the first {...}, inside, after
# a word (letters, or letters + "'" + one or two letters: "don't", "it's") | anything else
_LETTERS = "a-zA-ZÀ-ž"
_WORD_OR_OTHER = re.compile(
    rf"([{_LETTERS}]+'[{_LETTERS}]{{1,2}}|[{_LETTERS}]+)|([{{][^}}]+[}}]|[^{_LETTERS}{{}}]+)"
)
_TOKEN_CACHE_SIZE = 1 << 16
_SPACE_OUTSIDE_SPANS = re.compile(r" (?![^{]*\})")  # the spaces that become space ids
_PUNCTUATION = " !'(),-.:;?\""  # stripped from a word's ends

Segment = tuple[str, bool]  # (text, is_arpabet)


class TextProcessor:
    """Normalises and encodes English text for one model's symbol set and cleaners."""

    def __init__(
        self,
        symbol_set: str = "english_basic",
        cleaners: str | Sequence[str] = "english_cleaners_v2",
        p_arpabet: float = 0.0,
        *,
        frontend: str | None = None,
        seed: int = 0,
        dictionary: CMUDict | None = None,
    ) -> None:
        """`p_arpabet`: chance that a word becomes ARPAbet (1.0 for DLE's released FastPitch
        recipe); draws use random.Random(seed) afresh on every call, so a text always gives
        the same ids. `dictionary`: CMU dictionary to use (default: load_dictionary())."""
        self.symbol_set = symbol_set
        self.symbols = get_symbols(symbol_set)
        self.cleaners = resolve_cleaners(cleaners)
        if frontend is None:
            frontend = "tacotron2" if self.cleaners == ("english_cleaners",) else "fastpitch"
        if frontend not in FRONTENDS:
            raise SpeechRTError(f"unknown text front end {frontend!r}; known: {FRONTENDS}")
        self.frontend = frontend
        if not 0.0 <= p_arpabet <= 1.0:
            raise SpeechRTError(f"p_arpabet must be within [0, 1], got {p_arpabet}")
        if p_arpabet > 0 and frontend == "tacotron2":
            raise SpeechRTError("the tacotron2 text front end has no ARPAbet lookup (p_arpabet)")
        self.p_arpabet = float(p_arpabet)
        self.seed = seed
        self.dictionary = dictionary
        if p_arpabet > 0 and dictionary is None:
            self.dictionary = load_dictionary()
        self._ids = {s: i for i, s in enumerate(self.symbols)}
        self._dropped = frozenset("_~") if frontend == "tacotron2" else frozenset()
        self._clean_token = lru_cache(maxsize=_TOKEN_CACHE_SIZE)(self._clean)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], **kwargs: Any) -> TextProcessor:
        """From a model's text metadata {"symbol_set", "cleaners", "p_arpabet"[, "frontend"]}
        (or a model.json "meta" holding it under "text"); missing keys take DLE's defaults."""
        text_meta = meta.get("text", meta)
        if not isinstance(text_meta, Mapping):
            raise SpeechRTError(f"text metadata must be a mapping, got {type(text_meta).__name__}")
        return cls(
            symbol_set=text_meta.get("symbol_set", "english_basic"),
            cleaners=text_meta.get(
                "cleaners", text_meta.get("text_cleaners", "english_cleaners_v2")
            ),
            p_arpabet=float(text_meta.get("p_arpabet", 0.0)),
            frontend=text_meta.get("frontend"),
            **kwargs,
        )

    def to_meta(self) -> dict[str, Any]:
        """The settings from_meta reads back."""
        return {
            "symbol_set": self.symbol_set,
            "cleaners": list(self.cleaners),
            "p_arpabet": self.p_arpabet,
            "frontend": self.frontend,
        }

    # --- stages -------------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        """The text the model reads, ARPAbet spans in braces: "Dr. Who" -> "doctor who"."""
        return "".join("{" + s + "}" if arpabet else s for s, arpabet in self._segments(text))

    def text_to_ids(self, text: str) -> list[int]:
        """Symbol ids as DLE computes them (possibly empty or without any speech symbol)."""
        ids: list[int] = []
        for segment, arpabet in self._segments(text):
            if arpabet:
                phones = (ARPABET_PREFIX + p for p in segment.split())
                ids.extend(self._ids[p] for p in phones if p in self._ids)
            else:
                ids.extend(
                    self._ids[c] for c in segment if c in self._ids and c not in self._dropped
                )
        return ids

    def encode(self, text: str) -> list[int]:
        """Symbol ids for `text`; SpeechRTError when nothing speakable results."""
        ids = self.text_to_ids(text)
        if not any(is_speech_symbol(self.symbols[i]) for i in ids):
            if not text.strip():
                raise SpeechRTError("text is empty")
            raise SpeechRTError(f"nothing to speak in {_preview(text)}")
        return ids

    def encode_pieces(self, text: str, max_symbols: int) -> list[list[int]]:
        """encode(text) cut at spaces into pieces of at most `max_symbols` ids (split_ids);
        a piece left with nothing to speak (only punctuation) is dropped."""
        from speechrt.text.sentences import split_ids

        pieces = split_ids(self.encode(text), max_symbols, self._ids[" "])
        return [p for p in pieces if any(is_speech_symbol(self.symbols[i]) for i in p)]

    def word_spans(self, text: str) -> list[tuple[str, int, int]]:
        """(word, start, end) for each word of text_to_ids(text): ids[start:end] is a run between
        space ids that holds a speech symbol. The word is spelled as the cleaned text spells it
        ("$3" -> "three", "dollars"), before any ARPAbet lookup (a {...} span of the caller's
        stays in braces). Were the cleaned text's runs ever not one to one with the ids' runs,
        the words would be the runs' ids decoded, ARPAbet in braces, rather than misplaced."""
        ids = self.text_to_ids(text)
        space = self._ids[" "]
        runs: list[tuple[int, int]] = []
        start = 0
        for i, x in enumerate([*ids, space]):
            if x == space:
                runs.append((start, i))
                start = i + 1
        spelled = None
        if self.frontend == "fastpitch" and self.p_arpabet > 0:
            plain = TextProcessor(self.symbol_set, self.cleaners, 0.0, frontend=self.frontend)
            spelled = _SPACE_OUTSIDE_SPANS.split(plain.normalize(text))
            if len(spelled) != len(runs):
                spelled = None
        out = []
        for k, (a, b) in enumerate(runs):
            if any(is_speech_symbol(self.symbols[i]) for i in ids[a:b]):
                word = spelled[k] if spelled is not None else self.decode(ids[a:b])
                out.append((word.strip(_PUNCTUATION) or word, a, b))
        return out

    def has_speech(self, text: str) -> bool:
        """Whether `encode(text)` would succeed."""
        return any(is_speech_symbol(self.symbols[i]) for i in self.text_to_ids(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Ids back to text, ARPAbet runs in braces (DLE's sequence_to_text)."""
        out = []
        for i in ids:
            if 0 <= i < len(self.symbols):
                s = self.symbols[i]
                is_phone = s.startswith(ARPABET_PREFIX) and len(s) > 1
                out.append("{" + s[1:] + "}" if is_phone else s)
        return "".join(out).replace("}{", " ")

    # --- internals ----------------------------------------------------------------------------

    def _segments(self, text: str) -> list[Segment]:
        if not isinstance(text, str):
            raise SpeechRTError(f"text must be a string, got {type(text).__name__}")
        if self.frontend == "tacotron2":
            return self._segments_tacotron2(text)
        text = CURRENCY_RE.sub(expand_currency, text)
        pieces = [t if t[0] == "{" else self._clean_token(t) for t in _TOKEN.findall(text)]
        text = collapse_whitespace(" ".join(pieces))
        if self.p_arpabet > 0:
            text = self._to_arpabet(text)
        return _split_spans(text, clean=None)

    def _segments_tacotron2(self, text: str) -> list[Segment]:
        return _split_spans(text, clean=self._clean)

    def _clean(self, text: str) -> str:
        for name in self.cleaners:
            text = CLEANERS[name](text)
        return text

    def _to_arpabet(self, text: str) -> str:
        assert self.dictionary is not None
        rng = random.Random(self.seed) if self.p_arpabet < 1.0 else None
        out = []
        for word, other in _WORD_OR_OTHER.findall(text):
            if not word:
                out.append(other)
                continue
            # DLE draws one number per word; with p = 1 every word is tried
            if rng is None or rng.random() < self.p_arpabet:
                phones = word_to_arpabet(word, self.dictionary)
                out.append(word if phones is None else "{" + phones + "}")
            else:
                out.append(word)
        return "".join(out)


def _split_spans(text: str, clean: Any) -> list[Segment]:
    """Cut at {...} spans (DLE: first "{", shortest "...}" after it; "." stops at newlines),
    optionally cleaning the text between spans."""
    segments: list[Segment] = []
    while text:
        m = _FIRST_SPAN.match(text)
        if m is None:
            segments.append((clean(text) if clean else text, False))
            break
        before, span, text = m.group(1), m.group(2), m.group(3)
        segments.append((clean(before) if clean else before, False))
        segments.append((span, True))
    return segments


def _preview(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
