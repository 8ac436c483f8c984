"""The named-tensor contract of every component graph, written once.

A contract lists a graph's inputs and outputs: name, dtype and shape, where every dimension is
either a fixed size (an int read off the model's dims) or a named dynamic axis ("batch",
"symbols", "frames", ...). The ONNX export (input/output names, dynamic axes), every runner (eager,
cuda, onnx), `speechrt verify` and the KServe v2 model metadata and request checks all read the
same contract.

Besides name, dtype and shape, an input may say what values it accepts (`bounds`, and `counts` for
a lengths tensor: each item's valid length along that axis) and a `default` (an optional
per-item input: absent, every item gets that value). Runners always get every input; the server
fills defaults and checks values (check_values) before it runs a graph for a client.

This module imports no torch: the ONNX runtime uses it.

Which graphs each model kind has, and their ONNX file names, is in speechrt.registry.

ASR features (audio -> log-mel) run in torch for every backend (speechrt.audio.features): their
FFT-based STFT and per-item normalisation have no exported graph yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from speechrt.errors import SpeechRTError

Axis = int | str  # a fixed size, or the name of a dynamic axis


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor: `shape` mixes fixed sizes (int) and dynamic axis names (str)."""

    name: str
    dtype: str  # numpy dtype name: "float32", "int64", "bool"
    shape: tuple[Axis, ...]
    doc: str = ""
    pad: float = 0  # what fills positions added along a length axis (1 = True for masks)
    default: float | None = None  # optional (batch,) input: absent, every item gets this value
    counts: str | None = None  # a (batch,) lengths tensor: valid positions along this axis
    bounds: tuple[float, float] | None = None  # inclusive range of every value

    @property
    def optional(self) -> bool:
        return self.default is not None

    def dynamic_axes(self) -> dict[int, str]:
        """{dim index: axis name} for the dynamic dimensions (torch.onnx.export's format)."""
        return {i: a for i, a in enumerate(self.shape) if isinstance(a, str)}

    def check(self, value: Any, sizes: dict[str, int], graph: str) -> None:
        """Check rank, fixed sizes, dtype, and that a named axis has one size across tensors.

        `value` is anything with .shape and .dtype (numpy array, torch tensor, OrtValue-like).
        """
        shape = tuple(int(s) for s in value.shape)
        where = f"{graph}: input {self.name!r}"
        if len(shape) != len(self.shape):
            raise SpeechRTError(f"{where} must have shape {self.shape_text()}, got {shape}")
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype != self.dtype:
            raise SpeechRTError(f"{where} must be {self.dtype}, got {dtype}")
        for axis, n in zip(self.shape, shape, strict=True):
            if isinstance(axis, int):
                if n != axis:
                    raise SpeechRTError(f"{where} must have shape {self.shape_text()}, got {shape}")
            elif sizes.setdefault(axis, n) != n:
                raise SpeechRTError(f"{where}: axis {axis!r} is {n} here, {sizes[axis]} elsewhere")

    def check_values(self, value: Any, sizes: Mapping[str, int], graph: str) -> None:
        """Check `bounds`, and that a `counts` tensor's lengths lie in [1, size of its axis].

        `value` is a numpy array or torch tensor already passed check(); `sizes` as it returned.
        """
        if (self.bounds is None and self.counts is None) or not math.prod(value.shape):
            return
        low, high = float(value.min()), float(value.max())
        where = f"{graph}: input {self.name!r}"
        if self.bounds is not None and not self.bounds[0] <= low <= high <= self.bounds[1]:
            lo, hi = (f"{b:g}" for b in self.bounds)
            raise SpeechRTError(f"{where}: values must lie within [{lo}, {hi}]")
        if self.counts is not None and self.counts in sizes:
            limit = sizes[self.counts]
            if not 1 <= low <= high <= limit:
                raise SpeechRTError(
                    f"{where}: lengths must lie within [1, {limit}] ({self.counts})"
                )

    def shape_text(self) -> str:
        return "(" + ", ".join(str(a) for a in self.shape) + ")"


