"""`speechrt bench tts|asr`: pipelines timed in-process, stage by stage, as the seeds measure them.

Latency is host input (padded ids or audio) to host output (audio or text); text processing is
excluded as in DLE. Warm-up runs are excluded. Each row times the pipeline twice over: stage by
stage with a device synchronisation around every stage (`latency_s` is the sum, `stages_s` the
parts), and end to end with no synchronisation but the pipeline's own (`end_to_end_s`: what a
caller waits, with the host preparing a stage while the device still runs the one before).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from speechrt.bench.inputs import TTS_TEXT, synthetic_speechlike
from speechrt.bench.stats import summarize

if TYPE_CHECKING:
    from speechrt.asr import ASR
    from speechrt.tts import TTS

ASR_DURATIONS = (2.0, 7.0, 16.7)  # seconds, as in the Jasper/QuartzNet benchmark tables


@dataclass(frozen=True)
class Variant:
    backend: str
    precision: str


class StageTimer:
    """Accumulates synchronised wall time per named stage for one iteration; sync=False: times
    nothing and never synchronises (an end-to-end iteration)."""

    def __init__(self, device: torch.device, sync: bool = True) -> None:
        self.device, self.sync = device, sync
        self.times: dict[str, float] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if not self.sync:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0


def run_iterations(
    step: Callable[[StageTimer], dict], device: torch.device, warmup: int, iters: int, desc: str
) -> tuple[list[dict[str, float]], list[dict], list[float]]:
    """Run `step` warmup + iters times stage by stage, then iters times end to end; returns the
    per-iteration stage times, step results and end-to-end seconds."""
    for _ in range(warmup):
        step(StageTimer(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, infos, whole = [], [], []
    for _ in tqdm(range(iters), desc=desc, leave=False, unit="it"):
        timer = StageTimer(device)
        infos.append(step(timer))
        times.append(timer.times)
    for _ in tqdm(range(iters), desc=f"{desc} end to end", leave=False, unit="it"):
        timer = StageTimer(device, sync=False)
        t0 = time.perf_counter()
        step(timer)
        timer._sync()
        whole.append(time.perf_counter() - t0)
    return times, infos, whole


def row(
    variant: Variant,
    batch_size: int,
    times: list[dict[str, float]],
    device: torch.device,
    whole: list[float],
) -> dict:
    latencies = [sum(t.values()) for t in times]
    stages = {name: float(np.mean([t[name] for t in times])) for name in times[0]}
    out = {
        "backend": variant.backend,
        "precision": variant.precision,
        "batch_size": batch_size,
        "iterations": len(times),
        "latency_s": summarize(latencies),
        "end_to_end_s": summarize(whole),
        "stages_s": stages,
    }
    if device.type == "cuda":
        out["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def bench_tts(
    make_tts: Callable[[Variant], TTS],
    variants: list[Variant],
    batch_sizes: list[int],
    warmup: int,
    iters: int,
    denoise: float = 0.0,
    text: str = TTS_TEXT,
) -> list[dict]:
    """One result row per variant x batch size; `make_tts(variant)` builds the pipeline."""
    from speechrt.options import SynthesisOptions

    options = SynthesisOptions(denoise=denoise)
    rows = []
    for variant in variants:
        tts = make_tts(variant)
        for bs in batch_sizes:
            pieces = tts.text_to_pieces([text] * bs, list(range(bs)))

            @torch.inference_mode()
            def step(timer: StageTimer, tts=tts, pieces=pieces) -> dict:
                with timer.stage("input"):
                    ids, lengths, seeds = tts.batch_to_tensors(pieces)
                with timer.stage("acoustic"):
                    mel, mel_lengths = tts.ids_to_mel(ids, lengths, options, seeds)
                with timer.stage("vocoder"):
                    audio, audio_lengths = tts.mel_to_audio(mel, mel_lengths, options, seeds)
                if denoise > 0:
                    with timer.stage("denoiser"):
                        audio = tts.denoise(audio, audio_lengths, denoise)
                with timer.stage("output"):
                    wavs = tts.to_numpy(audio, audio_lengths)
                return {"frames": int(mel_lengths.sum()), "samples": sum(len(w) for w in wavs)}

            desc = f"tts {variant.backend}/{variant.precision} b{bs}"
            device = torch.device(tts.device)  # a name where the pipeline runs on numpy (onnx)
            times, infos, whole = run_iterations(step, device, warmup, iters, desc)
            r = row(variant, bs, times, device, whole)
            mean_latency = r["latency_s"]["mean"]
            samples = float(np.mean([i["samples"] for i in infos]))
            audio_s = samples / tts.sampling_rate
            r.update(
                avg_mel_frames=float(np.mean([i["frames"] for i in infos])) / bs,
                avg_audio_s=audio_s / bs,
                throughput_samples_s=samples / mean_latency,
                throughput_end_to_end_samples_s=samples / r["end_to_end_s"]["mean"],
                inferences_s=bs / mean_latency,
                rtf=audio_s / mean_latency,  # seconds of audio per second of compute
            )
            rows.append(r)
    return rows


def bench_asr(
    make_asr: Callable[[Variant], ASR],
    variants: list[Variant],
    batch_sizes: list[int],
    warmup: int,
    iters: int,
    durations: tuple[float, ...] = ASR_DURATIONS,
) -> list[dict]:
    """One row per variant x audio duration x batch size, as the Jasper/QuartzNet tables;
    `decode` is the CTC decoding, or a transducer's greedy loop (Parakeet)."""
    rows = []
    for variant in variants:
        asr = make_asr(variant)
        for seconds in durations:
            audio = synthetic_speechlike(seconds, asr.sample_rate)
            for bs in batch_sizes:
                segs = [seg for i in range(bs) for seg in asr.segments(i, audio)]

                @torch.inference_mode()
                def step(timer: StageTimer, asr=asr, segs=segs) -> dict:
                    if asr.front is not None:  # cuda: features and acoustic model, one graph
                        with timer.stage("features+acoustic"):
                            log_probs, out_lengths = asr.log_probs(segs)
                    else:
                        with timer.stage("features"):
                            feats, lengths, samples = asr.featurize(segs)
                        with timer.stage("acoustic"):
                            log_probs, out_lengths = asr.acoustic(feats, lengths, samples)
                    with timer.stage("decode"):
                        asr.decode(segs, log_probs, out_lengths)
                    return {"samples": sum(seg.audio.shape[0] for seg in segs)}

                desc = f"asr {variant.backend}/{variant.precision} {seconds}s b{bs}"
                device = torch.device(asr.device)  # a name on numpy (onnx)
                times, infos, whole = run_iterations(step, device, warmup, iters, desc)
                r = row(variant, bs, times, device, whole)
                mean_latency = r["latency_s"]["mean"]
                r.update(
                    audio_s=seconds,
                    throughput_samples_s=infos[0]["samples"] / mean_latency,
                    inferences_s=bs / mean_latency,
                    rtf=bs * seconds / mean_latency,
                )
                rows.append(r)
    return rows
