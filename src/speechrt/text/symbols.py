"""Symbol sets: the ordered lists whose positions are the ids an acoustic model's embedding sees.

The orders below are those of the DLE checkpoints (FastPitch `common/text/symbols.py`, Tacotron2
`tacotron2/text/symbols.py`); changing one position breaks every published model.
"""

from __future__ import annotations

from speechrt.errors import SpeechRTError

# The 84 ARPAbet phones (with stress digits 0/1/2 on vowels) of the CMU Pronouncing Dictionary,
# in the order DLE appends them to every symbol set.
_ARPABET_TEXT = """
    AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2
    B CH D DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2
    JH K L M N NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2
    V W Y Z ZH
"""
ARPABET: tuple[str, ...] = tuple(_ARPABET_TEXT.split())

# ARPAbet symbols carry an "@" so that e.g. "@B" never collides with the letter "B".
ARPABET_PREFIX = "@"

_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_PHONES = [ARPABET_PREFIX + p for p in ARPABET]

# name -> (characters in id order, then the ARPAbet block)
_CHARACTERS: dict[str, str] = {
    # pad "_" = 0, "-" = 1, punctuation 2..11 (space = 11), A-Z 12..37, a-z 38..63, ARPAbet 64..147
    "english_basic": "_" + "-" + "!'(),.:;? " + _UPPER + _LOWER,
    # as english_basic with a double quote and no capitals: 123 symbols
    "english_basic_lowercase": "_" + "-" + "!'\"(),.:;? " + _LOWER,
    # no pad symbol at 0 (DLE never trained a model with it): 175 symbols
    "english_expanded": "!'\",.:;? " + "#%&*+-/[]()" + "_@©°½—₩€$" + "áçéêëñöøćž" + _UPPER + _LOWER,
}

SYMBOL_SETS: tuple[str, ...] = tuple(_CHARACTERS)


def get_symbols(name: str = "english_basic") -> list[str]:
    """The symbols of set `name`; a symbol's index in the list is its id."""
    if name not in _CHARACTERS:
        raise SpeechRTError(f"unknown symbol set {name!r}; known: {', '.join(SYMBOL_SETS)}")
    return list(_CHARACTERS[name]) + list(_PHONES)


def is_speech_symbol(symbol: str) -> bool:
    """True for symbols that are pronounced: letters and ARPAbet phones (not punctuation/space)."""
    return symbol.isalpha() or (symbol.startswith(ARPABET_PREFIX) and len(symbol) > 1)
