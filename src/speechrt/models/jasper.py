"""Jasper (dense-residual 10x5) and QuartzNet (separable 5x5 / 15x5) CTC acoustic models.

One convolutional architecture, two DLE checkpoint layouts:
    features (B, n_feats, T) -> prologue (stride 2) -> residual blocks -> epilogue -> 1x1 decoder
    -> log-probs (B, T', n_classes), blank last

A block is `repeat` sub-blocks conv -> BN -> ReLU (the last one without ReLU), plus 1x1 conv + BN
projections of earlier outputs ("plain": the block input; "dense": every earlier output, Jasper
DR), then ReLU. QuartzNet convs are separable (depthwise k, then pointwise 1x1). At load, BatchNorm
(eps 1e-3) is folded into the conv before it (the pointwise one when separable); dropout is inert.

Every conv of more than one tap zeroes its input frames at or past the current length first (DLE
use_conv_masks), so an item's outputs, valid frames and padded tail alike, never depend on its
batch-mates. DLE masks the inputs of the 1x1 convs (pointwise, residual) as well; a 1x1 conv
mixes no frames, so that changes only frames past the length, and skipping it saves one pass
over the activations per separable sub-block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from speechrt.arch.jasper import JasperDims, QuartzNetDims
from speechrt.errors import SpeechRTError

BN_EPS = 1e-3
LABELS = (" ", *"abcdefghijklmnopqrstuvwxyz", "'")  # DLE English labels; CTC blank appended last


def mask_frames(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x: (B, C, T) with frames t >= lengths[b] set to zero."""
    t = torch.arange(x.shape[-1], device=x.device)
    return x.masked_fill((t[None, :] >= lengths[:, None]).unsqueeze(1), 0.0)


def conv_lengths(lengths: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Valid output frames of `conv` for `lengths` valid input frames (floor division)."""
    assert not isinstance(conv.padding, str)  # built with int padding (SubBlock)
    (p,), (k,), (d,), (s,) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
    return torch.div(lengths + 2 * p - d * (k - 1) - 1, s, rounding_mode="floor") + 1


class SubBlock(nn.Module):
    """One masked conv (or depthwise + pointwise pair) with its BatchNorm folded into the bias."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, dilation: int, separable: bool
    ) -> None:
        super().__init__()
        pad = (kernel // 2) * dilation  # 'same'
        self.separable = separable
        if separable:
            self.depthwise = nn.Conv1d(
                c_in, c_in, kernel, stride, pad, dilation, groups=c_in, bias=False
            )
            self.pointwise = nn.Conv1d(c_in, c_out, 1)
        else:
            self.conv = nn.Conv1d(c_in, c_out, kernel, stride, pad, dilation)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (B, C_in, T) -> (B, C_out, T'), lengths (B,) -> (B,)
        first = self.depthwise if self.separable else self.conv
        x = first(mask_frames(x, lengths))
        lengths = conv_lengths(lengths, first)
        if self.separable:
            x = self.pointwise(x)  # 1x1: frames past the length are masked by the next conv
        return x, lengths


class Block(nn.Module):
    def __init__(self, dims: JasperDims, b: int, c_in: int, res_in: list[int]) -> None:
        super().__init__()
        f, k, s, d = dims.filters[b], dims.kernels[b], dims.strides[b], dims.dilations[b]
        self.subs = nn.ModuleList(
            SubBlock(c_in if j == 0 else f, f, k, s, d, dims.separable[b])
            for j in range(dims.repeats[b])
        )
        self.res = nn.ModuleList(nn.Conv1d(c, f, 1) for c in res_in)

    def forward(
        self, xs: list[torch.Tensor], lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # xs: earlier outputs (B, C_i, T), the block input last; lengths: their valid frames
        x, out_lengths = xs[-1], lengths
        for j, sub in enumerate(self.subs):
            x, out_lengths = sub(x, out_lengths)
            if j < len(self.subs) - 1:
                x = F.relu(x)
        for conv, src in zip(self.res, xs, strict=False):
            x = x + conv(src)  # 1x1, unmasked (module doc)
        return F.relu(x), out_lengths


class Jasper(nn.Module):
    """features (B, n_feats, T) + lengths (B,) -> log-probs (B, T', n_classes) + lengths (B,)."""

    kind = "jasper"
    role = "asr"
    Dims = JasperDims
    pad_leading = 16  # DLE Jasper inference.py prepends this many zero frames

    def __init__(self, dims: JasperDims) -> None:
        super().__init__()
        cols = (dims.kernels, dims.repeats, dims.strides, dims.dilations, dims.separable)
        if any(len(c) != len(dims.filters) for c in (*cols, dims.residual)) or not dims.filters:
            raise SpeechRTError(f"{self.kind}: inconsistent block columns in dims")
        if set(dims.residual) - {"none", "plain", "dense"}:
            raise SpeechRTError(f"{self.kind}: unknown residual type in {dims.residual}")
        self.dims = dims
        self.blocks = nn.ModuleList()
        # Residual sources as DLE wires them: a dense block adds its input to the running pane
        # list and reads all of it; a plain one reads its input only.
        panes: list[int] = []
        c_in, xs = dims.n_feats, [dims.n_feats]
        for b, kind in enumerate(dims.residual):
            if kind == "dense":
                panes = [*panes, c_in]
            res_in = panes if kind == "dense" else [xs[0]] if kind == "plain" else []
            if res_in and len(res_in) > len(xs):
                raise SpeechRTError(f"{self.kind}: block {b} reads more residuals than exist")
            self.blocks.append(Block(dims, b, c_in, res_in))
            c_in = dims.filters[b]
            xs = [*xs, c_in] if kind == "dense" else [c_in]
        self._keeps = [kind == "dense" for kind in dims.residual]
        self.decoder = nn.Conv1d(c_in, dims.n_classes, 1)

    @property
    def time_stride(self) -> int:
        """Feature frames per output frame."""
        return math.prod(self.dims.strides)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Output frames for `lengths` input frames (B,)."""
        for block in self.blocks:
            for sub in block.subs:  # type: ignore[union-attr]  # ModuleList items type as Module
                lengths = conv_lengths(lengths, sub.depthwise if sub.separable else sub.conv)
        return lengths

    def forward(
        self, feats: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # feats: (B, n_feats, T); lengths: (B,) valid frames -> (B, T', n_classes) float32, (B,)
        xs = [feats]
        for block, keep in zip(self.blocks, self._keeps, strict=True):
            out, lengths = block(xs, lengths)
            xs = [*xs, out] if keep else [out]
        logits = self.decoder(xs[-1]).transpose(1, 2)
        return F.log_softmax(logits.float(), dim=-1), lengths


class QuartzNet(Jasper):
    kind = "quartznet"
    Dims = QuartzNetDims
    pad_leading = 0  # DLE QuartzNet inference.py pads nothing
