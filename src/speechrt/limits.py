"""What a server lets one request cost: the `Limits` dataclass, its defaults, its checks and the
`speechrt serve` flags made from it (add_flags, from_flags).

Torch-free and FastAPI-free: the CLI builds its flags from it before the `serve` extra is needed.
A field with a flag is set from it (its value x `scale`); one without keeps its default.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

from speechrt.errors import SpeechRTError

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Flag:
    help: str
    name: str = ""  # the flag when it is not the field's name ("--max-upload-mb")
    scale: float = 1.0  # the field's value per unit of the flag's (MiB: 1024 * 1024 bytes)


def _flag(default: N, help: str, name: str = "", scale: float = 1.0) -> N:
    return field(default=default, metadata={"flag": Flag(help, name, scale)})


@dataclass(frozen=True)
class Limits:
    """Every field is positive (SpeechRTError otherwise, naming its flag)."""

    max_text_chars: int = _flag(10_000, "per text")  # as sent
    # what the acoustic model reads, per request (all its texts), after normalisation: 5,000
    # digits are 5,000 characters but 21,000 symbols; English prose is about one per character
    max_text_symbols: int = _flag(
        15_000,
        "symbols a speech request reads, after numbers are spelled out and SSML expanded; "
        "the front end stops there",
    )
    max_pieces: int = 256  # sentence pieces (batch items) per request
    max_upload_bytes: int = _flag(  # request bodies (OpenAI's file limit)
        25 * 1024 * 1024, "request body limit", "--max-upload-mb", 1024 * 1024
    )
    max_audio_seconds: float = _flag(600.0, "per audio item")  # decoded audio
    # uploads decoding or waiting for a decoding thread (ASRService.decode); more are a 503
    max_pending_uploads: int = 32
    request_timeout_s: float = _flag(60.0, "seconds per request", "--request-timeout")
    realtime_idle_s: float = _flag(
        60.0,
        "close a realtime or text-streaming WebSocket session, or a Wyoming connection, after "
        "this long without an event while nothing is in flight",
        "--realtime-idle-seconds",
    )
    # KServe v2 component inputs, per item (speechrt.serving.v2models.axis_limits):
    max_symbols: int = _flag(  # a 300-character piece of words encodes to ~300-400
        1024, "symbol ids per item of a KServe v2 component request"
    )
    max_component_seconds: float = _flag(  # audio-time axes: mel frames, samples, ASR features
        30.0,
        "audio per item of a KServe v2 component request: bounds its mel frames, samples and "
        "feature frames",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise SpeechRTError(f"{_flag_name(f.name)} must be positive")


def _flags() -> list[tuple[str, Flag, int | float]]:
    """(field, its flag, its default) of every field that has a flag."""
    out: list[tuple[str, Flag, int | float]] = []
    for f in fields(Limits):
        flag, default = f.metadata.get("flag"), f.default
        if isinstance(flag, Flag) and isinstance(default, int | float):
            out.append((f.name, flag, default))
    return out


def _flag_name(name: str) -> str:
    """A field's flag: its Flag.name, else the field's name as a flag."""
    given = next((flag.name for n, flag, _ in _flags() if n == name), "")
    return given or "--" + name.replace("_", "-")


def _dest(name: str) -> str:
    return _flag_name(name)[2:].replace("-", "_")


def add_flags(group: argparse._ArgumentGroup) -> None:
    """One flag per flagged field, its default and help from the field."""
    for name, flag, default in _flags():
        value = default / flag.scale
        kind = int if isinstance(default, int) and flag.scale == 1 else float
        group.add_argument(
            _flag_name(name),
            type=kind,
            default=kind(value),
            help=f"{flag.help} (default: {value:g})",
        )


def from_flags(args: argparse.Namespace) -> Limits:
    """The Limits the flags of add_flags ask for, checked (SpeechRTError)."""
    values: dict[str, int | float] = {}
    for name, flag, default in _flags():
        value = getattr(args, _dest(name)) * flag.scale
        values[name] = int(value) if isinstance(default, int) else float(value)
    return replace(Limits(), **values)  # type: ignore[arg-type]  # each has its field's type
