"""FastSpeech (DLE): symbol ids (B, L) -> mel (B, n_mels, T)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.contracts import F32, PACE, B, Contract, ids, lengths, tensor


@dataclass(frozen=True)
class FastSpeechDims:
    """Architecture hyper-parameters; names are DLE's hparams (base.yaml), defaults its values."""

    n_symbols: int = 149  # DLE: len(symbols) + 1 (keithito symbols = english_basic, 148)
    d_model: int = 384
    max_seq_len: int = 2048
    d_head: int = 64  # DLE hard-codes d_k = d_v = 64
    phoneme_side_n_layer: int = 6
    phoneme_side_head: int = 2
    phoneme_side_conv1d_filter_size: int = 1536
    mel_side_n_layer: int = 6
    mel_side_head: int = 2
    mel_side_conv1d_filter_size: int = 1536
    fft_conv1d_kernel: int = 3
    fft_conv1d_padding: int = 1
    duration_predictor_filter_size: int = 256
    duration_predictor_kernel_size: int = 3
    n_mels: int = 80


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # DLE's base.yaml
    "tiny": dict(  # 80 mels, DLE's symbols, two 16-wide FFT layers per side
        d_model=16,
        max_seq_len=256,
        d_head=4,
        phoneme_side_n_layer=2,
        phoneme_side_conv1d_filter_size=32,
        mel_side_n_layer=2,
        mel_side_conv1d_filter_size=32,
        duration_predictor_filter_size=8,
    ),
}


def contract(d: FastSpeechDims) -> Contract:
    return Contract(
        "fastspeech",
        (
            ids("ids", d.n_symbols),
            lengths("lengths", "symbols"),
            tensor(
                "pace",
                F32,
                B,
                doc="speaking rate, > 1 is faster (DLE's alpha = 1 / pace)",
                default=1.0,
                bounds=PACE,
            ),
        ),
        (tensor("mel", F32, B, d.n_mels, "frames"), lengths("mel_lengths", "frames")),
    )


ARCHITECTURES = (
    Architecture(
        "fastspeech",
        FastSpeechDims,
        PRESETS,
        "speechrt.models.fastspeech:FastSpeech",
        (
            (
                Graph(
                    "fastspeech",
                    contract,
                    "speechrt.runtime.graphs.fastspeech:CODE",
                    FastSpeechDims,
                    channels_last=True,
                ),
                "model.onnx",
            ),
        ),
        "speechrt.convert.fastspeech:CONVERSION",
        {
            "n_symbols": ("word_emb.weight", 0),
            "d_model": ("word_emb.weight", 1),
            "n_mels": ("mel_linear.weight", 0),
        },
    ),
)
