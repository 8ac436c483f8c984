"""SSML: the subset NVIDIA Riva speaks, read into text segments the front end already handles.

    <speak> <p> <s>           paragraphs and sentences: a sentence boundary at each edge
    <break time="500ms|1s" strength="…"/>
                              exactly that much silence (time wins over strength)
    <prosody rate="…" pitch="…">
                              the request's pace times rate; its pitch shift plus pitch (Hz)
    <phoneme alphabet="x-arpabet" ph="…">
                              the ARPAbet given, as a {…} span (the content is not read)
    <sub alias="…">           the alias instead of the content
    <say-as interpret-as="characters|cardinal|ordinal|date|telephone" [format="mdy|dmy|ymd"]>

Text is SSML when it starts with "<speak" or with an XML declaration (<?xml version="1.0"?>),
leading whitespace aside. Anything else in the markup (another element or attribute, a value
out of range, a DOCTYPE or entity declaration, malformed XML) is a SpeechRTError naming the
problem: nothing is skipped in silence. The XML is read by expat with handlers that refuse any
DTD, so no entity is ever declared or expanded and nothing outside the text is fetched (the
attacks defusedxml guards against need one of those).

A <break> or a <prosody> edge inside a sentence cuts it: the pieces on either side are
synthesised apart and joined by the break's silence only (no sentence pause).

Reading a document costs time linear in its length, and `parse(text, max_symbols)` stops as
soon as what it has expanded (<say-as telephone> spells each digit, <sub> reads its alias, each
<phoneme> phone is one symbol) passes the limit, before any of it reaches a model.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import NoReturn
from xml.parsers import expat

from speechrt.errors import SpeechRTError
from speechrt.text.symbols import ARPABET

MAX_DEPTH = 32  # nested elements
MAX_BREAK_SECONDS = 10.0  # one <break>
MAX_TOTAL_BREAK_SECONDS = 60.0  # all the breaks of one text: silence costs memory too
RATE_RANGE = (0.25, 4.0)  # a <prosody rate> factor (OpenAI's speed range)
MAX_PITCH_HZ = 400.0  # |<prosody pitch>|
# W3C leaves the lengths to the processor; "medium" is a clear pause between sentences
BREAK_STRENGTHS = {
    "none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.5, "strong": 0.75, "x-strong": 1.0,
}  # fmt: skip
RATES = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
PITCHES = {"x-low": -60.0, "low": -30.0, "medium": 0.0, "default": 0.0, "high": 30.0,
           "x-high": 60.0}  # fmt: skip
INTERPRET_AS = ("characters", "cardinal", "ordinal", "date", "telephone")
DATE_FORMATS = ("mdy", "dmy", "ymd")
# Per element, the attributes it may carry (xmlns* and xml:lang are also allowed on the blocks).
ATTRIBUTES: dict[str, frozenset[str]] = {
    "speak": frozenset({"version", "xsi:schemaLocation"}),
    "p": frozenset(),
    "s": frozenset(),
    "break": frozenset({"time", "strength"}),
    "prosody": frozenset({"rate", "pitch"}),
    "phoneme": frozenset({"alphabet", "ph"}),
    "sub": frozenset({"alias"}),
    "say-as": frozenset({"interpret-as", "format"}),
}
_BLOCKS = ("speak", "p", "s")
_REPLACED = ("phoneme", "sub", "say-as")  # their content is replaced, so it holds only text
_TIME = re.compile(r"(\d+(?:\.\d+)?)(ms|s)")
_RELATIVE = re.compile(r"([+-]?)(\d+(?:\.\d+)?)%")
_HZ = re.compile(r"([+-]?\d+(?:\.\d+)?)Hz")
_DATE_PART = re.compile(r"[0-9]{1,4}")
_START = re.compile(r"\s*(?:<speak\b|<\?xml\s)")  # the <speak> element, or an XML declaration
_SENTENCE_CLOSERS = "\"'”’)]"  # may follow a sentence's final mark
_BRACED = re.compile(r"\{[^}]*\}")  # an {ARPAbet} span
_ARPABET = frozenset(ARPABET)
# Letter names in ARPAbet: written as words ("ay", "see") they would be read as words
_LETTERS = dict(zip("abcdefghijklmnopqrstuvwxyz", [
    "EY1", "B IY1", "S IY1", "D IY1", "IY1", "EH1 F", "JH IY1", "EY1 CH", "AY1", "JH EY1",
    "K EY1", "EH1 L", "EH1 M", "EH1 N", "OW1", "P IY1", "K Y UW1", "AA1 R", "EH1 S", "T IY1",
    "Y UW1", "V IY1", "D AH1 B AH0 L Y UW0", "EH1 K S", "W AY1", "Z IY1",
], strict=True))  # fmt: skip
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]  # fmt: skip


@dataclass(frozen=True)
class Segment:
    """A stretch of text read with one prosody: what the front end gets, as plain text."""

    text: str  # may hold {ARPAbet} spans (from <phoneme>, <say-as characters>)
    rate: float = 1.0  # multiplies the request's pace
    pitch: float = 0.0  # Hz added to the request's pitch shift
    before: float = 0.0  # seconds of <break> silence before it
    sentence: bool = False  # it starts a new sentence (not the middle of one cut by a break)


@dataclass(frozen=True)
class Script:
    """An SSML text read: its segments in order, and the silence after the last one."""

    segments: tuple[Segment, ...]
    after: float = 0.0


def is_ssml(text: str) -> bool:
    """Whether `text` is an SSML document: it starts with <speak or an XML declaration (which
    parse then requires to be followed by <speak>)."""
    return _START.match(text) is not None


def parse(text: str, max_symbols: int | None = None) -> Script:
    """An SSML document -> Script; SpeechRTError naming the first problem met, or as soon as
    the text it expands to passes `max_symbols` (read_length: characters and phones)."""
    reader = _Reader(max_symbols)
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse_dtd
    parser.EntityDeclHandler = _refuse_dtd
    parser.ExternalEntityRefHandler = _refuse_dtd
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.text
    try:
        parser.Parse(text.strip(), True)
    except expat.ExpatError as e:
        raise SpeechRTError(f"malformed SSML: {e}") from None
    return reader.script()


def _refuse_dtd(*_: object) -> NoReturn:
    raise SpeechRTError("SSML must not declare a DOCTYPE or entities")


@dataclass
class _Frame:
    tag: str
    rate: float
    pitch: float
    attrs: dict[str, str] = field(default_factory=dict)
    content: list[str] = field(default_factory=list)  # a replaced element's text


class _Reader:
    """expat's events -> segments."""

    def __init__(self, max_symbols: int | None = None) -> None:
        self.max_symbols = max_symbols
        self.length = 0  # read_length of what the document has expanded to so far
        self.stack: list[_Frame] = []
        self.segments: list[Segment] = []
        self.words: list[str] = []  # the current segment's text
        self.pause = 0.0  # break silence not yet placed
        self.total_pause = 0.0
        self.boundary = False  # a <p>/<s> edge since the last segment

    # -- events --------------------------------------------------------------------------------

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if not self.stack and tag != "speak":
            raise SpeechRTError(f"SSML must start with <speak>, not <{tag}>")
        if tag not in ATTRIBUTES:
            raise SpeechRTError(
                f"unsupported SSML element <{tag}>; supported: "
                + ", ".join(f"<{t}>" for t in ATTRIBUTES)
            )
        if self.stack:
            parent = self.stack[-1]
            if tag == "speak":
                raise SpeechRTError("<speak> cannot be nested")
            if parent.tag in (*_REPLACED, "break"):
                raise SpeechRTError(f"<{parent.tag}> may hold only text, not <{tag}>")
        if len(self.stack) >= MAX_DEPTH:
            raise SpeechRTError(f"SSML nests deeper than {MAX_DEPTH} elements")
        for name in attrs:
            blockwide = tag in _BLOCKS and (name.startswith("xmlns") or name == "xml:lang")
            if name not in ATTRIBUTES[tag] and not blockwide:
                raise SpeechRTError(f"unsupported attribute {name!r} on SSML <{tag}>")
        rate, pitch = (self.stack[-1].rate, self.stack[-1].pitch) if self.stack else (1.0, 0.0)
        if tag in ("p", "s"):
            self._flush()
            self.boundary = True
        elif tag == "break":
            self._flush()
            self._add_pause(_break_seconds(attrs))
        elif tag == "prosody":
            self._flush()
            rate *= _rate(attrs["rate"]) if "rate" in attrs else 1.0
            pitch += _pitch(attrs["pitch"]) if "pitch" in attrs else 0.0
        elif tag in _REPLACED:
            _check_replaced(tag, attrs)
        self.stack.append(_Frame(tag, rate, pitch, attrs))

    def end(self, tag: str) -> None:
        if tag in ("speak", "p", "s", "prosody"):
            self._flush()  # (the text read in this element's prosody)
            self.boundary = self.boundary or tag != "prosody"
        frame = self.stack.pop()
        if tag in _REPLACED:
            self._read(_replacement(frame))

    def text(self, data: str) -> None:
        top = self.stack[-1]
        if top.tag in _REPLACED:
            top.content.append(data)
        elif top.tag == "break":
            if data.strip():
                raise SpeechRTError("<break> must be empty")
        else:
            self._read(data)

    def _read(self, text: str) -> None:
        """Text to read, counted against max_symbols as it comes."""
        self.length += read_length(text)
        if self.max_symbols is not None and self.length > self.max_symbols:
            raise SpeechRTError(
                f"SSML expands to more than {self.max_symbols} symbols to read; the limit is "
                f"{self.max_symbols} per request"
            )
        self.words.append(text)

    # -- segments ------------------------------------------------------------------------------

    def _add_pause(self, seconds: float) -> None:
        self.pause += seconds
        self.total_pause += seconds
        if self.total_pause > MAX_TOTAL_BREAK_SECONDS:
            raise SpeechRTError(
                f"SSML breaks add up to more than {MAX_TOTAL_BREAK_SECONDS:g} s of silence"
            )

    def _flush(self) -> None:
        """The text gathered so far becomes a segment, with the prosody it was read in."""
        text = " ".join("".join(self.words).split())
        self.words = []
        if not text:
            return
        top = self.stack[-1]
        after_sentence = bool(self.segments) and _ends_sentence(self.segments[-1].text)
        self.segments.append(
            Segment(text, top.rate, top.pitch, self.pause, self.boundary or after_sentence)
        )
        self.pause, self.boundary = 0.0, False

    def script(self) -> Script:
        return Script(tuple(self.segments), self.pause)


