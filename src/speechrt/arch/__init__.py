"""One module per architecture: what it is, as data, without torch.

A module `speechrt.arch.<kind>` holds the architecture's `<Name>Dims` (a frozen dataclass stored
in model.json), its `PRESETS` (at least "default" and "tiny"), a contract builder per graph
(typed dims -> speechrt.contracts.Contract) and `ARCHITECTURES`, its registry entries. Code that
needs torch (the model class, the graph wrappers, checkpoint conversion) is named by import path
and imported on first use, so the ONNX runtime and the server's metadata read these modules
without torch. speechrt.registry finds every module of this package; nothing else lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class Regulated:
    """How a length-regulated graph's output length follows from its outputs: item b decodes
    sum_j floor(durations[b, j] / pace[b] + 0.5) frames, each duration at most max_duration
    (speechrt.runtime.bounds)."""

    durations: str  # the output of frames per symbol, before pace and rounding
    pace: str  # the input that divides them
    max_duration: float
    max_frames: int | None  # the model's own cap on frames per item (None: none)


@dataclass(frozen=True)
class Graph:
    """A component graph: its contract, the wrapper module computing it, how runners treat it."""

    name: str  # e.g. "fastpitch", "tacotron2.decoder_step"
    contract: Callable[[Any], Contract]  # dims (an instance of `dims`) -> Contract
    wrapper: str  # "module:suffix": the module defines build<suffix>() and example<suffix>()
    dims: type | None = None  # the Dims class the contract reads; None: it reads no dims
    exporter: str = "torchscript"  # which torch.onnx exporter writes it (runtime.export)
    float32: bool = False  # the cuda runner keeps it in float32 whatever the precision
    channels_last: bool = False  # the cuda runner runs its 1-D convolutions channels-last
    # (dims, {input axis: size}) -> {output axis: size} for the output axes that follow from
    # the inputs' sizes (HiFi-GAN's samples = frames * hop); None: none do. Plain arithmetic on
    # the dims, so a server on onnxruntime knows them without building the torch wrapper.
    derived_sizes: Callable[[Any, dict[str, int]], dict[str, int]] | None = None
    # a length-regulated graph (FastPitch): its frames are known once its durations are, so
    # runners can bound them before the decoder runs; None: not one
    regulated: Regulated | None = None


@dataclass(frozen=True)
class Architecture:
    kind: str  # registry name, stored as model.json "kind"
    dims: type  # the frozen Dims dataclass; model.json "dims" holds its fields
    presets: Mapping[str, Mapping[str, Any]]  # name -> Dims fields; "default" and "tiny" at least
    model: str  # "module:Class"; the class is built as Class(dims)
    graphs: tuple[tuple[Graph, str], ...]  # (graph, ONNX file name); the first is the main one
    # "module:function" of the checkpoint conversion (None: no foreign checkpoints to read):
    detect: str | None = None  # detect(keys: set[str]) -> bool, over the state-dict keys
    convert: str | None = None  # from_dle(ckpt: dict) -> speechrt.convert.Converted
    # {dims field: (weight name, axis)}: the weight axis each of these dims sizes. Backends that
    # never build the module (onnx) check model.json against the safetensors header with it
    # (repo.check_weight_dims); the eager path compares every weight (repo.check_dims).
    weight_dims: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    # another project's whole model file, by its suffix: (".nemo", "module:function"), the
    # function reading (path) -> speechrt.convert.Converted of this kind or a sibling kind
    reader: tuple[str, str] | None = None


def as_dims(cls: type, dims: Any) -> Any:
    """`dims` as an instance of the Dims dataclass `cls`: a Dims passes, a model.json dict
    (lists for tuples) is built; unknown fields are an error."""
    if isinstance(dims, cls):
        return dims
    unknown = set(dims) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise SpeechRTError(f"{cls.__name__}: unknown dims {sorted(unknown)}")
    return cls(**{k: untuple(v) for k, v in dims.items()})


def untuple(v: Any) -> Any:
    """JSON gives lists; Dims use tuples so that they stay hashable and frozen."""
    return tuple(untuple(x) for x in v) if isinstance(v, list) else v
