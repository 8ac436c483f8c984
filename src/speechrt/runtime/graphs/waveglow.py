"""WaveGlow as a graph with its noise as an input: mel, mel_lengths, z, sigma -> audio.

The flow is WaveGlow.infer_with_noise, always masking by mel_lengths (the model skips the mask
when every item is full length, a data-dependent branch a traced or compiled graph cannot keep;
masking a full-length item changes nothing). `sigma` is per item; the pipeline draws z per item
from its seed with WaveGlow.item_noise (early channels already times sigma), as mel_to_audio does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

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
        """Axes that follow from the number of mel frames."""
        return {
            "groups": sizes["frames"] * self.hop // self.n_group,
            "samples": sizes["frames"] * self.hop,
        }


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
