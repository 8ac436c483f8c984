"""How long an onnxruntime session on the CPU takes to build, without and with speechrt's cache of
optimised graphs (speechrt.runtime.onnx_cache), and how fast each one runs.

    python scripts/bench_onnx_cache.py MODEL_DIR [MODEL_DIR ...] [--rounds 5] [--frames 700]
                                       [--out OUT.json]

Per model directory (its main graph; inputs of float features or mels and int64 lengths, one
item of --frames frames): building the session with the cache off (onnxruntime's default
optimisation, ORT_ENABLE_ALL), building it from the cached graph, and the fastest of 3 runs of
each; medians over --rounds rounds, the two taking turns so a busy machine slows them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speechrt.bench.machine import cpu_model, git_commit  # noqa: E402
from speechrt.runtime.onnx import OnnxRunner  # noqa: E402
from speechrt.runtime.onnx_cache import ENV_VAR  # noqa: E402


def feeds(runner: OnnxRunner, frames: int) -> dict[str, np.ndarray]:
    """One item: float inputs random over (fixed sizes, `frames` for named axes), lengths full."""
    rng = np.random.default_rng(0)
    out = {}
    for spec in runner.contract.inputs:
        shape = [a if isinstance(a, int) else frames for a in spec.shape]
        shape[0] = 1
        if spec.dtype == "float32":
            out[spec.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            out[spec.name] = np.full(shape, frames, dtype=spec.dtype)
    return out


def timed(model: Path, cache: str, frames: int) -> tuple[float, float, Path]:
    """(build seconds, fastest run seconds, the graph it was built from) with $ENV_VAR=cache."""
    os.environ[ENV_VAR] = cache
    start = time.perf_counter()
    runner = OnnxRunner.from_dir(model, device="cpu")
    build = time.perf_counter() - start
    x = feeds(runner, frames)
    runner.run(x)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        runner.run(x)
        runs.append(time.perf_counter() - start)
    return build, min(runs), runner.graph


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--frames", type=int, default=700)
    p.add_argument("--out")
    args = p.parse_args()
    import onnxruntime as ort

    results = {}
    with tempfile.TemporaryDirectory() as cache:
        for model in args.models:
            timed(model, cache, args.frames)  # fills the cache (and warms the page cache)
            rows: dict[str, list[tuple[float, float]]] = {"off": [], "cached": []}
            for _ in range(args.rounds):
                for name, where in (("off", "off"), ("cached", cache)):
                    build, run, graph = timed(model, where, args.frames)
                    assert (graph != model / "model.onnx") == (name == "cached"), graph
                    rows[name].append((build, run))
            results[str(model)] = {
                name: {
                    "build_ms": 1000 * statistics.median(b for b, _ in r),
                    "run_ms": 1000 * statistics.median(t for _, t in r),
                }
                for name, r in rows.items()
            }
            print(model, json.dumps(results[str(model)]))
    stamp = dict(
        cpu=cpu_model(), cores=os.cpu_count(), onnxruntime=ort.__version__, commit=git_commit(),
        command=" ".join(sys.argv), frames=args.frames, rounds=args.rounds,
    )  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({**stamp, "models": results}, indent=1))


if __name__ == "__main__":
    main()
