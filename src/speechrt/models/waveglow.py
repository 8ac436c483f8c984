"""WaveGlow (NVIDIA DeepLearningExamples): mel spectrogram -> audio by an inverted normalising flow.

    mel (B, n_mels, T) -> transposed-conv upsample to T * hop samples -> group by n_group:
    spect (B, n_mels * n_group, L = T * hop / n_group), channel = mel_bin * n_group + position
    latent z: sigma * noise (B, n_remaining, L); for k = n_flows - 1 ... 0:
        affine coupling inverted with WN_k(first half, spect), then the inverse 1x1 conv W_k^-1;
        after flows k = n_early_every * j (j >= 1) n_early_size more noise channels go in FRONT
    audio (B, n_group, L) -> (B, L * n_group), sample index = group * n_group + channel

Weight norm is folded and every W_k^-1 computed once at conversion (float64, stored). Noise:
item i draws from torch.Generator(seeds[i]) on the CPU in DLE's order, randn(n_remaining, L_i),
then randn(n_early_size, L_i) per early insertion (first the one used after flow 8). At batch
size 1 this equals DLE's `infer` after torch.manual_seed(seed) on the CPU. In a batch, each item's
WN convolutions see zeros beyond its own length (as alone), so batched == single.

Output is DLE's, unclamped: nominally in [-1, 1] (encoders clip).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch.waveglow import WaveGlowDims
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions

DEFAULT_SIGMA = 0.9  # DLE Tacotron2/FastPitch inference.py --sigma-infer default (and infer_onnx's)


class WN(nn.Module):
    """Coupling net: audio (B, n_half, L), spect (B, n_mels * n_group, L) -> (B, 2 * n_half, L).

    keep (B, 1, L) bool: positions beyond an item's length are zeroed before every dilated conv.
    """

    def __init__(self, n_half: int, n_cond: int, d: WaveGlowDims) -> None:
        super().__init__()
        c, k = d.n_channels, d.kernel_size
        self.n_channels = c
        self.start = nn.Conv1d(n_half, c, 1)
        self.in_layers = nn.ModuleList(
            nn.Conv1d(c, 2 * c, k, dilation=2**i, padding=(k - 1) * 2**i // 2)
            for i in range(d.n_layers)
        )
        self.cond_layers = nn.ModuleList(nn.Conv1d(n_cond, 2 * c, 1) for _ in range(d.n_layers))
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(c, 2 * c if i < d.n_layers - 1 else c, 1) for i in range(d.n_layers)
        )
        self.end = nn.Conv1d(c, 2 * n_half, 1)

    def forward(self, audio: Tensor, spect: Tensor, keep: Tensor | None = None) -> Tensor:
        x = self.start(audio)
        out = None
        c = self.n_channels
        for i, (in_layer, cond_layer, res_skip) in enumerate(
            zip(self.in_layers, self.cond_layers, self.res_skip_layers, strict=True)
        ):
            if keep is not None:
                x = x.masked_fill(~keep, 0.0)
            acts = in_layer(x) + cond_layer(spect)
            acts = torch.tanh(acts[:, :c]) * torch.sigmoid(acts[:, c:])
            rs = res_skip(acts)
            if i < len(self.in_layers) - 1:
                x = x + rs[:, :c]
                rs = rs[:, c:]
            out = rs if out is None else out + rs
        return self.end(out)


class InverseConv1x1(nn.Module):
    """The inverse of WaveGlow's invertible 1x1 conv; `inverse` (C, C, 1) is W^-1, set at load."""

    inverse: Tensor  # buffer, registered in __init__

    def __init__(self, c: int) -> None:
        super().__init__()
        self.register_buffer("inverse", torch.eye(c).unsqueeze(-1))

    def forward(self, z: Tensor) -> Tensor:
        return F.conv1d(z, self.inverse)


