"""FastSpeech in DLE's checkpoint layout, written for the tests: key shapes, random weights,
tiny dims."""

from __future__ import annotations

import numpy as np
import torch

from speechrt.models.fastspeech import FastSpeechDims

TINY = FastSpeechDims(d_model=16, max_seq_len=64, phoneme_side_n_layer=2,
                      phoneme_side_conv1d_filter_size=32, mel_side_n_layer=2,
                      mel_side_conv1d_filter_size=32, duration_predictor_filter_size=8,
                      n_mels=8)  # fmt: skip


def dle_table(n_position: int, d: int) -> torch.Tensor:
    """DLE's get_sinusoid_encoding_table(n_position, d, padding_idx=0), in numpy as DLE."""
    angle = np.array([[p / np.power(10000, 2 * (j // 2) / d) for j in range(d)]
                      for p in range(n_position)])  # fmt: skip
    angle[:, 0::2], angle[:, 1::2] = np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])
    angle[0] = 0.0
    return torch.FloatTensor(angle)


def dle_shapes(d: FastSpeechDims) -> dict[str, list[int]]:
    """Key -> shape of DLE's Fastspeech state dict (d_k = d_v = 64)."""
    s: dict[str, list[int]] = {"word_emb.weight": [d.n_symbols, d.d_model]}

    def side(name: str, n: int, h: int, inner: int) -> None:
        s[f"{name}.position.weight"] = [d.max_seq_len + 1, d.d_model]
        for i in range(n):
            p, k, m = f"{name}.layer_stack.{i}.", d.fft_conv1d_kernel, d.d_model
            for sub, w, b in (("slf_attn.linear", [h * 192, m], [h * 192]),
                              ("slf_attn.layer_norm", [m], [m]),
                              ("slf_attn.fc", [m, h * 64], [m]),
                              ("pos_ffn.w_1", [inner, m, k], [inner]),
                              ("pos_ffn.w_2", [m, inner, k], [m]),
                              ("pos_ffn.layer_norm", [m], [m])):  # fmt: skip
                s[f"{p}{sub}.weight"], s[f"{p}{sub}.bias"] = w, b

    side("phoneme_side", d.phoneme_side_n_layer, d.phoneme_side_head,
         d.phoneme_side_conv1d_filter_size)  # fmt: skip
    p, f, k = "length_regulator.duration_predictor.", d.duration_predictor_filter_size, 3
    s.update({p + "conv1d_1.weight": [f, d.d_model, k], p + "conv1d_1.bias": [f],
              p + "layer_norm_1.weight": [f], p + "layer_norm_1.bias": [f],
              p + "conv1d_2.weight": [f, f, k], p + "conv1d_2.bias": [f],
              p + "layer_norm_2.weight": [f], p + "layer_norm_2.bias": [f],
              p + "linear_layer.weight": [1, f], p + "linear_layer.bias": [1]})  # fmt: skip
    side("mel_side", d.mel_side_n_layer, d.mel_side_head, d.mel_side_conv1d_filter_size)
    s.update({"mel_linear.weight": [d.n_mels, d.d_model], "mel_linear.bias": [d.n_mels]})
    return s


def dle_state_dict(d: FastSpeechDims = TINY) -> dict[str, torch.Tensor]:
    sd = {}
    for k, shape in dle_shapes(d).items():
        if k.endswith("position.weight"):
            sd[k] = dle_table(*shape)
        elif "layer_norm" in k and k.endswith("weight"):
            sd[k] = 1.0 + 0.1 * torch.randn(shape)
        else:
            sd[k] = torch.randn(shape) * 0.3
    sd["length_regulator.duration_predictor.linear_layer.bias"].fill_(1.2)  # ~1-6 frames each
    return sd
