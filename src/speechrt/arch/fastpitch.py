"""FastPitch 1.1: symbol ids (B, L) -> mel (B, n_mels, T), durations, pitch and energy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph, Regulated
from speechrt.contracts import F32, I64, PACE, SHIFT, B, Contract, ids, lengths, tensor
from speechrt.errors import SpeechRTError

MAX_DURATION = 75.0  # frames per symbol, DLE eager infer's clamp
MAX_FRAMES = 16384  # cap on mel frames per item (~190 s at 22.05 kHz / hop 256): decoder is O(T^2)


@dataclass(frozen=True)
class FastPitchDims:
    """Architecture hyper-parameters; field names are DLE's `config` keys (defaults = DLE's)."""

    n_mel_channels: int = 80
    n_symbols: int = 148  # english_basic
    padding_idx: int = 0
    symbols_embedding_dim: int = 384
    in_fft_n_layers: int = 6
    in_fft_n_heads: int = 1
    in_fft_d_head: int = 64
    in_fft_conv1d_kernel_size: int = 3
    in_fft_conv1d_filter_size: int = 1536
    in_fft_output_size: int = 384  # must equal symbols_embedding_dim
    out_fft_n_layers: int = 6
    out_fft_n_heads: int = 1
    out_fft_d_head: int = 64
    out_fft_conv1d_kernel_size: int = 3
    out_fft_conv1d_filter_size: int = 1536
    out_fft_output_size: int = 384  # must equal symbols_embedding_dim
    dur_predictor_kernel_size: int = 3
    dur_predictor_filter_size: int = 256
    dur_predictor_n_layers: int = 2
    pitch_predictor_kernel_size: int = 3
    pitch_predictor_filter_size: int = 256
    pitch_predictor_n_layers: int = 2
    pitch_embedding_kernel_size: int = 3
    pitch_conditioning_formants: int = 1
    energy_conditioning: bool = True  # off in DLE's argparse, on in the released model
    energy_predictor_kernel_size: int = 3
    energy_predictor_filter_size: int = 256
    energy_predictor_n_layers: int = 2
    energy_embedding_kernel_size: int = 3
    n_speakers: int = 1
    speaker_emb_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.in_fft_output_size == self.out_fft_output_size == self.symbols_embedding_dim:
            raise SpeechRTError("fastpitch: in/out_fft_output_size != symbols_embedding_dim")

    @property
    def n_mels(self) -> int:
        return self.n_mel_channels


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # the released LJSpeech model
    "tiny": dict(  # 80 mels, english_basic, one 16-wide FFT layer per side
        symbols_embedding_dim=16,
        in_fft_n_layers=1,
        in_fft_n_heads=2,
        in_fft_d_head=8,
        in_fft_conv1d_filter_size=32,
        in_fft_output_size=16,
        out_fft_n_layers=1,
        out_fft_n_heads=2,
        out_fft_d_head=8,
        out_fft_conv1d_filter_size=32,
        out_fft_output_size=16,
        dur_predictor_filter_size=16,
        pitch_predictor_filter_size=16,
        energy_predictor_filter_size=16,
    ),
}


def contract(d: FastPitchDims) -> Contract:
    inputs = [
        ids("ids", d.n_symbols, doc="symbol ids, right-padded"),
        lengths("lengths", "symbols"),
        tensor("pace", F32, B, doc="speaking rate, > 1 is faster", default=1.0, bounds=PACE),
        tensor(
            "pitch_shift", F32, B, doc="Hz added to the pitch contour", default=0.0, bounds=SHIFT
        ),
        tensor(
            "pitch_scale",
            F32,
            B,
            doc="multiplies the pitch deviation; 0 = monotone",
            default=1.0,
            bounds=(0.0, 10.0),
        ),
    ]
    if d.n_speakers > 1:
        inputs.append(tensor("speaker", I64, B, default=0, bounds=(0, d.n_speakers - 1)))
    outputs = [
        tensor("mel", F32, B, d.n_mels, "frames"),
        lengths("mel_lengths", "frames"),
        tensor("durations", F32, B, "symbols", doc="frames per symbol before pace and rounding"),
        tensor("pitch", F32, B, d.pitch_conditioning_formants, "symbols"),
    ]
    if d.energy_conditioning:
        outputs.append(tensor("energy", F32, B, "symbols"))
    return Contract("fastpitch", tuple(inputs), tuple(outputs))


ARCHITECTURES = (
    Architecture(
        "fastpitch",
        FastPitchDims,
        PRESETS,
        "speechrt.models.fastpitch:FastPitch",
        (
            (
                Graph(
                    "fastpitch",
                    contract,
                    "speechrt.runtime.graphs.fastpitch:CODE",
                    FastPitchDims,
                    channels_last=True,
                    regulated=Regulated("durations", "pace", MAX_DURATION, MAX_FRAMES),
                ),
                "model.onnx",
            ),
        ),
        "speechrt.convert.fastpitch:CONVERSION",
        {
            "n_symbols": ("encoder.word_emb.weight", 0),
            "symbols_embedding_dim": ("encoder.word_emb.weight", 1),
            "n_speakers": ("speaker_emb.weight", 0),
            "n_mel_channels": ("proj.weight", 0),
        },
    ),
)
