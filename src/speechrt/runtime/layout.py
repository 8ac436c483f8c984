"""1-D convolutions run as channels-last 2-D convolutions, for the cuda runner.

cuDNN's half-precision convolutions compute in NHWC. A (B, C, T) tensor in PyTorch's default
layout is NCHW once unsqueezed, so every Conv1d pays two transposes around its kernel. Swapping
each Conv1d / ConvTranspose1d for a module that runs conv2d over (B, C, 1, T) with channels-last
weights makes the first convolution move its input to NHWC once; from then on every convolution,
activation, mask and residual sum works on tensors whose memory is (B, T, C) and no transpose runs.

The modules keep the 1-D interface, (B, C, T) in and out, so the model's own forward runs
unchanged; only the memory layout of its intermediate tensors differs (outputs may be
non-contiguous: the runner copies them out contiguously).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _2d(v: tuple[int, ...], height: int = 1) -> tuple[int, int]:
    """A 1-D conv argument as the 2-D one over (B, C, 1, T): (stride/dilation 1 or pad 0, v)."""
    return (height, v[0])


class _Conv1dAs2d(nn.Module):
    """The 1-D attributes of `conv` (stride, padding, ... as nn.Conv1d has them: code such as
    Jasper's conv_lengths reads them) and its weights as (C, C', 1, k), channels-last."""

    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]

    def __init__(self, conv: nn.Conv1d | nn.ConvTranspose1d) -> None:
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ValueError(f"padding mode {conv.padding_mode!r} is not supported")
        for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding"):
            setattr(self, name, getattr(conv, name))
        self.dilation, self.groups = conv.dilation, conv.groups
        w = conv.weight.detach().unsqueeze(2)
        self.weight = nn.Parameter(w.contiguous(memory_format=torch.channels_last), False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), False)


class ChannelsLastConv1d(_Conv1dAs2d):
    """nn.Conv1d as conv2d over (B, C, 1, T) with channels-last weights; same math."""

    def forward(self, x: Tensor) -> Tensor:
        # x: (B, C_in, T) -> (B, C_out, T'), memory (B, T', C_out)
        pad = self.padding if isinstance(self.padding, str) else _2d(self.padding, 0)
        y = F.conv2d(
            x.unsqueeze(2), self.weight, self.bias, _2d(self.stride), pad, _2d(self.dilation),
            self.groups,
        )  # fmt: skip
        return y.squeeze(2)


class ChannelsLastConvTranspose1d(_Conv1dAs2d):
    """nn.ConvTranspose1d as conv_transpose2d over (B, C, 1, T), channels-last; same math."""

    def __init__(self, conv: nn.ConvTranspose1d) -> None:
        super().__init__(conv)
        self.output_padding = conv.output_padding

    def forward(self, x: Tensor) -> Tensor:
        # x: (B, C_in, T) -> (B, C_out, T'), memory (B, T', C_out)
        assert not isinstance(self.padding, str)  # ConvTranspose1d has no string padding
        y = F.conv_transpose2d(
            x.unsqueeze(2), self.weight, self.bias, _2d(self.stride), _2d(self.padding, 0),
            _2d(self.output_padding, 0), self.groups, _2d(self.dilation),
        )  # fmt: skip
        return y.squeeze(2)


def channels_last_convs(module: nn.Module, grouped: bool = True) -> nn.Module:
    """Replace, in place, every Conv1d / ConvTranspose1d below `module` (grouped=False: leave
    grouped ones, e.g. depthwise, as they are); returns `module`."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if not grouped and getattr(child, "groups", 1) > 1:
                continue
            if type(child) is nn.Conv1d:
                setattr(parent, name, ChannelsLastConv1d(child))
            elif type(child) is nn.ConvTranspose1d:
                setattr(parent, name, ChannelsLastConvTranspose1d(child))
    return module
