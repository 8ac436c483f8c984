"""Tiny random Parakeet model directories whose heads emit a variety of tokens, and a sound to
recognise, for the streaming and serving tests (no NeMo, no downloads); tiny talkative models
and their decoding steps on numpy arrays, for the model and chunked-recognition tests.

A random FastConformer's output barely changes over time (its per-channel constant part is ~20x
the rest), so every head would emit one token forever. Each head's input projection is
therefore whitened over the encoder output of a reference sound (weights / std, bias - mean),
and the blank's score raised a little: then the argmax follows the audio, with blanks between
tokens and margins far above float noise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from speechrt.models.parakeet import ParakeetCTC, ParakeetTransducer

# SentencePiece surfaces: a leading space starts a word
PIECES = [" the", " a", " speech", " is", " on", " this", " machine", " call", " her", " to",
          " bring", " from", " store", " it", " works", " and", " we", " you", " go", " do",
          "s", "ing", "ed", "er", "ly", "n", "t", "e", "a", "o", "i", "r", "l", ",", ".", "?",
          "'", " S", " T", " I"]  # fmt: skip
SR = 16000


def sound(seconds: float, seed: int = 0) -> np.ndarray:
    """A voiced-and-noisy sound: a gliding tone and noise taking turns. (N,) float32 at 16 kHz"""
    rng = np.random.default_rng(seed)
    t = np.arange(int(SR * seconds)) / SR
    f0 = 150 + 100 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t)
    tone = np.sin(2 * np.pi * np.cumsum(f0) / SR)
    x = env * tone + 0.3 * rng.standard_normal(t.size) * (1 - env)
    return (0.1 * x).astype(np.float32)


def _whiten(weight: torch.Tensor, bias: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor,
            scale: float) -> None:  # fmt: skip
    """y = W x + b  ->  y = scale * W (x - mu) / sd + b, in place; weight (out, in, ...)."""
    w = weight.reshape(weight.shape[0], -1) / sd[None] * scale
    bias.sub_(w @ mu)
    weight.copy_(w.reshape(weight.shape))


def build(out: Path, head: str, seed: int = 0) -> Path:
    """A model directory of the `tiny` preset with this head: tdt_ctc (a hybrid TDT + CTC
    transducer), ctc or rnnt."""
    import torch

    from speechrt.audio.features import log_mel_numpy
    from speechrt.convert.nemo import feature_config
    from speechrt.models.parakeet import ParakeetCTC, ParakeetTransducer
    from speechrt.registry import preset
    from speechrt.repo import ComponentInfo, save_component

    torch.manual_seed(seed)
    if head == "ctc":
        d = preset("parakeet_ctc", "tiny")
    else:
        durations = () if head == "rnnt" else (0, 1, 2, 3, 4)
        d = preset("parakeet_transducer", "tiny", head=head, durations=durations)
    assert len(PIECES) == d.vocab_size
    model = (ParakeetTransducer if d.transducer else ParakeetCTC)(d).eval()
    features = feature_config({"features": d.n_mels})
    ref = torch.from_numpy(log_mel_numpy(sound(4.0, seed=100), features))[None]
    with torch.no_grad():
        for p in model.encoder.parameters():  # no all-zero position biases
            if p.dim() == 2 and p.shape[0] == d.n_heads:
                p.normal_(0, 0.5)
        enc, _ = model.encoder(ref, torch.tensor([ref.shape[2] - 1]))
        mu, sd = enc[0].mean(0), enc[0].std(0)
        V = d.vocab_size
        if d.has_ctc:
            _whiten(model.ctc.weight, model.ctc.bias, mu, sd, 2.0)
            model.ctc.bias[V] += 1.5  # the blank
        if isinstance(model, ParakeetTransducer):
            _whiten(model.joint.enc.weight, model.joint.enc.bias, mu, sd, 8.0)
            model.joint.out.bias[V] += 1.5  # the blank
            if d.durations:
                model.joint.out.bias[V + 2] += 2.0  # skip one frame, mostly
    meta = {"labels": PIECES, "features": features.to_dict()}
    save_component(out, ComponentInfo(model.kind, d, meta=meta), model.state_dict())
    return out


def talkative(kind: str, seed: int = 0, **dims: object) -> ParakeetCTC:
    """A tiny random model whose joint emits tokens (its output layer scaled up)."""
    import torch

    from speechrt.models.parakeet import ParakeetCTC, ParakeetTransducer
    from speechrt.registry import preset

    torch.manual_seed(seed)
    d = preset(kind, "tiny", **dims)
    model = (ParakeetTransducer if d.transducer else ParakeetCTC)(d).eval()
    with torch.no_grad():
        for p in model.encoder.parameters():  # no all-zero position biases
            if p.dim() == 2 and p.shape[0] == d.n_heads:
                p.normal_(0, 0.5)
        if d.transducer:
            assert isinstance(model, ParakeetTransducer)
            model.joint.out.weight.mul_(8.0)
    return model


def steps_of(model: ParakeetTransducer) -> tuple:
    """(predict, joint, TransducerSpec): the model's decoding steps on numpy arrays."""
    import torch

    from speechrt.asr.transducer import TransducerSpec

    d = model.dims
    spec = TransducerSpec(d.vocab_size, d.durations, d.max_symbols, (d.pred_layers, d.pred_hidden))

    def predict(tokens: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple:
        with torch.inference_mode():
            out = model.predict(*(torch.from_numpy(x) for x in (tokens, h, c)))
        return tuple(x.numpy() for x in out)

    def joint(f: np.ndarray, g: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model.joint(torch.from_numpy(f), torch.from_numpy(g)).numpy()

    return predict, joint, spec
