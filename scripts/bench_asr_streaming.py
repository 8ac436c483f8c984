"""Streaming recognition on the bundled recogniser: compute per chunk, memory held, final pass.

    python scripts/bench_asr_streaming.py [--seconds 60] [--chunk 0.5]

Speech is the bundled voice reading held-out sentences until --seconds of audio. The audio is fed
as fast as it is recognised; the figures are compute time per chunk (all, and once the windows
reach their full length of 2 x the receptive field + a chunk), the real-time factor of the
streaming path, the most feature frames held, and the time of the final offline pass.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from speechrt.asr import ASR
from speechrt.asr.streaming import StreamingRecognizer, receptive_field
from speechrt.audio.io import resample
from speechrt.bench.stamp import stamp
from speechrt.tts import TTS

SENTENCES = Path(__file__).resolve().parents[1] / "tests" / "data" / "heldout_sentences.txt"


def speech(seconds: float) -> np.ndarray:
    tts = TTS(device="cpu")
    texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()]
    parts, total, i = [], 0.0, 0
    while total < seconds:
        (a,) = tts.synthesize([texts[i % len(texts)]])
        parts.append(resample(a, tts.sampling_rate, 16000))
        total += parts[-1].shape[0] / 16000
        i += 1
    return np.concatenate(parts)[: int(seconds * 16000)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--chunk", type=float, default=0.5)
    args = p.parse_args()
    audio = speech(args.seconds)
    asr = ASR(device="cpu")
    rec = StreamingRecognizer(asr, chunk=args.chunk)
    step = int(args.chunk * asr.sample_rate)
    rf_s = receptive_field(asr.info.dims) * asr.features.frame_shift
    times, held = [], 0
    for start in range(0, audio.shape[0], step):
        t0 = time.perf_counter()
        rec.push(audio[start : start + step])
        times.append(time.perf_counter() - t0)
        held = max(held, rec.front.frames.shape[1])
    t0 = time.perf_counter()
    final = rec.finish()
    final_s = time.perf_counter() - t0
    steady = times[int((2 * rf_s + args.chunk) / args.chunk) :]
    result = {
        "audio_s": round(audio.shape[0] / 16000, 2),
        "backend": asr.backend,
        "receptive_field_s": round(rf_s, 2),
        "chunk_s": args.chunk,
        "chunk_ms_mean": round(1000 * float(np.mean(times)), 1),
        "chunk_ms_steady_p50": round(1000 * float(np.median(steady)), 1) if steady else None,
        "chunk_ms_steady_p99": round(1000 * float(np.percentile(steady, 99)), 1)
        if steady
        else None,
        "streaming_rtf": round(audio.shape[0] / 16000 / sum(times), 2),
        "max_frames_held": held,
        "final_pass_s": round(final_s, 3),
        "final_words": len(final.text.split()),
        **stamp(torch.device("cpu")),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
