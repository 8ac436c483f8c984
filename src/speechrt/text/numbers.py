"""Numbers to words, reproducing the two DLE English front ends word for word.

* "v2" rules: FastPitch `english_cleaners_v2` (currency with magnitudes, decimals, ordinals, Roman
  numerals, "2x3", plurals like "1920s", years read in pairs).
* "v1" rules: Tacotron2 `english_cleaners` (keithito's: dollars, decimals, ordinals, years).

DLE spells numbers with `inflect.engine().number_to_words`; `number_words` below writes the same
words for every form these rules ask of it (cardinals with and without "and", ordinals,
decimals, years in pairs) in plain Python: importing inflect took seconds (typeguard
instruments it), on the first text holding a digit. tests/test_text.py compares the two.
"""

from __future__ import annotations

import re

from speechrt.errors import SpeechRTError

_UNITS = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen"]  # fmt: skip
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
# the name of each group of three digits, from the right; inflect names none past decillion
_THOUSANDS = ["", " thousand", " million", " billion", " trillion", " quadrillion",
              " quintillion", " sextillion", " septillion", " octillion", " nonillion",
              " decillion"]  # fmt: skip
# an ordinal's ending where it is not the cardinal's + "th" ("twenty" -> "twentieth")
_ORDINAL_ENDS = {
    "ty": "tieth", "one": "first", "two": "second", "three": "third", "five": "fifth",
    "eight": "eighth", "nine": "ninth", "twelve": "twelfth",
}  # fmt: skip
_ORDINAL_END = re.compile("(" + "|".join(_ORDINAL_ENDS) + ")$")


def number_words(
    value: int | str, *, andword: str = "and", zero: str = "zero", group: int = 0
) -> str:
    """A number in words, as inflect's number_to_words(value, andword=, zero=, group=) writes it:
    21 -> "twenty-one", 1005 -> "one thousand and five", "5th" -> "fifth", "2.05" -> "two
    point zero five", and with group=2 (years) 1905 -> "nineteen, oh five" (zero="oh").
    `value`: an int >= 0, or a string of digits with an optional ordinal suffix (st, nd, rd,
    th) or decimal part; at most 36 significant digits."""
    text = str(value)
    if group == 2:
        return ", ".join(_pair(p, zero) for p in _from_right(text, 2))
    if group != 0:
        raise SpeechRTError(f"number_words: group {group} is not supported")
    if text[-2:] in ("st", "nd", "rd", "th"):
        return _ordinal_words(_cardinal(text[:-2], andword, zero))
    whole, point, fraction = text.partition(".")
    words = _cardinal(whole, andword, zero) if whole else ""
    if not point:
        return words
    digits = " ".join(zero if d == "0" else _UNITS[int(d)] for d in fraction)
    return " ".join(w for w in (words, "point", digits) if w)


def _cardinal(digits: str, andword: str, zero: str) -> str:
    """ "1234" -> "one thousand, two hundred and thirty-four": the groups of three digits
    joined by ", ", but a last group below one hundred joins with "and" ("one thousand and
    five"; with andword="", a space)."""
    n = int(digits)
    if n == 0:
        return zero
    # (index from the right, value) of the nonzero groups of three digits, most significant first
    parts3 = _from_right(str(n), 3)
    groups = [(len(parts3) - 1 - i, int(p)) for i, p in enumerate(parts3) if int(p)]
    if groups[0][0] >= len(_THOUSANDS):
        raise SpeechRTError(f"number_words: {digits} has too many digits to spell")
    parts = [_group_words(g, andword) + _THOUSANDS[i] for i, g in groups]
    if len(parts) > 1 and groups[-1][0] == 0 and groups[-1][1] < 100:
        last = parts.pop()
        return ", ".join(parts) + (f" {andword} " if andword else " ") + last
    return ", ".join(parts)


def _group_words(n: int, andword: str) -> str:
    """1..999: "five", "forty-two", "three hundred", "three hundred and six"."""
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _below_hundred(rest)
    words = f"{_UNITS[hundreds]} hundred"
    if not rest:
        return words
    return words + (f" {andword} " if andword else " ") + _below_hundred(rest)


