"""WaveGlow in DLE's checkpoint layout, written for the tests: key shapes (weight norm
unfolded), random weights, tiny dims."""

from __future__ import annotations

import torch

TINY = dict(n_mel_channels=8, n_layers=2, n_channels=8)  # 12 flows, n_group 8, as DLE


def dle_shapes(n_mel_channels=80, n_flows=12, n_group=8, n_early_every=4, n_early_size=2,
               n_layers=8, kernel_size=3, n_channels=512) -> dict[str, list[int]]:  # fmt: skip
    """Key -> shape of DLE's WaveGlow state dict (weight norm unfolded as weight_g / weight_v)."""
    c, cond = n_channels, n_mel_channels * n_group
    shapes = {"upsample.weight": [n_mel_channels, n_mel_channels, 1024],
              "upsample.bias": [n_mel_channels]}  # fmt: skip

    def wn_conv(name: str, out: int, inp: int, k: int) -> None:
        shapes.update({f"{name}.bias": [out], f"{name}.weight_g": [out, 1, 1],
                       f"{name}.weight_v": [out, inp, k]})  # fmt: skip

    remaining = n_group
    for f in range(n_flows):
        if f and f % n_early_every == 0:
            remaining -= n_early_size
        half = remaining // 2
        for i in range(n_layers):
            wn_conv(f"WN.{f}.in_layers.{i}", 2 * c, c, kernel_size)
            wn_conv(f"WN.{f}.res_skip_layers.{i}", 2 * c if i < n_layers - 1 else c, c, 1)
            wn_conv(f"WN.{f}.cond_layers.{i}", 2 * c, cond, 1)
        wn_conv(f"WN.{f}.start", c, half, 1)
        shapes[f"WN.{f}.end.weight"] = [2 * half, c, 1]
        shapes[f"WN.{f}.end.bias"] = [2 * half]
    for f in range(n_flows):
        r = n_group - n_early_size * (f // n_early_every)
        shapes[f"convinv.{f}.conv.weight"] = [r, r, 1]
    return shapes


def dle_state_dict(**hp) -> dict[str, torch.Tensor]:
    """Random weights in DLE layout; orthogonal 1x1 convs as DLE initialises them."""
    sd = {}
    for k, shape in dle_shapes(**hp).items():
        if k.startswith("convinv."):
            w = torch.linalg.qr(torch.randn(shape[0], shape[0]))[0]
            sd[k] = w.unsqueeze(-1)
        elif k.endswith("weight_g"):
            sd[k] = torch.rand(shape) + 0.5
        else:
            sd[k] = torch.randn(shape) * (0.05 if ".end." in k or "upsample" in k else 0.5)
    return sd
