"""Parakeet on the CPU: a parakeet-tdt_ctc-110m-sized model on onnxruntime (the CPU default) and
eager torch, from a 10 s WAV file to text, through speechrt.asr.ASR.

Random weights (seeded), the blank's score shifted so that greedy decoding emits 3.5 tokens per
second (English speech) as scripts/bench_parakeet.py does; torch and onnxruntime on every core
of the machine (set OMP_NUM_THREADS to pin).

    python scripts/bench_parakeet_cpu.py --out DIR [--preset parakeet-tdt_ctc-110m] [--iters 5]
Writes DIR/parakeet-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speechrt.asr.transducer import greedy, spec_of  # noqa: E402
from speechrt.convert.nemo import feature_config  # noqa: E402
from speechrt.models.parakeet import ParakeetTransducer  # noqa: E402
from speechrt.registry import preset  # noqa: E402
from speechrt.repo import ComponentInfo, save_component  # noqa: E402

SECONDS, RATE, TOKENS_PER_SECOND = 10.0, 16000, 3.5


def build(name: str, out: Path) -> Path:
    """A seeded random model directory with its ONNX graphs, the blank calibrated."""
    import dataclasses

    from speechrt.runtime.export import export_dir

    torch.manual_seed(0)
    d = preset("parakeet_transducer", name)
    model = ParakeetTransducer(d).eval()
    labels = [f" w{i}" if i % 3 == 0 else f"p{i}" for i in range(d.vocab_size)]
    features = feature_config({"features": d.n_mels})
    calibrate(model, features)
    info = ComponentInfo(
        kind=model.kind,
        dims=d,
        meta={"labels": labels, "features": features.to_dict()},
        source={"file": f"random {name}", "dims": dataclasses.asdict(d)},
    )
    path = out / name
    save_component(path, info, model.state_dict())
    export_dir(path)
    return path


@torch.inference_mode()
def calibrate(model: ParakeetTransducer, features: object) -> None:
    """Shift the blank's score until 3.5 tokens per second come out on random audio."""
    from speechrt.runtime.featurizer import batch_features

    d = model.dims
    audio = torch.from_numpy(wave(1))
    feats, n = batch_features([audio], features)  # type: ignore[arg-type]
    f, lengths = model(feats, n)
    spec = spec_of(
        {"vocab_size": d.vocab_size, "durations": d.durations, "max_symbols": d.max_symbols,
         "pred_layers": d.pred_layers, "pred_hidden": d.pred_hidden}
    )  # fmt: skip

    def predict(t: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple:
        return tuple(x.numpy() for x in model.predict(*(torch.from_numpy(v) for v in (t, h, c))))

    def joint(fe: np.ndarray, g: np.ndarray) -> np.ndarray:
        return model.joint(torch.from_numpy(fe), torch.from_numpy(g)).numpy()

    bias, base = model.joint.out.bias, float(model.joint.out.bias[d.vocab_size])
    lo, hi = -50.0, 50.0
    for _ in range(16):
        mid = (lo + hi) / 2
        bias[d.vocab_size] = base + mid
        emitted = len(greedy(f.numpy(), lengths.numpy(), predict, joint, spec)[0])
        lo, hi = (mid, hi) if emitted > TOKENS_PER_SECOND * SECONDS else (lo, mid)
    print(f"calibrated blank +{mid:.2f}: {emitted} tokens per 10 s", flush=True)


def wave(seed: int) -> np.ndarray:
    """10 s of speech-like noise: bursts of coloured noise at syllable rate."""
    rng = np.random.default_rng(seed)
    n = int(SECONDS * RATE)
    noise = np.convolve(rng.standard_normal(n), np.hanning(16), "same")
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * np.arange(n) / RATE)
    return (0.1 * noise * envelope).astype(np.float32)


def time_backend(path: Path, backend: str, iters: int) -> dict:
    from speechrt.asr import ASR

    asr = ASR(path, backend=backend)
    audio = wave(2)
    asr.transcribe([audio])  # warm up
    times, text = [], ""
    for _ in range(iters):
        t0 = time.perf_counter()
        text = asr.transcribe([audio])[0].text
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    return {"backend": backend, "seconds": sec, "rtfx": SECONDS / sec, "words": len(text.split())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="parakeet-tdt_ctc-110m")
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    out = Path(args.out)
    path = build(args.preset, out)
    rows = [time_backend(path, b, args.iters) for b in ("onnx", "eager")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    stamp = {
        "cpu": platform.processor() or platform.machine(),
        "cores": torch.get_num_threads(),
        "commit": commit.stdout.strip(),
        "command": " ".join(sys.argv),
    }
    (out / "parakeet-cpu.json").write_text(json.dumps({**stamp, "rows": rows}, indent=1))
    for r in rows:
        print(f"{args.preset} {r['backend']:6} {r['seconds'] * 1e3:8.1f} ms  RTFx {r['rtfx']:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
