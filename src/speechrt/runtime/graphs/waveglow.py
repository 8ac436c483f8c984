"""WaveGlow as a graph with its noise as an input: mel, mel_lengths, z, sigma -> audio.

The flow is WaveGlow.infer_with_noise, always masking by mel_lengths (the model skips the mask
when every item is full length, a data-dependent branch a traced or compiled graph cannot keep;
masking a full-length item changes nothing). `sigma` is per item; the pipeline draws z per item
from its seed with WaveGlow.item_noise (early channels already times sigma), as mel_to_audio does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.arch.waveglow import derived_sizes
from speechrt.models.waveglow import WaveGlow
from speechrt.options import SynthesisOptions

if TYPE_CHECKING:
    from speechrt.runtime.base import Runner
    from speechrt.runtime.stages import StageParts


class WaveGlowGraph(nn.Module):
    """forward(mel (B, n_mels, T), mel_lengths (B,), z (B, n_group, T * hop / n_group),
    sigma (B,)) -> (audio (B, T * hop), audio_lengths (B,))."""

    def __init__(self, model: WaveGlow) -> None:
        super().__init__()
        self.model = model
        d = model.dims
        self.hop, self.n_group = d.hop_length, d.n_group

    def forward(
        self, mel: Tensor, mel_lengths: Tensor, z: Tensor, sigma: Tensor
    ) -> tuple[Tensor, Tensor]:
        m = self.model
        d = m.dims
        dtype = m.upsample.weight.dtype
        mel, z = mel.to(dtype), z.to(dtype)
        b, _, t = mel.shape
        length = z.shape[2]  # = t * hop / n_group
        spect = m.upsample(mel)[:, :, : t * d.hop_length]
        spect = spect.reshape(b, d.n_mel_channels, length, d.n_group).permute(0, 2, 1, 3)
        spect = spect.reshape(b, length, -1).transpose(1, 2)  # (B, n_mels * n_group, L)
        ends = mel_lengths * (d.hop_length // d.n_group)
        keep = (torch.arange(length, device=mel.device)[None, :] < ends[:, None])[:, None, :]
        audio = sigma.to(dtype)[:, None, None] * z[:, : m.n_remaining]
        early = z[:, m.n_remaining :]
        for k in reversed(range(d.n_flows)):
            n_half = audio.shape[1] // 2
            a0, a1 = audio[:, :n_half], audio[:, n_half:]
            out = m.WN[k](a0, spect, keep)
            a1 = (a1 - out[:, :n_half]) / torch.exp(out[:, n_half:])
            audio = m.convinv[k](torch.cat((a0, a1), 1))
            if k > 0 and k % d.n_early_every == 0:
                audio = torch.cat((early[:, : d.n_early_size], audio), 1)
                early = early[:, d.n_early_size :]
            audio = audio.masked_fill(~keep, 0.0)
        return audio.permute(0, 2, 1).reshape(b, -1), mel_lengths * d.hop_length

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.model.dims, sizes)

    def fused(self) -> WaveGlowGemm:
        """The same function as matrix products over (B, L, C) activations (the cuda runner's)."""
        return WaveGlowGemm(self.model)


class WaveGlowGemm(nn.Module):
    """WaveGlowGraph's function with activations (B, L, C) and every convolution a matmul:
    the cond layers of one flow are one GEMM (n_mels * n_group -> n_layers * 2C), each dilated
    in-layer one GEMM over its three shifted taps side by side, the 1x1 convs GEMMs. cuBLAS
    GEMMs with fused pointwise work between them replace NCHW dilated convolutions. Same outputs
    up to float rounding (tested)."""

    def __init__(self, model: WaveGlow) -> None:
        super().__init__()
        d = self.dims = model.dims
        self.n_remaining, c = model.n_remaining, d.n_channels
        self.upsample = model.upsample
        w = lambda conv: conv.weight.detach()  # noqa: E731  (out, in, k)
        p = nn.Parameter
        self.start_w, self.start_b = nn.ParameterList(), nn.ParameterList()
        self.cond_w, self.cond_b = nn.ParameterList(), nn.ParameterList()
        self.in_w, self.res_w, self.res_b = (
            nn.ParameterList(),
            nn.ParameterList(),
            nn.ParameterList(),
        )
        self.end_w, self.end_b, self.inv = (
            nn.ParameterList(),
            nn.ParameterList(),
            nn.ParameterList(),
        )
        flows: list[Any] = list(zip(model.WN, model.convinv, strict=True))  # (WN, inverse 1x1)
        for wn, inv in flows:
            self.start_w.append(p(w(wn.start)[:, :, 0].T.contiguous()))  # (n_half, C)
            self.start_b.append(p(wn.start.bias.detach().clone()))
            cond = [w(layer)[:, :, 0] for layer in wn.cond_layers]  # (2C, n_cond) each
            self.cond_w.append(p(torch.cat(cond).T.contiguous()))  # (n_cond, n_layers * 2C)
            # the in-layer's bias joins the cond bias: one add
            bias = [a.bias + b.bias for a, b in zip(wn.in_layers, wn.cond_layers, strict=True)]
            self.cond_b.append(p(torch.cat(bias).detach()))
            for layer in wn.in_layers:  # taps side by side: (k * C, 2C)
                self.in_w.append(p(w(layer).permute(2, 1, 0).reshape(-1, 2 * c).contiguous()))
            for layer in wn.res_skip_layers:
                self.res_w.append(p(w(layer)[:, :, 0].T.contiguous()))
                self.res_b.append(p(layer.bias.detach().clone()))
            self.end_w.append(p(w(wn.end)[:, :, 0].T.contiguous()))  # (C, 2 n_half)
            self.end_b.append(p(wn.end.bias.detach().clone()))
            self.inv.append(p(inv.inverse.detach()[:, :, 0].T.contiguous()))  # z @ W^-1.T

    def forward(
        self, mel: Tensor, mel_lengths: Tensor, z: Tensor, sigma: Tensor
    ) -> tuple[Tensor, Tensor]:
        """WaveGlowGraph.forward's contract."""
        d, c = self.dims, self.dims.n_channels
        dtype = self.upsample.weight.dtype
        mel, z = mel.to(dtype), z.to(dtype).transpose(1, 2)  # z (B, L, n_group)
        b, _, t = mel.shape
        length = z.shape[1]
        spect = self.upsample(mel)[:, :, : t * d.hop_length]
        spect = spect.reshape(b, d.n_mel_channels, length, d.n_group).permute(0, 2, 1, 3)
        spect = spect.reshape(b, length, -1)  # (B, L, n_mels * n_group)
        ends = mel_lengths * (d.hop_length // d.n_group)
        keep = (torch.arange(length, device=mel.device)[None, :] < ends[:, None])[:, :, None]
        audio = sigma.to(dtype)[:, None, None] * z[:, :, : self.n_remaining]
        early = z[:, :, self.n_remaining :]
        for k in reversed(range(d.n_flows)):
            n_half = audio.shape[2] // 2
            a0, a1 = audio[:, :, :n_half], audio[:, :, n_half:]
            cond = spect @ self.cond_w[k] + self.cond_b[k]  # (B, L, n_layers * 2C)
            x = a0 @ self.start_w[k] + self.start_b[k]  # (B, L, C)
            skip = None
            for i in range(d.n_layers):
                dil, j = 2**i, k * d.n_layers + i
                x = x.masked_fill(~keep, 0.0)
                pad = dil * (d.kernel_size - 1) // 2
                xp = torch.nn.functional.pad(x, (0, 0, pad, pad))  # (B, L + 2 pad, C)
                taps = torch.cat(
                    [xp[:, n * dil : n * dil + length] for n in range(d.kernel_size)], 2
                )
                acts = taps @ self.in_w[j] + cond[:, :, 2 * c * i : 2 * c * (i + 1)]
                acts = torch.tanh(acts[:, :, :c]) * torch.sigmoid(acts[:, :, c:])
                rs = acts @ self.res_w[j] + self.res_b[j]
                if i < d.n_layers - 1:
                    x = x + rs[:, :, :c]
                    rs = rs[:, :, c:]
                skip = rs if skip is None else skip + rs
            assert skip is not None
            out = skip @ self.end_w[k] + self.end_b[k]  # (B, L, 2 n_half)
            a1 = (a1 - out[:, :, :n_half]) / torch.exp(out[:, :, n_half:])
            audio = torch.cat((a0, a1), 2) @ self.inv[k]
            if k > 0 and k % d.n_early_every == 0:
                audio = torch.cat((early[:, :, : d.n_early_size], audio), 2)
                early = early[:, :, d.n_early_size :]
            audio = audio.masked_fill(~keep, 0.0)
        return audio.reshape(b, -1), mel_lengths * d.hop_length

    def derived_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return derived_sizes(self.dims, sizes)


def build(model: WaveGlow, info: object = None) -> WaveGlowGraph:
    return WaveGlowGraph(model)


def noise(
    model: WaveGlow, mel_lengths: Tensor, frames: int, seeds: list[int], sigma: float
) -> Tensor:
    """z (B, n_group, frames * hop / n_group) as WaveGlow.mel_to_audio draws it, on the CPU."""
    d = model.dims
    per_group = d.hop_length // d.n_group
    z = torch.zeros(len(seeds), d.n_group, frames * per_group)
    for i, seed in enumerate(seeds):
        n = int(mel_lengths[i]) * per_group
        z[i, :, :n] = model.item_noise(int(seed), n, sigma)
    return z


class WaveGlowStage:
    """mel (B, n_mels, T), mel_lengths (B,) -> audio (B, S) float32, audio_lengths (B,): the
    latent noise is drawn per item from its seed on the CPU, as WaveGlow.mel_to_audio draws it,
    and handed to the graph as `z`."""

    def __init__(self, runner: Runner, model: WaveGlow) -> None:
        self.runner, self.model = runner, model

    def __call__(
        self, mel: Tensor, mel_lengths: Tensor, options: SynthesisOptions, seeds: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        B, _, T = mel.shape
        seed_list = [options.seed + i for i in range(B)] if seeds is None else seeds.tolist()
        sigma = self.model.default_sigma if options.sigma is None else options.sigma
        z = noise(self.model, mel_lengths.cpu(), T, seed_list, sigma).to(mel.device)
        feeds = {"mel": mel.float(), "mel_lengths": mel_lengths, "z": z}
        out = self.runner.run(feeds | {"sigma": torch.full((B,), sigma, device=mel.device)})
        return out["audio"], out["audio_lengths"]

    def runners(self) -> list[Runner]:
        return [self.runner]


def stage(parts: StageParts) -> WaveGlowStage:
    assert isinstance(parts.model, WaveGlow)
    return WaveGlowStage(parts.runner(parts.graphs[0]), parts.model)


def example(graph: WaveGlowGraph, batch: int, length: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    m = graph.model
    mel = torch.randn(batch, m.dims.n_mel_channels, length, generator=g) - 4.0
    lengths = torch.tensor([max(1, length - 3 * i) for i in range(batch)])
    z = noise(m, lengths, length, [seed + i for i in range(batch)], 0.9)
    return {"mel": mel, "mel_lengths": lengths, "z": z, "sigma": torch.full((batch,), 0.9)}


CODE = GraphCode(build, example, stage)  # named by its registry entry (speechrt.arch)
