"""Parakeet: NeMo's FastConformer encoder with a CTC, RNN-T, TDT or hybrid (transducer + CTC) head.

features (B, n_mels, T) -> encoder (B, T', d_model), T' = T / 8 (three stride-2 convolutions)
    CTC head:   -> log-probs (B, T', vocab + 1), blank last
    transducer: prediction network (embedding + LSTM) and joint network, decoded greedily
                (speechrt.asr.transducer); TDT's joint also scores how many frames to skip

Graphs: `parakeet` (features -> encoder lengths, the CTC log-probs where there is a CTC head and
the encoder output through the joint's encoder projection where there is a transducer), and
for transducers `parakeet.predict` (one prediction-network step) and `parakeet.joint` (one joint
step), which the greedy decoder calls frame by frame on the onnx runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from speechrt.arch import Architecture, Graph
from speechrt.contracts import F32, I64, B, Contract, lengths, tensor

if TYPE_CHECKING:
    from torch import Tensor

Head = Literal["ctc", "rnnt", "tdt", "rnnt_ctc", "tdt_ctc"]
HEADS: tuple[str, ...] = ("ctc", "rnnt", "tdt", "rnnt_ctc", "tdt_ctc")


@dataclass(frozen=True)
class ParakeetDims:
    """A FastConformer recogniser as NeMo configures one (defaults: parakeet-ctc-0.6b)."""

    n_mels: int = 80  # features in (128 for parakeet-tdt-0.6b-v2)
    d_model: int = 1024
    n_layers: int = 24
    n_heads: int = 8
    ff_expansion: int = 4  # feed-forward width = d_model * this
    conv_kernel: int = 9  # depthwise kernel of the conv module
    subsampling_channels: int = 256  # channels of the dw_striding convolutions
    subsampling_layers: int = 3  # stride-2 convolutions: time / 2**this (8x)
    xscaling: bool = True  # the encoder input is multiplied by sqrt(d_model)
    # limited-context (local) attention: frames each side a frame attends to; None = all
    att_context: int | None = None
    head: Head = "ctc"
    vocab_size: int = 1024  # tokenizer pieces; the blank is index vocab_size
    pred_hidden: int = 640  # prediction network: embedding and LSTM width
    pred_layers: int = 2
    joint_hidden: int = 640
    durations: tuple[int, ...] = ()  # TDT: frames a token or blank may skip (0 = stay)
    max_symbols: int = 10  # greedy transducer decoding: most tokens on one frame

    def __post_init__(self) -> None:
        from speechrt.errors import SpeechRTError

        if self.head not in HEADS:
            raise SpeechRTError(f"parakeet head must be one of {HEADS}, got {self.head!r}")
        if self.head.startswith("tdt") != bool(self.durations):
            raise SpeechRTError("a TDT head needs durations, and only a TDT head has them")
        if self.d_model % self.n_heads:
            raise SpeechRTError(f"d_model {self.d_model} is not a multiple of {self.n_heads} heads")

    @property
    def has_ctc(self) -> bool:
        return self.head == "ctc" or self.head.endswith("_ctc")

    @property
    def transducer(self) -> bool:
        return self.head != "ctc"

    @property
    def n_classes(self) -> int:
        """Tokens + blank (the last)."""
        return self.vocab_size + 1

    @property
    def n_joint_out(self) -> int:
        """Joint outputs: token + blank scores, then one score per TDT duration."""
        return self.n_classes + len(self.durations)

    @property
    def stride(self) -> int:
        return 2**self.subsampling_layers


_TDT = dict(head="tdt", durations=(0, 1, 2, 3, 4), max_symbols=10)
_TINY = dict(
    d_model=32, n_layers=2, n_heads=2, subsampling_channels=8, vocab_size=40,
    pred_hidden=16, pred_layers=1, joint_hidden=16,
)  # fmt: skip

# the published sizes (NeMo model cards and configs of the Parakeet family); "tiny": narrow
# and shallow, with the real mel count and strides, for tests and smoke runs
CTC_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},  # parakeet-ctc-0.6b
    "tiny": _TINY,
    "parakeet-ctc-0.6b": {},
    "parakeet-ctc-1.1b": dict(n_layers=42),
}
TRANSDUCER_PRESETS: dict[str, dict[str, Any]] = {
    "default": _TDT,  # parakeet-tdt-0.6b-v2 with 80 mels
    "tiny": dict(_TINY, head="tdt_ctc", durations=(0, 1, 2, 3, 4), max_symbols=5),
    "parakeet-rnnt-0.6b": dict(head="rnnt", durations=()),
    "parakeet-rnnt-1.1b": dict(head="rnnt", durations=(), n_layers=42),
    "parakeet-tdt-0.6b-v2": dict(n_mels=128, xscaling=False, **_TDT),
    "parakeet-tdt_ctc-110m": dict(d_model=512, n_layers=17, **{**_TDT, "head": "tdt_ctc"}),
}


@dataclass(frozen=True)
class ParakeetCTCDims(ParakeetDims):
    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head != "ctc":
            from speechrt.errors import SpeechRTError

            raise SpeechRTError(f"parakeet_ctc has a CTC head, not {self.head!r}")


@dataclass(frozen=True)
class ParakeetTransducerDims(ParakeetDims):
    head: Head = "tdt"
    durations: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.transducer:
            from speechrt.errors import SpeechRTError

            raise SpeechRTError("parakeet_transducer needs a transducer head (rnnt, tdt, ...)")


Length = TypeVar("Length", int, "Tensor")


def halve(n: Length) -> Length:
    """A stride-2 conv's (kernel 3, padding 1) output length for input length n: an int or a
    tensor of lengths, (n - 1) // 2 + 1 as NeMo's calc_length computes it."""
    return (n - 1) // 2 + 1


