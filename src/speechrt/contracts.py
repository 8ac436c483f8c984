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

Each architecture's module in speechrt.arch builds its graphs' contracts from its typed dims
with the helpers below; speechrt.registry finds them by graph name.

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


def tensor(
    name: str,
    dtype: str,
    *shape: Axis,
    doc: str = "",
    pad: float = 0,
    default: float | None = None,
    counts: str | None = None,
    bounds: tuple[float, float] | None = None,
) -> TensorSpec:
    """TensorSpec with the shape written out: tensor("mel", F32, B, 80, "frames")."""
    return TensorSpec(name, dtype, tuple(shape), doc, pad, default, counts, bounds)


# numpy dtype name -> KServe v2 / Triton datatype (Triton's config writes TYPE_ + it, STRING for
# BYTES) ("object": an array of bytes objects)
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "object": "BYTES",
}

F32, I64, BOOL = "float32", "int64", "bool"
B = "batch"  # the batch axis of every tensor
PACE, SHIFT = (0.1, 10.0), (-2000.0, 2000.0)  # SynthesisOptions' ranges


def ids(name: str, n_symbols: int, doc: str = "") -> TensorSpec:
    """Symbol ids (batch, symbols), right-padded with 0, below n_symbols."""
    return tensor(name, I64, B, "symbols", doc=doc, bounds=(0, n_symbols - 1))


def lengths(name: str, axis: str) -> TensorSpec:
    """A (batch,) int64 lengths tensor: each item's valid positions along `axis`."""
    return tensor(name, I64, B, counts=axis)
