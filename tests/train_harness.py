"""What the trainer tests share: tiny training configs for FastPitch, HiFi-GAN and QuartzNet on
the synthetic corpus (tests/conftest.py's `corpus`), and the check that a resumed run trains
bit-for-bit as an uninterrupted one."""

from __future__ import annotations

import torch

from speechrt_train.fastpitch_train import FastPitchConfig
from speechrt_train.hifigan_train import HiFiGANConfig
from speechrt_train.loop import CHECKPOINT, run
from speechrt_train.quartznet_train import QuartzNetConfig

FP = FastPitchConfig(preset="fastpitch-tiny", batch_size=4, lr=3e-3, warmup=5, amp=False)
HG = HiFiGANConfig(preset="hifigan-tiny", disc_width=0.05, batch_size=2, segment_frames=8)
HG_ARGS = ["--preset", "hifigan-tiny", "--set", "disc_width=0.05", "--set", "segment_frames=8"]
QN = QuartzNetConfig(
    preset="quartznet-tiny", batch_size=4, lr=3e-3, warmup=5, amp=False, augment="synthetic"
)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _resume_matches(make, tmp_path, steps: int) -> tuple:
    """Train `steps` in one go and in two chunks (new trainer, resumed from last.pt)."""
    whole = make()
    run(whole, tmp_path / "whole", minutes=10, max_steps=steps, progress=False)
    run(make(), tmp_path / "split", minutes=10, max_steps=steps // 2, progress=False)
    torch.manual_seed(1234)  # the global RNG must come back from the checkpoint too
    resumed = make()
    summary = run(resumed, tmp_path / "split", minutes=10, max_steps=steps, progress=False)
    assert summary["steps"] == steps and (tmp_path / "split" / CHECKPOINT).exists()
    return whole, resumed
