"""Tacotron 2 as three graphs with DLE's ONNX tensor names: encoder, decoder step, postnet.

The decoder step and the postnet are the model's own modules (already pure tensor functions; the
prenet dropout masks are an input). The encoder wrapper runs the bidirectional LSTM without packed
sequences, which ONNX cannot hold: the forward direction runs over the padded batch (padding comes
after an item's frames, so it cannot reach them), the backward direction runs forward over each
item reversed within its own length, and positions past an item's length are zeroed, as
pad_packed_sequence leaves them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from speechrt.arch import GraphCode
from speechrt.models.tacotron2 import Tacotron2

if TYPE_CHECKING:
    from speechrt.runtime.stages import StageParts
    from speechrt.runtime.tacotron2 import Tacotron2Stage


def reverse_within(x: Tensor, lengths: Tensor) -> Tensor:
    """x (B, T, C): item b's first lengths[b] steps reversed, the rest left in place."""
    t = torch.arange(x.shape[1], device=x.device)[None, :]
    n = lengths[:, None]
    index = torch.where(t < n, n - 1 - t, t)  # (B, T); its own inverse
    return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[2]))


class EncoderGraph(nn.Module):
    """forward(sequences (B, L), sequence_lengths (B,)) -> (memory (B, L, E), processed_memory)."""

    def __init__(self, model: Tacotron2) -> None:
        super().__init__()
        enc = model.encoder
        self.encoder = enc
        lstm = enc.lstm
        self.forward_lstm = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
        self.backward_lstm = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            setattr(self.forward_lstm, name, getattr(lstm, name))  # shared, not copied
            setattr(self.backward_lstm, name, getattr(lstm, name + "_reverse"))

    def forward(self, sequences: Tensor, sequence_lengths: Tensor) -> tuple[Tensor, Tensor]:
        enc = self.encoder
        x = enc.embedding(sequences).transpose(1, 2)  # (B, E, L)
        keep = torch.arange(x.shape[2], device=x.device)[None, :] < sequence_lengths[:, None]
        keep_c = keep[:, None, :].to(x.dtype)
        for conv in enc.convs:
            x = F.relu(conv(x * keep_c))
        x = x.transpose(1, 2)  # (B, L, E)
        fwd, _ = self.forward_lstm(x)
        bwd, _ = self.backward_lstm(reverse_within(x, sequence_lengths))
        memory = torch.cat([fwd, reverse_within(bwd, sequence_lengths)], dim=2)
        memory = memory * keep[:, :, None].to(memory.dtype)
        return memory, enc.memory_layer(memory)


class DecoderStepGraph(nn.Module):
    """One decoder step: the model's DecoderStep (12 named inputs -> 9 named outputs)."""

    def __init__(self, model: Tacotron2) -> None:
        super().__init__()
        self.decoder = model.decoder

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self.decoder(*inputs)


class PostnetGraph(nn.Module):
    """forward(mel_outputs (B, n_mels, T), mel_lengths (B,)) -> mel_outputs_postnet."""

    def __init__(self, model: Tacotron2) -> None:
        super().__init__()
        self.postnet = model.postnet

    def forward(self, mel_outputs: Tensor, mel_lengths: Tensor) -> Tensor:
        dtype = self.postnet.convs[0].weight.dtype  # a ModuleList item, typed as Module
        return self.postnet(mel_outputs.to(dtype), mel_lengths)  # type: ignore[arg-type]


def _lengths(batch: int, length: int) -> Tensor:
    return torch.tensor([max(1, length - 3 * i) for i in range(batch)])


def build_encoder(model: Tacotron2, info: object = None) -> EncoderGraph:
    return EncoderGraph(model)


def build_decoder_step(model: Tacotron2, info: object = None) -> DecoderStepGraph:
    return DecoderStepGraph(model)


def build_postnet(model: Tacotron2, info: object = None) -> PostnetGraph:
    return PostnetGraph(model)


def example_encoder(graph: EncoderGraph, batch: int, length: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n_symbols = graph.encoder.embedding.num_embeddings
    lengths = _lengths(batch, length)
    ids = torch.randint(1, n_symbols, (batch, length), generator=g)
    ids = ids * (torch.arange(length)[None, :] < lengths[:, None])
    return {"sequences": ids, "sequence_lengths": lengths}


def stage(parts: StageParts) -> Tacotron2Stage:
    """encoder -> decoder-step loop -> postnet (speechrt.runtime.tacotron2); on cuda the loop
    compiles the decoder step itself, so that graph gets no runner."""
    from speechrt.runtime.tacotron2 import tacotron2_stage

    model = parts.model
    assert isinstance(model, Tacotron2)
    on_cuda = parts.backend == "cuda"
    runners = [None if on_cuda and "decoder" in g else parts.runner(g) for g in parts.graphs]
    return tacotron2_stage(
        model.dims,
        runners,
        parts.backend,
        model.decoder,
        parts.device,
        parts.buckets,
        parts.compile_mode,
    )


def example_decoder_step(graph: DecoderStepGraph, batch: int, length: int, seed: int = 0) -> dict:
    """A mid-utterance state: random memory and states, attention weights summing to 1."""
    g = torch.Generator().manual_seed(seed)
    d = graph.decoder
    # the prenet's width; ModuleList items type as Module
    p: int = d.prenet[1].out_features  # type: ignore[assignment]
    e = d.attention_rnn.input_size - p
    a_rnn, d_rnn = d.attention_rnn.hidden_size, d.decoder_rnn.hidden_size
    lengths = _lengths(batch, length)
    mask = ~(torch.arange(length)[None, :] < lengths[:, None])
    weights = torch.rand(batch, length, generator=g).masked_fill(mask, 0.0)
    weights = weights / weights.sum(1, keepdim=True)
    r = lambda *s: torch.randn(*s, generator=g) * 0.5  # noqa: E731
    keep = (torch.rand(batch, 2, p, generator=g) >= 0.5).float() * 2.0
    return {
        "decoder_input": r(batch, d.prenet[0].in_features),
        "attention_hidden": r(batch, a_rnn),
        "attention_cell": r(batch, a_rnn),
        "decoder_hidden": r(batch, d_rnn),
        "decoder_cell": r(batch, d_rnn),
        "attention_weights": weights,
        "attention_weights_cum": weights * 3.0,
        "attention_context": r(batch, e),
        "memory": r(batch, length, e).masked_fill(mask[:, :, None], 0.0),
        "processed_memory": r(batch, length, d.query_layer.out_features),
        "mask": mask,
        "prenet_masks": keep,
    }


def example_postnet(graph: PostnetGraph, batch: int, length: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    n_mels: int = graph.postnet.convs[0].in_channels  # type: ignore[assignment]  # as above
    return {
        "mel_outputs": torch.randn(batch, n_mels, length, generator=g) - 4.0,
        "mel_lengths": _lengths(batch, length),
    }


# named by the registry entries (speechrt.arch.tacotron2); the encoder's stage runs all three
ENCODER_CODE = GraphCode(build_encoder, example_encoder, stage)
DECODER_STEP_CODE = GraphCode(build_decoder_step, example_decoder_step)
POSTNET_CODE = GraphCode(build_postnet, example_postnet)
