"""Word captions of synthesized speech: [{word, start, end}] (seconds) as JSON, SRT or WebVTT.

One cue per word, so a player highlights each word as it is spoken.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speechrt.errors import SpeechRTError

CAPTION_FORMATS = ("json", "srt", "vtt")

Words = list[dict[str, Any]]  # [{"word": str, "start": float, "end": float}], seconds


def timestamp(seconds: float, sep: str) -> str:
    """Seconds as HH:MM:SS<sep>mmm (sep "," for SRT, "." for WebVTT)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_srt(words: Words) -> str:
    return "\n".join(
        f"{i + 1}\n{timestamp(w['start'], ',')} --> {timestamp(w['end'], ',')}\n{w['word']}\n"
        for i, w in enumerate(words)
    )


def to_vtt(words: Words) -> str:
    cues = [
        f"{timestamp(w['start'], '.')} --> {timestamp(w['end'], '.')}\n{w['word']}\n" for w in words
    ]
    return "WEBVTT\n\n" + "\n".join(cues)


def to_json(words: Words) -> str:
    return json.dumps({"words": words}, indent=1) + "\n"


def caption_format(path: str | Path) -> str:
    """The caption format a path's suffix names, or SpeechRTError."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in CAPTION_FORMATS:
        raise SpeechRTError(
            f"{path}: captions are written as {', '.join('.' + f for f in CAPTION_FORMATS)}"
        )
    return fmt


def write_captions(path: str | Path, words: Words) -> None:
    """Write `words` in the format of the path's suffix: .json, .srt or .vtt."""
    path = Path(path)
    writers = {"json": to_json, "srt": to_srt, "vtt": to_vtt}
    fmt = caption_format(path)
    try:
        path.write_text(writers[fmt](words), encoding="utf-8")
    except OSError as e:
        raise SpeechRTError(f"cannot write {path}: {e.strerror or e}") from None
