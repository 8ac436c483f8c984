"""Jasper / QuartzNet as a graph: features, feature_lengths -> log_probs, log_prob_lengths.

The model's forward is already a pure tensor function (masked convolutions, folded BatchNorm).
"""

from __future__ import annotations

import copy
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.jasper import derived_sizes
from speechrt.errors import SpeechRTError
from speechrt.models.jasper import Block, Jasper, SubBlock, mask_frames
from speechrt.runtime.fused_conv import fused_conv1d


class JasperGraph(nn.Module):
    """forward(features (B, n_feats, T), feature_lengths (B,)) -> (log_probs (B, T', V), (B,))."""

    def __init__(self, model: Jasper) -> None:
        super().__init__()
        self.model = model
        # The cuda runner's layout. Compiled and replayed as one CUDA graph on an H200 (fp16,
        # 800 frames, batch 1), QuartzNet 15x5 took 1.03 ms NCHW and 2.03 ms channels-last: its
        # depthwise convs are slower on NHWC tensors. Jasper's dense convs gain channels-last.
        self.channels_last = not any(model.dims.separable)

    def forward(self, features: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        w = self.model.decoder.weight
        return self.model(features.to(w.dtype), feature_lengths)

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)

    def fused(self) -> JasperGraph:
        """The same function with each convolution of a stride-1 dense block (Jasper's, not
        QuartzNet's separable ones) one fused kernel on a GPU, its input masked to the lengths
        and its bias, residual sum and ReLU applied before the store (FusedBlock; the cuda
        runner's form)."""
        if not any(FusedBlock.fits(cast(Block, b)) for b in self.model.blocks):
            return self
        model = copy.deepcopy(self.model)
        for i, block in enumerate(model.blocks):
            if FusedBlock.fits(cast(Block, block)):
                model.blocks[i] = FusedBlock(cast(Block, block))
        graph = JasperGraph(model)
        graph.channels_last = self.channels_last
        return graph


def masked_conv(
    x: Tensor,
    w_kio: Tensor,
    bias: Tensor,
    dilation: int,
    lengths: Tensor,
    residual: Tensor | None = None,
) -> Tensor:
    """relu(conv(x with frames >= lengths zeroed) + bias (+ residual)): x (B, C, T), w_kio
    (K, C, C'), lengths (B,) -> (B, C', T). On a GPU one Triton kernel
    (speechrt.runtime.fused_conv), elsewhere torch ops."""
    if x.is_cuda:
        if fused_conv1d is None:
            raise SpeechRTError(
                "Jasper's fused convolutions on a GPU need Triton (pip install triton)"
            )
        return fused_conv1d(x, w_kio, bias, dilation, 1.0, None, residual, lengths, True)
    K = w_kio.shape[0]
    y = F.conv1d(
        mask_frames(x, lengths), w_kio.permute(2, 1, 0), bias,
        padding=dilation * (K - 1) // 2, dilation=dilation,
    )  # fmt: skip
    return F.relu(y if residual is None else y + residual)


class FusedBlock(nn.Module):
    """A Jasper Block whose sub-block convs are masked_conv calls: each conv with the ReLU after
    it, the last also with the block's residual sum. The same function (tested). The 1x1
    residual projections stay as they are (cuBLAS GEMMs)."""

    @staticmethod
    def fits(block: Block) -> bool:
        """Stride-1, 'same'-padded, non-separable convs of more than one tap."""
        subs = cast(list[SubBlock], list(block.subs))
        return all(
            not s.separable and s.conv.stride == (1,) and s.conv.kernel_size[0] > 1 for s in subs
        )

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block
        convs = [cast(SubBlock, s).conv for s in block.subs]
        self.weights = nn.ParameterList()  # (K, C_in, C_out) per sub-block
        self.biases = nn.ParameterList()
        self.dilations = [c.dilation[0] for c in convs]
        for c in convs:
            assert c.bias is not None and c.padding == (c.dilation[0] * (c.kernel_size[0] // 2),)
            self.weights.append(
                nn.Parameter(c.weight.detach().permute(2, 1, 0).contiguous(), False)
            )
            self.biases.append(nn.Parameter(c.bias.detach(), False))

    def forward(self, xs: list[Tensor], lengths: Tensor) -> tuple[Tensor, Tensor]:
        # xs: earlier outputs (B, C_i, T), the block input last; lengths (B,): valid frames
        residual = None
        for conv, src in zip(self.block.res, xs, strict=False):
            r = conv(mask_frames(src, lengths))
            residual = r if residual is None else residual + r
        x, last = xs[-1], len(self.dilations) - 1
        for j, (w, bias, d) in enumerate(
            zip(self.weights, self.biases, self.dilations, strict=True)
        ):
            x = masked_conv(x, w, bias, d, lengths, residual if j == last else None)
        return x, lengths  # stride 1, 'same' padding: lengths unchanged


def build(model: Jasper, info: object = None) -> JasperGraph:
    return JasperGraph(model)


def example(graph: JasperGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Normalised-feature-like inputs, `length` frames (a multiple of 16 is what DLE feeds)."""
    g = torch.Generator().manual_seed(seed)
    n = graph.model.dims.n_feats
    lengths = torch.tensor([max(1, length - 5 * i) for i in range(batch)])
    feats = torch.randn(batch, n, length, generator=g)
    feats = feats * (torch.arange(length)[None, None, :] < lengths[:, None, None])
    return {"features": feats, "feature_lengths": lengths}
