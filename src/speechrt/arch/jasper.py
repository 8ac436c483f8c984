"""Jasper (dense-residual 10x5) and QuartzNet (separable 5x5 / 15x5): one CTC architecture.

features (B, n_feats, T) -> log-probs (B, T', n_classes), blank last; T' = ceil(T / 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speechrt.arch import Architecture, Graph
from speechrt.contracts import F32, B, Contract, lengths, tensor


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


# the published sizes (NVIDIA's Jasper and QuartzNet papers, DLE / NeMo configs)
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

    @property
    def n_mels(self) -> int:
        return self.n_feats


@dataclass(frozen=True)
class QuartzNetDims(JasperDims):
    filters: tuple[int, ...] = _Q["filters"]
    kernels: tuple[int, ...] = _Q["kernels"]
    repeats: tuple[int, ...] = _Q["repeats"]
    strides: tuple[int, ...] = _Q["strides"]
    dilations: tuple[int, ...] = _Q["dilations"]
    separable: tuple[bool, ...] = _Q["separable"]
    residual: tuple[str, ...] = _Q["residual"]


JASPER_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # jasper-10x5
    # 64 mels, English labels; a prologue, one dense pair of 16-wide blocks, an epilogue
    "tiny": _preset(
        [(16, 11, 1, 2, 1, False, "none")]
        + [(16, 13, 2, 1, 1, False, "dense")] * 2
        + [(32, 1, 1, 1, 1, False, "none")]
    ),
    "jasper-10x5": _J,
}
QUARTZNET_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # quartznet-15x5
    # 64 mels, English labels; a prologue, one plain 16-wide block, an epilogue
    "tiny": _preset(
        [(16, 11, 1, 2, 1, True, "none"), (16, 13, 2, 1, 1, True, "plain")]
        + [(32, 1, 1, 1, 1, False, "none")]
    ),
    "quartznet-5x5": PRESETS["quartznet-5x5"],
    "quartznet-15x5": _Q,
}


def contract(d: JasperDims) -> Contract:
    return Contract(
        "jasper",
        (
            tensor("features", F32, B, d.n_feats, "feature_frames"),
            lengths("feature_lengths", "feature_frames"),
        ),
        (
            tensor("log_probs", F32, B, "output_frames", d.n_classes, doc="blank last"),
            lengths("log_prob_lengths", "output_frames"),
        ),
    )


def output_frames(d: JasperDims, n: int) -> int:
    """Output frames for n input frames: every sub-block's strided conv ('same' padding
    (kernel // 2) * dilation) in turn, as models.jasper.Jasper.output_lengths computes it in
    torch (tested equal)."""
    for k, s, dil, r in zip(d.kernels, d.strides, d.dilations, d.repeats, strict=True):
        for _ in range(r):
            n = (n + 2 * (k // 2) * dil - dil * (k - 1) - 1) // s + 1
    return n


def derived_sizes(d: JasperDims, sizes: dict[str, int]) -> dict[str, int]:
    """Output frames for sizes["feature_frames"] input frames (the encoder's strides)."""
    return {"output_frames": output_frames(d, sizes["feature_frames"])}


# one graph for both: QuartzNet is Jasper with separable convolutions (its wrapper runs
# NCHW on the cuda runner: runtime/graphs/jasper.py)
JASPER = Graph(
    "jasper",
    contract,
    "speechrt.runtime.graphs.jasper:CODE",
    JasperDims,
    channels_last=True,
    derived_sizes=derived_sizes,
)
ARCHITECTURES = (
    Architecture(
        "jasper",
        JasperDims,
        JASPER_PRESETS,
        "speechrt.models.jasper:Jasper",
        ((JASPER, "model.onnx"),),
        "speechrt.convert.jasper:CONVERSION",
        {"n_feats": ("blocks.0.subs.0.conv.weight", 1), "n_classes": ("decoder.weight", 0)},
    ),
    Architecture(
        "quartznet",
        QuartzNetDims,
        QUARTZNET_PRESETS,
        "speechrt.models.jasper:QuartzNet",
        ((JASPER, "model.onnx"),),
        "speechrt.convert.jasper:QUARTZNET_CONVERSION",
        {"n_feats": ("blocks.0.subs.0.depthwise.weight", 0), "n_classes": ("decoder.weight", 0)},
    ),
)
