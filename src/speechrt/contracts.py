"""The named-tensor contract of every component graph, written once.

A contract lists a graph's inputs and outputs: name, dtype and shape, where every dimension is
either a fixed size (an int read off the model's dims) or a named dynamic axis ("batch",
"symbols", "frames", ...). The ONNX export (input/output names, dynamic axes), every runner (eager,
cuda, onnx), `speechrt verify` and the KServe v2 model metadata all read the same contract.

This module imports no torch: the ONNX runtime uses it.

Graphs per model kind (a kind's directory holds one ONNX file per graph):
    fastpitch    fastpitch                                  model.onnx
    fastspeech   fastspeech                                 model.onnx
    tacotron2    tacotron2.encoder / .decoder_step / .postnet   encoder.onnx, decoder_step.onnx,
                                                            postnet.onnx
    hifigan      hifigan, denoiser                          model.onnx, denoiser.onnx
    waveglow     waveglow, denoiser                         model.onnx, denoiser.onnx
    jasper       jasper                                     model.onnx
    quartznet    jasper (same architecture)                 model.onnx

ASR features (audio -> log-mel) run in torch for every backend (speechrt.audio.features): their
FFT-based STFT and per-item normalisation have no exported graph yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speechrt.errors import SpeechRTError

# numpy dtype name -> KServe v2 / Triton datatype
KSERVE_DATATYPES = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "BF16",
    "int64": "INT64",
    "int32": "INT32",
    "bool": "BOOL",
}

Axis = int | str  # a fixed size, or the name of a dynamic axis


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor: `shape` mixes fixed sizes (int) and dynamic axis names (str)."""

    name: str
    dtype: str  # numpy dtype name: "float32", "int64", "bool"
    shape: tuple[Axis, ...]
    doc: str = ""
    pad: float = 0  # what fills positions added along a length axis (1 = True for masks)

    def dynamic_axes(self) -> dict[int, str]:
        """{dim index: axis name} for the dynamic dimensions (torch.onnx.export's format)."""
        return {i: a for i, a in enumerate(self.shape) if isinstance(a, str)}

    def kserve(self) -> dict[str, Any]:
        """KServe v2 metadata tensor: {"name", "datatype", "shape"} with -1 for dynamic axes."""
        shape = [-1 if isinstance(a, str) else a for a in self.shape]
        return {"name": self.name, "datatype": KSERVE_DATATYPES[self.dtype], "shape": shape}

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

    def kserve_metadata(self, model_name: str, platform: str = "speechrt") -> dict[str, Any]:
        """The KServe v2 `GET /v2/models/{name}` response body for this graph."""
        return {
            "name": model_name,
            "versions": ["1"],
            "platform": platform,
            "inputs": [t.kserve() for t in self.inputs],
            "outputs": [t.kserve() for t in self.outputs],
        }


def _t(name: str, dtype: str, *shape: Axis, doc: str = "", pad: float = 0) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape), doc, pad)


F32, I64, BOOL = "float32", "int64", "bool"
B = "batch"


# -- one builder per graph: dims (the model.json "dims" dict) -> Contract -----------------------


def fastpitch(d: Mapping[str, Any]) -> Contract:
    inputs = [
        _t("ids", I64, B, "symbols", doc="symbol ids, right-padded"),
        _t("lengths", I64, B),
        _t("pace", F32, B, doc="speaking rate, > 1 is faster"),
        _t("pitch_shift", F32, B, doc="Hz added to the pitch contour"),
        _t("pitch_scale", F32, B, doc="multiplies the pitch deviation; 0 = monotone"),
    ]
    if d.get("n_speakers", 1) > 1:
        inputs.append(_t("speaker", I64, B))
    outputs = [
        _t("mel", F32, B, d.get("n_mel_channels", 80), "frames"),
        _t("mel_lengths", I64, B),
        _t("durations", F32, B, "symbols", doc="frames per symbol before pace and rounding"),
        _t("pitch", F32, B, d.get("pitch_conditioning_formants", 1), "symbols"),
    ]
    if d.get("energy_conditioning", True):
        outputs.append(_t("energy", F32, B, "symbols"))
    return Contract("fastpitch", tuple(inputs), tuple(outputs))


