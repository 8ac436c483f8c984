"""WER of a recogniser folder on the held-out lines of the real people's voices in a corpus
(queen, drascula, steelsky: game actors, `speechrt_train.people`): the real speech to choose
weights and decoding on. scripts/eval_human.py's recordings stay a test set.

    PYTHONPATH=src:train python -m speechrt_train.people_eval --asr DIR --corpus CORPUS \
        --out people-dev.json [--voices queen drascula steelsky]

Each held-out line is heard as eval_human hears a file (ASR.from_rate at the shard's rate,
then the folder's own decoding: beam search + word LM where it has one, VAD), seeded by its
key. References: what the line says, in the recogniser's transcript form.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from speechrt.asr.wer import wer
from speechrt_train.asr_data import transcript
from speechrt_train.corpus import load_shard, utterance_audio
from speechrt_train.human_speech import hear_seeded

VOICES = ("queen", "drascula", "steelsky")


def heldout_lines(shard: dict[str, Any]) -> list[tuple[str, str, int]]:
    """A shard -> its held-out (key, reference, index) with a non-empty reference."""
    lines = []
    for i, held in enumerate(shard["heldout"]):
        ref = transcript(shard["spoken"][i])
        if held and ref:
            lines.append((str(shard["keys"][i]), ref, i))
    return lines


def heard_lines(
    asr: Any, corpus: str | Path, voice: str
) -> tuple[list[str], list[str], Iterator[Any]]:
    """One voice's held-out lines as `asr` hears a file (ASR.from_rate at the shard's rate,
    seeded by key): (keys, references, a speechrt.asr.decoding.Heard per line, lazily)."""
    shard = load_shard(Path(corpus) / f"{voice}.pt")
    lines = heldout_lines(shard)
    rate = int(shard["sample_rate"])
    waves = [asr.from_rate(utterance_audio(shard, i).numpy(), rate) for _, _, i in lines]
    keys = [key for key, _, _ in lines]
    return keys, [ref for _, ref, _ in lines], hear_seeded(asr, waves, keys, voice)


def evaluate(asr_dir: str | Path, corpus: str | Path, voices: tuple[str, ...] = VOICES) -> dict:
    """Per voice and overall: lines, words, WER and the hypotheses."""
    from speechrt.asr import ASR

    asr = ASR(asr_dir)
    out: dict[str, Any] = {"asr": str(asr_dir), "voices": {}}
    refs_all: list[str] = []
    hyps_all: list[str] = []
    t0 = time.perf_counter()
    for voice in voices:
        keys, refs, heard = heard_lines(asr, corpus, voice)
        hyps = [transcript(asr.finish(h).text) for h in heard]
        out["voices"][voice] = {
            "lines": len(refs),
            "words": sum(len(r.split()) for r in refs),
            "wer": wer(refs, hyps),
            "hypotheses": [[k, r, h] for k, r, h in zip(keys, refs, hyps, strict=True)],
        }
        refs_all += refs
        hyps_all += hyps
    out["overall"] = {"lines": len(refs_all), "wer": wer(refs_all, hyps_all)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--asr", required=True, help="recogniser folder (+ LM)")
    p.add_argument("--corpus", required=True, help="folder of the voices' shards (VOICE.pt)")
    p.add_argument("--voices", nargs="+", default=list(VOICES))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result = evaluate(args.asr, args.corpus, tuple(args.voices))
    Path(args.out).write_text(json.dumps(result, indent=1))
    rows = {v: round(r["wer"], 4) for v, r in result["voices"].items()}
    print(json.dumps({"overall": round(result["overall"]["wer"], 4), **rows}))


if __name__ == "__main__":
    main()
