"""Seconds per Tacotron 2 training step (speechrt_train.tacotron2_train, DLE's dims): the eager
step beside GraphedStep (`--set graphs=true`), in one process on one GPU, on random utterances
shaped like the TTS voice's corpus (5.4 mel frames per symbol, all of one length so that every
step replays one graph). The first step of each variant (its capture) is timed apart.

    python scripts/bench_tacotron2_train.py --out tacotron2-train-speed.json
    python scripts/bench_tacotron2_train.py --device cpu --preset tiny --frames 64 --steps 2
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tqdm import tqdm

from speechrt.audio.mel import MelConfig
from speechrt_train.tacotron2_train import Tacotron2Config, Tacotron2Trainer
from speechrt_train.tts_data import VoiceData

# (name, batch size, bf16 autocast, graphs)
VARIANTS = [
    ("eager bf16, batch 32", 32, True, False),
    ("graphs bf16, batch 32", 32, True, True),
    ("graphs bf16, batch 64", 64, True, True),
    ("graphs fp32, batch 64", 64, False, True),
]


def random_voice(items: int, frames: int, symbols: int, device: torch.device) -> VoiceData:
    """`items` utterances of `frames` mel frames and `symbols` symbols (values random)."""
    cfg = MelConfig()
    g = torch.Generator().manual_seed(0)
    data = VoiceData(cfg, [], [], [], [], [], [], [])
    for i in range(items):
        durations = torch.full((symbols,), frames // symbols)
        durations[: frames - int(durations.sum())] += 1  # (sums to frames)
        data.keys.append(f"random-{i}")
        data.audio.append(torch.zeros(frames * cfg.hop_length, device=device))
        data.mels.append((torch.randn(cfg.n_mels, frames, generator=g) - 6.0).to(device))
        data.ids.append(torch.randint(1, 100, (symbols,), generator=g).to(device))
        data.durations.append(durations.to(device))
        data.pitch.append((torch.rand(symbols, generator=g) * 100 + 150).to(device))
        data.energy.append(torch.rand(symbols, generator=g).to(device))
    return data


def time_variant(data: VoiceData, config: Tacotron2Config, device: torch.device, steps: int):
    trainer = Tacotron2Trainer(data, None, config, device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    sync()
    t0 = time.perf_counter()
    trainer.step()  # (graphs: the capture)
    sync()
    first = time.perf_counter() - t0
    trainer.step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        parts = trainer.step()
    sync()
    per_step = (time.perf_counter() - t0) / steps
    return {"first_step_s": round(first, 3), "step_s": round(per_step, 4),
            "loss": float(parts["loss"])}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="default")
    p.add_argument("--frames", type=int, default=640, help="mel frames per utterance")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--out", help="JSON file")
    args = p.parse_args()
    device = torch.device(args.device)
    symbols = round(args.frames / 5.4)
    data = random_voice(128, args.frames, symbols, device)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "preset": args.preset, "frames": args.frames, "symbols": symbols,
              "steps": args.steps, "variants": {}}  # fmt: skip
    for name, batch, amp, graphs in tqdm(VARIANTS, desc="variants"):
        if graphs and device.type != "cuda":
            continue
        config = Tacotron2Config(preset=args.preset, batch_size=batch, amp=amp, graphs=graphs,
                                 max_frames=batch * args.frames)  # fmt: skip
        r = time_variant(data, config, device, args.steps)
        r["frames_per_s"] = round(batch * args.frames / r["step_s"])
        result["variants"][name] = r
        tqdm.write(f"{name}: {json.dumps(r)}")
    eager = result["variants"].get(VARIANTS[0][0])
    for r in result["variants"].values():
        if eager:
            r["speedup_frames_per_s"] = round(r["frames_per_s"] / eager["frames_per_s"], 2)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