def _ends_sentence(text: str) -> bool:
    """Whether `text` ends with ".", "!", "?", ";" or "…", closing quotes and brackets aside
    (read from its end: a regular expression searched over a run of dots is quadratic)."""
    return text.rstrip().rstrip(_SENTENCE_CLOSERS).endswith((".", "!", "?", ";", "…"))


def read_length(text: str) -> int:
    """About the symbols `text` reads as: its characters, whitespace runs as one, and each
    phone of an {ARPAbet} span as one (numbers spelled out later read longer)."""
    phones = sum(len(span.split()) for span in _BRACED.findall(text))
    return phones + len(" ".join(_BRACED.sub(" ", text).split()))


# -- attribute values ----------------------------------------------------------------------------


def _break_seconds(attrs: dict[str, str]) -> float:
    if "time" in attrs:
        m = _TIME.fullmatch(attrs["time"].strip())
        if m is None:
            raise SpeechRTError(f"<break time={attrs['time']!r}>: give e.g. 500ms or 1s")
        seconds = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
        if seconds > MAX_BREAK_SECONDS:
            raise SpeechRTError(
                f"<break time={attrs['time']!r}>: at most {MAX_BREAK_SECONDS:g} s per break"
            )
        return seconds
    strength = attrs.get("strength", "medium")
    if strength not in BREAK_STRENGTHS:
        raise SpeechRTError(
            f"<break strength={strength!r}>: choose one of {', '.join(BREAK_STRENGTHS)}"
        )
    return BREAK_STRENGTHS[strength]


