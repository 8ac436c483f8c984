"""Does a half-precision decoder step keep Tacotron 2's stop step? A trained Tacotron 2 (a
speechrt_train compact file) reads the TTS voice's sentences free-running three times, with the
same prenet dropout seeds: with its own float32 decoder step (the reference); with the cuda
runner's FusedStep in float32 (the same arithmetic, its sums in another order: the control, how
far any new kernel moves a stop); with FusedStep whose two LSTM GEMMs take bf16 weights
(FusedStep.lstm_in; state, attention and gate float32). Per sentence: the stop step of each, and
each mel's SNR against the reference over the frames both made. Writes --out.

    python scripts/tacotron2_stop_steps.py --weights runs/tacotron2.pt --corpus corpus \\
        --sentences 300 --device cuda --out OUT/tacotron2-stop-steps.json
    python scripts/tacotron2_stop_steps.py --summarize OUT/tacotron2-stop-steps.json  # again
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("src", "train")]

from speechrt.arch.tacotron2 import PRESETS, Tacotron2Dims  # noqa: E402
from speechrt.errors import MaxDecoderStepsWarning  # noqa: E402
from speechrt.models.tacotron2 import Tacotron2  # noqa: E402
from speechrt.options import SynthesisOptions  # noqa: E402
from speechrt.runtime.tacotron2 import FusedStep  # noqa: E402


def load(weights: str, n_mels: int, device: str) -> Tacotron2:
    state = torch.load(weights, map_location="cpu", weights_only=True)
    dims = Tacotron2Dims(**PRESETS[state["config"]["preset"]], n_mel_channels=n_mels)
    model = Tacotron2(dims)
    model.load_state_dict({k: v.float() for k, v in state["model"].items()})
    return model.to(device).eval()


def snr_db(reference: Tensor, other: Tensor) -> float:
    noise = (reference - other).pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(reference.pow(2).sum() / noise).item()


def compare(model: Tacotron2, sentences: list[Tensor], batch: int) -> list[dict[str, Any]]:
    """Each sentence's stop steps and mel SNRs: reference, fused float32 and bf16 LSTM GEMMs."""
    options = SynthesisOptions()
    rows: list[dict[str, Any]] = []
    full = model.decoder
    fused = FusedStep(full)
    half = FusedStep(full).lstm_in(torch.bfloat16)
    for start in range(0, len(sentences), batch):
        items = sentences[start : start + batch]
        ids = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
        lengths = torch.tensor([len(x) for x in items])
        seeds = torch.arange(start, start + len(items))
        runs = []
        for step in (full, half, fused):
            model.decoder = step
            runs.append(model.generate_mel(ids, lengths, options, seeds))
        model.decoder = full
        (a, na), (b, nb), (c, nc) = runs
        for i in range(len(items)):
            n, m = int(min(na[i], nb[i])), int(min(na[i], nc[i]))
            rows.append(
                dict(
                    symbols=len(items[i]),
                    stop_fp32=int(na[i]),
                    stop_bf16=int(nb[i]),
                    snr_db=snr_db(a[i, :, :n].float(), b[i, :, :n].float()) if n else None,
                    stop_fused=int(nc[i]),
                    snr_fused_db=snr_db(a[i, :, :m].float(), c[i, :, :m].float()) if m else None,
                )
            )
    return rows


def _correlation(x: list[int], y: list[int]) -> float | None:
    """Pearson's r; None where either side is constant (it is undefined)"""
    return statistics.correlation(x, y) if len(set(x)) > 1 and len(set(y)) > 1 else None


def agreement(rows: list[dict[str, Any]], stop: str, snr: str, prefix: str = "") -> dict[str, Any]:
    """How often rows[stop] equals the reference's stop step; the SNRs of rows[snr]."""
    delta = [r[stop] - r["stop_fp32"] for r in rows]
    snrs = [r[snr] for r in rows if r[snr] is not None]
    return {
        f"{prefix}stop_identical": sum(d == 0 for d in delta),
        f"{prefix}stop_within_1": sum(abs(d) <= 1 for d in delta),
        f"{prefix}stop_max_abs_delta": max(abs(d) for d in delta),
        f"{prefix}snr_db_median": statistics.median(snrs) if snrs else None,
        f"{prefix}snr_db_min": min(snrs) if snrs else None,
    }


def summary(rows: list[dict[str, Any]], max_steps: int) -> dict[str, Any]:
    """The bf16 step's agreement with the reference, the float32 control's where the rows have
    it (files written before it have not), and whether the model reads its text at all."""
    symbols, stops = [r["symbols"] for r in rows], [r["stop_fp32"] for r in rows]
    control = (
        agreement(rows, "stop_fused", "snr_fused_db", "fused_") if "stop_fused" in rows[0] else {}
    )
    return dict(
        sentences=len(rows),
        **agreement(rows, "stop_bf16", "snr_db"),
        never_stopped_fp32=sum(r["stop_fp32"] >= max_steps for r in rows),
        # an untrained gate stops at once: agreement then says nothing (look at the steps)
        stop_fp32_median=statistics.median(r["stop_fp32"] for r in rows),
        stop_fp32_min=min(r["stop_fp32"] for r in rows),
        # a model that reads its text stops in proportion to it (FastPitch's ~5.4 frames each)
        frames_per_symbol_median=statistics.median(r["stop_fp32"] / r["symbols"] for r in rows),
        stop_symbols_correlation=_correlation(symbols, stops),
        **control,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", help="a compact file of speechrt_train tacotron2")
    p.add_argument("--corpus", default="corpus")
    p.add_argument("--sentences", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", help="the result's file (--weights)")
    p.add_argument("--summarize", metavar="FILE", help="print an earlier result's summary again")
    args = p.parse_args()
    if args.summarize:
        result = json.loads(Path(args.summarize).read_text())
        steps = result.get("max_steps", Tacotron2Dims().max_decoder_steps)
        print(json.dumps(summary(result["rows"], steps)))
        return 0
    if not (args.weights and args.out):
        p.error("--weights and --out are required (or --summarize FILE)")
    if args.sentences < 1 or args.batch < 1:
        p.error("--sentences and --batch must be at least 1")
    from speechrt_train.corpus import TTS_VOICE, load_shard
    from speechrt_train.tts_data import load_voice

    shard = load_shard(Path(args.corpus) / f"{TTS_VOICE}.pt")
    held, train = load_voice(shard, heldout=True), load_voice(shard)
    sentences = (held.ids + train.ids)[: args.sentences]  # held-out first
    model = load(args.weights, held.mel_config.n_mels, args.device)
    warnings.simplefilter("ignore", MaxDecoderStepsWarning)  # counted: never_stopped_fp32
    with torch.inference_mode():
        rows = compare(model, [s.to(args.device) for s in sentences], args.batch)
    result = dict(
        weights=args.weights,
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        held_out=min(len(held), args.sentences),
        max_steps=model.dims.max_decoder_steps,
        summary=summary(rows, model.dims.max_decoder_steps),
        rows=rows,
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
