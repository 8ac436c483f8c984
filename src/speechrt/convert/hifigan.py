"""DLE HiFi-GAN generator checkpoints -> plain conv weights (weight norm folded)."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

import torch

from speechrt.arch import Conversion
from speechrt.arch.hifigan import PRESETS, HiFiGANDims
from speechrt.audio.mel import MelConfig
from speechrt.convert import Converted
from speechrt.convert.checkpoints import fold_weight_norm, tensors_of
from speechrt.errors import SpeechRTError
from speechrt.models.hifigan import HiFiGAN


def detect(keys: set[str]) -> bool:
    return any(k.startswith("conv_pre.") for k in keys) and "conv_post.bias" in keys


def from_dle(ckpt: dict) -> Converted:
    """A DLE `hifigan_gen_checkpoint_*.pt` dict (or a bare generator state dict) -> Converted.

    Reads 'generator', strips 'module.', renumbers the pre-ONNX flat `resblocks.{n}` keys,
    fixes Conv2d-style trailing singleton dims, folds weight norm; `config` gives the dims
    (missing keys: read from weight shapes, else DLE defaults); `train_setup` the MelConfig.
    """
    sd = tensors_of(ckpt, "generator")
    config = ckpt.get("config") or {}
    if not isinstance(config, dict):
        raise SpeechRTError(f"hifigan: checkpoint 'config' is a {type(config).__name__}")
    sd = fold_weight_norm(_fix_ranks(_renumber_flat_resblocks(sd, config)))
    dims = _dims_from(config, sd)
    mel = _mel_from(ckpt.get("train_setup") or {}, dims)
    return Converted(kind="hifigan", dims=dims, state_dict=sd, mel=mel)


def dle_state_dict(model: HiFiGAN) -> dict[str, torch.Tensor]:
    """The state dict of a `weight_norm=True` model in DLE's layout (name.weight_g/weight_v)."""
    out = {}
    for k, v in model.state_dict().items():
        k = k.replace(".parametrizations.weight.original0", ".weight_g")
        out[k.replace(".parametrizations.weight.original1", ".weight_v")] = v
    return out


_FLAT_RESBLOCK = re.compile(r"^resblocks\.(\d+)\.([^.]+\.\d+\.[^.]+)$")  # 5 dot-separated parts


_UPS = re.compile(r"^ups\.(\d+)\.")


