"""HiFi-GAN generator (V1/V2/V3), checkpoint-compatible with NVIDIA DeepLearningExamples.

mel (B, n_mels, T) -> conv_pre -> [lrelu(0.1) -> transposed conv (x rate) -> mean of the
multi-receptive-field resblocks] per upsampling stage -> lrelu(0.01) -> conv_post -> tanh
-> audio (B, 1, T * prod(upsample_rates)).

The inference module holds plain conv weights (speechrt.convert.hifigan folds DLE's weight
norm). Batched calls mask every position beyond an item's (stage-scaled) length before each
conv, which reproduces the zero padding an unbatched call sees at its right edge: an item's audio
never depends on its batch-mates, and a full-length item is computed exactly as DLE computes it.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from speechrt.arch.hifigan import HiFiGANDims
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions

LRELU_SLOPE = 0.1  # every leaky ReLU except the one before conv_post (torch's default, 0.01)
FINAL_LRELU_SLOPE = 0.01


def _conv(channels_in: int, channels_out: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    # "same" padding for odd kernels: dilation * (kernel - 1) / 2 on both sides.
    return nn.Conv1d(
        channels_in, channels_out, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2
    )


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


def _length_mask(
    mel_lengths: torch.Tensor | None, scale: int, T: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """mel_lengths (B,) -> (B, 1, T): 1 where t < length * scale (samples per frame), else 0."""
    if mel_lengths is None:
        return None
    t = torch.arange(T, device=mel_lengths.device)
    return (t[None, None, :] < (mel_lengths * scale)[:, None, None]).to(dtype)


class ResBlock1(nn.Module):
    """Three (dilated conv, plain conv) pairs, each a residual branch."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_conv(channels, channels, kernel, d) for d in dilations)
        self.convs2 = nn.ModuleList(_conv(channels, channels, kernel) for _ in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x: (B, C, T), zero beyond each item's length; mask: (B, 1, T) or None.
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            xt = _masked(c1(F.leaky_relu(x, LRELU_SLOPE)), mask)
            xt = _masked(c2(F.leaky_relu(xt, LRELU_SLOPE)), mask)
            x = xt + x
        return x


class ResBlock2(nn.Module):
    """Two dilated convs, each a residual branch (HiFi-GAN V3)."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(_conv(channels, channels, kernel, d) for d in dilations)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x: (B, C, T); mask: (B, 1, T) or None. DLE's copy of this block never sets its slope
        # and cannot run; the original HiFi-GAN uses 0.1, as here.
        for c in self.convs:
            x = _masked(c(F.leaky_relu(x, LRELU_SLOPE)), mask) + x
        return x


class HiFiGAN(nn.Module):
    """HiFi-GAN generator: log-mel (B, n_mels, T) -> audio (B, 1, T * hop) in [-1, 1].

    `weight_norm=True` re-parametrises every conv with weight norm (dim 0) as DLE trains it;
    `dle_state_dict` then gives DLE's checkpoint layout. Inference uses plain weights.
    """

    kind = "hifigan"
    role = "vocoder"
    Dims = HiFiGANDims

    def __init__(self, dims: HiFiGANDims = HiFiGANDims(), weight_norm: bool = False) -> None:
        super().__init__()
        self.dims = dims
        ch = dims.upsample_initial_channel
        self.conv_pre = _conv(dims.n_mels, ch, 7)
        block = ResBlock1 if dims.resblock == "1" else ResBlock2
        stages = list(zip(dims.upsample_rates, dims.upsample_kernel_sizes, strict=True))
        blocks = list(zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes, strict=True))
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()  # [stage][j]: one block per resblock kernel size
        for i, (u, k) in enumerate(stages):
            c_in, c_out = ch // 2**i, ch // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(c_in, c_out, k, u, padding=(k - u) // 2))
            self.resblocks.append(nn.ModuleList(block(c_out, bk, d) for bk, d in blocks))
        self.conv_post = _conv(ch // 2 ** len(dims.upsample_rates), 1, 7)
        if weight_norm:
            for m in self.modules():
                if isinstance(m, nn.Conv1d | nn.ConvTranspose1d):
                    nn.utils.parametrizations.weight_norm(m, dim=0)

    def forward(self, mel: torch.Tensor, mel_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """mel: (B, n_mels, T), mel_lengths: (B,) or None (= all T) -> audio (B, 1, T * hop).

        With lengths, everything beyond an item's length is zero (also in the output).
        """
        m = _length_mask(mel_lengths, 1, mel.shape[-1], mel.dtype)
        x = _masked(self.conv_pre(_masked(mel, m)), m)
        scale = 1  # audio samples per mel frame at this stage
        stages = zip(self.ups, self.resblocks, self.dims.upsample_rates, strict=True)
        for up, blocks, rate in stages:
            blocks = cast(nn.ModuleList, blocks)  # this stage's ResBlocks
            scale *= rate
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            m = _length_mask(mel_lengths, scale, x.shape[-1], x.dtype)
            x = _masked(x, m)
            xs = blocks[0](x, m)
            for b in blocks[1:]:
                xs = xs + b(x, m)
            x = xs / len(blocks)
        x = self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE))
        return _masked(torch.tanh(x), m)

    @torch.no_grad()
    def mel_to_audio(
        self,
        mel: torch.Tensor,
        mel_lengths: torch.Tensor,
        options: SynthesisOptions | None = None,
        seeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel: (B, n_mels, T), mel_lengths: (B,) -> audio (B, T * hop) float32, lengths (B,).

        Deterministic: `options` and `seeds` are accepted for the vocoder interface and unused.
        """
        if mel.dim() != 3 or mel.shape[1] != self.dims.n_mels:
            raise SpeechRTError(
                f"hifigan: expected mel (B, {self.dims.n_mels}, T), got {tuple(mel.shape)}"
            )
        if mel_lengths.shape != (mel.shape[0],):
            raise SpeechRTError(
                f"hifigan: mel_lengths must have shape ({mel.shape[0]},), "
                f"got {tuple(mel_lengths.shape)}"
            )
        if mel_lengths.numel() and (mel_lengths.min() < 0 or mel_lengths.max() > mel.shape[2]):
            raise SpeechRTError(f"hifigan: mel lengths must lie within [0, {mel.shape[2]}]")
        weight = self.conv_post.weight
        lengths = mel_lengths.to(device=mel.device, dtype=torch.long)
        audio = self(mel.to(device=weight.device, dtype=weight.dtype), lengths.to(weight.device))
        return audio.squeeze(1).float(), lengths * self.dims.hop_length


# -- checkpoint conversion helpers --------------------------------------------------------------
