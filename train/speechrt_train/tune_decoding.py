"""Tune the LM's decoding weights (alpha, beta, ...) on the dev sentences, never the CI's 40.

    PYTHONPATH=src:train python -m speechrt_train.tune_decoding --out tune.json \
        [--asr src/speechrt/defaults/asr] [--voice src/speechrt/defaults] [--reader rms] \
        [--grid '{"alpha": [0.6, 0.8, 1.0, 1.2], "beta": [-0.5, 0.0, 0.5]}']

Our voice (FastPitch + HiFi-GAN from --voice), or with --reader a teacher voice (rms: the one
no recogniser trains on), reads the dev sentences (held-out 300.. minus the CI's 40:
speechrt_train.round_trip_breakdown.sentence_sets); one acoustic pass gives the
log-probabilities, cached in --cache (reused while the recogniser and voice are the same), and
every point of the grid (speechrt.asr.beam.BeamOptions fields) decodes them with the recogniser's
LM. Prints and writes the WER of each point and the best one; put the best into lm.json's
"decoding" (and speechrt_train.language_model.DECODING) by hand, then measure once with
speechrt_train.asr_eval.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from speechrt.asr import ASR
from speechrt.asr.beam import beam_search
from speechrt.asr.wer import wer
from speechrt.audio.io import resample
from speechrt.tts import TTS
from speechrt_train.align import make_processor, tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.asr_eval import log_probs, teacher_reading
from speechrt_train.round_trip_breakdown import sentence_sets
from speechrt_train.teachers import Teachers

DEFAULT_GRID = {"alpha": [0.6, 0.8, 1.0, 1.2], "beta": [-0.5, 0.0, 0.5]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--asr", default="src/speechrt/defaults/asr", help="recogniser folder + LM")
    p.add_argument("--voice", default="src/speechrt/defaults", help="folder of voice-*")
    p.add_argument("--reader", help="a teacher voice reads the sentences instead (e.g. rms)")
    p.add_argument("--teachers", default="/tmp/teachers", help="unpacked .debs (fortunes)")
    p.add_argument("--grid", default=json.dumps(DEFAULT_GRID), help="JSON: field -> values")
    p.add_argument("--cache", help=".npz of the dev log-probs (written if absent)")
    p.add_argument("--limit", type=int, help="first N dev sentences (smoke runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    grid = json.loads(args.grid)
    torch.set_num_threads(2)
    asr = ASR(args.asr, device="cpu", decoder="beam")
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
    points = []
    for values in tqdm(list(itertools.product(*grid.values())), desc="grid"):
        fields = dict(zip(grid, values, strict=True))
        options = asr.beam_options.updated(**fields)
        hyps = [beam_search(lp, asr.labels, asr.lm, options) for lp in lps]
        points.append({**fields, "wer": round(wer(refs, hyps), 4)})
        tqdm.write(json.dumps(points[-1]))
    best = min(points, key=lambda r: r["wer"])
    result = {
        "asr": args.asr,
        "voice": args.reader or args.voice,
        "sentences": len(refs),
        "shipped": asr.beam_options.to_dict(),
        "points": points,
        "best": best,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("best", json.dumps(best))


if __name__ == "__main__":
    main()