def _rate(value: str) -> float:
    """x-slow .. x-fast; "150%" (of the current rate); "+20%" / "-20%"; or a factor "1.5"."""
    v = value.strip()
    rate: float | None = RATES.get(v)
    if rate is None and (m := _RELATIVE.fullmatch(v)) is not None:
        pct = float(m.group(2)) / 100.0
        rate = {"": pct, "+": 1.0 + pct, "-": 1.0 - pct}[m.group(1)]
    if rate is None and re.fullmatch(r"\d+(?:\.\d+)?", v):
        rate = float(v)
    lo, hi = RATE_RANGE
    if rate is None or not lo <= rate <= hi:
        raise SpeechRTError(
            f"<prosody rate={value!r}>: give {', '.join(RATES)}, a percentage (150%, +20%) or "
            f"a factor, within {lo:g}..{hi:g} times"
        )
    return rate


def _pitch(value: str) -> float:
    """Hz added to the pitch contour: x-low .. x-high, or "+20Hz" / "-20Hz"."""
    v = value.strip()
    hz: float | None = PITCHES.get(v)
    if hz is None and (m := _HZ.fullmatch(v)) is not None:
        hz = float(m.group(1))
    if hz is None or abs(hz) > MAX_PITCH_HZ:
        raise SpeechRTError(
            f"<prosody pitch={value!r}>: give {', '.join(PITCHES)} or a shift in Hz (+20Hz) "
            f"within ±{MAX_PITCH_HZ:g} Hz"
        )
    return hz


def _check_replaced(tag: str, attrs: dict[str, str]) -> None:
    """The attributes of <phoneme>, <sub> and <say-as>, checked when they open."""
    if tag == "phoneme":
        if attrs.get("alphabet") != "x-arpabet":
            raise SpeechRTError(
                f'<phoneme alphabet={attrs.get("alphabet")!r}>: only alphabet="x-arpabet" '
                "is supported"
            )
        phones = attrs.get("ph", "").split()
        bad = [p for p in phones if p not in _ARPABET]
        if not phones or bad:
            what = f"unknown phone {bad[0]!r}" if bad else "no phones"
            raise SpeechRTError(
                f"<phoneme ph={attrs.get('ph', '')!r}>: {what} (ARPAbet: HH AH0 L OW1)"
            )
    elif tag == "sub" and "alias" not in attrs:
        raise SpeechRTError("<sub> needs an alias attribute")
    elif tag == "say-as":
        kind = attrs.get("interpret-as")
        if kind not in INTERPRET_AS:
            raise SpeechRTError(
                f"<say-as interpret-as={kind!r}>: choose one of {', '.join(INTERPRET_AS)}"
            )
        fmt = attrs.get("format")
        if fmt is not None and (kind != "date" or fmt not in DATE_FORMATS):
            raise SpeechRTError(
                f"<say-as format={fmt!r}>: only dates take a format ({', '.join(DATE_FORMATS)})"
            )


