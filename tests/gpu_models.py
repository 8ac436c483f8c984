"""Random-weight default-dims components for the CUDA tests (test_cuda.py), weights that behave.

Random weights alone give durations of zero or 75 frames, Tacotron2 gates that never fire, and
ASR activations that vanish; each builder sets the few weights that make the check meaningful.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from speechrt.models import build_model

TEXT = {"symbol_set": "english_basic", "cleaners": "english_cleaners_v2", "p_arpabet": 0.0}

# -- random-weight components ------------------------------------------------------------------


def build(kind: str, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """A default-dims model with weights that behave: stopping gates, sane durations."""
    from speechrt.models import model_class

    torch.manual_seed(0)
    dims = dataclasses.asdict(model_class(kind).Dims())
    if kind == "tacotron2":
        dims["max_decoder_steps"] = 400
    model = build_model(kind, dims).to(device).eval()
    meta: dict[str, Any] = {}
    with torch.no_grad():
        if kind == "fastpitch":
            model.duration_predictor.fc.weight.mul_(0.1)
            model.duration_predictor.fc.bias.fill_(1.5)  # ~3.5 frames per symbol
            model.pitch_mean.fill_(214.7)
            model.pitch_std.fill_(65.7)
            meta = {"text": TEXT}
        elif kind == "fastspeech":
            model.length_regulator.duration_predictor.linear_layer.weight.mul_(0.1)
            model.length_regulator.duration_predictor.linear_layer.bias.fill_(1.3)
            meta = {"text": TEXT}
        elif kind == "tacotron2":
            stopping_gate(model, rate=0.008)
            meta = {"text": TEXT}
        elif kind == "waveglow":
            for wn in model.WN:
                wn.end.weight.normal_(0, 0.01)  # DLE zero-initialises it: exercise the flows
            for inv in model.convinv:  # a random orthogonal 1x1 conv: its inverse is W^T
                q, _ = torch.linalg.qr(torch.randn(inv.inverse.shape[0], inv.inverse.shape[0]))
                inv.inverse.copy_(q.T[:, :, None].to(device))
        elif kind in ("jasper", "quartznet"):
            from speechrt.audio.features import FeatureConfig
            from speechrt.models.jasper import LABELS

            normalise_convs(model, device)
            meta = {"labels": list(LABELS), "features": FeatureConfig().to_dict(),
                    "pad_leading": 16}  # fmt: skip
    return model, meta


def stopping_gate(model: torch.nn.Module, rate: float) -> None:
    """Decoder unit 0 integrates `rate` per step (plus a context term); the gate reads it, so
    each item stops after roughly 0.55 / rate steps, each at its own step."""
    d, rnn = model.dims, model.decoder.decoder_rnn
    h, a = d.decoder_rnn_dim, d.attention_rnn_dim
    for gate in range(4):
        rnn.weight_ih[gate * h].zero_()
        rnn.weight_hh[gate * h].zero_()
        rnn.bias_ih[gate * h] = 10.0 if gate != 2 else rate
        rnn.bias_hh[gate * h] = 0.0
    rnn.weight_ih[2 * h, a:].normal_(0, 0.002)
    model.decoder.gate_layer.weight.zero_()
    model.decoder.gate_layer.weight[0, 0] = 20.0
    model.decoder.gate_layer.bias.fill_(-10.0)


def normalise_convs(model: torch.nn.Module, device: torch.device) -> None:
    """Scale every conv so its output has unit std on speech-like features (what BatchNorm
    statistics would do), and sharpen the decoder: a random ASR model with sane activations."""
    feats = torch.randn(2, model.dims.n_feats, 400, device=device)
    lengths = torch.tensor([400, 300], device=device)
    for conv in [m for m in model.modules() if isinstance(m, torch.nn.Conv1d)]:
        std = output_std(model, conv, feats, lengths) or 1.0
        conv.weight.div_(std)
        if conv.bias is not None:
            conv.bias.div_(std)
    model.decoder.weight.mul_(4.0)


def output_std(
    model: torch.nn.Module, conv: torch.nn.Module, feats: torch.Tensor, lengths: torch.Tensor
) -> float:
    seen: list[torch.Tensor] = []
    handle = conv.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    model(feats, lengths)
    handle.remove()
    return float(seen[0].std())


def speechlike(seconds: float, seed: int, sr: int = 16000) -> np.ndarray:
    """Tone bursts and near-silence: a fixed ASR input."""
    rng = np.random.default_rng(seed)
    parts, total = [], int(seconds * sr)
    while sum(map(len, parts)) < total:
        n = int(rng.uniform(0.05, 0.4) * sr)
        t = np.arange(n) / sr
        f = rng.uniform(100, 3000)
        amp = 0.01 if rng.random() < 0.3 else rng.uniform(0.1, 0.5)
        parts.append(amp * np.sin(2 * np.pi * f * t) * np.hanning(n))
    return np.concatenate(parts)[:total].astype(np.float32)
