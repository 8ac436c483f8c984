"""Where the synthesize -> transcribe round trip loses words: the recogniser's WER on held-out
sentences read three ways, each stage of our voice replaced by the teacher's one at a time.

    PYTHONPATH=src:train python -m speechrt_train.round_trip_breakdown --out breakdown.json \
        [--defaults DIR --lm src/speechrt/defaults/asr --device cuda]

    teacher      the TTS voice's teacher (festival HTS slt) reading the sentences
    copy         the teacher's audio -> log-mel -> our HiFi-GAN (the vocoder's loss alone)
    ours         FastPitch -> HiFi-GAN (the bundled voice, what the CI round trip hears)

Sets: tests/data/heldout_sentences.txt (the CI's 40) and the LM's dev sentences (held-out
300..522 minus those 40). Needs the teachers unpacked (train/corpus/unpack.sh /tmp/teachers).
The recogniser decodes as shipped (beam search with its LM) and greedily, from one acoustic
pass (speechrt_train.asr_eval's `score`). `--defaults DIR`
reads the voice and the recogniser from an export's folder (voice-acoustic, voice-vocoder, asr;
the LM from `--lm` when the export's asr has none), as train/gpu_train.sh's export does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from speechrt.asr import ASR
from speechrt.asr.ctc import host
from speechrt.audio.io import resample
from speechrt.audio.mel import mel_spectrogram
from speechrt.options import SynthesisOptions
from speechrt.tts import TTS
from speechrt_train.align import make_processor, tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.asr_eval import score  # one acoustic pass, greedy and beam WER
from speechrt_train.corpus import TTS_VOICE
from speechrt_train.teachers import Teachers
from speechrt_train.texts import load_sentences, split

CI_SENTENCES = Path(__file__).resolve().parents[2] / "tests/data/heldout_sentences.txt"


def copy_synthesis(voice: TTS, audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Teacher audio -> our vocoder's log-mel -> our vocoder, at the vocoder's rate."""
    a = resample(audio, sample_rate, voice.mel.sampling_rate).astype(np.float32)
    mel: Any = mel_spectrogram(torch.from_numpy(a)[None], voice.mel).to(voice.device)
    lengths: Any = torch.tensor([mel.shape[-1]])
    if voice.numpy:  # the onnx backend's stages take and give numpy arrays
        mel, lengths = mel.cpu().numpy(), lengths.numpy()
    with torch.no_grad():
        y, n = voice.mel_to_audio(mel, lengths, SynthesisOptions(), None)
    return host(y[0, : int(n[0])])  # torch on the eager and cuda backends, numpy on onnx


def sentence_sets(teachers: str, limit: int | None = None) -> dict[str, list[str]]:
    """The CI's 40 held-out sentences and the dev ones (held-out 300.. minus those 40)."""
    ci = CI_SENTENCES.read_text().splitlines()
    _, held = split(load_sentences(teachers))
    sets = {"ci_40": ci, "dev": [s.text for s in held[300:] if s.text not in set(ci)]}
    return {k: v[:limit] for k, v in sets.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--defaults", default="src/speechrt/defaults", help="models' folder")
    p.add_argument("--lm", help="LM folder (default: the recogniser's own)")
    p.add_argument("--teachers", default="/tmp/teachers", help="unpacked .debs")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--limit", type=int, help="first N sentences of each set (smoke runs)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    models = Path(args.defaults)
    sets = sentence_sets(args.teachers, args.limit)
    tp = tp_plain(make_processor())
    teachers = Teachers(args.teachers)
    voice = TTS(models / "voice-acoustic", models / "voice-vocoder", device=args.device)
    asr = ASR(models / "asr", device=args.device, decoder="beam", lm=args.lm)
    result: dict = {
        "defaults": args.defaults,
        "lm": args.lm,
        "decoding": asr.beam_options.to_dict(),
    }
    for name, texts in sets.items():
        refs = [transcript(tp.normalize(t)) for t in texts]
        spoken = [tp.normalize(t).strip() for t in texts]
        read = teachers.synthesize(TTS_VOICE, spoken)
        rate = voice.mel.sampling_rate
        audio = {
            "teacher": [(u.audio, u.sample_rate) for u in read],
            "copy": [(copy_synthesis(voice, u.audio, u.sample_rate), rate) for u in tqdm(read)],
            "ours": [(a, rate) for a in voice.synthesize(texts)],
        }
        result[name] = {"sentences": len(texts)}
        for way, items in audio.items():
            row = score(asr, refs, [resample(a, sr, asr.sample_rate) for a, sr in items])
            result[name][way] = {k: row[k] for k in ("beam", "greedy")}
            print(name, way, result[name][way], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