@dataclass(frozen=True)
class Contract:
    """A component graph's inputs and outputs."""

    name: str  # graph name, e.g. "fastpitch", "tacotron2.decoder_step"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def spec(self, name: str) -> TensorSpec:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """torch.onnx.export's `dynamic_axes` argument."""
        return {t.name: t.dynamic_axes() for t in self.inputs + self.outputs if t.dynamic_axes()}

    def check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, int]:
        """Check that `feeds` holds exactly the inputs, well shaped; returns {axis: size}."""
        missing = [n for n in self.input_names if n not in feeds]
        extra = [n for n in feeds if n not in self.input_names]
        if missing or extra:
            raise SpeechRTError(
                f"{self.name}: inputs are {self.input_names}; missing {missing}, unexpected {extra}"
            )
        sizes: dict[str, int] = {}
        for t in self.inputs:
            t.check(feeds[t.name], sizes, self.name)
        return sizes

    def check_values(self, feeds: Mapping[str, Any], sizes: Mapping[str, int]) -> None:
        """Every input's values within its bounds and lengths (after check_feeds)."""
        for t in self.inputs:
            t.check_values(feeds[t.name], sizes, self.name)


def _t(
    name: str,
    dtype: str,
    *shape: Axis,
    doc: str = "",
    pad: float = 0,
    default: float | None = None,
    counts: str | None = None,
    bounds: tuple[float, float] | None = None,
) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape), doc, pad, default, counts, bounds)


F32, I64, BOOL = "float32", "int64", "bool"
B = "batch"
INF = math.inf
PACE, SHIFT = (0.1, 10.0), (-2000.0, 2000.0)  # SynthesisOptions' ranges


def _ids(name: str, d: Mapping[str, Any], doc: str = "") -> TensorSpec:
    """Symbol ids (batch, symbols), right-padded with 0, below the dims' n_symbols."""
    n = d.get("n_symbols")
    return _t(name, I64, B, "symbols", doc=doc, bounds=(0, INF if n is None else n - 1))


def _lengths(name: str, axis: str) -> TensorSpec:
    return _t(name, I64, B, counts=axis)


# -- one builder per graph: dims (the model.json "dims" dict) -> Contract -----------------------


def fastpitch(d: Mapping[str, Any]) -> Contract:
    inputs = [
        _ids("ids", d, doc="symbol ids, right-padded"),
        _lengths("lengths", "symbols"),
        _t("pace", F32, B, doc="speaking rate, > 1 is faster", default=1.0, bounds=PACE),
        _t("pitch_shift", F32, B, doc="Hz added to the pitch contour", default=0.0, bounds=SHIFT),
        _t(
            "pitch_scale",
            F32,
            B,
            doc="multiplies the pitch deviation; 0 = monotone",
            default=1.0,
            bounds=(0.0, 10.0),
        ),
    ]
    n_speakers = d.get("n_speakers", 1)
    if n_speakers > 1:
        inputs.append(_t("speaker", I64, B, default=0, bounds=(0, n_speakers - 1)))
    outputs = [
        _t("mel", F32, B, d.get("n_mel_channels", 80), "frames"),
        _lengths("mel_lengths", "frames"),
        _t("durations", F32, B, "symbols", doc="frames per symbol before pace and rounding"),
        _t("pitch", F32, B, d.get("pitch_conditioning_formants", 1), "symbols"),
    ]
    if d.get("energy_conditioning", True):
        outputs.append(_t("energy", F32, B, "symbols"))
    return Contract("fastpitch", tuple(inputs), tuple(outputs))


def hifigan(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "hifigan",
        (_t("mel", F32, B, d.get("n_mels", 80), "frames"), _lengths("mel_lengths", "frames")),
        (_t("audio", F32, B, "samples"), _lengths("audio_lengths", "samples")),
    )


def denoiser(d: Mapping[str, Any]) -> Contract:
    del d  # sizes of the STFT are inside the graph
    return Contract(
        "denoiser",
        (
            _t("audio", F32, B, "samples"),
            _lengths("audio_lengths", "samples"),
            _t(
                "strength",
                F32,
                B,
                doc="multiple of the vocoder's bias spectrum to subtract",
                bounds=(0.0, 1.0),
            ),
        ),
        (_t("denoised", F32, B, "samples"),),
    )


