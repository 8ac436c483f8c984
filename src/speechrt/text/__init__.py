"""English text front end: normalisation and symbol ids for the DLE TTS models.

Imports no torch (checked by a test), so clients and the ONNX runtime can use it alone.

    tp = TextProcessor.from_meta(info.meta)     # symbol set, cleaners, p_arpabet of a model
    for sentence in split_sentences(text):
        ids = tp.encode(sentence)               # list[int]; SpeechRTError if nothing speakable
"""

from speechrt.text.cleaners import CLEANERS, clean_text
from speechrt.text.cmudict import CMUDict, load_dictionary
from speechrt.text.processor import FRONTENDS, TextProcessor
from speechrt.text.sentences import DEFAULT_MAX_CHARS, split_sentences
from speechrt.text.symbols import ARPABET, SYMBOL_SETS, get_symbols

__all__ = [
    "ARPABET",
    "CLEANERS",
    "CMUDict",
    "DEFAULT_MAX_CHARS",
    "FRONTENDS",
    "SYMBOL_SETS",
    "TextProcessor",
    "clean_text",
    "get_symbols",
    "load_dictionary",
    "split_sentences",
]
