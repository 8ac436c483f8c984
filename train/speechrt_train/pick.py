"""Pick a recogniser among candidates by a rule fixed before any of them is measured.

    PYTHONPATH=src:train python -m speechrt_train.pick SHIPPED CANDIDATE... --out pick.json \
        [--teachers /tmp/teachers] [--recorded corpus/queen.pt]

Each candidate (a recogniser folder with its LM, as `export` or `average` writes it) hears, as
`ASR()` ships it (beam search + LM, voice activity detection):
- the dev sentences (held-out 300.. minus the CI's 40: round_trip_breakdown.sentence_sets) read
  by each voice no recogniser trains on (corpus.HELDOUT_VOICES): rms, flite's rule-based voice,
  and joe-x, the neural voice joe with a pitch and vocal tract between the trained joe-h and
  joe-f. One is an unseen speaker with machine prosody, the other an unseen speaker with
  natural prosody;
- with `--recorded SHARD`, the held-out items of a recorded voice (a corpus shard of
  `speechrt_train.people`, e.g. queen: real actors' lines no recogniser trains on, though their
  speakers are trained on), as another held-out voice;
- the CI's 40 held-out sentences read by the bundled voice (the round-trip test of
  tests/test_defaults.py).

The pick: the lowest mean WER over the held-out voices among the candidates whose round trip
stays within the test's bound (0.10). The shipped recogniser, listed first, stays unless a
candidate beats its mean by more than TIE_MARGIN (0.002, about 10 words). Every voice's audio
is made once and heard by every candidate. joe's VITS draws noise as it speaks, so each run
reads joe-x afresh (up to about a point of WER apart between runs): compare candidates within
one run, or keep the audio with `--readings FILE` (written if absent, else read). Real
recordings (scripts/eval_human.py) are a test set and never read here.
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
from speechrt.asr.wer import wer
from speechrt.audio.io import resample
from speechrt.tts import TTS
from speechrt_train.align import tp_plain
from speechrt_train.asr_data import transcript
from speechrt_train.asr_eval import teacher_reading
from speechrt_train.corpus import ASR_RATE, HELDOUT_VOICES, load_shard, utterance_audio
from speechrt_train.round_trip_breakdown import sentence_sets
from speechrt_train.teachers import Teachers

ROUND_TRIP_WER = 0.10  # tests/test_defaults.py's bound on the CI's 40 sentences
# a candidate must beat the first (shipped) one by more than this mean WER, about 10 words of the
# two readings' 4,920: less is within what the readings can tell apart
TIE_MARGIN = 0.002
ROUND_TRIP = "round_trip"  # the bundled voice reading the CI's 40, beside the voices' readings


Reading = tuple[list[str], list[np.ndarray]]  # references, (N_i,) float32 audio at ASR_RATE


def voice_reading(voice: TTS, texts: list[str]) -> Reading:
    refs = [transcript(tp_plain(voice.text).normalize(s)) for s in texts]
    return refs, [resample(a, voice.sampling_rate, ASR_RATE) for a in voice.synthesize(texts)]


def recorded_reading(path: Path) -> tuple[str, Reading]:
    """(voice name, reading) of a recorded voice's held-out items (a `people` corpus shard)."""
    shard = load_shard(path)
    held = [i for i, h in enumerate(shard["heldout"]) if h]
    if not held:
        raise SystemExit(f"pick: {path} holds no held-out items")
    rate = shard["sample_rate"]
    audios = [resample(utterance_audio(shard, i).numpy(), rate, ASR_RATE) for i in held]
    return shard["voice"], ([transcript(shard["spoken"][i]) for i in held], audios)


def load_readings(path: Path) -> dict[str, Reading]:
    z = np.load(path, allow_pickle=False)
    sets = json.loads(str(z["refs"]))
    return {k: (refs, [z[f"{k}/{i}"] for i in range(len(refs))]) for k, refs in sets.items()}


def save_readings(path: Path, readings: dict[str, Reading]) -> None:
    arrays = {f"{k}/{i}": a for k, (_, audios) in readings.items() for i, a in enumerate(audios)}
    refs = json.dumps({k: refs for k, (refs, _) in readings.items()})
    np.savez_compressed(path, refs=np.array(refs), **arrays)


def heard(asr: ASR, reading: Reading) -> float:
    refs, audios = reading
    return round(wer(refs, [t.text for t in asr.transcribe(audios, batch_size=8)]), 4)


def pick(rows: list[dict[str, Any]], margin: float = TIE_MARGIN) -> dict[str, Any] | None:
    """The rule: among the rows whose `round_trip` is within ROUND_TRIP_WER, the one with the
    lowest `held_out`, unless the first row (the shipped model) is one of them and within
    `margin` of it: then the first row. None when no row is eligible."""
    eligible = [r for r in rows if r["round_trip"] <= ROUND_TRIP_WER]
    if not eligible:
        return None
    best = min(eligible, key=lambda r: r["held_out"])
    shipped = rows[0]
    if shipped in eligible and shipped["held_out"] - best["held_out"] <= margin:
        return shipped
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("candidates", nargs="+", help="recogniser folders, the shipped one first")
    p.add_argument("--voice", default="src/speechrt/defaults", help="folder of voice-*")
    p.add_argument("--teachers", default="/tmp/teachers", help="unpacked .debs (fortunes)")
    p.add_argument("--limit", type=int, help="first N sentences of each set (smoke runs)")
    p.add_argument("--readings", help=".npz of every reading's audio (written if absent)")
    p.add_argument(
        "--recorded", nargs="*", default=[], help="recorded voices' corpus shards (people)"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(2)
    cache = Path(args.readings) if args.readings else None
    if cache is not None and cache.exists():
        readings = load_readings(cache)
    else:
        sets = sentence_sets(args.teachers, args.limit)
        teachers = Teachers(args.teachers)
        readings = {v: teacher_reading(teachers, v, sets["dev"]) for v in HELDOUT_VOICES}
        voice = TTS(Path(args.voice) / "voice-acoustic", Path(args.voice) / "voice-vocoder", "cpu")
        readings[ROUND_TRIP] = voice_reading(voice, sets["ci_40"])
        if cache is not None:
            save_readings(cache, readings)
    round_trip = readings.pop(ROUND_TRIP)
    for shard in args.recorded:  # read from the shard each run, not kept in --readings
        name, reading = recorded_reading(Path(shard))
        if name in readings:
            raise SystemExit(f"pick: two readings named {name}")
        readings[name] = reading
    rows = []
    for folder in tqdm(args.candidates, desc="candidates"):
        asr = ASR(folder, device="cpu")
        row: dict[str, Any] = {"asr": folder} | {v: heard(asr, r) for v, r in readings.items()}
        row["held_out"] = round(float(np.mean([row[v] for v in readings])), 4)
        row["round_trip"] = heard(asr, round_trip)
        rows.append(row)
        tqdm.write(json.dumps(row))
    chosen = pick(rows)
    result = {
        "voices": list(readings),
        "sentences": {"dev": len(next(iter(readings.values()))[0]), "ci_40": len(round_trip[0])},
        "items": {v: len(refs) for v, (refs, _) in readings.items()},
        "round_trip_bound": ROUND_TRIP_WER,
        "tie_margin": TIE_MARGIN,
        "candidates": rows,
        "pick": chosen and chosen["asr"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("pick", result["pick"])


if __name__ == "__main__":
    main()