def _replacement(frame: _Frame) -> str:
    """What a <phoneme>, <sub> or <say-as> element reads as."""
    if frame.tag == "phoneme":
        return "{" + " ".join(frame.attrs["ph"].split()) + "}"
    if frame.tag == "sub":
        return frame.attrs["alias"]
    content = " ".join("".join(frame.content).split())
    kind = frame.attrs["interpret-as"]
    if not content:
        raise SpeechRTError(f'<say-as interpret-as="{kind}"> is empty')
    if kind == "characters":
        return characters(content)
    if kind == "cardinal":
        return cardinal(content)
    if kind == "ordinal":
        return ordinal(content)
    if kind == "date":
        return date(content, frame.attrs.get("format"))
    return telephone(content)


# -- say-as --------------------------------------------------------------------------------------


def characters(text: str) -> str:
    """Each letter by its name (as ARPAbet), each digit as a word: "AB1" -> "{EY1} {B IY1} one"."""
    out = []
    for c in text.lower():
        if c in _LETTERS:
            out.append("{" + _LETTERS[c] + "}")
        elif c.isdigit() and c.isascii():
            out.append(_DIGITS[int(c)])
    if not out:
        raise SpeechRTError(f'<say-as interpret-as="characters">: no letter or digit in {text!r}')
    return " ".join(out)


def cardinal(text: str) -> str:
    from speechrt.text.numbers import number_words

    digits = text.replace(",", "").replace(" ", "")
    if not re.fullmatch(r"-?\d{1,15}", digits):
        raise SpeechRTError(f'<say-as interpret-as="cardinal">: {text!r} is not a whole number')
    words = number_words(abs(int(digits)))
    return f"minus {words}" if digits.startswith("-") else words


def ordinal(text: str) -> str:
    from speechrt.text.numbers import number_words

    m = re.fullmatch(r"(\d{1,15})(?:st|nd|rd|th)?", text.replace(",", "").strip().lower())
    if m is None:
        raise SpeechRTError(f'<say-as interpret-as="ordinal">: {text!r} is not a whole number')
    n = int(m.group(1))
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return number_words(f"{n}{suffix}")


def date(text: str, fmt: str | None) -> str:
    """ "2024-01-05" (ISO, whatever the format), or "1/5/2024" read as `fmt` (default mdy) ->
    "January fifth, twenty twenty-four"."""
    from speechrt.text.numbers import normalize_numbers_v2

    what = f'<say-as interpret-as="date">: {text[:40]!r}'
    parts = re.split(r"[-/.]", text.strip())
    # a year of at most 4 digits, a month and a day of at most 2 (datetime's range: a longer
    # run would overflow its C int, or int() itself past 4,300 digits)
    if len(parts) != 3 or not all(_DATE_PART.fullmatch(p) for p in parts):
        raise SpeechRTError(f"{what} is not a date like 2024-01-05")
    order = "ymd" if len(parts[0]) == 4 else (fmt or "mdy")
    if len(parts[order.index("m")]) > 2 or len(parts[order.index("d")]) > 2:
        raise SpeechRTError(f"{what}: a month and a day take at most two digits")
    value = dict(zip(order, map(int, parts), strict=True))
    try:
        day = datetime.date(value["y"], value["m"], value["d"])
    except ValueError as e:
        raise SpeechRTError(f"{what}: {e}") from None
    year = normalize_numbers_v2(str(day.year))
    return f"{_MONTHS[day.month - 1]} {ordinal(str(day.day))}, {year}"


def telephone(text: str) -> str:
    """Digit by digit, a pause between groups: "+1 555-0100" -> "plus one, five five five, ..."."""
    groups = re.findall(r"\+|\d+", text)
    if not any(g.isdigit() for g in groups):
        raise SpeechRTError(f'<say-as interpret-as="telephone">: no digits in {text!r}')
    words = ["plus" if g == "+" else " ".join(_DIGITS[int(c)] for c in g) for g in groups]
    out: list[str] = []
    for w in words:  # "plus" joins the group after it
        out.append(w if not out or out[-1] != "plus" else out.pop() + " " + w)
    return ", ".join(out)
