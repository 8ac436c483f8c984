"""The spoken lines of Beneath a Steel Sky (Debian `beneath-a-steel-sky`, the CD version 0.0372),
each with the game's own English text for it: a voice of speechrt_train.people.

    usr/share/scummvm/beneath-a-steel-sky/: sky.dnr (the index) + sky.dsk (the files, some
    RNC-packed) -> text sections (Huffman-coded) + one speech file per line (8-bit PCM)
    -> (name, WAV bytes, the line's English text, "bass")

The engine says text N (N >> 12: its section, N & 0xFFF: its place in it) by playing disk file
SPEECH + FIRST_SPEECH[N >> 12] + (N & 0xFFF) (ScummVM's engines/sky/sound.cpp, startSpeech), so
a line's words and its audio are found from the same number. Which character says a line is
set by the game's scripts, not by either file: every line is the one speaker label "bass".
"""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import numpy as np

GAME = "usr/share/scummvm/beneath-a-steel-sky"
RATE = 11025
HEADER = 22  # every disk file starts with 11 little-endian 16-bit words (ScummVM's struc.h)
TEXTS = 60600  # the English text of section s: file TEXTS + s
SPEECH = 50000
FIRST_SPEECH = (0, 600, 1100, 2430, 3380, 4530, 5080, 5230)  # section -> its first speech file
SPEAKER = "bass"
FILES = 5097  # sky.dnr's count in version 0.0372, the version whose text code is below

# The game's text code (version 0.0372; the tree ships in the engine, not in the data): its
# leaves in code order, left (bit 0) first, with each leaf's code length (base 17, g = 16).
# A byte over 127 is a letter of another language's text.
LEAF_BYTES = (b" eaostn.ir\0EumAlIdRNSTOhcDgLCpU!yMPvH?b'f,GBVkFqwK-WJ*zYj+Q\x85)Z\x8b<\x95~\x8a"
              b"\x87:\x7f]#xX\x91\x88`20\x831/(=\x86^39\x984}8\\\"\x90&\x8d56\x92\x8f\x8e\x93"
              b"\x8c7\x80\x81\x99$@[\x9a_>\x96\x82%\t\x9c\x97{\x94!")  # fmt: skip
LEAF_DEPTHS = ("3445555554665556666665776667777776887778877799888998889999aa9aa9bbaaabbabbaccbccb"
               "ccbbbccccddcccddddddddeedeeeeffeeeffefffgg")  # fmt: skip

# not words, or no certain spoken form: a number ("WD40"), a letter held ("Hmmm", "SSSHHH"),
# a word said in syllables ("EX-TER-MIN-ATE"), or a line of nothing but sounds ("Uh-huh?")
UNCERTAIN = re.compile(r"([A-Za-z])\1\1|\d|\w-\w+-\w")
SOUNDS = {"AH", "AHH", "AAH", "AARGH", "ARGH", "EH", "ER", "ERM", "HA", "HAH", "HE", "HEH", "HM",
          "HMM", "HUH", "MM", "MMM", "OH", "OHH", "OOH", "OW", "OUCH", "PHEW", "SHH", "TSK",
          "UGH", "UH", "UM", "UMM", "WOW", "ZZZ", "MMF", "M'PHUG"}  # fmt: skip


def index(dnr: bytes) -> dict[int, tuple[int, int, int]]:
    """sky.dnr -> {file number: (offset in sky.dsk, stored size, flags)}: a 32-bit count, then
    8 bytes a file (16-bit number, 24-bit offset, 24-bit size and flags; little-endian)."""
    (count,) = struct.unpack_from("<I", dnr)
    if len(dnr) != 4 + 8 * count:
        raise ValueError("not a sky.dnr")
    out = {}
    for at in range(4, 4 + 8 * count, 8):
        (number,) = struct.unpack_from("<H", dnr, at)
        offset = int.from_bytes(dnr[at + 2 : at + 5], "little")
        word = int.from_bytes(dnr[at + 5 : at + 8], "little")
        if offset & 0x800000:  # the offset counts 16-byte units
            offset = (offset & 0x7FFFFF) << 4
        out[number] = (offset, word & 0x3FFFFF, word >> 22)
    return out


