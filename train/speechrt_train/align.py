"""Exact durations for FastPitch from the teacher's own phone timings (festival's segments).

The model reads what speechrt's front end makes of a sentence with p_arpabet = 1: words the CMU
dictionary pronounces one way become ARPAbet phones, others ("the", heteronyms, unknown words)
stay letters, and spaces / punctuation are symbols too. Festival says, for each of its words, when
each phone ends. Mapping one onto the other:

    our words  <-difflib on letters-only names->  festival words (a segment-less word such as
                                                  "'s" is merged into the one before)
    a word's n symbols  <-  its m festival phones: symbol boundaries are festival's cumulative
                            phone boundaries sampled at j * m / n (exact when n == m)
    pauses between words  ->  the first punctuation symbol between them (else the space)
    the final pause       ->  the closing punctuation, at most TRAIL_SECONDS of it
    leading pause         ->  cut from the audio

Whatever does not map (words festival adds or drops) raises AlignError: the utterance is skipped.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import numpy as np

from speechrt.text import TextProcessor
from speechrt.text.cmudict import CMUDict, word_to_arpabet
from speechrt.text.symbols import ARPABET_PREFIX
from speechrt_train.teachers import Segment

TRAIL_SECONDS = 0.15  # silence kept after the last word (on its closing punctuation)
PAUSE = "pau"

# As speechrt.text.processor: a word (letters, or letters ' one or two letters) | anything else
_LETTERS = "a-zA-ZÀ-ž"
_WORD_OR_OTHER = re.compile(
    rf"([{_LETTERS}]+'[{_LETTERS}]{{1,2}}|[{_LETTERS}]+)|([{{][^}}]+[}}]|[^{_LETTERS}{{}}]+)"
)
_PUNCTUATION = frozenset("!'(),.:;?-")


class AlignError(ValueError):
    """The teacher's words do not map onto ours."""


@dataclass
class Token:
    """A word (ids = its phones or letters) or a run of spaces / punctuation (ids = its chars)."""

    text: str
    ids: list[int]
    is_word: bool


@dataclass
class Alignment:
    ids: list[int]  # symbol ids, == TextProcessor(p_arpabet=1).text_to_ids(sentence)
    durations: list[int]  # mel frames per id; sum = frames
    start: float  # seconds into the teacher's audio where frame 0 starts
    frames: int


def tokenize(spoken: str, tp: TextProcessor) -> list[Token]:
    """Normalised text (what `TextProcessor.normalize` gives with p_arpabet 0) -> tokens."""
    assert tp.dictionary is not None
    ids = tp._ids
    tokens = []
    for word, other in _WORD_OR_OTHER.findall(spoken):
        if word:
            phones = word_to_arpabet(word, tp.dictionary)
            if phones is None:
                tid = [ids[c] for c in word if c in ids]
            else:
                tid = [ids[ARPABET_PREFIX + p] for p in phones.split()]
            tokens.append(Token(word, tid, True))
        else:
            tokens.append(Token(other, [ids[c] for c in other if c in ids], False))
    return tokens


def _name(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalpha())


def festival_words(
    words: list[tuple[str, str]], segments: list[Segment]
) -> list[tuple[str, list[tuple[float, float]]]]:
    """Festival's words with their phones' (start, end): [(letters-only name, spans)], in order."""
    spans: dict[str, list[tuple[float, float]]] = {}
    start = 0.0
    for seg in segments:
        if seg.phone != PAUSE:
            spans.setdefault(seg.word, []).append((start, seg.end))
        start = seg.end
    units: list[tuple[str, list[tuple[float, float]]]] = []
    for wid, name in words:
        phones = spans.get(wid, [])
        if phones or not units:
            units.append((_name(name), phones))
        else:  # "'s" after "smith": festival gives its phone to the word before
            units[-1] = (units[-1][0] + _name(name), units[-1][1])
    if units and not units[0][1]:  # leading segment-less words: fold into the next
        first = units.pop(0)[0]
        if units:
            units[0] = (first + units[0][0], units[0][1])
    if any(not phones for _, phones in units):
        raise AlignError("festival word without phones")
    return units


