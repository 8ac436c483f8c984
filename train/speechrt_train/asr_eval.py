"""The recogniser card's numbers: WER with greedy and with beam (LM) decoding on held-out text.

    PYTHONPATH=src:train python -m speechrt_train.asr_eval --asr src/speechrt/defaults/asr \
        --teachers /tmp/teachers --out asr-eval.json [--sentences 200]

Two sets, both the first N sentences of the held-out split (no model or LM trained on them):
spoken by the default voice (FastPitch + HiFi-GAN in src/speechrt/defaults) and by the held-out
teacher voice rms (flite, unpacked by train/corpus/unpack.sh; the recogniser never heard it).
Each set also at 8 kHz (`8khz`: as the recogniser hears an 8 kHz file, through its telephone
band; `8khz_resampled_only`: the same samples only resampled back to 16 kHz).
References are what each voice was asked to say, in the recogniser's transcript form. One ASR
pass per set gives the log-probabilities; both decoders read the same ones. `speechrt_train
cards --decoding asr-eval.json` puts the result in docs/models/quartznet.md.

`--fit N` also measures how much the recogniser learnt its sentences by heart: the TTS teacher
(slt-hts, which it trained on) reading the first N *training* sentences against N held-out
ones (`teacher_fit`; the LM knows the training sentences too, so compare the greedy WERs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from speechrt.asr import ASR
from speechrt.asr.beam import beam_search
from speechrt.asr.ctc import greedy_decode
from speechrt.asr.wer import wer
from speechrt.audio.io import resample
from speechrt.audio.telephone import NARROWBAND_RATE as TELEPHONE_RATE
from speechrt.tts import TTS
from speechrt_train.align import make_processor, tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.corpus import ASR_RATE, HELDOUT_VOICE, TTS_VOICE
from speechrt_train.teachers import Teachers
from speechrt_train.texts import load_sentences, split


def log_probs(asr: ASR, audios: list[np.ndarray]) -> list[np.ndarray]:
    """(T_i, labels + 1) per utterance, each one window (held-out sentences are short)."""
    out = []
    for i, audio in enumerate(tqdm(audios, desc="recogniser", leave=False)):
        segments = asr.segments(i, audio, asr.seed + i)
        if len(segments) != 1:
            raise ValueError(f"utterance {i} is longer than one window")
        lp, n = asr.log_probs(segments)  # torch (eager, cuda) or numpy (onnx) arrays
        lp = lp[0, : int(n[0])]
        out.append(lp.float().cpu().numpy() if torch.is_tensor(lp) else np.float32(lp))
    return out


def score(asr: ASR, refs: list[str], audios: list[np.ndarray]) -> dict[str, Any]:
    start = time.perf_counter()
    lps = log_probs(asr, audios)  # features and the acoustic model, one utterance at a time
    acoustic = time.perf_counter() - start
    greedy = [
        greedy_decode(torch.from_numpy(lp)[None], torch.tensor([len(lp)]), asr.labels, 1.0)[0].text
        for lp in lps
    ]
    t0 = time.perf_counter()
    beam = [beam_search(lp, asr.labels, asr.lm, asr.beam_options) for lp in lps]
    seconds = sum(len(a) for a in audios) / asr.sample_rate
    return {
        "sentences": len(refs),
        "audio_seconds": round(seconds, 1),
        "greedy": round(wer(refs, greedy), 4),
        "beam": round(wer(refs, beam), 4),
        "beam_ms_per_audio_second": round(1000 * (time.perf_counter() - t0) / seconds, 1),
        "acoustic_ms_per_audio_second": round(1000 * acoustic / seconds, 1),
        "examples": [
            {"ref": r, "greedy": g, "beam": b}
            for r, g, b in zip(refs[:8], greedy[:8], beam[:8], strict=True)
        ],
    }


def with_telephone(asr: ASR, refs: list[str], audios: list[np.ndarray]) -> dict[str, Any]:
    """`score` of the audio as it is, and at 8 kHz: as the recogniser hears an 8 kHz file
    (ASR.from_rate: its telephone band, where its features ask for it) and only resampled."""
    narrow = [resample(a, asr.sample_rate, TELEPHONE_RATE) for a in audios]
    return score(asr, refs, audios) | {
        "8khz": score(asr, refs, [asr.from_rate(a, TELEPHONE_RATE) for a in narrow]),
        "8khz_resampled_only": score(
            asr, refs, [resample(a, TELEPHONE_RATE, asr.sample_rate) for a in narrow]
        ),
    }


def teacher_reading(
    teachers: Teachers, voice: str, texts: list[str], rate: int = ASR_RATE
) -> tuple[list[str], list[np.ndarray]]:
    """A teacher voice reading these texts as spoken (english_cleaners_v2) -> the references in
    transcript form, and (N_i,) float32 audio at `rate` (the recogniser's)."""
    tp = tp_plain(make_processor())
    spoken = [tp.normalize(t).strip() for t in texts]
    utts = teachers.synthesize(voice, spoken)
    return [transcript(t) for t in spoken], [resample(u.audio, u.sample_rate, rate) for u in utts]


def teacher_score(
    asr: ASR, teachers: str, voice: str, texts: list[str], telephone: bool = False
) -> dict[str, Any]:
    """`score` (with `telephone`: `with_telephone`) of a teacher voice reading these texts."""
    refs, audios = teacher_reading(Teachers(teachers), voice, texts, asr.sample_rate)
    return (with_telephone if telephone else score)(asr, refs, audios)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--asr", default="src/speechrt/defaults/asr", help="recogniser folder + LM")
    p.add_argument("--teachers", default="/tmp/teachers", help="unpacked .debs (flite, fortunes)")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--fit", type=int, default=0, help="N: teacher on train vs held-out text")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    torch.set_num_threads(2)
    asr = ASR(args.asr, device="cpu", decoder="beam")
    train, heldout = split(load_sentences(args.teachers))
    texts = [s.text for s in heldout[: args.sentences]]
    tp = tp_plain(make_processor())
    spoken = [tp.normalize(t).strip() for t in texts]
    refs = [transcript(s) for s in spoken]

    voice = TTS(device="cpu")
    ours = [resample(a, voice.sampling_rate, asr.sample_rate) for a in voice.synthesize(texts)]
    hello = resample(voice.synthesize(["Hello world."])[0], voice.sampling_rate, asr.sample_rate)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result = {
        "asr": args.asr,
        "commit": commit.stdout.strip(),
        "decoding": asr.beam_options.to_dict(),
        "our_voice": with_telephone(asr, refs, ours),
        f"heldout_voice_{HELDOUT_VOICE}": teacher_score(
            asr, args.teachers, HELDOUT_VOICE, texts, telephone=True
        ),
        "hello_world": asr.transcribe([hello])[0].text,
    }
    if args.fit:
        result["teacher_fit"] = {
            name: teacher_score(asr, args.teachers, TTS_VOICE, [s.text for s in part[: args.fit]])
            for name, part in (("train_text", train), ("heldout_text", heldout))
        }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=1))
    rows = {k: result[k] for k in ("our_voice", f"heldout_voice_{HELDOUT_VOICE}")}
    rows.update({f"{TTS_VOICE} {k}": v for k, v in result.get("teacher_fit", {}).items()})
    for k, row in rows.items():
        print(k, {m: row[m] for m in ("sentences", "greedy", "beam")})
        for at in ("8khz", "8khz_resampled_only"):
            if at in row:
                print(f"  {at}", {m: row[at][m] for m in ("greedy", "beam")})


if __name__ == "__main__":
    main()
