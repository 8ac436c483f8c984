"""DLE Tacotron2 checkpoints -> our key layout, BatchNorm folded into the convolutions."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from speechrt.arch import Conversion
from speechrt.arch.tacotron2 import Tacotron2Dims
from speechrt.audio.mel import MelConfig
from speechrt.convert import Converted
from speechrt.convert.checkpoints import strip_prefix
from speechrt.errors import SpeechRTError


def detect(keys: set[str]) -> bool:
    return any(k.endswith("decoder.attention_rnn.weight_ih") for k in keys)


def from_dle(ckpt: dict) -> Converted:
    """DLE train.py checkpoint ({'state_dict', 'config', ...}) -> Converted.

    'module.1.' / 'module.' are removed anywhere in the keys (DLE's unwrap_distributed);
    'config' gives the dims when present, else the weight shapes do; BatchNorm is folded.
    Training-only config keys (dropouts, mask_padding) are ignored, and so is
    decoder_no_early_stopping: DLE's mel lengths do not depend on it.
    """
    if not isinstance(ckpt.get("state_dict"), dict):
        raise SpeechRTError("tacotron2: checkpoint has no 'state_dict'")
    sd = strip_prefix(ckpt["state_dict"], r"module\.1\.|module\.")
    config = ckpt.get("config")
    dims = _dims_from_config(config) if isinstance(config, dict) else _dims_from_shapes(sd)
    text = {"symbol_set": "english_basic", "cleaners": "english_cleaners", "p_arpabet": 0.0}
    mel = MelConfig(n_mels=dims.n_mel_channels)
    return Converted("tacotron2", dims, _inference_state(sd, dims), mel, {"text": text})


BN_EPS = 1e-5  # BatchNorm1d default


def _dims_from_config(config: dict[str, Any]) -> Tacotron2Dims:
    if config.get("n_frames_per_step", 1) != 1:
        raise SpeechRTError("tacotron2: only n_frames_per_step 1 is supported (as in DLE)")
    fields = Tacotron2Dims.__dataclass_fields__
    return Tacotron2Dims(**{k: v for k, v in config.items() if k in fields})


def _dims_from_shapes(sd: dict[str, Tensor]) -> Tacotron2Dims:
    """Dims of a checkpoint without 'config': sizes from the weight shapes, the rest DLE's."""
    try:
        n_sym, emb = sd["embedding.weight"].shape
        enc = sd["encoder.convolutions.0.0.conv.weight"]
        post = sd["postnet.convolutions.0.0.conv.weight"]
        loc = sd["decoder.attention_layer.location_layer.location_conv.conv.weight"]
        prenet = sd["decoder.prenet.layers.0.linear_layer.weight"]
        return Tacotron2Dims(
            n_mel_channels=prenet.shape[1],
            n_symbols=n_sym,
            symbols_embedding_dim=emb,
            encoder_kernel_size=enc.shape[2],
            encoder_n_convolutions=_count(sd, r"encoder\.convolutions\.(\d+)\.0\.conv\.weight"),
            encoder_embedding_dim=enc.shape[0],
            attention_rnn_dim=sd["decoder.attention_rnn.weight_hh"].shape[1],
            attention_dim=sd["decoder.attention_layer.query_layer.linear_layer.weight"].shape[0],
            attention_location_n_filters=loc.shape[0],
            attention_location_kernel_size=loc.shape[2],
            decoder_rnn_dim=sd["decoder.decoder_rnn.weight_hh"].shape[1],
            prenet_dim=prenet.shape[0],
            postnet_embedding_dim=post.shape[0],
            postnet_kernel_size=post.shape[2],
            postnet_n_convolutions=_count(sd, r"postnet\.convolutions\.(\d+)\.0\.conv\.weight"),
        )
    except KeyError as e:
        raise SpeechRTError(f"tacotron2: checkpoint lacks {e}") from None


def _count(sd: dict[str, Tensor], pattern: str) -> int:
    return sum(1 for k in sd if re.fullmatch(pattern, k))


def _fold_bn(sd: dict[str, Tensor], conv: str, bn: str) -> tuple[Tensor, Tensor]:
    """Conv1d followed by eval-mode BatchNorm1d -> one Conv1d (weight, bias), folded in float64."""
    w, b = sd[conv + ".weight"].double(), sd[conv + ".bias"].double()
    scale = sd[bn + ".weight"].double() / torch.sqrt(sd[bn + ".running_var"].double() + BN_EPS)
    shift = sd[bn + ".bias"].double() - sd[bn + ".running_mean"].double() * scale
    dtype = sd[conv + ".weight"].dtype
    return (w * scale[:, None, None]).to(dtype), (b * scale + shift).to(dtype)


_ENCODER_KEYS = {
    "embedding.weight": "encoder.embedding.weight",
    "decoder.attention_layer.memory_layer.linear_layer.weight": "encoder.memory_layer.weight",
}


def _inference_state(sd: dict[str, Tensor], dims: Tacotron2Dims) -> dict[str, Tensor]:
    """DLE keys -> ours: drop the LinearNorm/ConvNorm/attention wrappers, fold BatchNorm."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        if key.startswith(("encoder.convolutions.", "postnet.convolutions.")):
            continue  # folded below
        if key in _ENCODER_KEYS:  # DLE's export runs these in the encoder component too
            out[_ENCODER_KEYS[key]] = value
            continue
        for old, new in (("attention_layer.", ""), ("location_layer.", ""), ("linear_layer.", ""),
                         (".conv.", "."), ("prenet.layers.", "prenet.")):  # fmt: skip
            key = key.replace(old, new)
        out[key] = value
    try:
        for part, n in (("encoder", dims.encoder_n_convolutions),
                        ("postnet", dims.postnet_n_convolutions)):  # fmt: skip
            for i in range(n):
                w, b = _fold_bn(sd, f"{part}.convolutions.{i}.0.conv", f"{part}.convolutions.{i}.1")
                out[f"{part}.convs.{i}.weight"], out[f"{part}.convs.{i}.bias"] = w, b
    except KeyError as e:
        raise SpeechRTError(f"tacotron2: checkpoint lacks {e}") from None
    return out


CONVERSION = Conversion(detect, from_dle)  # named by its registry entry (speechrt.arch)
