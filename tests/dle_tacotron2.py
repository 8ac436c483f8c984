"""Tacotron 2 in DLE's checkpoint layout, written for the tests: key shapes (BatchNorm
unfolded), random weights, a decoder that stops, tiny dims."""

from __future__ import annotations

import torch

from speechrt.models.tacotron2 import Tacotron2Dims

TINY = dict(n_mel_channels=8, n_symbols=30, symbols_embedding_dim=16, encoder_embedding_dim=16,
            attention_rnn_dim=24, attention_dim=8, attention_location_n_filters=4,
            attention_location_kernel_size=7, decoder_rnn_dim=24, prenet_dim=12,
            postnet_embedding_dim=16, max_decoder_steps=100)  # fmt: skip


def dle_shapes(d: Tacotron2Dims) -> dict[str, list[int]]:
    """Key -> shape of DLE's Tacotron2 state dict (BatchNorm unfolded)."""
    e, m, a = d.encoder_embedding_dim, d.n_mel_channels, d.attention_rnn_dim
    s = {"embedding.weight": [d.n_symbols, d.symbols_embedding_dim]}

    def conv_bn(name: str, out: int, inp: int, k: int) -> None:
        s.update({f"{name}.0.conv.weight": [out, inp, k], f"{name}.0.conv.bias": [out]})
        s.update(
            {f"{name}.1.{p}": [out] for p in ("weight", "bias", "running_mean", "running_var")}
        )
        s[f"{name}.1.num_batches_tracked"] = []

    for i in range(d.encoder_n_convolutions):
        conv_bn(f"encoder.convolutions.{i}", e, e, d.encoder_kernel_size)
    for suffix in ("", "_reverse"):
        s.update({f"encoder.lstm.weight_ih_l0{suffix}": [2 * e, e],
                  f"encoder.lstm.weight_hh_l0{suffix}": [2 * e, e // 2],
                  f"encoder.lstm.bias_ih_l0{suffix}": [2 * e],
                  f"encoder.lstm.bias_hh_l0{suffix}": [2 * e]})  # fmt: skip
    p = "decoder."
    s[p + "prenet.layers.0.linear_layer.weight"] = [d.prenet_dim, m]
    s[p + "prenet.layers.1.linear_layer.weight"] = [d.prenet_dim, d.prenet_dim]
    for rnn, inp, h in (
        ("attention_rnn", d.prenet_dim + e, a),
        ("decoder_rnn", a + e, d.decoder_rnn_dim),
    ):
        s.update({f"{p}{rnn}.weight_ih": [4 * h, inp], f"{p}{rnn}.weight_hh": [4 * h, h],
                  f"{p}{rnn}.bias_ih": [4 * h], f"{p}{rnn}.bias_hh": [4 * h]})  # fmt: skip
        if rnn == "attention_rnn":
            q = p + "attention_layer."
            s[q + "query_layer.linear_layer.weight"] = [d.attention_dim, a]
            s[q + "memory_layer.linear_layer.weight"] = [d.attention_dim, e]
            s[q + "v.linear_layer.weight"] = [1, d.attention_dim]
            s[q + "location_layer.location_conv.conv.weight"] = [
                d.attention_location_n_filters, 2, d.attention_location_kernel_size]  # fmt: skip
            s[q + "location_layer.location_dense.linear_layer.weight"] = [
                d.attention_dim, d.attention_location_n_filters]  # fmt: skip
    s[p + "linear_projection.linear_layer.weight"] = [m, d.decoder_rnn_dim + e]
    s[p + "linear_projection.linear_layer.bias"] = [m]
    s[p + "gate_layer.linear_layer.weight"] = [1, d.decoder_rnn_dim + e]
    s[p + "gate_layer.linear_layer.bias"] = [1]
    n, c = d.postnet_n_convolutions, d.postnet_embedding_dim
    sizes = [m] + [c] * (n - 1) + [m]
    for i in range(n):
        conv_bn(f"postnet.convolutions.{i}", sizes[i + 1], sizes[i], d.postnet_kernel_size)
    return s


def dle_state_dict(d: Tacotron2Dims) -> dict[str, torch.Tensor]:
    sd = {}
    for k, shape in dle_shapes(d).items():
        if k.endswith("num_batches_tracked"):
            sd[k] = torch.tensor(1000)
        elif k.endswith(("running_var", ".1.weight")):  # BN variance and scale
            sd[k] = torch.rand(shape) + 0.5
        else:
            sd[k] = torch.randn(shape) * (0.3 if "lstm" in k or "_rnn" in k else 0.5)
    return sd


def make_stopping(sd: dict, d: Tacotron2Dims, rate: float = 0.06) -> None:
    """Decoder unit 0 integrates a context-dependent rate; the gate fires at tanh(c0) > 0.5, so
    items stop after tens of steps, each at its own step."""
    h, a, e, p = d.decoder_rnn_dim, d.attention_rnn_dim, d.encoder_embedding_dim, "decoder."
    for gate in (0, 1, 2, 3):  # input, forget, cell, output rows of unit 0
        sd[p + "decoder_rnn.weight_ih"][gate * h] = 0
        sd[p + "decoder_rnn.weight_hh"][gate * h] = 0
        sd[p + "decoder_rnn.bias_ih"][gate * h] = 10.0 if gate != 2 else rate
        sd[p + "decoder_rnn.bias_hh"][gate * h] = 0
    sd[p + "decoder_rnn.weight_ih"][2 * h, a:] = torch.randn(e) * 0.03
    sd[p + "gate_layer.linear_layer.weight"].zero_()
    sd[p + "gate_layer.linear_layer.weight"][0, 0] = 20.0
    sd[p + "gate_layer.linear_layer.bias"].fill_(-10.0)
