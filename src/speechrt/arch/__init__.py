"""One module per architecture: what it is, as data, without torch.

A module `speechrt.arch.<kind>` holds the architecture's `<Name>Dims` (a frozen dataclass stored
in model.json), its `PRESETS` (at least "default" and "tiny"), a contract builder per graph
(typed dims -> speechrt.contracts.Contract) and `ARCHITECTURES`, its registry entries. Code that
needs torch (the model class, the graph wrappers, checkpoint conversion) is named by import path,
"module:NAME", and imported on first use by speechrt.registry, which checks the type of what it
finds: a graph's wrapper functions are one typed `GraphCode` in the wrapper module, a conversion's
one `Conversion` in its convert module, so mypy checks their signatures where they are written.
The ONNX runtime and the server's metadata read these modules without torch. speechrt.registry
finds every module of this package; nothing else lists them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    from torch import Tensor, nn

    from speechrt.convert import Converted
    from speechrt.repo import ComponentInfo
    from speechrt.runtime.stages import StageParts


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
class GraphCode:
    """A graph's torch side: the functions of its wrapper module (speechrt.runtime.graphs.<kind>
    or the model file), gathered there in one constant that `Graph.code` names."""

    # (loaded model, its ComponentInfo or None) -> the wrapper, whose forward takes the
    # contract's inputs in order and returns its outputs in order
    build: Callable[[Any, ComponentInfo | None], nn.Module]
    # (wrapper, batch, length, seed) -> valid random inputs whose main dynamic axis is `length`
    example: Callable[[Any, int, int, int], dict[str, Tensor]]
    # (StageParts) -> the component's pipeline stage, for a main graph that a batch runs more than
    # once (a decoder loop, noise per item); its Graph says `own_stage`. None: the plain stage
    stage: Callable[[StageParts], Any] | None = None


@dataclass(frozen=True)
class Graph:
    """A component graph: its contract, the wrapper code computing it, how runners treat it."""

    name: str  # e.g. "fastpitch", "tacotron2.decoder_step"
    contract: Callable[[Any], Contract]  # dims (an instance of `dims`) -> Contract
    code: str  # "module:NAME" of the graph's GraphCode, imported on first use (torch)
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
    # its code has a `stage` (GraphCode.stage): said here too, so that the onnx backend knows
    # without importing torch that the plain numpy stages do not serve this component
    own_stage: bool = False


@dataclass(frozen=True)
class Conversion:
    """Another project's checkpoints read as this kind: the functions of speechrt.convert.<kind>,
    gathered there in one constant that `Architecture.convert` names."""

    # a checkpoint's state-dict keys (prefix `module.` removed) -> whether it is this kind
    detect: Callable[[set[str]], bool] | None = None
    # a checkpoint from torch.load(weights_only=True) -> Converted
    from_dle: Callable[[dict], Converted] | None = None
    # a whole model file of the suffix `Architecture.reads` -> Converted of this kind or a sibling
    read: Callable[[str | Path], Converted] | None = None


@dataclass(frozen=True)
class Architecture:
    kind: str  # registry name, stored as model.json "kind"
    dims: type  # the frozen Dims dataclass; model.json "dims" holds its fields
    presets: Mapping[str, Mapping[str, Any]]  # name -> Dims fields; "default" and "tiny" at least
    model: str  # "module:Class" of the model class, built as Class(dims)
    graphs: tuple[tuple[Graph, str], ...]  # (graph, ONNX file name); the first is the main one
    # "module:NAME" of its Conversion (None: no other project's checkpoints to read)
    convert: str | None = None
    # {dims field: (weight name, axis)}: the weight axis each of these dims sizes. Backends that
    # never build the module (onnx) check model.json against the safetensors header with it
    # (repo.check_weight_dims); the eager path compares every weight (repo.check_dims).
    weight_dims: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    # the suffix of another project's whole model files that `convert().read` reads (".nemo")
    reads: str | None = None


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