def load(dsk: bytes, entry: tuple[int, int, int]) -> bytes:
    """One file of sky.dsk: flags bit 1 set: stored as is; else, when its header's flag word
    has bit 7, its body (or the whole file, flags bit 0) is RNC-packed after the header."""
    offset, size, flags = entry
    data = dsk[offset : offset + size]
    if flags & 2 or not data[0] & 0x80 or data[HEADER : HEADER + 4] != b"RNC\x01":
        return data
    body = rnc_unpack(data[HEADER:])
    return body if flags & 1 else data[:HEADER] + body


class _Bits:
    """RNC's bit stream: 16-bit little-endian words, each read low bit first and only when a
    bit of it is needed; the literal bytes of a run sit in the stream where the next word
    would be."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at, self.value, self.count = data, at, 0, 0

    def take(self, n: int) -> int:
        while self.count < n:
            word = int.from_bytes(self.data[self.at : self.at + 2], "little")
            self.value |= word << self.count
            self.at, self.count = self.at + 2, self.count + 16
        out = self.value & ((1 << n) - 1)
        self.value >>= n
        self.count -= n
        return out

    def peek(self, n: int) -> int:
        """The next n bits, left unread."""
        value, count, at = self.value, self.count, self.at
        while count < n:
            value |= int.from_bytes(self.data[at : at + 2], "little") << count
            at, count = at + 2, count + 16
        return value & ((1 << n) - 1)

    def table(self) -> list[tuple[int, int] | None]:
        """A Huffman table as sent: up to 31 symbols, a 4-bit code length each (0: unused),
        codes canonical by (length, symbol), sent first bit high -> for each value of the
        next `width` bits as read (width: the longest code), (symbol, its code's length)."""
        lengths = [self.take(4) for _ in range(self.take(5))]
        width = max(lengths, default=0)
        out: list[tuple[int, int] | None] = [None] * (1 << width)
        code = 0
        for length in range(1, 17):
            for symbol, n in enumerate(lengths):
                if n == length:
                    first = int(format(code >> (16 - n), f"0{n}b")[::-1], 2)
                    for low in range(first, 1 << width, 1 << n):
                        out[low] = (symbol, n)
                    code += 1 << (16 - n)
        return out

    def number(self, table: list[tuple[int, int] | None]) -> int:
        """A symbol of `table`; symbol s >= 2 stands for 2**(s-1) plus s-1 more bits."""
        entry = table[self.peek(len(table).bit_length() - 1)]
        if entry is None:
            raise ValueError("RNC: bad Huffman code")
        symbol, n = entry
        self.take(n)
        return symbol if symbol < 2 else (1 << (symbol - 1)) | self.take(symbol - 1)


def _crc_table() -> list[int]:
    out = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
        out.append(crc)
    return out


CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray) -> int:
    """RNC's check: CRC-16 with the reflected polynomial 0xA001, starting at 0."""
    crc = 0
    for byte in data:
        crc = (crc >> 8) ^ CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc


