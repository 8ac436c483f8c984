"""Tacotron 2, as DLE's TensorRT export splits it: encoder, one decoder step, postnet.

encoder        sequences (B, L) -> memory (B, L, E), processed_memory (B, L, attention_dim)
decoder_step   the previous frame (B, n_mels) + the recurrent state -> the next frame + state
postnet        mel_outputs (B, n_mels, T) -> mel_outputs_postnet (B, n_mels, T)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.contracts import BOOL, F32, B, Contract, TensorSpec, ids, lengths, tensor


@dataclass(frozen=True)
class Tacotron2Dims:
    """Architecture hyper-parameters; names are DLE's `config` keys, defaults its argparse's."""

    n_mel_channels: int = 80
    n_symbols: int = 148  # english_basic
    symbols_embedding_dim: int = 512
    encoder_kernel_size: int = 5
    encoder_n_convolutions: int = 3
    encoder_embedding_dim: int = 512
    attention_rnn_dim: int = 1024
    attention_dim: int = 128
    attention_location_n_filters: int = 32
    attention_location_kernel_size: int = 31
    decoder_rnn_dim: int = 1024
    prenet_dim: int = 256
    postnet_embedding_dim: int = 512
    postnet_kernel_size: int = 5
    postnet_n_convolutions: int = 5
    max_decoder_steps: int = 2000  # SynthesisOptions.max_decoder_steps overrides
    gate_threshold: float = 0.5

    @property
    def n_mels(self) -> int:
        return self.n_mel_channels


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # the released LJSpeech model
    "tiny": dict(  # 80 mels, english_basic, 16-24 wide
        symbols_embedding_dim=16,
        encoder_embedding_dim=16,
        attention_rnn_dim=24,
        attention_dim=8,
        attention_location_n_filters=4,
        attention_location_kernel_size=7,
        decoder_rnn_dim=24,
        prenet_dim=12,
        postnet_embedding_dim=16,
        max_decoder_steps=80,
    ),
}


def encoder(d: Tacotron2Dims) -> Contract:
    return Contract(
        "tacotron2.encoder",
        (ids("sequences", d.n_symbols), lengths("sequence_lengths", "symbols")),
        (
            tensor("memory", F32, B, "symbols", d.encoder_embedding_dim),
            tensor("processed_memory", F32, B, "symbols", d.attention_dim),
        ),
    )


def _state(d: Tacotron2Dims, prefix: str = "") -> tuple[TensorSpec, ...]:
    a, r = d.attention_rnn_dim, d.decoder_rnn_dim
    return (
        tensor(prefix + "attention_hidden", F32, B, a),
        tensor(prefix + "attention_cell", F32, B, a),
        tensor(prefix + "decoder_hidden", F32, B, r),
        tensor(prefix + "decoder_cell", F32, B, r),
        tensor(prefix + "attention_weights", F32, B, "symbols"),
        tensor(prefix + "attention_weights_cum", F32, B, "symbols"),
        tensor(prefix + "attention_context", F32, B, d.encoder_embedding_dim),
    )


def decoder_step(d: Tacotron2Dims) -> Contract:
    """One decoder step, DLE's decoder_iter.onnx names plus the prenet dropout masks."""
    inputs = (
        tensor("decoder_input", F32, B, d.n_mels, doc="the previous frame (zeros at step 1)"),
        *_state(d),
        tensor("memory", F32, B, "symbols", d.encoder_embedding_dim),
        tensor("processed_memory", F32, B, "symbols", d.attention_dim),
        tensor("mask", BOOL, B, "symbols", doc="True at padding", pad=1),
        tensor("prenet_masks", F32, B, 2, d.prenet_dim, doc="0 or 2: dropout p 0.5"),
    )
    outputs = (
        tensor("decoder_output", F32, B, d.n_mels),
        tensor("gate_prediction", F32, B, 1, doc="stop logit"),
        *_state(d, "out_"),
    )
    return Contract("tacotron2.decoder_step", inputs, outputs)


def postnet(d: Tacotron2Dims) -> Contract:
    return Contract(
        "tacotron2.postnet",
        (tensor("mel_outputs", F32, B, d.n_mels, "frames"), lengths("mel_lengths", "frames")),
        (tensor("mel_outputs_postnet", F32, B, d.n_mels, "frames"),),
    )


def _graph(
    part: str, contract: Callable[[Tacotron2Dims], Contract], code: str, float32: bool
) -> Graph:
    own_stage = part == "encoder"  # the encoder's stage runs all three graphs
    code = f"speechrt.runtime.graphs.tacotron2:{code}"
    return Graph(
        f"tacotron2.{part}", contract, code, Tacotron2Dims, float32=float32, own_stage=own_stage
    )


# The encoder and the decoder step stay float32 on the cuda runner: they feed an autoregressive
# loop whose stop gate amplifies rounding.
ARCHITECTURES = (
    Architecture(
        "tacotron2",
        Tacotron2Dims,
        PRESETS,
        "speechrt.models.tacotron2:Tacotron2",
        (
            (_graph("encoder", encoder, "ENCODER_CODE", True), "encoder.onnx"),
            (_graph("decoder_step", decoder_step, "DECODER_STEP_CODE", True), "decoder_step.onnx"),
            (_graph("postnet", postnet, "POSTNET_CODE", False), "postnet.onnx"),
        ),
        "speechrt.convert.tacotron2:CONVERSION",
        {
            "n_symbols": ("encoder.embedding.weight", 0),
            "symbols_embedding_dim": ("encoder.embedding.weight", 1),
            "n_mel_channels": ("decoder.linear_projection.weight", 0),
        },
    ),
)