def _below_hundred(n: int) -> str:
    """1..99: "seven", "eleven", "forty", "forty-two"."""
    if n < 10:
        return _UNITS[n]
    if n < 20:
        return _TEENS[n - 10]
    return _TENS[n // 10] + (f"-{_UNITS[n % 10]}" if n % 10 else "")


def _pair(part: str, zero: str) -> str:
    """One group of two digits (or one, leading) as inflect's group=2 reads it: "19" ->
    "nineteen", "05" -> "oh five" (zero="oh"), "00" -> "oh oh"."""
    n = int(part)
    if len(part) == 1:
        return _UNITS[n] or zero
    if n >= 10:
        return _below_hundred(n)
    return f"{zero} {_UNITS[n] or zero}"


def _ordinal_words(words: str) -> str:
    """ "twenty-one" -> "twenty-first", "seven" -> "seventh", "twelve" -> "twelfth"."""
    m = _ORDINAL_END.search(words)
    if m is None:
        return words + "th"
    return words[: m.start()] + _ORDINAL_ENDS[m.group(1)]


def _from_right(digits: str, size: int) -> list[str]:
    """ "1234567" -> ["1", "234", "567"] (size 3): groups aligned from the right."""
    head = (len(digits) - 1) % size + 1
    return [digits[:head]] + [digits[i : i + size] for i in range(head, len(digits), size)]


# --- shared -------------------------------------------------------------------------------------

_DIGITS_WITH_COMMAS = re.compile(r"([0-9][0-9,]+[0-9])")  # "1,000,000" (also "1,2": DLE does too)
_DECIMAL = re.compile(r"([0-9]+\.[0-9]+)")
_ORDINAL = re.compile(r"[0-9]+(st|nd|rd|th)")


# inflect gives up on numbers of more than 36 digits and int() on strings over 4300 digits, where
# DLE crashes; such digit runs are read digit by digit instead
_DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _too_long(digits: str) -> bool:
    return len(digits) > 4000 or len(digits.lstrip("0")) > 36


def _digit_by_digit(digits: str) -> str:
    return " ".join(_DIGIT_NAMES[int(d)] for d in digits)


def _drop_commas(m: re.Match[str]) -> str:
    return m.group(1).replace(",", "")


def _decimal_point(m: re.Match[str]) -> str:
    return m.group(1).replace(".", " point ")  # "3.14" -> "3 point 14" -> "three point fourteen"


def _ordinal(m: re.Match[str]) -> str:
    digits = m.group(0)[:-2]
    return _digit_by_digit(digits) if _too_long(digits) else number_words(m.group(0))


# --- v2 (FastPitch) -----------------------------------------------------------------------------

_CURRENCY_UNIT = {"$": "dollar", "£": "pound", "€": "euro", "₩": "won"}
_SHORT_MAGNITUDE = {"m": "million", "b": "billion", "t": "trillion"}
# "$3.50", "€1,200", "$2.5 billion", "$5m" (a magnitude must not run into further letters)
CURRENCY_RE = re.compile(
    r"([$€£₩])([0-9.,]*[0-9]+)"
    r"(?:[ ]?(trillion|billion|million|thousand|hundred|m|b|t)(?=[^a-zA-Z]|$))?",
    re.IGNORECASE,
)
# "XIV", "II", "MCMLXXXIV": only forms ending in II/III/IV/IX count, so a lone "I", "V" or "X" is
# left alone (as are "VI", "XI"). No IGNORECASE: the cleaners run this before lower-casing.
_ROMAN = re.compile(r"\b(?=[MDCLXVI]+\b)M{0,4}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{2,3})\b")
_ROMAN_VALUE = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
_TIMES = re.compile(r"(\b[0-9]+)(x)([0-9]+)")  # "2x3" -> "2 by 3"
_NUMBER_V2 = re.compile(r"[0-9]+'s|[0-9]+s|[0-9]+")  # "1920s", "80's", "42"


def _hundreds(value: int | str) -> str:
    """Amounts like 1200 are read "twelve hundred"; anything else as inflect writes it."""
    number = float(value)
    if 1000 < number < 10000 and number % 100 == 0 and number % 1000 != 0:
        return number_words(int(number / 100)) + " hundred"
    return number_words(value)


def expand_currency(m: re.Match[str]) -> str:
    """Replacement for CURRENCY_RE: "$3.50" -> "three dollars, fifty cents"."""
    unit = _CURRENCY_UNIT[m.group(1)]
    amount = m.group(2).replace(",", "")
    magnitude = m.group(3)
    if magnitude is not None:
        # a one-letter magnitude is spelled out; a word keeps the case it was written in
        magnitude = _SHORT_MAGNITUDE.get(magnitude.lower(), magnitude)
        if amount.count(".") > 1 or _too_long(amount):  # unreadable (DLE crashes)
            return f"{amount} {magnitude} {unit}s"
        return f"{_hundreds(amount)} {magnitude} {unit}s"
    parts = amount.split(".")
    if len(parts) > 2 or any(_too_long(p) for p in parts):  # "1.2.3": unreadable as money
        return f"{amount} {unit}s"
    whole = int(parts[0]) if parts[0] else 0
    # the fraction is read as an integer number of cents: "$3.5" gives "five cents" (as DLE)
    cents = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    whole_text = f"{_hundreds(whole)} {unit if whole == 1 else unit + 's'}"
    cents_text = f"{number_words(cents)} {'cent' if cents == 1 else 'cents'}"
    if whole and cents:
        return f"{whole_text}, {cents_text}"
    if whole:
        return whole_text
    if cents:
        return cents_text
    return f"zero {unit}s"


def _roman(m: re.Match[str]) -> str:
    numeral = m.group(0)
    total = 0
    for i, ch in enumerate(numeral):
        value = _ROMAN_VALUE[ch]
        # a symbol followed by a larger one is subtracted ("IV" = 5 - 1)
        if i + 1 < len(numeral) and value < _ROMAN_VALUE[numeral[i + 1]]:
            total -= value
        else:
            total += value
    return str(total)


def _times(m: re.Match[str]) -> str:
    return f"{m.group(1)} by {m.group(3)}"


def _number_v2(m: re.Match[str]) -> str:
    digits = re.match(r"[0-9]+", m.group(0))
    assert digits is not None  # _NUMBER_V2 always starts with a digit
    suffix = m.group(0)[digits.end() :]  # "", "s" or "'s"
    if _too_long(digits.group(0)):
        return _digit_by_digit(digits.group(0)) + suffix
    number = int(digits.group(0))
    if number > 1000 and number % 100 == 0 and number % 1000 != 0:
        text = number_words(number // 100) + " hundred"  # 1900 -> "nineteen hundred"
    elif 1000 < number < 3000:
        if number == 2000:
            text = "two thousand"
        elif 2000 < number < 2010:
            text = "two thousand " + number_words(number % 100)
        else:  # years in pairs: 1984 -> "nineteen eighty four", 1905 -> "nineteen oh five"
            text = number_words(number, andword="", zero="oh", group=2)
            text = text.replace(", ", " ").replace("-", " ")
    else:
        text = number_words(number, andword="and").replace("-", " ").replace(",", "")
    if suffix:  # plurals: "1920s" -> "nineteen twenties", "5's" -> "five's"
        text = text[:-1] + "ies" if text.endswith("y") else text + suffix
    return text


def normalize_numbers_v2(text: str) -> str:
    """FastPitch number expansion (runs before lower-casing: Roman numerals are still capitals)."""
    text = _DIGITS_WITH_COMMAS.sub(_drop_commas, text)
    text = CURRENCY_RE.sub(expand_currency, text)
    text = _DECIMAL.sub(_decimal_point, text)
    text = _ORDINAL.sub(_ordinal, text)
    text = _ROMAN.sub(_roman, text)
    text = _TIMES.sub(_times, text)
    return _NUMBER_V2.sub(_number_v2, text)


# --- v1 (Tacotron2) -----------------------------------------------------------------------------

_DOLLARS_V1 = re.compile(r"\$([0-9.,]*[0-9]+)")
_NUMBER_V1 = re.compile(r"[0-9]+")
# (Tacotron2 also has a "£N" -> "N pounds" rule, but its cleaner transliterates "£" away first, so
# it never fires; it is left out here.)


def _dollars_v1(m: re.Match[str]) -> str:
    """ "$3.50" -> "3 dollars, 50 cents": digits stay digits for the number rule that follows."""
    amount = m.group(1).replace(",", "")  # (DLE keeps the commas and crashes on "$,5")
    parts = amount.split(".")
    if len(parts) > 2 or any(_too_long(p) for p in parts):
        return amount + " dollars"
    dollars = int(parts[0]) if parts[0] else 0
    cents = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    dollars_text = f"{dollars} {'dollar' if dollars == 1 else 'dollars'}"
    cents_text = f"{cents} {'cent' if cents == 1 else 'cents'}"
    if dollars and cents:
        return f"{dollars_text}, {cents_text}"
    if dollars:
        return dollars_text
    if cents:
        return cents_text
    return "zero dollars"


def _number_v1(m: re.Match[str]) -> str:
    if _too_long(m.group(0)):
        return _digit_by_digit(m.group(0))
    number = int(m.group(0))
    if 1000 < number < 3000:
        if number == 2000:
            return "two thousand"
        if 2000 < number < 2010:
            return "two thousand " + number_words(number % 100)
        if number % 100 == 0:
            return number_words(number // 100) + " hundred"
        # hyphens stay: 2021 -> "twenty twenty-one"
        return number_words(number, andword="", zero="oh", group=2).replace(", ", " ")
    return number_words(number, andword="")  # 123 -> "one hundred twenty-three"


def normalize_numbers_v1(text: str) -> str:
    """Tacotron2 number expansion (runs after lower-casing)."""
    text = _DIGITS_WITH_COMMAS.sub(_drop_commas, text)
    text = _DOLLARS_V1.sub(_dollars_v1, text)
    text = _DECIMAL.sub(_decimal_point, text)
    text = _ORDINAL.sub(_ordinal, text)
    return _NUMBER_V1.sub(_number_v1, text)