def hifigan(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "hifigan",
        (_t("mel", F32, B, d.get("n_mels", 80), "frames"), _t("mel_lengths", I64, B)),
        (_t("audio", F32, B, "samples"), _t("audio_lengths", I64, B)),
    )


def denoiser(d: Mapping[str, Any]) -> Contract:
    del d  # sizes of the STFT are inside the graph
    return Contract(
        "denoiser",
        (
            _t("audio", F32, B, "samples"),
            _t("audio_lengths", I64, B),
            _t("strength", F32, B, doc="multiple of the vocoder's bias spectrum to subtract"),
        ),
        (_t("denoised", F32, B, "samples"),),
    )


def tacotron2_encoder(d: Mapping[str, Any]) -> Contract:
    e = d.get("encoder_embedding_dim", 512)
    return Contract(
        "tacotron2.encoder",
        (_t("sequences", I64, B, "symbols"), _t("sequence_lengths", I64, B)),
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
        (_t("mel_outputs", F32, B, n_mels, "frames"), _t("mel_lengths", I64, B)),
        (_t("mel_outputs_postnet", F32, B, n_mels, "frames"),),
    )


def fastspeech(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "fastspeech",
        (
            _t("ids", I64, B, "symbols"),
            _t("lengths", I64, B),
            _t("pace", F32, B, doc="speaking rate, > 1 is faster (DLE's alpha = 1 / pace)"),
        ),
        (_t("mel", F32, B, d.get("n_mels", 80), "frames"), _t("mel_lengths", I64, B)),
    )


def waveglow(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "waveglow",
        (
            _t("mel", F32, B, d.get("n_mel_channels", 80), "frames"),
            _t("mel_lengths", I64, B),
            _t(
                "z", F32, B, d.get("n_group", 8), "groups", doc="latent noise, frames * hop / group"
            ),
            _t("sigma", F32, B, doc="scales the first latent channels"),
        ),
        (_t("audio", F32, B, "samples"), _t("audio_lengths", I64, B)),
    )


def jasper(d: Mapping[str, Any]) -> Contract:
    return Contract(
        "jasper",
        (
            _t("features", F32, B, d.get("n_feats", 64), "feature_frames"),
            _t("feature_lengths", I64, B),
        ),
        (
            _t("log_probs", F32, B, "output_frames", d.get("n_classes", 29), doc="blank last"),
            _t("log_prob_lengths", I64, B),
        ),
    )


# graph name -> builder
CONTRACTS: dict[str, Callable[[Mapping[str, Any]], Contract]] = {
    "fastpitch": fastpitch,
    "hifigan": hifigan,
    "denoiser": denoiser,
    "tacotron2.encoder": tacotron2_encoder,
    "tacotron2.decoder_step": tacotron2_decoder_step,
    "tacotron2.postnet": tacotron2_postnet,
    "fastspeech": fastspeech,
    "waveglow": waveglow,
    "jasper": jasper,
}

# model kind -> {graph name: ONNX file name in the model directory}; the first is the main graph
GRAPHS: dict[str, dict[str, str]] = {
    "fastpitch": {"fastpitch": "model.onnx"},
    "hifigan": {"hifigan": "model.onnx", "denoiser": "denoiser.onnx"},
    "tacotron2": {
        "tacotron2.encoder": "encoder.onnx",
        "tacotron2.decoder_step": "decoder_step.onnx",
        "tacotron2.postnet": "postnet.onnx",
    },
    "fastspeech": {"fastspeech": "model.onnx"},
    "waveglow": {"waveglow": "model.onnx", "denoiser": "denoiser.onnx"},
    "jasper": {"jasper": "model.onnx"},
    "quartznet": {"jasper": "model.onnx"},
}


def contract(graph: str, dims: Mapping[str, Any]) -> Contract:
    """The contract of `graph` (e.g. "fastpitch") for a model with these dims."""
    try:
        return CONTRACTS[graph](dims)
    except KeyError:
        raise SpeechRTError(f"no contract for {graph!r}; known: {', '.join(CONTRACTS)}") from None


def graphs_of(kind: str) -> dict[str, str]:
    """{graph name: ONNX file name} for a model kind."""
    try:
        return GRAPHS[kind]
    except KeyError:
        raise SpeechRTError(
            f"{kind}: no exportable graphs; known kinds: {', '.join(GRAPHS)}"
        ) from None
