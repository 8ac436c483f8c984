"""The rewrite rules the English cleaners are built from (numbers live in numbers.py).

Each function takes and returns a string; `cleaners.py` chains them in DLE's order. Where DLE's
behaviour is odd it is kept (and said so): a model hears what it was trained on.
"""

from __future__ import annotations

import re

from unidecode import unidecode

# --- transliteration ----------------------------------------------------------------------------

# DLE transliterates with its own table; we use Unidecode, overridden to give DLE's result where
# the two disagree on characters likely in English text:
# - DLE reads umlauts the German way ("Müller" -> "Mueller") and maps "€" to "E", "¢" to "c";
# - DLE has no entry for the signs below and drops them, where Unidecode would write letters,
#   digits or punctuation the model then reads aloud ("£" -> "PS", "§" -> "SS", "°" -> "deg",
#   "½" -> " 1/2", "¿" -> "?", "…" -> "...", "‰" -> "%0"). Currency amounts like "£5" are expanded
#   before this runs (processor.py), so "£5" still reads "five pounds".
# - One deliberate difference: DLE also drops em dashes, fusing "wait—what" into "waitwhat";
#   here they become a space, which gives DLE's result whenever the dash has spaces around it.
_DROPPED = "¡£¤¦§©«¬®¯°±²³¶·¹»¼½¾¿÷‖‗„†‡•‣‥…‧‰‱″‴‶‷‸※‼‾‿⁀⁂⁅⁆⁇⁈⁉⁊⁋⁌⁍⁒⁗₤₪₻₼₾™"
_ASCII_OVERRIDES = str.maketrans(
    {
        "ä": "ae", "ö": "oe", "ü": "ue", "Ä": "Ae", "Ö": "Oe", "Ü": "Ue",
        "€": "E", "¢": "c", "¥": "Y", "—": " ", "―": " ",
        **{ch: "" for ch in _DROPPED},
    }
)  # fmt: skip


def to_ascii(text: str) -> str:
    """Fold to ASCII: "café" -> "cafe", curly quotes -> straight ones, "naïve" -> "naive"."""
    if text.isascii():
        return text
    return unidecode(text.translate(_ASCII_OVERRIDES))


# --- times: "10:30am" -> "10 30 a.m.", "7 PM" -> "7 p.m.", "9:00pm" -> "9 p.m." -------------------

_AM_PM = re.compile(r"([0-9]|0[0-9]|1[0-9]|2[0-3]):?([0-5][0-9])?\s*([AaPp][Mm]\b)")


def _am_pm(m: re.Match[str]) -> str:
    hour, minutes, suffix = m.group(1), m.group(2), m.group(3)
    text = hour if minutes is None or int(minutes) == 0 else f"{hour} {minutes}"
    return text + (" a.m." if suffix[0] in "Aa" else " p.m.")


def expand_times(text: str) -> str:
    return _AM_PM.sub(_am_pm, text)


# --- letters next to numbers: units, dimensions, "A100", "mp3" ----------------------------------

_UNIT = re.compile(r"([0-9]+(?:[.,][0-9]+)?)(?:\s?)(tb|gb|mb|kb|ghz|mhz|khz|hz|mm)", re.IGNORECASE)
_UNIT_WORD = {
    "tb": "terabyte", "gb": "gigabyte", "mb": "megabyte", "kb": "kilobyte",
    "ghz": "gigahertz", "mhz": "megahertz", "khz": "kilohertz", "hz": "hertz", "mm": "millimeter",
}  # fmt: skip
_NUM = r"\d+(?:[,.]\d+)?"
_DIMENSIONS = re.compile(
    rf"\b({_NUM}\s*[xX]\s*{_NUM}\s*[xX]\s*{_NUM}(?:in|inch|m)?)\b"
    rf"|\b({_NUM}\s*[xX]\s*{_NUM}(?:in|inch|m)?)\b"
)
_MIXED = re.compile(r"((?:[a-zA-Z]+[0-9]|[0-9]+[a-zA-Z])[a-zA-Z0-9']*)", re.IGNORECASE)
_NUMBER_SUFFIXES = ("'s", "s", "th", "nd", "st", "rd")


def _unit(m: re.Match[str]) -> str:
    amount, unit = m.group(1), _UNIT_WORD[m.group(2).lower()]
    # "16gb" -> "16 gigabytes"; hertz never takes an "s"
    if not unit.endswith("z") and float(amount.replace(",", "")) > 1:
        unit += "s"
    return f"{amount} {unit}"


def _dimensions(m: re.Match[str]) -> str:
    text = m.group(1) or m.group(2)
    # only a lower-case "x" becomes "by" (as DLE); "2X3" stays
    text = text.replace(" x ", " by ").replace("x", " by ")
    if text.endswith("m") and text[-2].isdigit():
        text = text[:-1] + " meter"
    elif text.endswith("in") and text[-3].isdigit():
        text = text[:-2] + " inch"
    # ("...inch" is left glued to its number, as in DLE)
    return text