def rnc_unpack(packed: bytes) -> bytes:
    """An RNC method-1 file ("RNC\\x01", unpacked and packed sizes, their CRCs, 2 more bytes,
    then the bit stream) -> its bytes: per chunk, three Huffman tables (literal run lengths,
    match distances, match lengths), a 16-bit count of steps, each step a run of literal
    bytes and then (but the last) a match: copy `length` bytes from `distance` back."""
    if packed[:4] != b"RNC\x01":
        raise ValueError("not an RNC method-1 file")
    size, packed_size, crc, packed_crc = struct.unpack_from(">IIHH", packed, 4)
    if crc16(packed[18 : 18 + packed_size]) != packed_crc:
        raise ValueError("RNC: packed data damaged")
    bits, out = _Bits(packed, 18), bytearray()
    bits.take(2)  # (two flag bits, not needed to unpack)
    for _ in range(packed[17]):
        runs, distances, lengths = bits.table(), bits.table(), bits.table()
        steps = bits.take(16)
        for step in range(steps, 0, -1):
            run = bits.number(runs)
            out += packed[bits.at : bits.at + run]
            bits.at += run
            if step > 1:
                back = bits.number(distances) + 1
                for _ in range(bits.number(lengths) + 2):  # may overlap what it writes
                    out.append(out[-back])
    if len(out) != size or crc16(out) != crc:
        raise ValueError("RNC: unpacked data damaged")
    return bytes(out)


def _tree() -> dict[str, int]:
    """{code as a string of bits: byte} from LEAF_DEPTHS and LEAF_BYTES."""
    codes, code, depth = {}, 0, 0
    for byte, c in zip(LEAF_BYTES, LEAF_DEPTHS, strict=True):
        n = int(c, 17)
        code = code << (n - depth) if n >= depth else code >> (depth - n)
        codes[format(code, f"0{n}b")] = byte
        code, depth = code + 1, n
    return codes


def section_texts(chunk: bytes) -> list[str]:
    """A text section -> its texts, in number order. The section starts with two 16-bit
    offsets (to the texts' skip bytes, one a text; to the bit stream), then the 16-bit size
    of each block of 32 texts but the last; text i begins at the sizes of the blocks before
    its own plus the skips of the texts before it in its block (a skip byte with bit 7 set
    counts 8 times its low 7 bits), all in 2-bit units, and ends at a 0 byte."""
    skips_at, stream_at = struct.unpack_from("<HH", chunk)
    sizes = struct.unpack_from(f"<{(skips_at - 4) // 2}H", chunk, 4)
    codes, bits = _tree(), "".join(format(b, "08b") for b in chunk[stream_at:])
    out, start = [], 0
    for i, skip in enumerate(chunk[skips_at:stream_at]):
        if i % 32 == 0:
            start = sum(sizes[: i // 32])
        at, text, code = 2 * start, bytearray(), ""
        while at < len(bits) and (not text or text[-1]):
            code += bits[at]
            at += 1
            if code in codes:
                text.append(codes[code])
                code = ""
        out.append(text[:-1].decode("latin-1"))
        start += (skip & 0x7F) << 3 if skip & 0x80 else skip
    return out


def wav(speech: bytes) -> bytes:
    """A speech file (header, then 8-bit unsigned PCM at RATE) -> WAV bytes (float)."""
    import soundfile as sf

    audio = (np.frombuffer(speech[HEADER:], np.uint8).astype(np.float32) - 128.0) / 128.0
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def certain(text: str) -> bool:
    """Whether a line's text is words with one spoken form: no number, no held letter, not
    only sounds."""
    words = set(re.findall(r"[A-Z']+", text.upper())) - {"'"}
    return bool(words - SOUNDS) and not UNCERTAIN.search(text)


def spoken_lines(root: Path) -> list[tuple[str, bytes, str, str]]:
    """The unpacked package -> (name: the text number, WAV bytes, text, SPEAKER) per spoken
    line whose text is `certain`."""
    game = root / GAME
    files, dsk = index((game / "sky.dnr").read_bytes()), (game / "sky.dsk").read_bytes()
    if len(files) != FILES:
        raise ValueError(f"sky.dnr lists {len(files)} files, not version 0.0372's {FILES}")
    out = []
    for section, first in enumerate(FIRST_SPEECH):
        for i, text in enumerate(section_texts(load(dsk, files[TEXTS + section]))):
            speech = files.get(SPEECH + first + i)
            if speech is not None and certain(text):
                text = text.replace("`", "'")  # (the game opens a quotation with a backtick)
                out.append((str(section << 12 | i), wav(load(dsk, speech)), text, SPEAKER))
    return out
