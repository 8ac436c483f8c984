"""The trained default models shipped as package data (src/speechrt/defaults/<name>/), used when
the CLI is given no model. A name counts only if its model.json is present."""

from __future__ import annotations

from pathlib import Path

DEFAULTS = Path(__file__).parent / "defaults"
VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL = "voice-acoustic", "voice-vocoder", "asr"


def default_model(name: str) -> Path | None:
    """The bundled model directory `name`, or None when this install ships none."""
    path = DEFAULTS / name
    return path if (path / "model.json").is_file() else None
