"""speechrt_train.talkie on a small archive laid out as queen.1c is; and the voice `queen` that
speechrt_train.people makes of it."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("speechrt_train")
from speechrt_train import people, talkie  # noqa: E402


def _string(text: str, at: int, align: int) -> bytes:
    """A length-prefixed string as written at offset `at`, padded to `align`."""
    raw = bytes([len(text)]) + text.encode("latin-1")
    end = at + len(raw)
    return raw + b"\0" * (((end + align - 1) & ~(align - 1)) - end)


def _dog() -> bytes:
    """Talk key 2, one level; Joe's option (id 0) in two pieces, the person's answer (id 0x1a),
    and the line the person says when Joe comes back."""
    d = bytearray(200)
    struct.pack_into(">5h", d, 0, 1, 0, 2, 1, 1)
    person_at, again_at = 60, 90
    struct.pack_into(">3H", d, 22, person_at, 0, again_at)
    joe = b"\0\0" + struct.pack(">h", 0) + _string("Hello there.*03How are you?", 132, 4)
    d[128 : 128 + len(joe)] = joe
    answer = b"\0\0" + struct.pack(">h", 0x1A) + _string("Fine.", person_at + 4, 4)
    d[person_at : person_at + len(answer)] = answer
    again = _string("Back again?", again_at, 2) + b"\0"
    d[again_at : again_at + len(again)] = again
    return bytes(20) + bytes(d)


def _cut() -> bytes:
    """Two objects: object 1 says a line, object 2's is a stage direction."""
    d = bytearray(40)
    struct.pack_into(">Hh", d, 0, 0, 2)
    struct.pack_into(">H", d, 8, 40)
    sentences = _string("x", 40, 2)
    sentences += _string("Look out!", 40 + len(sentences), 2)
    sentences += _string("#walk", 40 + len(sentences), 2)
    return bytes(20) + bytes(d) + sentences


def _jas() -> tuple[bytes, bytes]:
    jas = bytes(20) + struct.pack(">4H", 1, 1, 0, 1)
    lines = ["A rusty key."] + ["key", "hall"] + [f"verb {i}" for i in range(12)]
    lines += ["I can't do that."] + [f"reply {i}" for i in range(2, 41)]
    return jas, "\r\n".join(lines).encode("latin-1")


def _archive(files: dict[str, bytes]) -> bytes:
    head = b"QTBL" + b"CEM10\0" + b"\0\0" + bytes([1]) + struct.pack(">H", len(files))
    at = len(head) + 21 * len(files)
    table, data = b"", b""
    for name, blob in files.items():
        table += struct.pack(">12sBII", name.encode(), 1, at + len(data), len(blob))
        data += blob
    return head + table + data


def _ogg(seconds: float, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    audio = (0.1 * rng.standard_normal(int(11025 * seconds))).astype(np.float32)
    sf.write(buf, audio, 11025, format="OGG")
    return buf.getvalue()


def _files() -> dict[str, bytes]:
    jas, jas2 = _jas()
    files = {"FAYE1.DOG": _dog(), "BOAT.CUT": _cut(), "QUEEN.JAS": jas, "QUEEN2.JAS": jas2}
    clips = {  # the script's clips (Joe's second piece and the stage direction have none)
        "02SSSSJ1.SB": 1.0, "02001AP1.SB": 0.5, "02XXXXP1.SB": 0.9, "BOAT_011.SB": 0.8,
        "JOE00411.SB": 1.0, "JOE00011.SB": 9.0,  # "i can't do that" over 9 s: not read so
        "123SSSS1.SB": 0.5,  # a sound effect no line names
    }  # fmt: skip
    return files | {name: _ogg(s, i) for i, (name, s) in enumerate(clips.items())}


def test_each_clip_gets_the_words_of_its_piece_of_the_script() -> None:
    files = _files()
    lines = talkie.spoken_lines(_archive(files))
    assert [(name, words, who) for name, _, words, who in lines] == [
        ("BOAT_011", "Look out!", "cut:BOAT"),
        ("02SSSSJ1", "Hello there.", "JOE"),
        ("02001AP1", "Fine.", "FAYE"),
        ("02XXXXP1", "Back again?", "FAYE"),
        ("JOE00411", "A rusty key.", "JOE"),
        ("JOE00011", "I can't do that.", "JOE"),
    ]
    assert lines[1][1] == files["02SSSSJ1.SB"]
    assert talkie.pieces("a*03b*XY12345678901c") == [(1, "a"), (2, "b"), (3, "c")]
    with pytest.raises(ValueError, match="queen.1c"):
        talkie.read_table(b"RIFF" + bytes(20))


def test_the_queen_voice_keeps_lines_read_at_a_speaking_rate(tmp_path: Path) -> None:
    root = tmp_path / "flight-of-the-amazon-queen"
    (root / talkie.ARCHIVE).parent.mkdir(parents=True)
    (root / talkie.ARCHIVE).write_bytes(_archive(_files()))
    source = next(s for s in people.SOURCES if s.voice == "queen")
    its = people.items({source.package: root}, (source,))["queen"]
    assert sorted(x["spoken"] for x in its) == [
        "a rusty key", "back again", "fine", "hello there", "look out",
    ]  # fmt: skip
    assert all(x["audio"].dtype == np.int16 for x in its)
    assert people.read_as_written("hello there", 1.0)
    assert not people.read_as_written("i will", 7.0)  # a pause, or not these words
    assert not people.read_as_written("r", 0.4)  # a letter spelt out
