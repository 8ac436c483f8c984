"""HiFi-GAN (V1/V2/V3 generator): mel (B, n_mels, T) -> audio (B, T * hop)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.arch.denoiser import DENOISER
from speechrt.contracts import F32, B, Contract, lengths, tensor
from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class HiFiGANDims:
    """Generator hyper-parameters; field names are DLE's checkpoint `config` keys.

    Defaults are DLE's argparse defaults (= the NGC checkpoints): V1 with resblock kernels
    (11, 7, 3), which the original V1 config lists in the opposite order.
    """

    upsample_rates: tuple[int, ...] = (8, 8, 2, 2)  # strides; their product is the hop length
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 4, 4)  # one per upsampling stage
    upsample_initial_channel: int = 512  # channels after conv_pre; halved by every stage
    resblock: str = "1"  # "1": 3 dilated + 3 plain convs per block; "2": 2 dilated convs
    resblock_kernel_sizes: tuple[int, ...] = (11, 7, 3)  # one resblock per kernel size, per stage
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    n_mels: int = 80  # input channels (DLE hard-codes 80)

    def __post_init__(self) -> None:
        if self.resblock not in ("1", "2"):
            raise SpeechRTError(f"hifigan: resblock must be '1' or '2', got {self.resblock!r}")
        if len(self.upsample_rates) != len(self.upsample_kernel_sizes):
            raise SpeechRTError(
                "hifigan: upsample_rates and upsample_kernel_sizes differ in length"
            )
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise SpeechRTError(
                "hifigan: resblock_kernel_sizes and resblock_dilation_sizes differ in length"
            )
        n_dil = 3 if self.resblock == "1" else 2
        if any(len(d) != n_dil for d in self.resblock_dilation_sizes):
            raise SpeechRTError(f"hifigan: resblock {self.resblock} needs {n_dil} dilations each")
        for u, k in zip(self.upsample_rates, self.upsample_kernel_sizes, strict=True):
            # padding (k - u) / 2 gives exactly T * u output samples only for even k - u >= 0.
            if k < u or (k - u) % 2:
                raise SpeechRTError(f"hifigan: upsample kernel {k} does not fit rate {u}")
        if self.upsample_initial_channel % 2 ** len(self.upsample_rates):
            raise SpeechRTError("hifigan: upsample_initial_channel not divisible by 2^stages")

    @property
    def hop_length(self) -> int:
        """Audio samples per mel frame."""
        return math.prod(self.upsample_rates)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> HiFiGANDims:
        """A named preset ("hifigan-v1", "tiny", ...), optionally overridden."""
        try:
            preset = PRESETS[name]
        except KeyError:
            raise SpeechRTError(
                f"unknown HiFi-GAN preset {name!r}; known: {', '.join(PRESETS)}"
            ) from None
        return cls(**{**preset, **overrides})


# The published sizes are the original HiFi-GAN configs (jik876/hifi-gan config_v{1,2,3}.json).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "tiny": dict(  # hop 256 as the published ones, 16 channels, one resblock per stage
        upsample_rates=(8, 8, 4),
        upsample_kernel_sizes=(16, 16, 8),
        upsample_initial_channel=16,
        resblock="1",
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1, 3, 5),),
    ),
    "hifigan-v1": dict(
        upsample_rates=(8, 8, 2, 2),
        upsample_kernel_sizes=(16, 16, 4, 4),
        upsample_initial_channel=512,
        resblock="1",
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
    ),
    "hifigan-v2": dict(
        upsample_rates=(8, 8, 2, 2),
        upsample_kernel_sizes=(16, 16, 4, 4),
        upsample_initial_channel=128,
        resblock="1",
        resblock_kernel_sizes=(3, 7, 11),
        resblock_dilation_sizes=((1, 3, 5), (1, 3, 5), (1, 3, 5)),
    ),
    "hifigan-v3": dict(
        upsample_rates=(8, 8, 4),
        upsample_kernel_sizes=(16, 16, 8),
        upsample_initial_channel=256,
        resblock="2",
        resblock_kernel_sizes=(3, 5, 7),
        resblock_dilation_sizes=((1, 2), (2, 6), (3, 12)),
    ),
}


def contract(d: HiFiGANDims) -> Contract:
    return Contract(
        "hifigan",
        (tensor("mel", F32, B, d.n_mels, "frames"), lengths("mel_lengths", "frames")),
        (tensor("audio", F32, B, "samples"), lengths("audio_lengths", "samples")),
    )


def derived_sizes(d: HiFiGANDims, sizes: dict[str, int]) -> dict[str, int]:
    """The output's sample axis for an input of sizes["frames"] frames."""
    return {"samples": sizes["frames"] * d.hop_length}


HIFIGAN = Graph(
    "hifigan",
    contract,
    "speechrt.runtime.graphs.hifigan:CODE",
    HiFiGANDims,
    channels_last=True,
    derived_sizes=derived_sizes,
)
ARCHITECTURES = (
    Architecture(
        "hifigan",
        HiFiGANDims,
        PRESETS,
        "speechrt.models.hifigan:HiFiGAN",
        ((HIFIGAN, "model.onnx"), (DENOISER, "denoiser.onnx")),
        "speechrt.convert.hifigan:CONVERSION",
        {"n_mels": ("conv_pre.weight", 1), "upsample_initial_channel": ("conv_pre.weight", 0)},
    ),
)
