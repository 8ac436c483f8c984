"""The recogniser's held-out WER over its training stages, as a picture for docs/models/README.md.

    python -m speechrt_train.plot_training [--csv docs/models/quartznet-progress.csv]
        [--out docs/models/quartznet-progress.png]
    python -m speechrt_train.plot_training --sweep docs/bench/fastconformer-sweep-h200.json
        --out docs/models/fastconformer-sweep.png   (train/sweep.sh's losses, one line a variant)

The CSV holds one row per training chunk (from each chunk's train.log: the step and the held-out
voice's greedy WER that ends it; `stage` as in the recipe's schedule) and, where one was
measured, our voice's beam + LM WER on 200 held-out sentences (speechrt_train.asr_eval).
The round trip's target (0.10, tests/test_defaults.py) is drawn in.
"""

from __future__ import annotations

import argparse
import csv
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default="docs/models/quartznet-progress.csv")
    p.add_argument("--out", default="docs/models/quartznet-progress.png")
    p.add_argument("--sweep", help="a sweep.json of train/sweep.sh: its training losses instead")
    args = p.parse_args()
    if args.sweep:
        return plot_sweep(args.sweep, args.out)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    stages = sorted({r["stage"] for r in rows}, key=int)
    colours = plt.get_cmap("tab20").colors  # (more stages than the default cycle's 10 colours)
    for i, stage in enumerate(stages):
        its = [r for r in rows if r["stage"] == stage]
        steps = [int(r["step"]) for r in its]
        wers = [float(r["val_wer_rms_greedy"]) for r in its]
        top.plot(steps, wers, "o-", color=colours[i % 20], label=f"stage {stage}")
    top.set_ylabel("WER, held-out voice rms\n(greedy, 300 sentences)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    measured = [r for r in rows if r["our_voice_beam_lm"]]
    bottom.plot(
        [int(r["step"]) for r in measured],
        [float(r["our_voice_beam_lm"]) for r in measured],
        "s-",
        color="C3",
        label="our voice, beam + LM (200 sentences)",
    )
    bottom.axhline(0.10, color="k", linestyle="--", linewidth=1, label="target")
    bottom.set_ylabel("round-trip WER")
    bottom.set_xlabel("QuartzNet training step")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    fig.suptitle("Bundled recogniser (QuartzNet 5x5) during training")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


def plot_sweep(path: str, out: str) -> None:
    """Each variant's logged training loss against its step."""
    with open(path) as f:
        runs = json.load(f)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, r in enumerate(runs):
        points = [
            (x["step"], x[k]) for x in r["log"] for k in x if k not in ("step", "seconds", "eval")
        ]
        steps, losses = zip(*points, strict=True)
        ax.plot(steps, losses, "o-", markersize=3, label=f"[{i}] {r['args']}")
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (CTC per target piece)")
    ax.set_ylim(top=7)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.suptitle(f"train/sweep.sh: {path}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
