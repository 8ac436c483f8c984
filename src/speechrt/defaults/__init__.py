"""The trained default models shipped as package data (a directory each, beside this file), used
by the CLI, the Python API (`TTS()`, `ASR()`) and `speechrt serve` when they are given no model.
A name counts only if its model.json is present; docs/models/ has their cards and recipe."""

from __future__ import annotations

from pathlib import Path

from speechrt.errors import SpeechRTError

DEFAULTS = Path(__file__).parent
VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL = "voice-acoustic", "voice-vocoder", "asr"
BUNDLED_VOICE = "default"  # the bundled voice's name, wherever a voice is named (`voice`, ...)


def default_model(name: str) -> Path | None:
    """The bundled model directory `name`, or None when this install ships none."""
    path = DEFAULTS / name
    return path if (path / "model.json").is_file() else None


def voice_dirs(
    acoustic: str | Path | None, vocoder: str | Path | None
) -> tuple[str | Path, str | Path]:
    """Both given: themselves; neither: the bundled voice; else (or none bundled) an error."""
    if acoustic is None and vocoder is None:
        acoustic, vocoder = default_model(VOICE_ACOUSTIC), default_model(VOICE_VOCODER)
        if acoustic is None or vocoder is None:
            raise SpeechRTError(
                "no voice given and none bundled: pass --acoustic DIR --vocoder DIR "
                "(make them from DLE/NGC checkpoints with `speechrt convert CHECKPOINT DIR`)"
            )
    if acoustic is None or vocoder is None:
        raise SpeechRTError("a voice needs both an acoustic model and a vocoder (--acoustic DIR "
                            "--vocoder DIR), or neither for the bundled voice")  # fmt: skip
    return acoustic, vocoder


def asr_dir(model: str | Path | None) -> str | Path:
    """`model` itself, or the bundled recogniser; an error when neither exists."""
    if model is None:
        model = default_model(ASR_MODEL)
        if model is None:
            raise SpeechRTError(
                "no recogniser given and none bundled: give --model DIR "
                "(make one from a DLE/NGC checkpoint with `speechrt convert CHECKPOINT DIR`)"
            )
    return model


def voice_name(acoustic: str | Path) -> str:
    """A voice's name: BUNDLED_VOICE for the bundled voice (however its directory is given),
    else its acoustic model's directory name."""
    bundled = default_model(VOICE_ACOUSTIC)
    if bundled is not None and Path(acoustic).resolve() == bundled.resolve():
        return BUNDLED_VOICE
    return Path(acoustic).name
