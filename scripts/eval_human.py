"""WER of the bundled recogniser and of pocketsphinx on recordings of real people (held out).

    pip install pocketsphinx G722     # optional: only this script needs them (the `human` extra)
    python scripts/eval_human.py [--cache out/human-speech] [--json out/human-eval.json] \
        [--asr DIR]     # another recogniser folder (model + LM) in place of the bundled one

Fetches the packages listed in speechrt_train.human_speech (Debian .debs with `apt-get download`,
the pocketsphinx sdist with `pip download`) into the git-ignored cache, builds a JSON-lines
manifest there (cache/manifest.jsonl; `speechrt eval --manifest` reads it too), and transcribes
every utterance with
  (a) the bundled recogniser, speechrt.asr.ASR() as it ships: beam search + word LM, with VAD;
  (b) pocketsphinx's default en-us model (acoustic model, LM and dictionary in its wheel).
Both hear the same recordings, mixed to mono: the bundled recogniser as it hears a file
(ASR.from_rate: resampled to 16 kHz, an 8 kHz file then through the telephone band it learnt),
pocketsphinx the file resampled to 16 kHz. Prints a table
per source, overall (every recording as shipped) and overall, wideband (the 8 kHz prompts
replaced by their G.722 takes at 16 kHz), and writes the figures, per-utterance hypotheses, CPU
and commit as JSON.

The recordings are a test set only: never train, tune decoding or pick checkpoints on them.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import soundfile as sf
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "train")]

import speechrt_train.human_speech as hs  # noqa: E402
from speechrt.audio.io import resample  # noqa: E402
from speechrt.bench.machine import cpu_model, git_commit  # noqa: E402

SAMPLE_RATE = 16000


def load_mono(path: str) -> tuple[np.ndarray, int]:
    """A file -> (mono float32 (N,) with its channels averaged, its sample rate)."""
    audio, sr = sf.read(path, dtype="float32", always_2d=True)
    return audio.mean(axis=1), sr


def run_bundled(
    recordings: list[tuple[np.ndarray, int]], ids: list[str], folder: str | None = None
) -> tuple[list[str], float]:
    """The shipped recogniser, or the one in `folder` (its defaults: beam + LM, VAD), hearing
    each recording as it hears a file at that rate -> (hypotheses, compute seconds)."""
    from speechrt.asr import ASR

    asr = ASR(folder)
    waves = [asr.from_rate(audio, sr) for audio, sr in recordings]
    t0 = time.perf_counter()
    hyps = hs.transcribe_seeded(asr, waves, ids, "bundled")
    return hyps, time.perf_counter() - t0


def run_pocketsphinx(
    recordings: list[tuple[np.ndarray, int]], ids: list[str]
) -> tuple[list[str], float]:
    """pocketsphinx's default en-us model, one utterance at a time, on each recording
    resampled to 16 kHz -> (hypotheses, seconds)."""
    from pocketsphinx import Decoder

    waves = [resample(audio, sr, SAMPLE_RATE) for audio, sr in recordings]
    decoder = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL")
    t0 = time.perf_counter()
    hyps = []
    for w in tqdm(waves, desc="pocketsphinx", unit="utt", file=sys.stderr):
        pcm = (np.clip(w, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        hyps.append(hyp.hypstr if hyp is not None else "")
    return hyps, time.perf_counter() - t0


def report(results: dict[str, dict[str, hs.Tally]]) -> None:
    from rich.console import Console
    from rich.table import Table

    names = list(results)
    table = Table(title="Real human speech (held out)")
    for col in ("source", "utts", "speakers", "min"):
        table.add_column(col, justify="left" if col == "source" else "right", no_wrap=True)
    for name in names:
        table.add_column(f"WER {name}", justify="right")
        table.add_column(f"CER {name}", justify="right")
    if len(names) == 2:
        table.add_column(f"WER {names[0]} / {names[1]}", justify="right")
    first = results[names[0]]
    totals = [k for k in (hs.OVERALL, hs.WIDEBAND) if k in first]
    lengths = [k for k in hs.LENGTH_GROUPS if k in first]
    for source in [s for s in first if s not in totals + lengths] + totals + lengths:
        t = first[source]
        row = [source, str(t.utterances), str(len(t.speakers)), f"{t.seconds / 60:.1f}"]
        for name in names:
            r = results[name][source]
            row += [f"{100 * r.words.rate:.1f} %", f"{100 * r.chars.rate:.1f} %"]
        if len(names) == 2:
            b = results[names[1]][source].words.rate
            row.append(f"{first[source].words.rate / b:.2f}x" if b > 0 else "-")
        table.add_row(*row)
    Console(width=max(Console().width, 130)).print(table)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", default=str(ROOT / "out/human-speech"), help="download folder")
    p.add_argument("--json", default=str(ROOT / "out/human-eval.json"), help="results file")
    p.add_argument("--sources", nargs="+", default=list(hs.BUILDERS), choices=list(hs.BUILDERS))
    p.add_argument("--skip-pocketsphinx", action="store_true", help="only the bundled model")
    p.add_argument("--asr", help="a recogniser folder (model + LM) in place of the bundled one")
    args = p.parse_args(argv)
    if not args.skip_pocketsphinx:
        try:
            import pocketsphinx  # noqa: F401
        except ImportError:
            print("eval_human: pocketsphinx is not installed (pip install pocketsphinx)")
            return 1
    if "asterisk-g722" in args.sources and importlib.util.find_spec("G722") is None:
        print("eval_human: G722 is not installed (pip install G722): skipping asterisk-g722")
        args.sources.remove("asterisk-g722")
    cache = Path(args.cache)
    roots = {s: hs.fetch(s, cache) for s in args.sources}
    entries: list[hs.Entry] = hs.build_manifest(roots, cache / "manifest.jsonl")
    recordings = [load_mono(e.audio_filepath) for e in entries]
    seconds = sum(audio.shape[0] / sr for audio, sr in recordings)
    recognisers = {"bundled": functools.partial(run_bundled, folder=args.asr)}
    if not args.skip_pocketsphinx:
        recognisers["pocketsphinx"] = run_pocketsphinx
    hyps, results, timing = {}, {}, {}
    for name, fn in recognisers.items():
        hyps[name], spent = fn(recordings, [e.id for e in entries])
        results[name] = hs.score(entries, hyps[name])
        timing[name] = {"compute_s": round(spent, 2), "rtf": round(seconds / spent, 2)}
    report(results)
    out = {
        "command": " ".join(["python", "scripts/eval_human.py", *(argv or sys.argv[1:])]),
        "cpu": cpu_model(),
        "commit": git_commit(),
        "asr": args.asr or "bundled",
        "audio_minutes": round(seconds / 60, 2),
        "timing": timing,
        "results": {n: {s: t.to_dict() for s, t in r.items()} for n, r in results.items()},
        # each file by its package and path in it (`package`, `path`), not this machine's cache
        "utterances": [
            {k: v for k, v in asdict(e).items() if k != "audio_filepath"}
            | {f"hyp_{n}": hyps[n][i] for n in hyps}
            for i, e in enumerate(entries)
        ],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
