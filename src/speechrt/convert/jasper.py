"""DLE Jasper and QuartzNet checkpoints -> dims + state dict with BatchNorm folded."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import torch

from speechrt.arch import Conversion
from speechrt.audio.features import FeatureConfig
from speechrt.convert import Converted
from speechrt.errors import SpeechRTError
from speechrt.models.jasper import BN_EPS, LABELS, Jasper, QuartzNet


def detect(keys: set[str]) -> bool:
    return any(k.endswith(".0.conv.0.weight") for k in keys)  # v1 keys too


def detect_quartznet(keys: set[str]) -> bool:
    return "encoder.layers.0.mconv.0.weight" in keys


def from_dle_quartznet(ckpt: dict) -> Converted:
    return from_dle(ckpt, QuartzNet)


def from_dle(ckpt: dict, cls: type[Jasper] = Jasper) -> Converted:
    """A DLE Jasper/QuartzNet training checkpoint -> dims + folded state dict.

    Takes `ema_state_dict` when present (DLE inference default), else `state_dict`; renames v1
    Jasper keys. Strides and dilations come from ckpt["config"] (the DLE yaml) when present,
    else from the family's fixed layout: prologue stride 2, first block after the residual
    blocks dilation 2 (all published Jasper and QuartzNet configs).
    """
    which = next(
        (k for k in ("ema_state_dict", "state_dict") if isinstance(ckpt.get(k), dict) and ckpt[k]),
        None,
    )
    sd = ckpt[which] if which else ckpt
    if not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise SpeechRTError(
            "no state dict found in checkpoint (looked for ema_state_dict, state_dict)"
        )
    sd = convert_v1_keys(sd)
    config = ckpt["config"] if isinstance(ckpt.get("config"), dict) else {}
    blocks = _parse_blocks(sd)
    fields, state = _dims_and_state(blocks, sd, config.get(cls.kind, {}).get("encoder", {}))
    dims = cls.Dims(**fields)
    labels = list(config.get("labels", LABELS))
    if len(labels) + 1 != dims.n_classes:
        raise SpeechRTError(
            f"checkpoint has {dims.n_classes} output classes but {len(labels)} labels + blank"
        )
    fb = config.get("input_val", {}).get("filterbank_features", {})
    features = FeatureConfig.from_dle(fb) if fb else FeatureConfig()
    if features.n_mels != dims.n_feats:
        raise SpeechRTError(f"features have {features.n_mels} mels, model {dims.n_feats}")
    meta = {
        "labels": labels,  # CTC blank = len(labels), the last class
        "features": features.to_dict(),
        "pad_leading": int(config.get("pad_leading", cls.pad_leading)),
        "weights": which or "state_dict",
    }
    return Converted(kind=cls.kind, dims=dims, state_dict=state, meta=meta)


def convert_v1_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DLE convert_v1_state_dict: old Jasper names -> current, preprocessor buffers dropped."""
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^module\.", "", k)
        if k.startswith(("acoustic_model.", "audio_preprocessor.")):
            continue
        k = re.sub(r"^jasper_encoder\.encoder\.", "encoder.layers.", k)
        out[re.sub(r"^jasper_decoder\.decoder_layers\.", "decoder.layers.", k)] = v
    return out


_SUB_KEY = re.compile(r"^encoder\.layers\.(\d+)\.m?conv\.(\d+)\.(\w+)$")


_RES_KEY = re.compile(r"^encoder\.layers\.(\d+)\.res\.(\d+)\.([01])\.(\w+)$")


Mod = dict[str, torch.Tensor]


