"""Where a server decodes transcriptions: one after another, in threads, or in processes.

    python scripts/bench_decode.py [--items 8] [--seconds 7.6] [--workers 2] [--repeats 3]

The bundled recogniser (beam search with its word LM) hears `items` utterances of the bundled
voice, `seconds` long each, once (speechrt.asr.ASR.hear); their decoding (ASR.finish) is then
timed one after another, in `workers` threads and in a DecodePool of `workers` processes (started
and warmed before timing). Prints the median of `repeats` per way, with the CPU and commit.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from speechrt.asr import ASR
from speechrt.asr.decoding import DecodePool
from speechrt.bench.machine import cpu_model, git_commit
from speechrt.tts import TTS

TEXT = "Speech recognition works on this machine. Please call Stella at noon today."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=8)
    p.add_argument("--seconds", type=float, default=7.6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    asr, tts = ASR(), TTS()
    (voice,) = tts.synthesize([TEXT])
    one = asr.load_audio(voice if tts.sampling_rate == asr.sample_rate else _resample(voice, tts))
    n = int(args.seconds * asr.sample_rate)
    wave = np.tile(one, -(-n // one.size))[:n]
    heard = asr.hear([wave] * args.items, batch_size=args.items)
    pool = DecodePool(asr.decoding, args.workers)
    pool.warm()

    def sequential(hs: list) -> None:
        for h in hs:
            asr.finish(h)

    def threads(hs: list) -> None:
        with ThreadPoolExecutor(args.workers) as ex:
            list(ex.map(asr.finish, hs))

    def processes(hs: list) -> None:
        for f in [pool.submit(h) for h in hs]:
            f.result()

    ways = {"one after another": sequential, f"{args.workers} threads": threads,
            f"{args.workers} processes": processes}  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            hs = copy.deepcopy(heard)  # finish consumes the log-probs
            t0 = time.perf_counter()
            way(hs)
            times[name].append(time.perf_counter() - t0)
    pool.close()
    cores = len(os.sched_getaffinity(0))
    print(f"# {cpu_model()}, {cores} cores, commit {git_commit(dirty=True)}")
    print(f"# {args.items} transcripts of {args.seconds:g} s, beam search with the bundled LM")
    for name, ts in times.items():
        print(f"{name:20} {statistics.median(ts) * 1e3:8.0f} ms")


def _resample(audio: np.ndarray, tts: TTS) -> np.ndarray:
    from speechrt.audio.io import resample

    return resample(audio, tts.sampling_rate, 16000)


if __name__ == "__main__":
    main()
