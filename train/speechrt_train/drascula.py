"""The spoken lines of Drascula: The Vampire Strikes Back (Debian `drascula`, the English
version), each with the words its text table gives it: a voice of speechrt_train.people.

    usr/share/scummvm/drascula/en/: NAME.ALS (a line's audio: 32-byte header, 8-bit unsigned
    PCM at 11,025 Hz, 32 bytes of tail) + drascula.dat (ScummVM's table of the game's texts)
    -> (name, WAV bytes, the line's English text, the speaker)

The engine plays PREFIX<i>.ALS while it shows text i of one table per speaker (ScummVM's
engines/drascula/talk.cpp): "12.ALS" says _text[12] (the hero), "D12.ALS" _textd[12] (the
count), and so on (TABLES). drascula.dat (version 6, big-endian) holds, after the engine's
other tables, 15 text tables, each as a count and per language a blob; text i of a blob
starts where the 16-bit length before it says (loadTexts in ScummVM's drascula.cpp).
"""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import numpy as np

GAME = "usr/share/scummvm/drascula/en"
RATE = 11025
# the .ALS prefix -> its speaker and the index of its table in drascula.dat
TABLES = {"": ("hero", 0), "D": ("drascula", 1), "B": ("drunk", 2), "BJ": ("bj", 3),
          "E": ("mus", 4), "I": ("igor", 5), "L": ("wolf", 6), "P": ("pianist", 7),
          "T": ("bartender", 8), "VB": ("vonbraun", 9)}  # fmt: skip
ELSEWHERE = {"D83"}  # played with another table's text (the trunk: _text[83])
# the engine's other tables before the texts: (bytes per record) each after a 16-bit count
RECORDS = (4, 4, 4, 2, 4, 2, 4, 2, 2, 20, 20, 10, 8)
FILE = re.compile(r"([A-Z]*)(\d+)\.ALS")
# not words, or no certain spoken form: a letter held ("NO WAYYYY", "UUUUM"), a number
# ("ROOM 512": "five twelve"?), or a line of nothing but sounds ("HA, HA, HA", "HIC")
UNCERTAIN = re.compile(r"([A-Z])\1\1|\d")
SOUNDS = {"AH", "AHH", "AAH", "EH", "HA", "HE", "HIC", "HM", "HMM", "HUH", "OH", "OOH", "UH", "UM",
          "JA", "JAMM", "BURP", "ARGH", "AAARGH", "PSST", "SHH", "UGH", "WOW"}  # fmt: skip


def texts(dat: bytes, lang: int = 0) -> list[list[str]]:
    """drascula.dat -> its 15 text tables in language `lang` (0: English)."""
    if dat[:9] != b"DRASCULA\x06":
        raise ValueError("not a version-6 drascula.dat")
    pos = 9

    def u16() -> int:
        nonlocal pos
        pos += 2
        return int(struct.unpack_from(">H", dat, pos - 2)[0])

    for size in RECORDS:
        count = u16()  # (not `pos += u16() * size`: that adds to pos as it was before)
        pos += count * size
    langs = u16()
    tables = []
    for _ in range(15):
        count = u16()
        for n in range(langs):
            size = u16()
            blob, pos = dat[pos : pos + size], pos + size
            if n == lang:
                starts, at = [0], 4  # text 0 is unused: the engine counts from 1
                for _ in range(1, count):
                    at += int(struct.unpack_from(">H", blob, at - 2)[0])
                    starts.append(at)
                tables.append([blob[s : blob.index(b"\0", s)].decode("latin-1") for s in starts])
    if pos != len(dat):
        raise ValueError("drascula.dat: unexpected layout")
    return tables


def wav(als: bytes) -> bytes:
    """An .ALS file -> WAV bytes (float, RATE)."""
    import soundfile as sf

    audio = (np.frombuffer(als[32:-32], np.uint8).astype(np.float32) - 128.0) / 128.0
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def spoken_lines(root: Path) -> list[tuple[str, bytes, str, str]]:
    """The unpacked package -> (name, WAV bytes, text, speaker) per line with a text of words
    (no number, no held letter, not only sounds)."""
    game = root / GAME
    tables = texts((game / "drascula.dat").read_bytes())
    out = []
    for f in sorted(game.glob("*.ALS")):
        m = FILE.fullmatch(f.name)
        if not m or m.group(1) not in TABLES or f.stem in ELSEWHERE:
            continue
        speaker, table = TABLES[m.group(1)]
        index = int(m.group(2))
        text = tables[table][index] if 0 < index < len(tables[table]) else ""
        if not set(re.findall(r"[A-Z']+", text.upper())) - SOUNDS or UNCERTAIN.search(text):
            continue
        out.append((f.stem, wav(f.read_bytes()), text, speaker))
    return out
