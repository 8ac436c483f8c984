"""The denoiser graph both vocoders share: spectral subtraction of the vocoder's own bias.

It is not an architecture of its own (no checkpoint, no model.json): speechrt.models.denoiser
builds it from a loaded vocoder, and the hifigan and waveglow entries list DENOISER.
"""

from __future__ import annotations

from dataclasses import dataclass

from speechrt.arch import Architecture, Graph
from speechrt.contracts import F32, B, Contract, lengths, tensor
from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class DenoiserDims:
    n_fft: int = 1024  # DLE's filter_length
    hop_length: int = 256  # n_fft / 4
    win_length: int = 1024  # Hann window length, <= n_fft

    def __post_init__(self) -> None:
        if self.n_fft % 2 or not 0 < self.win_length <= self.n_fft or self.hop_length <= 0:
            raise SpeechRTError(f"denoiser: invalid STFT sizes {self}")


def contract(d: object = None) -> Contract:
    del d  # the STFT sizes are inside the graph, read off the vocoder's mel config
    return Contract(
        "denoiser",
        (
            tensor("audio", F32, B, "samples"),
            lengths("audio_lengths", "samples"),
            tensor(
                "strength",
                F32,
                B,
                doc="multiple of the vocoder's bias spectrum to subtract",
                bounds=(0.0, 1.0),
            ),
        ),
        (tensor("denoised", F32, B, "samples"),),
    )


# float32: its DFT sums n_fft products per bin
DENOISER = Graph("denoiser", contract, "speechrt.runtime.graphs.denoiser:CODE", float32=True)
ARCHITECTURES: tuple[Architecture, ...] = ()
