"""Named-tensor I/O of every model the server exposes over KServe v2, in one place.

Components (the acoustic model, the vocoder, the ASR acoustic model) follow the pipeline
interfaces (ids + lengths -> mel + mel_lengths -> audio + audio_lengths; features + lengths ->
log-probs + lengths). When speechrt.contracts lands (the runtime's shared contract module), the
COMPONENTS table below is the one thing to derive from it. -1 marks a dynamic axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# KServe v2 datatype -> numpy dtype string (little-endian); BYTES is an object array of bytes.
DATATYPES: dict[str, str] = {
    "BOOL": "|b1",
    "UINT8": "|u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "|i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BYTES": "O",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # a KServe v2 datatype
    shape: tuple[int, ...]  # -1 = dynamic
    optional: bool = False
    any_shape: bool = False  # accept any shape (flattened), e.g. texts as [B] or [B, 1]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def check(self, shape: tuple[int, ...], datatype: str) -> str | None:
        """None when an input of this shape and datatype fits, else why not."""
        if datatype != self.datatype:
            return f"input {self.name!r} must be {self.datatype}, got {datatype}"
        if self.any_shape:
            return None
        if len(shape) != len(self.shape) or any(
            want not in (-1, got) for want, got in zip(self.shape, shape, strict=True)
        ):
            want = "[" + ", ".join("-1" if d < 0 else str(d) for d in self.shape) + "]"
            return f"input {self.name!r} must have shape {want}, got {list(shape)}"
        return None


@dataclass(frozen=True)
class ModelSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def component_spec(role: str, channels: int, classes: int = -1) -> ModelSpec:
    """The contract of one component role; `channels` = mel bins / feature count."""
    if role == "acoustic":
        return ModelSpec(
            (TensorSpec("ids", "INT64", (-1, -1)), TensorSpec("lengths", "INT64", (-1,))),
            (
                TensorSpec("mel", "FP32", (-1, channels, -1)),
                TensorSpec("mel_lengths", "INT64", (-1,)),
            ),
        )
    if role == "vocoder":
        return ModelSpec(
            (
                TensorSpec("mel", "FP32", (-1, channels, -1)),
                TensorSpec("mel_lengths", "INT64", (-1,)),
            ),
            (TensorSpec("audio", "FP32", (-1, -1)), TensorSpec("audio_lengths", "INT64", (-1,))),
        )
    if role == "asr":
        return ModelSpec(
            (
                TensorSpec("features", "FP32", (-1, channels, -1)),
                TensorSpec("lengths", "INT64", (-1,)),
            ),
            (
                TensorSpec("log_probs", "FP32", (-1, -1, classes)),
                TensorSpec("log_prob_lengths", "INT64", (-1,)),
            ),
        )
    raise ValueError(f"no serving contract for component role {role!r}")


TTS_SPEC = ModelSpec(
    (TensorSpec("TEXT", "BYTES", (-1,), any_shape=True),),
    (TensorSpec("AUDIO", "FP32", (-1, -1)), TensorSpec("AUDIO_LENGTHS", "INT64", (-1,))),
)

ASR_SPEC = ModelSpec(
    (
        TensorSpec("AUDIO", "FP32", (-1, -1)),
        TensorSpec("AUDIO_LENGTHS", "INT64", (-1,), optional=True),
    ),
    (TensorSpec("TEXT", "BYTES", (-1,)),),
)
