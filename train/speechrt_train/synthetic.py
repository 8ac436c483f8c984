"""A synthetic corpus in the real shard format, made without any synthesizer (tests, smoke runs).

TTS voice: each symbol of a sentence (speechrt's ids, p_arpabet 1) lasts a few frames and sounds
as a harmonic tone whose pitch and loudness depend on the symbol (spaces: silence), so durations,
pitch, energy and mel are exact and learnable. Recogniser voices: each letter of the transcript
is a tone pair chosen by the letter (DTMF-like), spaces are silence, and each voice shifts all
frequencies by its own factor. `python -m speechrt_train corpus --plan synthetic` writes one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.audio.mel import MelConfig
from speechrt_train.align import make_processor, tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.corpus import ASR_RATE, HELDOUT_VOICE, TTS_VOICE, make_shard
from speechrt_train.loop import save_atomic
from speechrt_train.texts import text_key

SENTENCES = (
    "Hello world.",
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "We need more time, said the man.",
    "Is it going to rain today?",
    "She sells sea shells by the sea shore.",
    "Good morning, my friend.",
    "Numbers like twelve are words too.",
    "Open the door and let the light in.",
    "Music makes people happy.",
    "Where is the nearest station?",
    "Keep calm and carry on.",
)
VOICE_SHIFTS = {TTS_VOICE: 1.0, "slt": 1.12, HELDOUT_VOICE: 0.9}


def _tone(f0: float, n: int, sr: int, amplitude: float, phase: float = 0.0) -> np.ndarray:
    t = np.arange(n) / sr
    return amplitude * sum(np.sin(2 * np.pi * k * f0 * t + phase) / k for k in (1, 2, 3))


def tts_item(sentence: str, rng: np.random.Generator, mel: MelConfig, heldout: bool) -> dict:
    tp = make_processor()
    ids = tp.text_to_ids(sentence)
    symbols = tp.symbols
    durations, pieces = [], []
    for i in ids:
        speech = symbols[i].isalpha() or symbols[i].startswith("@")
        d = int(rng.integers(3, 8)) if speech else int(rng.integers(0, 3))
        durations.append(d)
        n = d * mel.hop_length
        f0 = 110.0 + 2.5 * (i % 64)
        pieces.append(
            _tone(f0, n, mel.sampling_rate, 0.1 + 0.002 * (i % 50)) if speech else np.zeros(n)
        )
    audio = np.concatenate(pieces) if pieces else np.zeros(0)
    return {
        "key": text_key(sentence),
        "text": sentence,
        "spoken": tp_plain(tp).normalize(sentence).strip(),
        "heldout": heldout,
        "ids": ids,
        "durations": durations,
        "frames": sum(durations),
        "audio": (audio * 32767).astype(np.int16),
    }


def asr_item(sentence: str, voice: str, rng: np.random.Generator, heldout: bool) -> dict:
    spoken = tp_plain(make_processor()).normalize(sentence).strip()
    shift = VOICE_SHIFTS.get(voice, 1.0)
    pieces = [np.zeros(int(0.1 * ASR_RATE))]
    for c in transcript(spoken):
        n = int(rng.integers(int(0.06 * ASR_RATE), int(0.09 * ASR_RATE)))
        if c == " ":
            pieces.append(np.zeros(n))
            continue
        k = ord(c) - ord("a") if c.isalpha() else 26
        low, high = 300 + 60 * (k % 7), 1200 + 150 * (k // 7)
        t = np.arange(n) / ASR_RATE
        tone = np.sin(2 * np.pi * low * shift * t) + np.sin(2 * np.pi * high * shift * t)
        pieces.append(0.2 * tone * np.hanning(n))
    pieces.append(np.zeros(int(0.1 * ASR_RATE)))
    audio = np.concatenate(pieces)
    key = text_key(sentence)
    return {
        "key": key,
        "text": sentence,
        "spoken": spoken,
        "heldout": heldout,
        "audio": (audio * 32767).astype(np.int16),
    }


def write_corpus(out_dir: str | Path, heldout: int = 3, seed: int = 0) -> dict[str, Any]:
    """Shards for the TTS voice, one training recogniser voice and the held-out voice."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    mel = MelConfig()
    n = len(SENTENCES)
    flags = [i >= n - heldout for i in range(n)]

    voices: dict[str, Any] = {}
    for voice in VOICE_SHIFTS:
        if voice == TTS_VOICE:
            items = [tts_item(s, rng, mel, h) for s, h in zip(SENTENCES, flags, strict=True)]
        else:
            items = [asr_item(s, voice, rng, h) for s, h in zip(SENTENCES, flags, strict=True)]
        if voice == HELDOUT_VOICE:
            items = [x for x in items if x["heldout"]]
        shard = make_shard(voice, items)
        save_atomic(shard, out / f"{voice}.pt")  # (a new file: a mapped old one stays whole)
        voices[voice] = {
            "utterances": len(items),
            "heldout": sum(shard["heldout"]),
            "hours": round(len(shard["audio"]) / shard["sample_rate"] / 3600, 4),
            "synthetic": True,
        }
    manifest = {"plan": "synthetic", "voices": voices}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
