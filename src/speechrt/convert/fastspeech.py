"""DLE FastSpeech checkpoints -> dims (from the config or the weight shapes) + state dict."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from speechrt.arch import Conversion
from speechrt.arch.fastspeech import FastSpeechDims
from speechrt.audio.mel import MelConfig
from speechrt.convert import Converted
from speechrt.convert.checkpoints import strip_prefix
from speechrt.errors import SpeechRTError
from speechrt.models.fastspeech import sinusoid_table


def detect(keys: set[str]) -> bool:
    return any(k.endswith("phoneme_side.position.weight") for k in keys)


def from_dle(ckpt: dict) -> Converted:
    """DLE checkpoint ({'step', 'model', 'optim'}; also 'state_dict') -> Converted.

    Dims from 'config' when present, else from the weight shapes; the stored sinusoid tables
    are checked against the formula and dropped.
    """
    sd = next((ckpt[k] for k in ("model", "state_dict") if isinstance(ckpt.get(k), dict)), None)
    if sd is None:
        raise SpeechRTError("fastspeech: checkpoint has no 'model' state dict")
    sd = strip_prefix(sd, r"module\.")
    config = ckpt.get("config")
    dims = _dims_from_config(config) if isinstance(config, dict) else _dims_from_shapes(sd)
    expected = sinusoid_table(dims.max_seq_len + 1, dims.d_model)
    out = {}
    for key, value in sd.items():
        if key.endswith(".position.weight"):
            if value.device.type != "meta" and not torch.allclose(
                value.float(), expected, atol=1e-4
            ):
                raise SpeechRTError(f"fastspeech: {key} is not DLE's sinusoid table")
            continue
        out[key] = value
    text = {"symbol_set": "english_basic", "cleaners": "english_cleaners", "p_arpabet": 0.0}
    return Converted("fastspeech", dims, out, MelConfig(n_mels=dims.n_mels), {"text": text})


def _dims_from_config(config: dict[str, Any]) -> FastSpeechDims:
    fields = FastSpeechDims.__dataclass_fields__
    return FastSpeechDims(**{k: v for k, v in config.items() if k in fields})


def _dims_from_shapes(sd: dict[str, Tensor]) -> FastSpeechDims:
    try:
        n_symbols, d_model = sd["word_emb.weight"].shape
        side: dict[str, int] = {}
        for name in ("phoneme_side", "mel_side"):
            ffn = sd[f"{name}.layer_stack.0.pos_ffn.w_1.weight"]  # (d_inner, D, k)
            n = len(
                {m.group(1) for k in sd if (m := re.match(rf"{name}\.layer_stack\.(\d+)\.", k))}
            )
            heads = sd[f"{name}.layer_stack.0.slf_attn.linear.weight"].shape[0] // (3 * 64)
            side |= {f"{name}_n_layer": n, f"{name}_head": heads,
                     f"{name}_conv1d_filter_size": ffn.shape[0]}  # fmt: skip
        kernel = sd["phoneme_side.layer_stack.0.pos_ffn.w_1.weight"].shape[2]
        dur = sd["length_regulator.duration_predictor.conv1d_1.weight"]
        return FastSpeechDims(
            n_symbols=n_symbols,
            d_model=d_model,
            max_seq_len=sd["phoneme_side.position.weight"].shape[0] - 1,
            fft_conv1d_kernel=kernel,
            fft_conv1d_padding=(kernel - 1) // 2,
            duration_predictor_filter_size=dur.shape[0],
            duration_predictor_kernel_size=dur.shape[2],
            n_mels=sd["mel_linear.weight"].shape[0],
            **side,
        )
    except KeyError as e:
        raise SpeechRTError(f"fastspeech: checkpoint lacks {e}") from None


CONVERSION = Conversion(detect, from_dle)  # named by its registry entry (speechrt.arch)