def _parse_blocks(sd: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per block: sub-blocks as ([conv weights], bn) and residuals as (conv weight, bn)."""
    mods: dict[int, dict[int, Mod]] = defaultdict(lambda: defaultdict(dict))
    res: dict[int, dict[int, dict[int, Mod]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for key, v in sd.items():
        if m := _SUB_KEY.match(key):
            mods[int(m[1])][int(m[2])][m[3]] = v
        elif m := _RES_KEY.match(key):
            res[int(m[1])][int(m[2])][int(m[3])][m[4]] = v
        elif not key.startswith("decoder.layers.0."):
            raise SpeechRTError(f"unexpected key {key!r} in a Jasper/QuartzNet checkpoint")
    if not mods or sorted(mods) != list(range(len(mods))):
        raise SpeechRTError("checkpoint has no encoder.layers.N.(m)conv.* blocks numbered 0..N")
    blocks = []
    for b in range(len(mods)):
        subs: list[tuple[list[torch.Tensor], Mod]] = []
        pending: list[torch.Tensor] = []
        for i in sorted(mods[b]):
            mod = mods[b][i]
            if "running_mean" in mod:
                if not 1 <= len(pending) <= 2:
                    raise SpeechRTError(f"block {b}: BatchNorm {i} follows {len(pending)} convs")
                subs.append((pending, mod))
                pending = []
            else:
                pending.append(mod["weight"])
        if pending:
            raise SpeechRTError(f"block {b}: conv without BatchNorm at the end")
        rs = [(res[b][r][0]["weight"], res[b][r][1]) for r in sorted(res.get(b, {}))]
        blocks.append({"subs": subs, "res": rs})
    return blocks


def _fold_bn(weight: torch.Tensor, bn: Mod) -> tuple[torch.Tensor, torch.Tensor]:
    # conv (no bias) then BN(eps 1e-3) == conv with weight * s and bias beta - mean * s
    w = weight.double()
    scale = bn["weight"].double() / torch.sqrt(bn["running_var"].double() + BN_EPS)
    bias = bn["bias"].double() - bn["running_mean"].double() * scale
    return (w * scale[:, None, None]).float(), bias.float()


def _dims_and_state(
    blocks: list[dict[str, Any]], sd: dict[str, torch.Tensor], enc_cfg: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    cfg_blocks = enc_cfg.get("blocks")
    if cfg_blocks is not None and len(cfg_blocks) != len(blocks):
        raise SpeechRTError(f"config has {len(cfg_blocks)} blocks, checkpoint {len(blocks)}")
    if enc_cfg.get("activation", "relu") != "relu" or enc_cfg.get("frame_splicing", 1) != 1:
        raise SpeechRTError("only ReLU activation without frame splicing is supported")
    dense = any(len(blk["res"]) > 1 for blk in blocks)
    cols: dict[str, list] = defaultdict(list)
    state: dict[str, torch.Tensor] = {}
    for b, blk in enumerate(blocks):
        first = blk["subs"][0][0]
        separable = len(first) == 2
        if any(len(convs) != len(first) for convs, _ in blk["subs"]):
            raise SpeechRTError(f"block {b}: mixes separable and plain convs")
        for j, (convs, bn) in enumerate(blk["subs"]):
            p = f"blocks.{b}.subs.{j}."
            if separable:
                state[p + "depthwise.weight"] = convs[0].float()
                state[p + "pointwise.weight"], state[p + "pointwise.bias"] = _fold_bn(convs[1], bn)
            else:
                state[p + "conv.weight"], state[p + "conv.bias"] = _fold_bn(convs[0], bn)
        for r, (w, bn) in enumerate(blk["res"]):
            state[f"blocks.{b}.res.{r}.weight"], state[f"blocks.{b}.res.{r}.bias"] = _fold_bn(w, bn)
        cols["filters"].append(int(blk["subs"][-1][1]["running_mean"].shape[0]))
        cols["kernels"].append(int(first[0].shape[-1]))
        cols["repeats"].append(len(blk["subs"]))
        cols["separable"].append(separable)
        residual = "none" if not blk["res"] else "dense" if dense else "plain"
        stride = 2 if b == 0 else 1
        after_res = b > 0 and blocks[b - 1]["res"] and not blk["res"]
        dilation = 2 if after_res and first[0].shape[-1] > 1 else 1
        if cfg_blocks is not None:
            c = cfg_blocks[b]
            stride, dilation = _first(c.get("stride", 1)), _first(c.get("dilation", 1))
            if c.get("residual", False):
                residual = "dense" if c.get("residual_dense", False) else "plain"
            elif blk["res"]:
                raise SpeechRTError(f"block {b}: residual weights but config says residual: false")
            want = (c.get("filters"), _first(c.get("kernel_size")), c.get("repeat"))
            have = (cols["filters"][-1], cols["kernels"][-1], cols["repeats"][-1])
            if want != have:
                raise SpeechRTError(f"block {b}: config (filters, kernel, repeat) {want} != {have}")
        cols["strides"].append(stride)
        cols["dilations"].append(dilation)
        cols["residual"].append(residual)
    state["decoder.weight"] = sd["decoder.layers.0.weight"].float()
    state["decoder.bias"] = sd["decoder.layers.0.bias"].float()
    first_w = blocks[0]["subs"][0][0][0]
    dims: dict[str, Any] = {k: tuple(v) for k, v in cols.items()}
    dims["n_feats"] = int(
        first_w.shape[0] if len(blocks[0]["subs"][0][0]) == 2 else first_w.shape[1]
    )
    dims["n_classes"] = int(state["decoder.weight"].shape[0])
    return dims, state


def _first(v: Any) -> int:
    return int(v[0] if isinstance(v, (list, tuple)) else v)


# named by the registry entries (speechrt.arch.jasper)
CONVERSION = Conversion(detect, from_dle)
QUARTZNET_CONVERSION = Conversion(detect_quartznet, from_dle_quartznet)