def _split_digits(digits: str) -> list[str]:
    """How DLE reads digit runs inside words: "2021" -> 20 21, "105" -> 1 0 5, "100" -> 100."""
    if len(digits) >= 5:
        return [digits]
    if len(digits) > 2 and digits[-2] == "0":
        return [digits] if digits[-1] == "0" else [digits[:-2], digits[-2], digits[-1]]
    if len(digits) % 2 == 0:
        return [digits[i : i + 2] for i in range(0, len(digits), 2)]
    if len(digits) > 2:
        return [digits[0]] + [digits[i : i + 2] for i in range(1, len(digits), 2)]
    return [digits]


def _mixed(m: re.Match[str]) -> str:
    parts = re.split(r"(\d+)", m.group(0))
    # the split leaves an empty string at one end (or both); DLE drops only one of them
    if parts[-1] == "":
        parts.pop()
    elif parts[0] == "":
        parts.pop(0)
    # keep "1920s", "AK47's", "5th" together for the number rules
    if parts[-1] in _NUMBER_SUFFIXES and parts[-2].isdigit():
        parts[-2:] = [parts[-2] + parts[-1]]
    words: list[str] = []
    for part in parts:
        words.extend(_split_digits(part) if part.isdigit() else [part])
    return " ".join(words)


def expand_letters_and_numbers(text: str) -> str:
    text = _UNIT.sub(_unit, text)
    text = _DIMENSIONS.sub(_dimensions, text)
    return _MIXED.sub(_mixed, text)


# --- abbreviations ------------------------------------------------------------------------------


def _abbreviation_table(pairs: str) -> list[tuple[re.Pattern[str], str]]:
    table = []
    for pair in pairs.split(","):
        short, long = pair.split("=")
        table.append((re.compile(rf"\b{short.strip()}\.", re.IGNORECASE), long.strip()))
    return table


# Order matters only where one form is a prefix of another followed by "." (mrs/ms/mr).
_TITLES = (
    "mrs=misess, ms=miss, mr=mister, dr=doctor, st=saint, co=company, jr=junior, maj=major, "
    "gen=general, drs=doctors, rev=reverend, lt=lieutenant, hon=honorable, sgt=sergeant, "
    "capt=captain, esq=esquire, ltd=limited, col=colonel, ft=fort"
)
_ABBREVIATIONS_V1 = _abbreviation_table(_TITLES.replace("ms=miss, ", ""))
_ABBREVIATIONS_V2 = _abbreviation_table(_TITLES + ", sen=senator, etc=et cetera")

_NUMBER_SIGN = re.compile(r"No\.(?=[ ]?[0-9])")  # "No. 5" -> "Number 5" (capital "No" only)
_PERCENT = re.compile(r"[ ]?%")
_WEB_DOMAIN = re.compile(r"([a-zA-Z])\.(com|gov|org)")
# (DLE v2 also reads "½" as "and a half", but its transliteration has removed "½" by then.)


def expand_abbreviations_v1(text: str) -> str:
    """Tacotron2: titles only ("dr." -> "doctor"); expects lower-case text."""
    for pattern, replacement in _ABBREVIATIONS_V1:
        text = pattern.sub(replacement, text)
    return text


def expand_abbreviations_v2(text: str) -> str:
    """FastPitch: "No. 5", "%", "&", "@", "x.com", then titles ("Dr." -> "doctor")."""
    text = _NUMBER_SIGN.sub("Number", text)
    text = _PERCENT.sub(" percent", text)
    text = text.replace("&", " and ").replace("@", " at ")
    text = _WEB_DOMAIN.sub(r"\1 dot \2", text)
    for pattern, replacement in _ABBREVIATIONS_V2:
        text = pattern.sub(replacement, text)
    return text


# --- acronyms: "GPU" -> "G.P.U.", "GPUs" -> "G.P.U.'s", "NVIDIA" -> "N.VIDIA" ---------------------

_EMAIL = re.compile(r"\bemail\b", re.IGNORECASE)
# two or more capitals, optionally after lower-case letters ("iOS") and before "s" and/or "."
_ACRONYM = re.compile(r"([a-z]*[A-Z][A-Z]+)s?\.?")
_ACRONYM_SPELLING = {"NVIDIA": "N.VIDIA"}


def _spell(m: re.Match[str]) -> str:
    letters, whole = m.group(1), m.group(0)
    text = _ACRONYM_SPELLING.get(letters) or ".".join(letters) + "."
    # DLE tests for an "s" anywhere in the match, so a lower-case prefix with an "s" counts too
    if "s" in whole:
        text += "'s"
    # a full stop eaten by the match is put back unless the spelling already ends in one
    if whole.endswith(".") and not text.endswith("."):
        text += "."
    return text


def spell_acronyms(text: str) -> str:
    text = _EMAIL.sub("e-mail", text)
    return _ACRONYM.sub(_spell, text)
