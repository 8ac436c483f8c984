"""WaveGlow: mel (B, n_mels, T) + latent noise -> audio (B, T * hop) by an inverted flow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.arch.denoiser import DENOISER
from speechrt.contracts import F32, B, Contract, lengths, tensor


@dataclass(frozen=True)
class WaveGlowDims:
    """Architecture hyper-parameters; DLE config names (WN_config flattened), DLE defaults."""

    n_mel_channels: int = 80
    n_flows: int = 12
    n_group: int = 8
    n_early_every: int = 4
    n_early_size: int = 2
    n_layers: int = 8  # WN_config
    kernel_size: int = 3  # WN_config
    n_channels: int = 512  # WN_config; the NGC model of the READMEs uses 256
    upsample_kernel: int = 1024  # DLE hard-codes the ConvTranspose1d(1024, stride 256)
    hop_length: int = 256

    @property
    def n_mels(self) -> int:
        return self.n_mel_channels

    def channels(self) -> list[int]:
        """Channels of the flow variable at each flow k (DLE: 8, 8, 8, 8, 6, 6, 6, 6, 4, ...)."""
        out, c = [], self.n_group
        for k in range(self.n_flows):
            if k > 0 and k % self.n_early_every == 0:
                c -= self.n_early_size
            out.append(c)
        return out


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # DLE's argparse
    "ngc-256": dict(n_channels=256),  # the NGC checkpoint of DLE's READMEs
    # 80 mels, hop 256, two 8-wide WN layers per flow; upsampling kernel = one hop
    "tiny": dict(n_layers=2, n_channels=8, upsample_kernel=256),
}


def contract(d: WaveGlowDims) -> Contract:
    return Contract(
        "waveglow",
        (
            tensor("mel", F32, B, d.n_mels, "frames"),
            lengths("mel_lengths", "frames"),
            tensor("z", F32, B, d.n_group, "groups", doc="latent noise, frames * hop / group"),
            tensor("sigma", F32, B, doc="scales the first latent channels", bounds=(0.0, 2.0)),
        ),
        (tensor("audio", F32, B, "samples"), lengths("audio_lengths", "samples")),
    )


# Not channels-last: its couplings split and join channels, which channels-last memory turns
# into copies (H200, 7.7 s, batch 1: 20 ms NCHW, 24-37 ms).
def derived_sizes(d: WaveGlowDims, sizes: dict[str, int]) -> dict[str, int]:
    """The latent's groups and the output's samples for sizes["frames"] mel frames."""
    samples = sizes["frames"] * d.hop_length
    return {"groups": samples // d.n_group, "samples": samples}


WAVEGLOW = Graph(
    "waveglow",
    contract,
    "speechrt.runtime.graphs.waveglow:CODE",
    WaveGlowDims,
    derived_sizes=derived_sizes,
    own_stage=True,  # noise is drawn per item (speechrt.runtime.graphs.waveglow.stage)
)
ARCHITECTURES = (
    Architecture(
        "waveglow",
        WaveGlowDims,
        PRESETS,
        "speechrt.models.waveglow:WaveGlow",
        ((WAVEGLOW, "model.onnx"), (DENOISER, "denoiser.onnx")),
        "speechrt.convert.waveglow:CONVERSION",
        {"n_mel_channels": ("upsample.weight", 0), "upsample_kernel": ("upsample.weight", 2)},
    ),
)
