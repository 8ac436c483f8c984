"""The benchmark inputs, which need no download and no torch: the seeds' 128-character TTS
sentence and speech-like audio. `serve --warmup` runs them too."""

from __future__ import annotations

import numpy as np

# A 128-character LJSpeech sentence, the seeds' TTS benchmark input length.
TTS_TEXT = (
    "The forms of printed letters should be beautiful, and that their arrangement on the page "
    "should be reasonable and a help to the shape"
)


def synthetic_speechlike(seconds: float, sample_rate: int, seed: int = 0) -> np.ndarray:
    """Deterministic noise shaped by a syllable-rate envelope: realistic compute, no download."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sample_rate))
    t = np.arange(n) / sample_rate
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4.0 * t)
    tone = np.sin(2 * np.pi * (150 + 50 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (0.1 * envelope * (tone + 0.3 * rng.standard_normal(n))).astype(np.float32)