def encoder_frames(d: ParakeetDims, n: int) -> int:
    """Encoder frames for n feature frames: halve() once per stride-2 conv."""
    for _ in range(d.subsampling_layers):
        n = halve(n)
    return n


def derived_sizes(d: ParakeetDims, sizes: dict[str, int]) -> dict[str, int]:
    return {"encoder_frames": encoder_frames(d, sizes["feature_frames"])}


def contract(d: ParakeetDims) -> Contract:
    outputs = [lengths("encoded_lengths", "encoder_frames")]
    if d.has_ctc:
        outputs.append(
            tensor("log_probs", F32, B, "encoder_frames", d.n_classes, doc="CTC head; blank last")
        )
    if d.transducer:
        outputs.append(
            tensor(
                "joint_encoded", F32, B, "encoder_frames", d.joint_hidden,
                doc="encoder output through the joint's encoder projection",
            )
        )  # fmt: skip
    return Contract(
        "parakeet",
        (
            tensor("features", F32, B, d.n_mels, "feature_frames"),
            lengths("feature_lengths", "feature_frames"),
        ),
        tuple(outputs),
    )


def predict_contract(d: ParakeetDims) -> Contract:
    state = (d.pred_layers, B, d.pred_hidden)
    ids = (0, d.vocab_size)  # a token or the blank
    return Contract(
        "parakeet.predict",
        (
            tensor("tokens", I64, B, doc="the last token; blank at the start", bounds=ids),
            tensor("h", F32, *state),
            tensor("c", F32, *state),
        ),
        (
            tensor("joint_predicted", F32, B, d.joint_hidden, doc="through the joint's projection"),
            tensor("h_next", F32, *state),
            tensor("c_next", F32, *state),
        ),
    )


def joint_contract(d: ParakeetDims) -> Contract:
    return Contract(
        "parakeet.joint",
        (
            tensor("joint_encoded", F32, B, d.joint_hidden),
            tensor("joint_predicted", F32, B, d.joint_hidden),
        ),
        (tensor("logits", F32, B, d.n_joint_out, doc="tokens, blank, then TDT durations"),),
    )


# dims tied to a weight's axis, checked against the safetensors header on onnx
_WEIGHT_DIMS = {
    "d_model": ("encoder.layers.0.norm_out.weight", 0),
    "subsampling_channels": ("encoder.pre_encode.convs.0.weight", 0),
}
_TRANSDUCER_WEIGHT_DIMS = {
    **_WEIGHT_DIMS,
    "joint_hidden": ("joint.enc.weight", 0),
    "pred_hidden": ("predictor.embed.weight", 1),
}

# the CTC kind has the main graph only; the transducer kinds add the two decoding steps
# (their wrappers are in the model file)
ENCODER = Graph(
    "parakeet",
    contract,
    "speechrt.runtime.graphs.parakeet:ENCODER_CODE",
    ParakeetDims,
    derived_sizes=derived_sizes,
)
PREDICT = Graph(
    "parakeet.predict",
    predict_contract,
    "speechrt.runtime.graphs.parakeet:PREDICT_CODE",
    ParakeetDims,
)
JOINT = Graph(
    "parakeet.joint", joint_contract, "speechrt.runtime.graphs.parakeet:JOINT_CODE", ParakeetDims
)

# .nemo files are read whole by speechrt.convert.nemo (`speechrt convert X.nemo DIR`), which
# tells the kind from the file's config; there is no state-dict key detection
NEMO = "speechrt.convert.nemo:CONVERSION"
ARCHITECTURES = (
    Architecture(
        "parakeet_ctc",
        ParakeetCTCDims,
        CTC_PRESETS,
        "speechrt.models.parakeet:ParakeetCTC",
        ((ENCODER, "model.onnx"),),
        NEMO,
        _WEIGHT_DIMS,
        reads=".nemo",
    ),
    Architecture(
        "parakeet_transducer",
        ParakeetTransducerDims,
        TRANSDUCER_PRESETS,
        "speechrt.models.parakeet:ParakeetTransducer",
        ((ENCODER, "model.onnx"), (PREDICT, "predict.onnx"), (JOINT, "joint.onnx")),
        NEMO,
        _TRANSDUCER_WEIGHT_DIMS,
        reads=".nemo",
    ),
)