def word_spans(tokens: list[Token], units: list[tuple[str, list]]) -> list[list[tuple]]:
    """For each word token, the festival phone spans it was spoken with."""
    ours = [_name(t.text) for t in tokens if t.is_word]
    theirs = [name for name, _ in units]
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    out: list[list[tuple]] = [[] for _ in ours]
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            for k in range(i2 - i1):
                out[i1 + k] = list(units[j1 + k][1])
        elif op == "replace" and i2 - i1 == 1 and "".join(theirs[j1:j2]) == ours[i1]:
            # one word of ours read as several: "xyz" spelled as "x", "y", "z"
            out[i1] = [span for _, spans in units[j1:j2] for span in spans]
        else:
            raise AlignError(f"{op}: {ours[i1:i2]} vs {theirs[j1:j2]}")
    return out


def split_span(spans: list[tuple[float, float]], n: int) -> np.ndarray:
    """n + 1 boundaries for n symbols sharing m phones' time: festival's cumulative boundaries
    sampled at j * m / n (the phones' own boundaries when n == m)."""
    bounds = np.array([spans[0][0]] + [e for _, e in spans])
    m = len(spans)
    return np.interp(np.arange(n + 1) * m / n, np.arange(m + 1), bounds)


def align(
    sentence: str,
    tp: TextProcessor,
    words: list[tuple[str, str]],
    segments: list[Segment],
    frames_per_second: float,
) -> Alignment:
    """Durations in mel frames for `sentence`'s ids, from festival's words and segments."""
    spoken = tp_plain(tp).normalize(sentence)
    tokens = tokenize(spoken, tp)
    expected = tp.text_to_ids(sentence)
    if [i for t in tokens for i in t.ids] != expected:
        raise AlignError("tokens do not reproduce the front end's ids")
    spans = word_spans(tokens, festival_words(words, segments))
    word_tokens = [k for k, t in enumerate(tokens) if t.is_word]
    if not word_tokens or any(not tokens[k].ids for k in word_tokens):
        raise AlignError("a word without symbols")
    t0 = spans[0][0][0]
    # bounds[k]: boundary times of token k's symbols (len(ids) + 1 values)
    bounds: list[np.ndarray] = [np.empty(0)] * len(tokens)
    for k, sp in zip(word_tokens, spans, strict=True):
        bounds[k] = split_span(sp, len(tokens[k].ids))
    end_of_speech = spans[-1][-1][1]
    last_seg_end = segments[-1].end if segments else end_of_speech
    for k, tok in enumerate(tokens):
        if tok.is_word:
            continue
        before = [w for w in word_tokens if w < k]
        after = [w for w in word_tokens if w > k]
        if not before:
            start = end = t0  # nothing before the first word: no time
        elif not after:
            start = bounds[before[-1]][-1]
            end = min(last_seg_end, start + TRAIL_SECONDS)
        else:
            start, end = bounds[before[-1]][-1], bounds[after[0]][0]
        n = len(tok.ids)
        times = np.full(n + 1, end)
        times[0] = start
        if n:  # the pause goes to the first punctuation symbol, else the first symbol
            chars = [c for c in tok.text if c in tp._ids]
            first = next((j for j, c in enumerate(chars) if c in _PUNCTUATION), 0)
            times[: first + 1] = start
        bounds[k] = times
    ids, boundaries = [], [t0]
    for tok, b in zip(tokens, bounds, strict=True):
        ids += tok.ids
        boundaries += list(b[1:]) if len(tok.ids) else []
    frames = np.round((np.array(boundaries) - t0) * frames_per_second).astype(np.int64)
    durations = np.diff(frames)
    if (durations < 0).any():
        raise AlignError("festival's times go backwards")
    if len(durations) != len(ids):
        raise AlignError("internal: durations and ids differ in length")
    return Alignment(ids, durations.tolist(), float(t0), int(frames[-1]))


_PLAIN: dict[int, TextProcessor] = {}


def tp_plain(tp: TextProcessor) -> TextProcessor:
    """The same front end without ARPAbet (gives the text the teachers are asked to read)."""
    key = id(tp)
    if key not in _PLAIN:
        _PLAIN[key] = TextProcessor(tp.symbol_set, tp.cleaners, 0.0)
    return _PLAIN[key]


def make_processor(dictionary: CMUDict | None = None) -> TextProcessor:
    """The front end our voice is trained with: english_basic, english_cleaners_v2, ARPAbet."""
    return TextProcessor("english_basic", "english_cleaners_v2", 1.0, dictionary=dictionary)
