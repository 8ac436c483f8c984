"""Published-size models with random weights, for benchmarks only (no trained weights exist here).

Compute depends on shapes, not values, with two exceptions this script pins down so the work
matches the seeds' benchmark (128-character input, ~8 s of audio):
- FastPitch: durations come from the predictor, so its output bias is set to give ~5.4 frames
  per symbol (DLE's 128-character phrases give 693 frames for ~128 symbols);
- Tacotron 2: random weights never fire the stop gate, so it decodes exactly --t2-steps frames
  (DLE's table: ~602 mels for 128 characters).

    python scripts/bench_models.py OUT_DIR [--preset tiny]

`--preset tiny` writes every architecture's "tiny" preset instead: a quick run of the harness.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch

from speechrt.audio.features import FeatureConfig
from speechrt.audio.mel import MelConfig
from speechrt.models.fastpitch import FastPitch
from speechrt.models.hifigan import HiFiGAN
from speechrt.models.jasper import LABELS, Jasper, QuartzNet
from speechrt.models.tacotron2 import Tacotron2
from speechrt.models.waveglow import WaveGlow
from speechrt.registry import preset
from speechrt.repo import ComponentInfo, save_component

FASTPITCH_TEXT = {
    "symbol_set": "english_basic",
    "cleaners": "english_cleaners_v2",
    "p_arpabet": 0.0,
}
TACOTRON2_TEXT = {"symbol_set": "english_basic", "cleaners": "english_cleaners", "p_arpabet": 0.0}


TTS_MEL = MelConfig()


def save(model: torch.nn.Module, out: Path, meta: dict, mel: MelConfig | None = TTS_MEL) -> None:
    info = ComponentInfo(model.kind, model.dims, mel, meta, {"file": "random-weights"})
    save_component(out, info, model.state_dict())
    print(f"{out}: {model.kind}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params")


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--t2-steps", type=int, default=602, help="Tacotron 2 decoder steps")
    ap.add_argument("--frames-per-symbol", type=float, default=5.4)
    ap.add_argument("--preset", choices=("default", "tiny"), default="default")
    args = ap.parse_args()
    torch.manual_seed(0)
    # the published sizes: each kind's default, but the NGC WaveGlow (256 channels) of DLE's tables
    names = {"waveglow": "ngc-256"} if args.preset == "default" else {}

    def dims(kind: str, **overrides: object) -> Any:
        return preset(kind, names.get(kind, args.preset), **overrides)

    fp = FastPitch(dims("fastpitch")).eval()
    fp.duration_predictor.fc.weight.mul_(1e-3)  # near-constant durations ...
    fp.duration_predictor.fc.bias.fill_(math.log1p(args.frames_per_symbol))  # ... of this size
    fp.pitch_mean.fill_(214.72)
    fp.pitch_std.fill_(65.72)
    save(fp, args.out / "fastpitch", {"text": FASTPITCH_TEXT})
    save(HiFiGAN(dims("hifigan")).eval(), args.out / "hifigan", {})

    t2 = Tacotron2(dims("tacotron2", max_decoder_steps=args.t2_steps)).eval()
    t2.decoder.gate_layer.bias.fill_(-1e4)  # never stops: exactly t2-steps frames
    save(t2, args.out / "tacotron2", {"text": TACOTRON2_TEXT})
    wg = WaveGlow(dims("waveglow")).eval()
    for name, p in wg.named_parameters():
        if ".end." in name:  # trained models' coupling outputs are small: keep exp(s) finite
            p.mul_(1e-2)
    save(wg, args.out / ("waveglow256" if args.preset == "default" else "waveglow"), {})

    meta = {"labels": list(LABELS), "features": FeatureConfig().to_dict(), "pad_leading": 16}
    save(Jasper(dims("jasper")).eval(), args.out / "jasper", meta | {"weights": "random"}, None)
    qn = QuartzNet(dims("quartznet")).eval()  # default: 15x5
    save(qn, args.out / "quartznet", meta | {"weights": "random", "pad_leading": 0}, None)


if __name__ == "__main__":
    main()
