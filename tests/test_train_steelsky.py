"""speechrt_train.steelsky on a small Beneath a Steel Sky made here: an RNC packer, a Huffman
text section and a sky.dnr/sky.dsk pair written by the tests, checked against exact outputs."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from speechrt_train import steelsky


class _BitWriter:
    """RNC's stream as the reader takes it: a 16-bit word is placed where the output ends when
    its first bit is written; literal bytes go where the output ends."""

    def __init__(self) -> None:
        self.out, self.word_at, self.used = bytearray(), -1, 16

    def bits(self, value: int, n: int) -> None:  # low bit first
        for i in range(n):
            if self.used == 16:
                self.word_at, self.used = len(self.out), 0
                self.out += b"\0\0"
            word = int.from_bytes(self.out[self.word_at : self.word_at + 2], "little")
            word |= ((value >> i) & 1) << self.used
            self.out[self.word_at : self.word_at + 2] = word.to_bytes(2, "little")
            self.used += 1

    def number(self, value: int) -> None:
        """`value` under a table of 16 symbols, 4 bits each (symbol i: code i, high bit first)."""
        symbol = value if value < 2 else value.bit_length()
        for shift in (3, 2, 1, 0):
            self.bits(symbol >> shift, 1)
        if symbol >= 2:
            self.bits(value - (1 << (symbol - 1)), symbol - 1)


def _rnc(steps: list[tuple[bytes, int, int]], unpacked: bytes) -> bytes:
    """One chunk of steps (literal bytes, match distance, match length; the last step's match
    is not sent) -> an RNC method-1 file."""
    w = _BitWriter()
    w.bits(0, 2)
    for _ in range(3):  # literal runs, distances, lengths: every symbol 4 bits long
        w.bits(16, 5)
        for _ in range(16):
            w.bits(4, 4)
    w.bits(len(steps), 16)
    for i, (literal, distance, length) in enumerate(steps):
        w.number(len(literal))
        w.out += literal
        if i < len(steps) - 1:
            w.number(distance - 1)
            w.number(length - 2)
    sizes = struct.pack(">IIHH", len(unpacked), len(w.out), steelsky.crc16(unpacked),
                        steelsky.crc16(bytes(w.out)))  # fmt: skip
    return b"RNC\x01" + sizes + b"\0\x01" + bytes(w.out)


def test_crc16_is_rncs() -> None:
    assert steelsky.crc16(b"123456789") == 0xBB3D  # CRC-16/ARC's check value


def test_rnc_unpack_copies_runs_and_matches() -> None:
    want = b"abcdefgh" * 6 + bytes(range(40)) + bytes([39]) * 19 + b"!"
    steps = [(b"abcdefgh", 8, 40), (bytes(range(40)), 1, 19), (b"!", 0, 0)]
    # the second run's 40 bytes start where a word ends (bit 256 of the stream): they sit
    # right after it, no further word read ahead
    packed = _rnc(steps, want)
    assert steelsky.rnc_unpack(packed) == want
    damaged = packed[:-1] + bytes([packed[-1] ^ 1])
    with pytest.raises(ValueError, match="damaged"):
        steelsky.rnc_unpack(damaged)


def test_the_game_text_code() -> None:
    codes = {byte: code for code, byte in steelsky._tree().items()}
    assert codes[ord(" ")] == "000"
    assert codes[ord("e")] == "0010"
    assert codes[ord("o")] == "01000"
    assert codes[0] == "100000"
    assert codes[ord("H")] == "1110001"


def _section(texts: list[str]) -> bytes:
    """A text section: each text's code padded to whole 2-bit units (to 16 bits past 127 units,
    which its skip byte then counts in eights); 3 units of padding after each full block."""
    codes = {byte: code for code, byte in steelsky._tree().items()}
    stream, skips, sizes = "", bytearray(), []
    for i, text in enumerate(texts):
        bits = "".join(codes[b] for b in text.encode("latin-1") + b"\0")
        units = -(-len(bits) // 2)
        if units > 127:
            units = -(-units // 8) * 8
            skips.append(0x80 | units // 8)
        else:
            skips.append(units)
        stream += bits.ljust(2 * units, "0")
        if i % 32 == 0:
            sizes.append(0)
        sizes[-1] += units
        if i % 32 == 31:
            stream += "000000"
            sizes[-1] += 3
    stream = stream.ljust(-(-len(stream) // 8) * 8, "0")
    sizes_out = struct.pack(f"<{len(sizes) - 1}H", *sizes[:-1])
    skips_at = 4 + len(sizes_out)
    head = struct.pack("<HH", skips_at, skips_at + len(skips)) + sizes_out + bytes(skips)
    return head + int(stream, 2).to_bytes(len(stream) // 8, "big")


def test_section_texts_finds_every_text_by_its_skips() -> None:
    texts = ["?", "Hey" + "!" * 60, *(f"Line {'x' * (i % 7)} here." for i in range(40))]
    assert steelsky.section_texts(_section(texts)) == texts


def _disk_file(body: bytes, pack: bool) -> bytes:
    """A disk file: the 22-byte header (flag word bit 7: packed; word 6: the whole size), its
    body RNC-packed or not."""
    header = struct.pack("<11H", 0x80 if pack else 0, 0, 0, 0, 0, 0, 22 + len(body), 0, 0, 0, 0)
    return header + (_rnc([(body, 0, 0)], body) if pack else body)


def _game(root: Path, files: dict[int, tuple[bytes, int]]) -> None:
    """sky.dnr + sky.dsk holding {number: (bytes, flags)} and as many empty files as version
    0.0372 lists; odd numbers at a byte offset, even ones at a 16-byte unit."""
    files = {**{n: (b"", 2) for n in range(1, 1 + steelsky.FILES - len(files))}, **files}
    dsk, entries = bytearray(), b""
    for number, (data, flags) in files.items():
        if number % 2 == 0:
            dsk += b"\0" * (-len(dsk) % 16)
            offset = 0x800000 | len(dsk) >> 4
        else:
            offset = len(dsk)
        entries += struct.pack("<H", number) + offset.to_bytes(3, "little")
        entries += (len(data) | flags << 22).to_bytes(3, "little")
        dsk += data
    game = root / steelsky.GAME
    game.mkdir(parents=True)
    (game / "sky.dnr").write_bytes(struct.pack("<I", len(files)) + entries)
    (game / "sky.dsk").write_bytes(bytes(dsk))


def test_spoken_lines_pair_each_speech_file_with_its_text(tmp_path: Path) -> None:
    import soundfile as sf

    sections = [["?", "Hello, Joey.", "WD40!", "Hmmm...", "Uh-huh?", "It's `LOCKED'..."]]
    sections += [["?", "I'm GOING."]] * 7
    files = {steelsky.TEXTS + s: (_section(t), 2) for s, t in enumerate(sections)}  # stored
    rng = np.random.default_rng(0)
    samples = {n: rng.integers(0, 256, 300 + n, dtype=np.uint8).tobytes() for n in range(6)}
    for i in range(1, 6):  # section 0's lines 1-5: packed (flags 0) but for line 2 (stored)
        packed = i != 2
        files[steelsky.SPEECH + i] = (_disk_file(samples[i], packed), 0 if packed else 2)
    files[steelsky.SPEECH + steelsky.FIRST_SPEECH[2] + 1] = (_disk_file(samples[0], True), 0)
    _game(tmp_path, files)

    lines = steelsky.spoken_lines(tmp_path)
    assert [(name, words, who) for name, _, words, who in lines] == [
        ("1", "Hello, Joey.", "bass"),
        ("5", "It's 'LOCKED'...", "bass"),
        ("8193", "I'm GOING.", "bass"),
    ]  # 2-4: a number, a held letter, only sounds
    audio, rate = sf.read(io.BytesIO(lines[0][1]), dtype="float32")
    assert rate == 11025
    want = (np.frombuffer(samples[1], np.uint8).astype(np.float32) - 128) / 128
    assert np.array_equal(audio, want)
    assert len(sf.read(io.BytesIO(lines[2][1]))[0]) == len(samples[0])


def test_spoken_lines_refuse_another_version(tmp_path: Path) -> None:
    game = tmp_path / steelsky.GAME
    game.mkdir(parents=True)
    (game / "sky.dnr").write_bytes(struct.pack("<I", 1) + b"\0" * 8)
    (game / "sky.dsk").write_bytes(b"")
    with pytest.raises(ValueError, match="0.0372"):
        steelsky.spoken_lines(tmp_path)
