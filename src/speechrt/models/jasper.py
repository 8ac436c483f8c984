"""Jasper (dense-residual 10x5) and QuartzNet (separable 5x5 / 15x5) CTC acoustic models.

One convolutional architecture, two DLE checkpoint layouts:
    features (B, n_feats, T) -> prologue (stride 2) -> residual blocks -> epilogue -> 1x1 decoder
    -> log-probs (B, T', n_classes), blank last

A block is `repeat` sub-blocks conv -> BN -> ReLU (the last one without ReLU), plus 1x1 conv + BN
projections of earlier outputs ("plain": the block input; "dense": every earlier output, Jasper
DR), then ReLU. QuartzNet convs are separable (depthwise k, then pointwise 1x1). At load, BatchNorm
(eps 1e-3) is folded into the conv before it (the pointwise one when separable); dropout is inert.

Every conv zeroes its input frames at or past the current length first (DLE use_conv_masks), so an
item's outputs, valid frames and padded tail alike, never depend on its batch-mates.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from speechrt.errors import SpeechRTError
from speechrt.models import Converted

BN_EPS = 1e-3
LABELS = (" ", *"abcdefghijklmnopqrstuvwxyz", "'")  # DLE English labels; CTC blank appended last


def _preset(blocks: list[tuple], n_feats: int = 64, n_classes: int = 29) -> dict[str, Any]:
    # blocks: (filters, kernel, repeat, stride, dilation, separable, residual) per encoder block
    names = ("filters", "kernels", "repeats", "strides", "dilations", "separable", "residual")
    cols = {name: tuple(b[i] for b in blocks) for i, name in enumerate(names)}
    return dict(cols, n_feats=n_feats, n_classes=n_classes)


_JASPER_BLOCKS = [(f, k, 5, 1, 1, False, "dense") for f, k in ((256, 11), (384, 13), (512, 17))]
_JASPER_BLOCKS += [(f, k, 5, 1, 1, False, "dense") for f, k in ((640, 21), (768, 25))]
_QN_BLOCKS = [(256, 33), (256, 39), (512, 51), (512, 63), (512, 75)]


def _quartznet(times: int) -> dict[str, Any]:
    body = [(f, k, 5, 1, 1, True, "plain") for f, k in _QN_BLOCKS for _ in range(times)]
    prologue, epilogue = (256, 33, 1, 2, 1, True, "none"), (512, 87, 1, 1, 2, True, "none")
    return _preset([prologue, *body, epilogue, (1024, 1, 1, 1, 1, False, "none")])


PRESETS: dict[str, dict[str, Any]] = {
    "jasper-10x5": _preset(
        [(256, 11, 1, 2, 1, False, "none")]
        + [b for b in _JASPER_BLOCKS for _ in range(2)]
        + [(896, 29, 1, 1, 2, False, "none"), (1024, 1, 1, 1, 1, False, "none")]
    ),
    "quartznet-5x5": _quartznet(1),
    "quartznet-15x5": _quartznet(3),
}
_J, _Q = PRESETS["jasper-10x5"], PRESETS["quartznet-15x5"]


@dataclass(frozen=True)
class JasperDims:
    """Per-block columns (prologue, residual blocks, epilogue), then input/output sizes."""

    filters: tuple[int, ...] = _J["filters"]  # output channels
    kernels: tuple[int, ...] = _J["kernels"]
    repeats: tuple[int, ...] = _J["repeats"]  # sub-blocks per block
    strides: tuple[int, ...] = _J["strides"]  # the prologue's 2 is the model's time reduction
    dilations: tuple[int, ...] = _J["dilations"]
    separable: tuple[bool, ...] = _J["separable"]  # depthwise + pointwise instead of one conv
    residual: tuple[str, ...] = _J["residual"]  # "none" | "plain" | "dense"
    n_feats: int = 64  # mel bins in
    n_classes: int = 29  # labels + CTC blank (last)


@dataclass(frozen=True)
class QuartzNetDims(JasperDims):
    filters: tuple[int, ...] = _Q["filters"]
    kernels: tuple[int, ...] = _Q["kernels"]
    repeats: tuple[int, ...] = _Q["repeats"]
    strides: tuple[int, ...] = _Q["strides"]
    dilations: tuple[int, ...] = _Q["dilations"]
    separable: tuple[bool, ...] = _Q["separable"]
    residual: tuple[str, ...] = _Q["residual"]


def mask_frames(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """x: (B, C, T) with frames t >= lengths[b] set to zero."""
    t = torch.arange(x.shape[-1], device=x.device)
    return x.masked_fill((t[None, :] >= lengths[:, None]).unsqueeze(1), 0.0)


def conv_lengths(lengths: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Valid output frames of `conv` for `lengths` valid input frames (floor division)."""
    assert not isinstance(conv.padding, str)  # built with int padding (SubBlock)
    (p,), (k,), (d,), (s,) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
    return torch.div(lengths + 2 * p - d * (k - 1) - 1, s, rounding_mode="floor") + 1


