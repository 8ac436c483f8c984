"""DLE WaveGlow checkpoints -> weight norm folded, every invertible 1x1 conv inverted."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from speechrt.arch import Conversion
from speechrt.arch.waveglow import WaveGlowDims
from speechrt.audio.mel import MelConfig
from speechrt.convert import Converted
from speechrt.convert.checkpoints import fold_weight_norm, strip_prefix
from speechrt.errors import SpeechRTError


def detect(keys: set[str]) -> bool:
    return any(k.endswith("convinv.0.conv.weight") for k in keys)


def from_dle(ckpt: dict) -> Converted:
    """DLE train.py checkpoint ({'state_dict', 'config', ...}) -> Converted.

    Strips 'module.1.' / 'module.' anywhere, folds weight norm, replaces every invertible
    1x1 conv weight W by W^-1; dims from 'config' when present, else from the shapes
    (so 256- and 512-channel models are told apart by their weights).
    """
    if not isinstance(ckpt.get("state_dict"), dict):
        raise SpeechRTError("waveglow: checkpoint has no 'state_dict'")
    sd = fold_weight_norm(strip_prefix(ckpt["state_dict"], r"module\.1\.|module\."))
    config = ckpt.get("config")
    dims = _dims_from_config(config) if isinstance(config, dict) else _dims_from_shapes(sd)
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        m = re.fullmatch(r"convinv\.(\d+)\.conv\.weight", key)
        if m:
            w = value.squeeze(-1).double()
            if w.dim() != 2 or w.shape[0] != w.shape[1]:
                raise SpeechRTError(f"waveglow: {key} is not a square 1x1 conv weight")
            try:
                inv = torch.linalg.inv(w)
            except torch.linalg.LinAlgError:
                raise SpeechRTError(f"waveglow: {key} is singular") from None
            out[f"convinv.{m.group(1)}.inverse"] = inv.to(value.dtype).unsqueeze(-1)
        else:
            out[key] = value
    return Converted("waveglow", dims, out, MelConfig(n_mels=dims.n_mel_channels))


def _dims_from_config(config: dict[str, Any]) -> WaveGlowDims:
    wn = config.get("WN_config") or {}
    fields = WaveGlowDims.__dataclass_fields__
    flat = {k: v for k, v in {**config, **wn}.items() if k in fields}
    return WaveGlowDims(**flat)


def _dims_from_shapes(sd: dict[str, Tensor]) -> WaveGlowDims:
    """Dims of a checkpoint without 'config' (DLE inference.py's case), read off the weights."""
    try:
        up = sd["upsample.weight"]  # (n_mels, n_mels, kernel)
        sizes = [sd[f"convinv.{k}.conv.weight"].shape[0] for k in range(_count(sd, "convinv"))]
        drop = [k for k in range(1, len(sizes)) if sizes[k] < sizes[k - 1]]
        return WaveGlowDims(
            n_mel_channels=up.shape[0],
            n_flows=len(sizes),
            n_group=sizes[0],
            n_early_every=drop[0] if drop else len(sizes),
            n_early_size=sizes[drop[0] - 1] - sizes[drop[0]] if drop else 0,
            n_layers=_count(sd, "WN.0.in_layers"),
            kernel_size=sd["WN.0.in_layers.0.weight"].shape[2],
            n_channels=sd["WN.0.start.weight"].shape[0],
            upsample_kernel=up.shape[2],
        )
    except (KeyError, IndexError) as e:
        raise SpeechRTError(f"waveglow: checkpoint lacks {e}") from None


def _count(sd: dict[str, Tensor], prefix: str) -> int:
    rx = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    return len({m.group(1) for k in sd if (m := rx.match(k))})


CONVERSION = Conversion(detect, from_dle)  # named by its registry entry (speechrt.arch)
