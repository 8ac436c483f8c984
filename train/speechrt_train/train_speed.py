"""Training throughput of the trainers, per configuration variant: pick the GPU config.

    PYTHONPATH=src:train python -m speechrt_train.train_speed --corpus corpus --seconds 120 \
        --out speed.json [--models hifigan,quartznet,fastconformer] [--tiny] [--profile]

For each model the corpus is loaded once; each variant (config overrides: batch size, compile)
builds a fresh trainer, runs --warmup steps (compilation, cuDNN autotuning), then times --steps
steps between device synchronisations. Reported per variant: steps/s, items/s (utterances or
segments), audio seconds/s (recognisers: input audio; HiFi-GAN: generated segments), peak device
memory, and with --profile the op counts of one more step split into data / forward / backward /
optimizer (torch.profiler; the trainers mark those regions with record_function). The whole run
stops cleanly when --seconds is spent: a variant cut short says so, later ones are "skipped".
The JSON is rewritten after every variant, so a killed run still leaves its results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

REGIONS = ("data", "forward", "backward", "optimizer")

# (label, config overrides); QuartzNet's max_samples scales with its batch size
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "fastpitch": [{"batch_size": 32}, {"batch_size": 64}],
    "hifigan": [{"batch_size": b, "compile": c} for c in (False, True) for b in (16, 32, 64)],
    "quartznet": [{"batch_size": b, "compile": c} for c in (False, True) for b in (64, 128, 256)],
    # launch-bound at 128 (163 ms a step at 64, 182 at 128 on an H200): the larger batches first
    "fastconformer": [
        *({"batch_size": b} for b in (128, 256, 512)),
        {"batch_size": 256, "compile": True},
    ],
}
TINY = {
    "fastpitch": {"preset": "fastpitch-tiny"},
    "hifigan": {"preset": "hifigan-tiny", "disc_width": 0.05, "segment_frames": 8},
    "quartznet": {"preset": "quartznet-tiny"},
    "fastconformer": {"preset": "tiny"},
}
TINY_VARIANTS: dict[str, list[dict[str, Any]]] = {
    "fastpitch": [{"batch_size": 4}],
    "hifigan": [{"batch_size": 4}, {"batch_size": 8}],
    "quartznet": [{"batch_size": 4}, {"batch_size": 8}],
    "fastconformer": [{"batch_size": 4}],
}


class Counted:
    """Wraps a trainer's Batches: counts the items (and their lengths) it hands out."""

    def __init__(self, batches: Any, lengths: list[int]) -> None:
        self.inner, self.lengths = batches, lengths
        self.items = 0
        self.units = 0

    def __next__(self) -> list[int]:
        index = next(self.inner)
        self.items += len(index)
        self.units += sum(self.lengths[i] for i in index)
        return index

    def __iter__(self) -> Counted:
        return self

    def state_dict(self) -> dict[str, int]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.inner.load_state_dict(state)


def load_data(model: str, corpus: Path, device: str, limit: int | None) -> Any:
    """The training items `model` learns from (no held-out set: nothing is evaluated)."""
    from speechrt_train.corpus import HELDOUT_VOICE, TTS_VOICE, load_shard

    if model in ("fastpitch", "hifigan"):
        from speechrt_train.tts_data import load_voice

        shard = load_shard(corpus / f"{TTS_VOICE}.pt")
        return load_voice(shard, heldout=False, device=device, limit=limit)
    from speechrt_train.asr_data import load_speech

    shards = [load_shard(p) for p in sorted(corpus.glob("*.pt")) if p.stem != HELDOUT_VOICE]
    return load_speech(shards, heldout=False, device=device, limit=limit)