def _renumber_flat_resblocks(
    sd: dict[str, torch.Tensor], config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    # Old checkpoints keep one flat list: resblocks.{stage * K + j} -> resblocks.{stage}.{j}.
    # DLE divides by 3; K (the resblocks per stage) is 3 in every published config, and otherwise
    # comes from the config or from the number of flat blocks per upsampling stage.
    flat = {k: _FLAT_RESBLOCK.match(k) for k in sd}
    if not any(flat.values()):
        return sd
    if "resblock_kernel_sizes" in config:
        per_stage = len(config["resblock_kernel_sizes"])
    else:
        stages = 1 + max((int(m.group(1)) for k in sd if (m := _UPS.match(k))), default=-1)
        n_flat = 1 + max(int(m.group(1)) for m in flat.values() if m)
        if stages == 0 or n_flat % stages:
            raise SpeechRTError(f"hifigan: {n_flat} flat resblocks do not fit {stages} stages")
        per_stage = n_flat // stages
    out = {}
    for k, v in sd.items():
        m = flat[k]
        if m:
            n = int(m.group(1))
            k = f"resblocks.{n // per_stage}.{n % per_stage}.{m.group(2)}"
        out[k] = v
    return out


def _fix_ranks(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Every generator weight is a Conv1d/ConvTranspose1d one (rank 3), every bias rank 1;
    # Conv2d/NHWC variants differ by a trailing singleton dim (DLE's load_state_dict fix).
    out = {}
    for k, v in sd.items():
        want = 1 if k.endswith(".bias") else 3
        if v.dim() == want + 1 and v.shape[-1] == 1:
            v = v.squeeze(-1)
        elif v.dim() == want - 1:
            v = v.unsqueeze(-1)
        out[k] = v
    return out


def _untuple(v: Any) -> Any:
    return tuple(_untuple(x) for x in v) if isinstance(v, list | tuple) else v


def _dims_from(config: dict[str, Any], sd: dict[str, torch.Tensor]) -> HiFiGANDims:
    """Dims from the checkpoint config; keys it lacks are read off the (folded) weight shapes."""
    try:
        pre = sd["conv_pre.weight"]
        n_stages = 1 + max(int(m.group(1)) for k in sd if (m := _UPS.match(k)))
        ups_k = tuple(int(sd[f"ups.{i}.weight"].shape[2]) for i in range(n_stages))
        resblock = "2" if any(k.startswith("resblocks.0.0.convs.") for k in sd) else "1"
        first = "convs" if resblock == "2" else "convs1"
        n_blocks = 1 + max(
            int(k.split(".")[2]) for k in sd if k.startswith("resblocks.0.") and ".0.weight" in k
        )
        block_k = tuple(
            int(sd[f"resblocks.0.{j}.{first}.0.weight"].shape[2]) for j in range(n_blocks)
        )
    except (KeyError, ValueError) as e:
        raise SpeechRTError(f"hifigan: not a HiFi-GAN generator state dict ({e})") from None
    known = {f.name for f in fields(HiFiGANDims)}
    given = {k: _untuple(v) for k, v in config.items() if k in known}
    if "resblock" in given:
        given["resblock"] = str(given["resblock"])
    inferred: dict[str, Any] = dict(
        upsample_kernel_sizes=ups_k,
        upsample_initial_channel=int(pre.shape[0]),
        resblock=resblock,
        resblock_kernel_sizes=block_k,
        n_mels=int(pre.shape[1]),
    )
    if "upsample_rates" not in given:
        # Not visible in the weights; every published config uses kernel = 2 x rate.
        inferred["upsample_rates"] = tuple(
            k // 2 for k in given.get("upsample_kernel_sizes", ups_k)
        )
    if "resblock_dilation_sizes" not in given:
        kind = given.get("resblock", resblock)
        if kind == "1":
            inferred["resblock_dilation_sizes"] = ((1, 3, 5),) * len(block_k)
        elif len(block_k) == 3:
            inferred["resblock_dilation_sizes"] = PRESETS["hifigan-v3"]["resblock_dilation_sizes"]
        else:
            raise SpeechRTError("hifigan: checkpoint has no config giving the resblock dilations")
    return HiFiGANDims(**{**inferred, **given})


def _mel_from(train_setup: dict[str, Any], dims: HiFiGANDims) -> MelConfig:
    """DLE's train_setup (absent: the DLE TTS defaults) -> MelConfig, checked against the dims."""
    d = MelConfig(n_mels=dims.n_mels)
    fmax = train_setup.get("mel_fmax", d.fmax)
    mel = MelConfig(
        sampling_rate=int(train_setup.get("sampling_rate", d.sampling_rate)),
        n_fft=int(train_setup.get("filter_length", d.n_fft)),
        hop_length=int(train_setup.get("hop_length", d.hop_length)),
        win_length=int(train_setup.get("win_length", d.win_length)),
        n_mels=int(train_setup.get("num_mels", d.n_mels)),
        fmin=float(train_setup.get("mel_fmin", d.fmin)),
        fmax=None if fmax is None else float(fmax),
    )
    if mel.n_mels != dims.n_mels:
        raise SpeechRTError(
            f"hifigan: train_setup num_mels {mel.n_mels} but conv_pre takes {dims.n_mels} channels"
        )
    if mel.hop_length != dims.hop_length:
        where = "train_setup" if "hop_length" in train_setup else "no train_setup: default"
        raise SpeechRTError(
            f"hifigan: {where} hop_length {mel.hop_length} but the upsample rates multiply "
            f"to {dims.hop_length}"
        )
    return mel


CONVERSION = Conversion(detect, from_dle)  # named by its registry entry (speechrt.arch)
