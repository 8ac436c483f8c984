"""Tune the LM's decoding weights (alpha, beta, ...) on the dev sentences, never the CI's 40.

    PYTHONPATH=src:train python -m speechrt_train.tune_decoding --out tune.json \
        [--asr src/speechrt/defaults/asr] [--voice src/speechrt/defaults] [--reader rms] \
        [--people CORPUS] [--grid '{"alpha": [0.6, 0.8, 1.0, 1.2], "beta": [-0.5, 0.0, 0.5]}']

Our voice (FastPitch + HiFi-GAN from --voice), or with --reader a teacher voice (rms: the one
no recogniser trains on), reads the dev sentences (held-out 300.. minus the CI's 40:
speechrt_train.round_trip_breakdown.sentence_sets); one acoustic pass gives the
log-probabilities, cached in --cache (reused while the recogniser and voice are the same), and
every point of the grid (speechrt.asr.beam.BeamOptions fields) decodes them with the recogniser's
LM. With --people CORPUS the real speech of the actors' held-out lines is tuned on instead,
heard as speechrt_train.people_eval hears it (the folder's own VAD and dither), so that the
shipped point's WER is people_eval's. Prints and writes the WER of each point and the best
one; put the best into lm.json's "decoding" (and speechrt_train.language_model.DECODING) by
hand, then measure once with speechrt_train.asr_eval.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from speechrt.asr import ASR
from speechrt.asr.beam import BeamOptions, beam_search
from speechrt.asr.decoding import Heard
from speechrt.asr.wer import wer
from speechrt.audio.io import resample
from speechrt.tts import TTS
from speechrt_train.align import make_processor, tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.asr_eval import log_probs, teacher_reading
from speechrt_train.people_eval import VOICES, heard_lines
from speechrt_train.round_trip_breakdown import sentence_sets
from speechrt_train.teachers import Teachers

DEFAULT_GRID = {"alpha": [0.6, 0.8, 1.0, 1.2], "beta": [-0.5, 0.0, 0.5]}


Decode = Callable[[BeamOptions], tuple[list[str], list[str]]]


def dev_set(asr: ASR, args: argparse.Namespace) -> Decode:
    """The dev sentences read by our voice (or --reader), heard once (or from --cache):
    beam options -> (references, hypotheses)."""
    texts = sentence_sets(args.teachers, args.limit)["dev"]
    tp = tp_plain(make_processor())
    refs = [transcript(tp.normalize(t)) for t in texts]
    cache = Path(args.cache) if args.cache else None
    if cache is not None and cache.exists():  # (made by the same reader: the caller's care)
        z = np.load(cache)
        lps = [z[f"arr_{i}"] for i in range(len(z.files))]
        if len(lps) != len(refs):
            raise SystemExit(f"{cache} holds {len(lps)} utterances, the dev set {len(refs)}")
    else:
        if args.reader:
            teachers = Teachers(args.teachers)
            _, audios = teacher_reading(teachers, args.reader, texts, asr.sample_rate)
        else:
            folder = Path(args.voice)
            voice = TTS(folder / "voice-acoustic", folder / "voice-vocoder", "cpu")
            audios = [
                resample(a, voice.sampling_rate, asr.sample_rate)
                for a in voice.synthesize(texts, batch_size=8)
            ]
        lps = log_probs(asr, audios)
        if cache is not None:
            np.savez_compressed(cache, *lps)

    def decode(options: BeamOptions) -> tuple[list[str], list[str]]:
        return refs, [beam_search(lp, asr.labels, asr.lm, options) for lp in lps]

    return decode


def people_set(asr: ASR, corpus: str | Path, voices: tuple[str, ...] = VOICES) -> Decode:
    """The actors' held-out lines of `corpus`, heard once: beam options -> (references,
    hypotheses), each line decoded as ASR.finish does, with these options."""
    refs: list[str] = []
    heard: list[Heard] = []
    for voice in voices:
        _, voice_refs, voice_heard = heard_lines(asr, corpus, voice)
        refs += voice_refs
        heard += [h.without_audio() for h in voice_heard]

    def decode(options: BeamOptions) -> tuple[list[str], list[str]]:
        decoder = replace(asr.decoding, beam=options)
        return refs, [transcript(decoder.finish(h.without_audio()).text) for h in heard]

    return decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--asr", default="src/speechrt/defaults/asr", help="recogniser folder + LM")
    p.add_argument("--voice", default="src/speechrt/defaults", help="folder of voice-*")
    p.add_argument("--reader", help="a teacher voice reads the sentences instead (e.g. rms)")
    p.add_argument("--teachers", default="/tmp/teachers", help="unpacked .debs (fortunes)")
    p.add_argument("--grid", default=json.dumps(DEFAULT_GRID), help="JSON: field -> values")
    p.add_argument("--people", help="corpus folder: tune on its actors' held-out lines")
    p.add_argument("--cache", help=".npz of the dev log-probs (written if absent)")
    p.add_argument("--limit", type=int, help="first N dev sentences (smoke runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    grid = json.loads(args.grid)
    torch.set_num_threads(2)
    asr = ASR(args.asr, device="cpu", decoder="beam")
    decode = people_set(asr, args.people) if args.people else dev_set(asr, args)
    points = []
    for values in tqdm(list(itertools.product(*grid.values())), desc="grid"):
        fields = dict(zip(grid, values, strict=True))
        refs, hyps = decode(asr.beam_options.updated(**fields))
        points.append({**fields, "wer": round(wer(refs, hyps), 4)})
        tqdm.write(json.dumps(points[-1]))
    best = min(points, key=lambda r: r["wer"])
    result = {
        "asr": args.asr,
        "voice": "actors' held-out lines" if args.people else args.reader or args.voice,
        "sentences": len(refs),
        "shipped": asr.beam_options.to_dict(),
        "points": points,
        "best": best,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("best", json.dumps(best))


if __name__ == "__main__":
    main()