def make_trainer(model: str, data: Any, overrides: dict[str, Any], device: str) -> Any:
    if model == "fastpitch":
        from speechrt_train.fastpitch_train import FastPitchConfig, FastPitchTrainer

        config = dataclasses.replace(FastPitchConfig(), **overrides)
        return FastPitchTrainer(data, None, config, device)
    if model == "hifigan":
        from speechrt_train.hifigan_train import HiFiGANConfig, HiFiGANTrainer

        config = dataclasses.replace(HiFiGANConfig(), **overrides)
        return HiFiGANTrainer(data, None, config, device)
    from speechrt_train.fastconformer_train import FastConformerConfig, FastConformerTrainer
    from speechrt_train.quartznet_train import QuartzNetConfig, QuartzNetTrainer

    if "batch_size" in overrides and "max_samples" not in overrides:
        overrides = {**overrides, "max_samples": overrides["batch_size"] * 16000 * 5}
    if model == "fastconformer":
        fc = dataclasses.replace(FastConformerConfig(), **overrides)
        return FastConformerTrainer(data, None, fc, device)
    config = dataclasses.replace(QuartzNetConfig(), **overrides)
    return QuartzNetTrainer(data, None, config, device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def count_ops(trainer: Any, device: str) -> dict[str, Any]:
    """One step under torch.profiler: aten ops (all, and outermost = dispatches from Python or
    from autograd) and CUDA kernel launches, per region (by start time)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    _sync(device)
    with profile(activities=activities) as prof:
        trainer.step()
        _sync(device)
    events = list(prof.events())
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name in REGIONS]

    def region(t: float) -> str:
        for name, start, end in spans:
            if start <= t <= end:
                return name
        return "other"

    out: dict[str, dict[str, int]] = {}
    for e in events:
        is_aten = e.name.startswith("aten::")
        outer = is_aten and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))
        launch = e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
        sync = e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize")
        if not (is_aten or launch or sync):
            continue
        counts = out.setdefault(region(e.time_range.start), {})
        for key, hit in (("aten", is_aten), ("outer", outer), ("launch", launch), ("sync", sync)):
            if hit:
                counts[key] = counts.get(key, 0) + 1
    total = {k: sum(c.get(k, 0) for c in out.values()) for k in ("aten", "outer", "launch")}
    return {"total": total, "regions": out}


def time_variant(
    model: str,
    data: Any,
    overrides: dict[str, Any],
    device: str,
    steps: int,
    warmup: int,
    deadline: float,
    profile: bool,
) -> dict[str, Any]:
    torch.manual_seed(0)
    trainer = make_trainer(model, data, overrides, device)
    lengths = [a.shape[0] for a in data.audio]
    if model == "hifigan":  # samples per segment, whatever the item's length
        hop = data.mel_config.hop_length
        lengths = [trainer.config.segment_frames * hop] * len(data.audio)
    trainer.batches = Counted(trainer.batches, lengths)
    rate = 16000 if model in ("quartznet", "fastconformer") else data.mel_config.sampling_rate
    result: dict[str, Any] = {"model": model, **overrides}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        if time.time() > deadline:
            return {**result, "stopped": "budget (warm-up)"}
        trainer.step()
    _sync(device)
    result["warmup_s"] = round(time.perf_counter() - t0, 2)
    items0, units0 = trainer.batches.items, trainer.batches.units
    t0 = time.perf_counter()
    done = 0
    each = []  # per-step times on the CPU (no asynchrony there): the median resists contention
    for _ in range(steps):
        if time.time() > deadline:
            result["stopped"] = "budget"
            break
        t1 = time.perf_counter()
        trainer.step()
        each.append(time.perf_counter() - t1)
        done += 1
    _sync(device)
    seconds = time.perf_counter() - t0
    if done and not device.startswith("cuda"):
        result["median_ms_per_step"] = round(1000 * sorted(each)[len(each) // 2], 2)
    if done:
        result.update(
            steps=done,
            seconds=round(seconds, 3),
            ms_per_step=round(1000 * seconds / done, 2),
            steps_per_s=round(done / seconds, 2),
            items_per_s=round((trainer.batches.items - items0) / seconds, 1),
        )
        if model != "fastpitch":
            audio = (trainer.batches.units - units0) / rate
            result["audio_s_per_s"] = round(audio / seconds, 1)
    if device.startswith("cuda"):
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if profile and time.time() < deadline:
        result["ops"] = count_ops(trainer, device)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--corpus", default="corpus")
    p.add_argument("--out", default="speed.json")
    p.add_argument("--models", default="hifigan,quartznet,fastpitch")
    p.add_argument("--seconds", type=float, default=120.0, help="budget for the whole run")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation)")
    p.add_argument("--device", default="auto")
    p.add_argument("--limit", type=int, help="utterances per voice (faster loading)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--tiny", action="store_true", help="tiny presets (CPU smoke runs)")
    p.add_argument("--profile", action="store_true", help="count ops of one more step")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="MODEL:FIELD=VALUE,...",
        help="replace the default variants of MODEL (repeatable)",
    )
    args = p.parse_args(argv)
    start = time.time()
    deadline = start + args.seconds
    corpus = Path(args.corpus)
    if not (corpus / "manifest.json").exists():
        print(f"no corpus at {corpus} (manifest.json missing)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")
    variants = {m: list(v) for m, v in (TINY_VARIANTS if args.tiny else VARIANTS).items()}
    custom: dict[str, list[dict[str, Any]]] = {}
    for spec in args.variant:
        model, _, fields = spec.partition(":")
        custom.setdefault(model, []).append(
            {k: json.loads(v) for k, _, v in (f.partition("=") for f in fields.split(",") if f)}
        )
    variants.update(custom)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "results": [],
    }
    out = Path(args.out)
    for model in args.models.split(","):
        if time.time() > deadline:
            report["results"].append({"model": model, "stopped": "skipped"})
            continue
        t0 = time.time()
        data = load_data(model, corpus, device, args.limit)
        print(f"{model}: {len(data)} items loaded in {time.time() - t0:.1f} s", file=sys.stderr)
        for overrides in variants[model]:
            overrides = {**(TINY[model] if args.tiny else {}), **overrides}
            if time.time() > deadline:
                report["results"].append({"model": model, **overrides, "stopped": "skipped"})
                continue
            try:
                row = time_variant(
                    model, data, overrides, device, args.steps, args.warmup, deadline,
                    args.profile,
                )  # fmt: skip
            except Exception as e:  # a variant that cannot run (out of memory, ...) is reported
                row = {"model": model, **overrides, "error": f"{type(e).__name__}: {e}"[:300]}
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
            report["results"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "ops"}), file=sys.stderr)
            out.write_text(json.dumps(report, indent=1))
        del data
    report["wall_s"] = round(time.time() - start, 1)
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