class WaveGlow(nn.Module):
    """DLE WaveGlow in inference form; `mel_to_audio` is the vocoder interface."""

    kind = "waveglow"
    role = "vocoder"
    Dims = WaveGlowDims
    default_sigma = DEFAULT_SIGMA

    def __init__(self, dims: WaveGlowDims) -> None:
        super().__init__()
        if dims.hop_length % dims.n_group or dims.n_group % 2:
            raise SpeechRTError("waveglow: hop_length must be a multiple of an even n_group")
        self.dims = dims
        n = dims.n_mel_channels
        self.upsample = nn.ConvTranspose1d(n, n, dims.upsample_kernel, stride=dims.hop_length)
        chans = dims.channels()
        self.WN = nn.ModuleList(WN(c // 2, n * dims.n_group, dims) for c in chans)
        self.convinv = nn.ModuleList(InverseConv1x1(c) for c in chans)
        self.n_remaining = chans[-1]

    @property
    def hop_length(self) -> int:
        return self.dims.hop_length

    def infer_with_noise(
        self,
        mel: Tensor,
        z: Tensor,
        sigma: float = DEFAULT_SIGMA,
        mel_lengths: Tensor | None = None,
    ) -> Tensor:
        """mel (B, n_mels, T), z (B, n_group, T * hop / n_group) -> audio (B, T * hop).

        As DLE's `infer_onnx`: z[:, :n_remaining] * sigma is the initial latent; the following
        channels, n_early_size at a time, are inserted as they are (NOT scaled by sigma). With
        mel_lengths, every item's positions beyond mel_lengths * hop are zero and do not leak.
        """
        d = self.dims
        b, _, t = mel.shape
        if t == 0:
            return mel.new_zeros(b, 0)
        s = t * d.hop_length
        length = s // d.n_group
        spect = self.upsample(mel)[:, :, :s]  # DLE drops the last kernel - hop samples
        spect = spect.reshape(b, d.n_mel_channels, length, d.n_group).permute(0, 2, 1, 3)
        spect = spect.reshape(b, length, -1).transpose(1, 2)  # (B, n_mels * n_group, L)
        keep = None
        if mel_lengths is not None and bool((mel_lengths < t).any()):
            ends = mel_lengths.to(mel.device) * (d.hop_length // d.n_group)
            keep = (torch.arange(length, device=mel.device) < ends.unsqueeze(1)).unsqueeze(1)
        audio = sigma * z[:, : self.n_remaining]
        early = z[:, self.n_remaining :]
        for k in reversed(range(d.n_flows)):
            n_half = audio.shape[1] // 2
            a0, a1 = audio[:, :n_half], audio[:, n_half:]
            out = self.WN[k](a0, spect, keep)
            a1 = (a1 - out[:, :n_half]) / torch.exp(out[:, n_half:])
            audio = self.convinv[k](torch.cat((a0, a1), 1))
            if k > 0 and k % d.n_early_every == 0:
                audio = torch.cat((early[:, : d.n_early_size], audio), 1)
                early = early[:, d.n_early_size :]
            if keep is not None:  # keep padding finite and zero: it must never leak
                audio = audio.masked_fill(~keep, 0.0)
        return audio.permute(0, 2, 1).reshape(b, -1)

    def item_noise(self, seed: int, length: int, sigma: float) -> Tensor:
        """z (n_group, length) for one item, in DLE's draw order, early channels times sigma."""
        d = self.dims
        g = torch.Generator().manual_seed(seed)
        parts = [torch.randn(self.n_remaining, length, generator=g)]
        for _ in range((d.n_group - self.n_remaining) // max(d.n_early_size, 1)):
            parts.append(sigma * torch.randn(d.n_early_size, length, generator=g))
        return torch.cat(parts)

    @torch.no_grad()
    def mel_to_audio(
        self,
        mel: Tensor,
        mel_lengths: Tensor,
        options: SynthesisOptions,
        seeds: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """mel (B, n_mels, T), mel_lengths (B,) -> audio (B, T * hop) float32, lengths * hop.

        options.sigma (None: 0.9) scales the latent; seeds (B,) (None: options.seed + i).
        """
        d = self.dims
        if mel.dim() != 3 or mel.shape[1] != d.n_mel_channels or mel.shape[0] == 0:
            raise SpeechRTError(
                f"waveglow: expected mel (B, {d.n_mel_channels}, T), got {tuple(mel.shape)}"
            )
        b, _, t = mel.shape
        lengths = mel_lengths.detach().to("cpu", torch.long)
        if lengths.shape != (b,) or lengths.min() < 0 or lengths.max() > t:
            raise SpeechRTError(f"waveglow: mel_lengths must be (B,) values in [0, {t}]")
        if seeds is not None and seeds.shape != (b,):
            raise SpeechRTError(f"waveglow: seeds must have shape ({b},)")
        seed_list = [options.seed + i for i in range(b)] if seeds is None else seeds.tolist()
        sigma = self.default_sigma if options.sigma is None else options.sigma
        w = self.upsample.weight
        per_group = d.hop_length // d.n_group
        z = torch.zeros(b, d.n_group, t * per_group)
        for i in range(b):
            n = int(lengths[i]) * per_group
            z[i, :, :n] = self.item_noise(int(seed_list[i]), n, sigma)
        mel = mel.to(w.device, w.dtype)
        audio = self.infer_with_noise(mel, z.to(w.device, w.dtype), sigma, lengths.to(w.device))
        return audio.float(), lengths.to(w.device) * d.hop_length