class SubBlock(nn.Module):
    """One masked conv (or depthwise + pointwise pair) with its BatchNorm folded into the bias."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int, stride: int, dilation: int, separable: bool
    ) -> None:
        super().__init__()
        pad = (kernel // 2) * dilation  # 'same'
        self.separable = separable
        if separable:
            self.depthwise = nn.Conv1d(
                c_in, c_in, kernel, stride, pad, dilation, groups=c_in, bias=False
            )
            self.pointwise = nn.Conv1d(c_in, c_out, 1)
        else:
            self.conv = nn.Conv1d(c_in, c_out, kernel, stride, pad, dilation)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: (B, C_in, T) -> (B, C_out, T'), lengths (B,) -> (B,)
        first = self.depthwise if self.separable else self.conv
        x = first(mask_frames(x, lengths))
        lengths = conv_lengths(lengths, first)
        if self.separable:
            x = self.pointwise(mask_frames(x, lengths))
        return x, lengths


class Block(nn.Module):
    def __init__(self, dims: JasperDims, b: int, c_in: int, res_in: list[int]) -> None:
        super().__init__()
        f, k, s, d = dims.filters[b], dims.kernels[b], dims.strides[b], dims.dilations[b]
        self.subs = nn.ModuleList(
            SubBlock(c_in if j == 0 else f, f, k, s, d, dims.separable[b])
            for j in range(dims.repeats[b])
        )
        self.res = nn.ModuleList(nn.Conv1d(c, f, 1) for c in res_in)

    def forward(
        self, xs: list[torch.Tensor], lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # xs: earlier outputs (B, C_i, T), the block input last; lengths: their valid frames
        x, out_lengths = xs[-1], lengths
        for j, sub in enumerate(self.subs):
            x, out_lengths = sub(x, out_lengths)
            if j < len(self.subs) - 1:
                x = F.relu(x)
        for conv, src in zip(self.res, xs, strict=False):
            x = x + conv(mask_frames(src, lengths))
        return F.relu(x), out_lengths


class Jasper(nn.Module):
    """features (B, n_feats, T) + lengths (B,) -> log-probs (B, T', n_classes) + lengths (B,)."""

    kind = "jasper"
    role = "asr"
    Dims = JasperDims
    pad_leading = 16  # DLE Jasper inference.py prepends this many zero frames

    def __init__(self, dims: JasperDims) -> None:
        super().__init__()
        cols = (dims.kernels, dims.repeats, dims.strides, dims.dilations, dims.separable)
        if any(len(c) != len(dims.filters) for c in (*cols, dims.residual)) or not dims.filters:
            raise SpeechRTError(f"{self.kind}: inconsistent block columns in dims")
        if set(dims.residual) - {"none", "plain", "dense"}:
            raise SpeechRTError(f"{self.kind}: unknown residual type in {dims.residual}")
        self.dims = dims
        self.blocks = nn.ModuleList()
        # Residual sources as DLE wires them: a dense block adds its input to the running pane
        # list and reads all of it; a plain one reads its input only.
        panes: list[int] = []
        c_in, xs = dims.n_feats, [dims.n_feats]
        for b, kind in enumerate(dims.residual):
            if kind == "dense":
                panes = [*panes, c_in]
            res_in = panes if kind == "dense" else [xs[0]] if kind == "plain" else []
            if res_in and len(res_in) > len(xs):
                raise SpeechRTError(f"{self.kind}: block {b} reads more residuals than exist")
            self.blocks.append(Block(dims, b, c_in, res_in))
            c_in = dims.filters[b]
            xs = [*xs, c_in] if kind == "dense" else [c_in]
        self._keeps = [kind == "dense" for kind in dims.residual]
        self.decoder = nn.Conv1d(c_in, dims.n_classes, 1)

    @property
    def time_stride(self) -> int:
        """Feature frames per output frame."""
        return math.prod(self.dims.strides)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """Output frames for `lengths` input frames (B,)."""
        for block in self.blocks:
            for sub in block.subs:  # type: ignore[union-attr]  # ModuleList items type as Module
                lengths = conv_lengths(lengths, sub.depthwise if sub.separable else sub.conv)
        return lengths

    def forward(
        self, feats: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # feats: (B, n_feats, T); lengths: (B,) valid frames -> (B, T', n_classes) float32, (B,)
        xs = [feats]
        for block, keep in zip(self.blocks, self._keeps, strict=True):
            out, lengths = block(xs, lengths)
            xs = [*xs, out] if keep else [out]
        logits = self.decoder(xs[-1]).transpose(1, 2)
        return F.log_softmax(logits.float(), dim=-1), lengths

    # -- DLE checkpoints ------------------------------------------------------------------------

    @classmethod
    def from_dle(cls, ckpt: dict) -> Converted:
        """A DLE Jasper/QuartzNet training checkpoint -> dims + folded state dict.

        Takes `ema_state_dict` when present (DLE inference default), else `state_dict`; renames v1
        Jasper keys. Strides and dilations come from ckpt["config"] (the DLE yaml) when present,
        else from the family's fixed layout: prologue stride 2, first block after the residual
        blocks dilation 2 (all published Jasper and QuartzNet configs).
        """
        which = next(
            (
                k
                for k in ("ema_state_dict", "state_dict")
                if isinstance(ckpt.get(k), dict) and ckpt[k]
            ),
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
        from speechrt.audio.features import FeatureConfig

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


class QuartzNet(Jasper):
    kind = "quartznet"
    Dims = QuartzNetDims
    pad_leading = 0  # DLE QuartzNet inference.py pads nothing


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
