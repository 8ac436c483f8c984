"""Triton `config.pbtxt` text from speechrt's contracts. Imports no torch and no onnx.

A Triton model with `max_batch_size > 0` lists each tensor's dims without the batch axis; a
dynamic axis is -1. A (batch,) tensor (lengths, pace) has no dims left: Triton wants at least
one, so it is declared `dims: [1]` with `reshape: { shape: [] }` (Triton's documented form for a
per-item scalar): clients send (B, 1), the model sees (B,). An input with a default
(`TensorSpec.optional`) is `optional: true`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from speechrt.contracts import DATATYPES, Contract, TensorSpec


class Enum(str):
    """A protobuf enum value: written bare (TYPE_FP32), not quoted."""


def data_type(dtype: str) -> Enum:
    """numpy dtype name -> Triton's config data_type ("float32" -> TYPE_FP32; bytes: STRING)."""
    return Enum("TYPE_" + DATATYPES[dtype].replace("BYTES", "STRING"))


def tensor_config(t: TensorSpec, is_input: bool, reshape: bool = True) -> dict[str, Any]:
    """One `input [...]` / `output [...]` entry of a batching model (the batch axis first).
    `reshape` False: a (batch,) tensor is plain dims [1] (python models, ensembles)."""
    if not t.shape or t.shape[0] != "batch":
        raise ValueError(f"{t.name}: a batching model's tensors start with the batch axis")
    dims = [-1 if isinstance(a, str) else a for a in t.shape[1:]]
    out: dict[str, Any] = {"name": t.name, "data_type": data_type(t.dtype)}
    if dims:
        out["dims"] = dims
    else:
        out["dims"] = [1]
        if reshape:
            out["reshape"] = {"shape": []}
    if is_input and t.optional:
        out["optional"] = True
    return out


def model_config(
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_batch_size: int,
    *,
    backend: str | None = None,
    platform: str | None = None,
    queue_delay_us: int | None = None,
    reshape: bool = True,
    parameters: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A model's config as nested dicts (to_pbtxt writes it). `queue_delay_us` None: no
    dynamic batching (ensembles; python models that take each request as it comes);
    `reshape` as tensor_config."""
    config: dict[str, Any] = {"name": name}
    if backend:
        config["backend"] = backend
    if platform:
        config["platform"] = platform
    config["max_batch_size"] = max_batch_size
    config["input"] = [tensor_config(t, True, reshape) for t in inputs]
    config["output"] = [tensor_config(t, False, reshape) for t in outputs]
    if queue_delay_us is not None:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": queue_delay_us}
    for key, value in (parameters or {}).items():
        config.setdefault("parameters", []).append({"key": key, "value": {"string_value": value}})
    config.update(extra or {})
    return config


def contract_config(
    name: str, c: Contract, max_batch_size: int, queue_delay_us: int
) -> dict[str, Any]:
    """An exported graph on Triton's onnxruntime backend, with dynamic batching."""
    return model_config(
        name,
        c.inputs,
        c.outputs,
        max_batch_size,
        backend="onnxruntime",
        queue_delay_us=queue_delay_us,
    )


def to_pbtxt(config: Mapping[str, Any]) -> str:
    """Protobuf text format: a dict is a message, a list a repeated field, Enum a bare name."""
    return "".join(_fields(config, 0))


def _fields(message: Mapping[str, Any], depth: int) -> list[str]:
    pad = "  " * depth
    lines = []
    for key, value in message.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for item in value:
                lines.append(f"{pad}{key} {{\n")
                lines += _fields(item, depth + 1)
                lines.append(f"{pad}}}\n")
        elif isinstance(value, Mapping):
            lines.append(f"{pad}{key} {{\n")
            lines += _fields(value, depth + 1)
            lines.append(f"{pad}}}\n")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}\n")
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return repr(value)