def tacotron2_encoder(d: Mapping[str, Any]) -> Contract:
    e = d.get("encoder_embedding_dim", 512)
    return Contract(
        "tacotron2.encoder",
        (_ids("sequences", d), _lengths("sequence_lengths", "symbols")),
        (
            _t("memory", F32, B, "symbols", e),
            _t("processed_memory", F32, B, "symbols", d.get("attention_dim", 128)),
        ),
    )


def _tacotron2_state(d: Mapping[str, Any], prefix: str = "") -> tuple[TensorSpec, ...]:
    a, r = d.get("attention_rnn_dim", 1024), d.get("decoder_rnn_dim", 1024)
    return (
        _t(prefix + "attention_hidden", F32, B, a),
        _t(prefix + "attention_cell", F32, B, a),
        _t(prefix + "decoder_hidden", F32, B, r),
        _t(prefix + "decoder_cell", F32, B, r),
        _t(prefix + "attention_weights", F32, B, "symbols"),
        _t(prefix + "attention_weights_cum", F32, B, "symbols"),
        _t(prefix + "attention_context", F32, B, d.get("encoder_embedding_dim", 512)),
    )


def tacotron2_decoder_step(d: Mapping[str, Any]) -> Contract:
    """One decoder step, DLE's decoder_iter.onnx names plus the prenet dropout masks."""
    n_mels = d.get("n_mel_channels", 80)
    inputs = (
        _t("decoder_input", F32, B, n_mels, doc="the previous frame (zeros at step 1)"),
        *_tacotron2_state(d),
        _t("memory", F32, B, "symbols", d.get("encoder_embedding_dim", 512)),
        _t("processed_memory", F32, B, "symbols", d.get("attention_dim", 128)),
        _t("mask", BOOL, B, "symbols", doc="True at padding", pad=1),
        _t("prenet_masks", F32, B, 2, d.get("prenet_dim", 256), doc="0 or 2: dropout p 0.5"),
    )
    outputs = (
        _t("decoder_output", F32, B, n_mels),
        _t("gate_prediction", F32, B, 1, doc="stop logit"),
        *_tacotron2_state(d, "out_"),
    )
    return Contract("tacotron2.decoder_step", inputs, outputs)


def tacotron2_postnet(d: Mapping[str, Any]) -> Contract:
    n_mels = d.get("n_mel_channels", 80)
    return Contract(
        "tacotron2.postnet",
        (_t("mel_outputs", F32, B, n_mels, "frames"), _lengths("mel_lengths", "frames")),
        (_t("mel_outputs_postnet", F32, B, n_mels, "frames"),),
    )


def fastspeech(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "fastspeech",
        (
            _ids("ids", d),
            _lengths("lengths", "symbols"),
            _t(
                "pace",
                F32,
                B,
                doc="speaking rate, > 1 is faster (DLE's alpha = 1 / pace)",
                default=1.0,
                bounds=PACE,
            ),
        ),
        (_t("mel", F32, B, d.get("n_mels", 80), "frames"), _lengths("mel_lengths", "frames")),
    )


def waveglow(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "waveglow",
        (
            _t("mel", F32, B, d.get("n_mel_channels", 80), "frames"),
            _lengths("mel_lengths", "frames"),
            _t(
                "z", F32, B, d.get("n_group", 8), "groups", doc="latent noise, frames * hop / group"
            ),
            _t("sigma", F32, B, doc="scales the first latent channels", bounds=(0.0, 2.0)),
        ),
        (_t("audio", F32, B, "samples"), _lengths("audio_lengths", "samples")),
    )


def jasper(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "jasper",
        (
            _t("features", F32, B, d.get("n_feats", 64), "feature_frames"),
            _lengths("feature_lengths", "feature_frames"),
        ),
        (
            _t("log_probs", F32, B, "output_frames", d.get("n_classes", 29), doc="blank last"),
            _lengths("log_prob_lengths", "output_frames"),
        ),
    )
