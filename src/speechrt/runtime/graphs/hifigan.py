"""HiFi-GAN as a named-tensor graph: mel, mel_lengths -> audio, audio_lengths."""

from __future__ import annotations

import copy
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.arch.hifigan import derived_sizes
from speechrt.errors import SpeechRTError
from speechrt.models.hifigan import LRELU_SLOPE, HiFiGAN, ResBlock1, ResBlock2
from speechrt.runtime.fused_conv import fused_conv1d, precompile


class HiFiGANGraph(nn.Module):
    """forward(mel (B, n_mels, T), mel_lengths (B,)) -> (audio (B, T * hop), audio_lengths (B,))."""

    def __init__(self, model: HiFiGAN) -> None:
        super().__init__()
        self.model = model
        self.hop = model.dims.hop_length

    def forward(self, mel: Tensor, mel_lengths: Tensor) -> tuple[Tensor, Tensor]:
        audio = self.model(mel.to(self.model.conv_pre.weight.dtype), mel_lengths).squeeze(1)
        return audio, mel_lengths * self.hop

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)

    def fused_variants(self) -> set[tuple[int, int, int, bool]]:
        """(channels, kernel size, dilation, residual) of each distinct fused resblock conv:
        one compiled kernel each (none where the graph is not fused)."""
        blocks = [m for m in self.modules() if isinstance(m, FusedResBlock)]
        return set().union(*(b.variants() for b in blocks))

    def precompile(self) -> int:
        """The fused kernels compiled side by side (on a GPU, where the graph is fused; else
        nothing). Returns how many."""
        weight = self.model.conv_pre.weight
        if not weight.is_cuda or fused_conv1d is None:
            return 0  # without Triton the first call says what is missing
        return precompile(self.fused_variants(), weight.dtype, weight.device)

    def fused(self) -> HiFiGANGraph:
        """The same function with every resblock conv one fused kernel on a GPU (FusedResBlock;
        the cuda runner's form)."""
        model = copy.deepcopy(self.model)
        for stage in model.resblocks:
            blocks = cast(nn.ModuleList, stage)
            for j, block in enumerate(blocks):
                blocks[j] = FusedResBlock(cast(ResBlock1 | ResBlock2, block))
        return HiFiGANGraph(model)


def lrelu_conv(
    x: Tensor,
    w_kio: Tensor,
    bias: Tensor,
    dilation: int,
    mask: Tensor | None,
    residual: Tensor | None = None,
) -> Tensor:
    """mask * conv(lrelu(x)) (+ residual): x (B, C, T), w_kio (K, C, C'), mask (B, 1, T) ->
    (B, C', T). On a GPU one Triton kernel (speechrt.runtime.fused_conv), elsewhere torch ops."""
    if x.is_cuda:
        if fused_conv1d is None:
            raise SpeechRTError(
                "HiFi-GAN's fused convolutions on a GPU need Triton (pip install triton)"
            )
        return fused_conv1d(x, w_kio, bias, dilation, LRELU_SLOPE, mask, residual)
    K = w_kio.shape[0]
    y = F.conv1d(
        F.leaky_relu(x, LRELU_SLOPE), w_kio.permute(2, 1, 0), bias,
        padding=dilation * (K - 1) // 2, dilation=dilation,
    )  # fmt: skip
    y = y if mask is None else y * mask
    return y if residual is None else y + residual


class FusedResBlock(nn.Module):
    """ResBlock1 / ResBlock2 with each conv and the leaky ReLU before it, its mask and its
    residual sum in one lrelu_conv: the same function (tested). With `cudnn_single` (blocks of
    more than 64 channels), a batch of one item on a GPU runs the plain block (cuDNN's convs,
    whose layout the runner sets). HiFi-GAN V1 at 704 frames, one item, H100: 2.11 ms with the
    blocks of 32 and 64 channels fused, 2.16 ms with all fused, 2.36 ms with none; at batch 8
    13.80 ms fused against 14.63 ms with cuDNN's convs (`gpu_profile.py --parts fusedconv`)."""

    def __init__(self, block: ResBlock1 | ResBlock2) -> None:
        super().__init__()
        self.block = block
        branches: list[list[nn.Conv1d]]  # each residual branch's convs, in order
        if isinstance(block, ResBlock1):
            branches = [[a, b] for a, b in zip(block.convs1, block.convs2, strict=True)]  # type: ignore[list-item]
        else:
            branches = [[c] for c in block.convs]  # type: ignore[list-item]
        self.weights = nn.ParameterList()  # (K, C_in, C_out) per conv, branch by branch
        self.biases = nn.ParameterList()
        self.dilations = [[c.dilation[0] for c in convs] for convs in branches]
        for c in (c for convs in branches for c in convs):
            assert c.bias is not None and c.padding == (
                c.dilation[0] * (c.kernel_size[0] - 1) // 2,
            )
            self.weights.append(
                nn.Parameter(c.weight.detach().permute(2, 1, 0).contiguous(), False)
            )
            self.biases.append(nn.Parameter(c.bias.detach(), False))
        self.cudnn_single = self.weights[0].shape[1] > 64

    def variants(self) -> set[tuple[int, int, int, bool]]:
        """(channels, kernel size, dilation, residual) of each conv: what its fused kernel is
        compiled for."""
        out, k = set(), 0
        for dilations in self.dilations:
            for i, d in enumerate(dilations):
                K, c, _ = self.weights[k].shape
                out.add((c, K, d, i == len(dilations) - 1))
                k += 1
        return out

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        # x: (B, C, T), zero beyond each item's length; mask: (B, 1, T) or None
        if self.cudnn_single and x.is_cuda and x.shape[0] == 1:
            return self.block(x, mask)
        k = 0
        for dilations in self.dilations:
            xt = x
            for i, d in enumerate(dilations):
                residual = x if i == len(dilations) - 1 else None
                xt = lrelu_conv(xt, self.weights[k], self.biases[k], d, mask, residual)
                k += 1
            x = xt
        return x


def build(model: HiFiGAN, info: object = None) -> HiFiGANGraph:
    return HiFiGANGraph(model)


def example(graph: HiFiGANGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Random log-mel-like inputs: `batch` items, the longest `length` frames."""
    g = torch.Generator().manual_seed(seed)
    mel = torch.randn(batch, graph.model.dims.n_mels, length, generator=g) - 5.0
    lengths = torch.tensor([max(1, length - 3 * i) for i in range(batch)])
    return {"mel": mel, "mel_lengths": lengths}


CODE = GraphCode(build, example)  # named by its registry entry (speechrt.arch)
