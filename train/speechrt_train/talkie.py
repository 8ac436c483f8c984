"""Flight of the Amazon Queen's talkie: the game's voice actors' lines with the script's words.

Debian's `flight-of-the-amazon-queen` (freeware: free to give away and to modify) ships the CD
version's data as one archive, queen.1c, holding every spoken line as a short MP3 (11,025 Hz,
mono) and the scripts those lines were recorded from. About 6,600 lines, 4.5 hours, 13 actors
playing about 40 characters; the main character, Joe, speaks about a third of them. Read from
the format alone (nothing of a game engine is used):

    queen.1c: "QTBL", 6-byte version, 2 bytes, compression id (1 = MP3), u16 count, then per
        file: 12-byte name, u8 bundle, u32 offset, u32 size (big-endian throughout)
    NAME.DOG (a conversation) / NAME.CUT (a cut-scene) / QUEEN.JAS + QUEEN2.JAS (Joe's
        descriptions and stock replies): the script's sentences
    a sentence, split at its stage commands ("*" + 2 characters, "*XY" + 11 more), is spoken
        as pieces 1, 2, ...; piece k of a sentence is the clip PREFIX + hex(k) + ".SB", the
        prefix made from the script's numbers (`dog_lines`, `cut_lines`, `jas_lines`)

The script is what the actors read; a recording may stray from it (an ad-lib, a name spelled
out), and nobody here has listened. `people` keeps the pairs whose length in characters per
second of audio is a speaking rate's.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

ARCHIVE = "usr/share/scummvm/flight-of-the-amazon-queen/queen.1c"
JOE_RESPONSES = 40  # QUEEN2.JAS's stock replies ("I can't do that."), after 12 verb names


@dataclass(frozen=True)
class Line:
    prefix: str  # the clip name without the piece number
    sentence: str  # as the script writes it, stage commands included
    speaker: str  # the character (JOE) or the scene


def read_table(archive: bytes) -> dict[str, tuple[int, int]]:
    """queen.1c's file table -> {NAME: (offset, size)}."""
    if archive[:4] != b"QTBL":
        raise ValueError("not a queen.1c archive (no QTBL table)")
    (count,) = struct.unpack_from(">H", archive, 13)
    table = {}
    for i in range(count):
        name, _bundle, offset, size = struct.unpack_from(">12sBII", archive, 15 + 21 * i)
        table[name.split(b"\0")[0].decode("ascii")] = (offset, size)
    return table


def _string(data: bytes, offset: int, align: int) -> tuple[str, int]:
    """A length-prefixed Latin-1 string at `offset` -> (it, the next offset, aligned)."""
    n = data[offset]
    if n == 0:
        return "", offset + 1
    end = offset + 1 + n
    return data[offset + 1 : end].decode("latin-1"), (end + align - 1) & ~(align - 1)


def pieces(sentence: str) -> list[tuple[int, str]]:
    """A sentence split at its stage commands -> [(piece number from 1, its words)]."""
    out, k = [], 1
    for part in re.split(r"\*XY.{11}|\*..", sentence, flags=re.S):
        out.append((k, part))
        k += 1
    return out


def clip_name(prefix: str, piece: int) -> str:
    return f"{prefix}{piece:x}".replace(" ", "0").upper() + ".SB"


def dog_lines(name: str, data: bytes) -> list[Line]:
    """A conversation: Joe's options, the other person's answers, and the two lines said when
    Joe comes back. After a 20-byte header: i16 level count, unique key, talk key, Joe's and
    the person's line counts, ...; u16 offsets of the person's list (at 22) and of the return
    lines (at 26); Joe's list at 32 + 96 x levels. List entries: 2 bytes, i16 id, string
    (aligned to 4)."""
    d = data[20:]
    levels, _, key, joe_n, person_n = struct.unpack_from(">5h", d, 0)
    person_at, _, again_at = struct.unpack_from(">3H", d, 22)
    person = re.sub(r"\d+$", "", name.removesuffix(".DOG"))
    out = []
    for at, count, tag, who in ((32 + 96 * abs(levels), joe_n, "J", "JOE"),
                                (person_at, person_n, "P", person)):  # fmt: skip
        for _ in range(count):
            (ident,) = struct.unpack_from(">h", d, at + 2)
            text, at = _string(d, at + 4, 4)
            if text:
                code = "SSSS" if tag == "J" and ident == 0 else f"{ident & 0xFFFF:4x}"
                out.append(Line(f"{key:2d}{code}{tag}", text, who))
    first, at = _string(d, again_at, 2)
    second, _ = _string(d, at, 2)
    out += [Line(f"{key:2d}XXXXP", first, person)] if first else []
    out += [Line(f"{key:2d}XXXXJ", second, "JOE")] if second else []
    return out


def cut_lines(name: str, data: bytes) -> list[Line]:
    """A cut-scene: i16 object count at 22 and u16 offset of its sentences at 28 (from the
    header's end); the first sentence sets the scene, then object k says sentence k."""
    d = data[20:]
    count = abs(struct.unpack_from(">h", d, 2)[0])
    (at,) = struct.unpack_from(">H", d, 8)
    base = name.removesuffix(".CUT")
    prefix = base + "_" * max(0, 5 - len(base))
    _, at = _string(d, at, 2)
    out = []
    for k in range(1, count + 1):
        if at >= len(d):
            break
        text, at = _string(d, at, 2)
        if text and text != "*" and not text.startswith("#"):
            out.append(Line(f"{prefix}{k:02d}"[: len(prefix) + 2], text, f"cut:{base}"))
    return out


def jas_lines(jas: bytes, jas2: bytes) -> list[Line]:
    """Joe's object descriptions (JOE{40 + n}) and stock replies (JOE{n}): QUEEN.JAS counts the
    rooms, names, objects and descriptions (u16 at 20); QUEEN2.JAS lists descriptions, names,
    rooms, 12 verbs and the replies, one a CRLF line."""
    rooms, names, _, descriptions = struct.unpack_from(">4H", jas, 20)
    text = jas2.decode("latin-1").split("\r\n")
    out = [
        Line(f"JOE{JOE_RESPONSES + n:04d}", text[n - 1], "JOE") for n in range(1, descriptions + 1)
    ]
    replies = descriptions + names + rooms + 12
    out += [Line(f"JOE{n:04d}", text[replies + n - 1], "JOE") for n in range(1, JOE_RESPONSES + 1)]
    return out


def spoken_lines(archive: bytes) -> list[tuple[str, bytes, str, str]]:
    """Every clip the scripts account for -> [(clip name, its MP3 bytes, words, speaker)], each
    clip once (the first sentence that names it)."""
    table = read_table(archive)

    def file(name: str) -> bytes:
        offset, size = table[name]
        return archive[offset : offset + size]

    lines = []
    for name in sorted(table):
        if name.endswith(".DOG"):
            lines += dog_lines(name, file(name))
        elif name.endswith(".CUT"):
            lines += cut_lines(name, file(name))
    lines += jas_lines(file("QUEEN.JAS"), file("QUEEN2.JAS"))
    out, seen = [], set()
    for line in lines:
        for k, words in pieces(line.sentence):
            clip = clip_name(line.prefix, k)
            words = " ".join(words.split())
            if words and clip in table and clip not in seen:
                seen.add(clip)
                out.append((clip.removesuffix(".SB"), file(clip), words, line.speaker))
    return out
