"""ONNX graphs that read their weights from the model.safetensors beside them. Imports no torch.

An exported graph holds its weights as float32 initializers. `link_weights` replaces every
initializer whose values equal a tensor of model.safetensors (as stored, or stored in float16 and
widened) by an external-data reference into that file: location "model.safetensors", the tensor's
byte offset and length (the safetensors layout is an 8-byte header size, a JSON header, then the
raw little-endian tensors). A float16 tensor is read as a float16 initializer `<name>.stored`
and widened by a Cast node that outputs the original name (a Linear weight the exporter stored
transposed for its MatMul is read as stored and transposed back by a Transpose node), so the
graph computes in float32 exactly as before, and the weights exist once on disk. onnxruntime
folds the Casts into float32 constants when it builds the session.

Initializers that are not weights of the file (constants the exporter folded, a bias spectrum)
stay inside the .onnx file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechrt.errors import SpeechRTError

WEIGHTS_FILE = "model.safetensors"
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64, "F64": np.float64}


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str  # safetensors dtype code, e.g. "F16"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the file
    length: int  # bytes


def safetensors_index(path: str | Path) -> dict[str, StoredTensor]:
    """Every tensor's dtype, shape and byte range in a safetensors file, from its header."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    start = 8 + size
    return {
        name: StoredTensor(
            name,
            t["dtype"],
            tuple(t["shape"]),
            start + t["data_offsets"][0],
            t["data_offsets"][1] - t["data_offsets"][0],
        )  # fmt: skip
        for name, t in header.items()
        if name != "__metadata__"
    }


def read_stored(path: str | Path, t: StoredTensor) -> np.ndarray:
    """One tensor of the file as a numpy array (memory-mapped, read-only)."""
    dtype = DTYPES.get(t.dtype)
    if dtype is None:
        raise SpeechRTError(f"{path}: tensor {t.name} has unsupported dtype {t.dtype}")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.length,))
    return data.view(dtype).reshape(t.shape)


def link_weights(onnx_path: str | Path, weights: str | Path | None = None) -> tuple[int, int]:
    """Point `onnx_path`'s initializers at equal tensors of `weights` (default: the
    model.safetensors beside it) and rewrite the file. Returns (tensors linked, bytes left
    inside the graph). The weights file must sit in the graph's directory."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    onnx_path = Path(onnx_path)
    weights = Path(weights) if weights is not None else onnx_path.parent / WEIGHTS_FILE
    if weights.parent.resolve() != onnx_path.parent.resolve():
        raise SpeechRTError(f"{weights}: the weights must sit beside {onnx_path}")
    index = safetensors_index(weights)
    # candidates by shape: (stored tensor, its values as float32)
    by_shape: dict[tuple[int, ...], list[tuple[StoredTensor, np.ndarray]]] = {}
    for t in index.values():
        if t.dtype in ("F32", "F16"):
            by_shape.setdefault(t.shape, []).append((t, read_stored(weights, t)))

    model = onnx.load(str(onnx_path))
    graph = model.graph
    kept, linked, left = [], 0, 0
    casts = []
    for init in graph.initializer:
        value = numpy_helper.to_array(init)
        match, transposed = find_stored(value, by_shape), False
        if match is None and value.ndim == 2:
            match, transposed = find_stored(value.T, by_shape), True
        if match is None:
            kept.append(init)
            left += value.nbytes
            continue
        widen = match.dtype == "F16"
        stored_name = init.name + ".stored" if widen or transposed else init.name
        ref = TensorProto(name=stored_name, dims=list(match.shape))
        ref.data_type = TensorProto.FLOAT16 if match.dtype == "F16" else TensorProto.FLOAT
        ref.data_location = TensorProto.EXTERNAL
        for key, val in (
            ("location", weights.name),
            ("offset", str(match.offset)),
            ("length", str(match.length)),
        ):
            entry = ref.external_data.add()
            entry.key, entry.value = key, val
        kept.append(ref)
        name = stored_name
        if widen:
            name = init.name + ".wide" if transposed else init.name
            casts.append(helper.make_node("Cast", [stored_name], [name], to=TensorProto.FLOAT))
        if transposed:
            casts.append(helper.make_node("Transpose", [name], [init.name], perm=[1, 0]))
        linked += 1
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(onnx_path))
    return linked, left


def find_stored(
    value: np.ndarray, by_shape: dict[tuple[int, ...], list[tuple[StoredTensor, np.ndarray]]]
) -> StoredTensor | None:
    """The stored tensor whose values (widened to float32) equal `value`, if any."""
    if value.dtype != np.float32:
        return None
    for t, stored in by_shape.get(tuple(value.shape), []):
        if np.array_equal(stored.astype(np.float32), value):
            return t
    return None
