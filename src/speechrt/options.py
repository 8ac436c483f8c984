"""What a synthesis call asks for, apart from what a voice is (see repo.py / model.json)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class SynthesisOptions:
    pace: float = (
        1.0  # speaking rate: > 1 is faster (FastPitch/FastSpeech durations are divided by it)
    )
    pitch_shift: float = 0.0  # Hz added to the predicted pitch contour (FastPitch)
    pitch_scale: float = 1.0  # multiplies the pitch deviation from the mean ("amplify"; FastPitch)
    pitch_flatten: bool = False  # monotone: every pitch value set to the speaker mean (FastPitch)
    speaker: int = 0  # speaker id for multi-speaker models
    denoise: float = 0.0  # denoiser strength (0 = off); DLE uses 0.005-0.01
    sigma: float | None = None  # WaveGlow latent scale; None = the model's default
    seed: int = 0  # base seed: item i of a request draws its noise from seed + i
    max_decoder_steps: int | None = None  # autoregressive models; None = the model's default

    def __post_init__(self) -> None:
        if not 0.1 <= self.pace <= 10.0:
            raise SpeechRTError(f"pace must be within [0.1, 10], got {self.pace}")
        if not -2000.0 <= self.pitch_shift <= 2000.0:
            raise SpeechRTError(f"pitch shift must be within ±2000 Hz, got {self.pitch_shift}")
        if not 0.0 <= self.pitch_scale <= 10.0:
            raise SpeechRTError(f"pitch scale must be within [0, 10], got {self.pitch_scale}")
        if not 0.0 <= self.denoise <= 1.0:
            raise SpeechRTError(f"denoise strength must be within [0, 1], got {self.denoise}")
        if self.speaker < 0:
            raise SpeechRTError(f"speaker id must be >= 0, got {self.speaker}")
        if self.max_decoder_steps is not None and not 1 <= self.max_decoder_steps <= 100_000:
            raise SpeechRTError(
                f"max decoder steps must be within [1, 100000], got {self.max_decoder_steps}"
            )
        if self.sigma is not None and not 0.0 <= self.sigma <= 2.0:
            raise SpeechRTError(f"sigma must be within [0, 2], got {self.sigma}")


class SynthesisKeywords(TypedDict, total=False):
    """SynthesisOptions' fields as keywords (a request's parameters, once checked)."""

    pace: float
    pitch_shift: float
    pitch_scale: float
    pitch_flatten: bool
    speaker: int
    denoise: float
    sigma: float | None
    seed: int
    max_decoder_steps: int | None
