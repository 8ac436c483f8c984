"""ONNX export of a model directory: one file per graph, checked by onnxruntime after writing.

Each graph's wrapper (speechrt.runtime.graphs) is exported with the contract's input/output names
and dynamic axes, then run by onnxruntime on the CPU at batch sizes and lengths other than the
example it was traced with, and compared with the eager wrapper: a graph that silently fixed a
size to the example fails here, not in production.

Weights are not copied into the graphs: where the model directory holds model.safetensors, each
graph reads its weights from that file (speechrt.runtime.onnx_weights), so an exported directory
holds every weight once and its graphs are a few hundred kB.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError
from speechrt.registry import contract, graphs_of
from speechrt.registry import graph as registry_graph
from speechrt.repo import WEIGHTS_FILE, ComponentInfo, load_component
from speechrt.runtime import DEFAULT_OPSET
from speechrt.runtime.eager import EagerRunner
from speechrt.runtime.graphs import build_graph, example_feeds
from speechrt.runtime.onnx_weights import link_weights

EXAMPLE = (2, 11)  # (batch, length) traced
CHECKS = ((1, 5), (3, 17), (2, 29))  # (batch, length) checked after export: 3 lengths, 2 batches


@dataclass
class GraphCheck:
    graph: str
    batch: int
    length: int
    max_abs_error: float  # over every output, within each item's valid region


def export_graph(
    graph: str,
    wrapper: nn.Module,
    c: Contract,
    path: Path,
    opset: int = DEFAULT_OPSET,
    example_of: nn.Module | None = None,
) -> None:
    """Trace `wrapper` at the example size and write `path` with the contract's names and axes.

    `example_of`: the graph wrapper that makes the example inputs, when `wrapper` wraps it.
    """
    feeds = example_feeds(graph, example_of or wrapper, *EXAMPLE)
    args = tuple(feeds[n] for n in c.input_names)
    exporter = registry_graph(graph).exporter
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".onnx.tmp")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on constants and its deprecation
        torch.onnx.export(
            wrapper,
            args,
            str(tmp),
            input_names=c.input_names,
            output_names=c.output_names,
            dynamic_axes=c.dynamic_axes(),
            opset_version=opset,
            dynamo=exporter == "dynamo",
        )
    stamp_shapes(tmp, c)
    tmp.replace(path)


def stamp_shapes(path: Path, c: Contract) -> None:
    """Write the contract's shapes into the graph's inputs and outputs: fixed sizes as values,
    dynamic axes by name (the exporter leaves some as generated names, e.g. after an LSTM)."""
    import onnx

    model = onnx.load(str(path))
    for values, specs in ((model.graph.input, c.inputs), (model.graph.output, c.outputs)):
        by_name = {v.name: v for v in values}
        for spec in specs:
            dims = by_name[spec.name].type.tensor_type.shape.dim
            if len(dims) != len(spec.shape):  # rank unknown to the exporter
                del dims[:]
                dims.extend(onnx.TensorShapeProto.Dimension() for _ in spec.shape)
            for dim, axis in zip(dims, spec.shape, strict=True):
                if isinstance(axis, int):
                    dim.dim_value = axis
                else:
                    dim.dim_param = axis
    onnx.save(model, str(path))


def check_graph(
    graph: str, wrapper: nn.Module, c: Contract, path: Path, tolerance: float = 1e-4
) -> list[GraphCheck]:
    """Run `path` in onnxruntime (CPU) at CHECKS sizes; compare with the eager wrapper."""
    from speechrt.runtime.onnx import OnnxRunner

    onnx = OnnxRunner(path, c, device="cpu")
    eager = EagerRunner(wrapper, c)
    results = []
    for batch, length in CHECKS:
        feeds = example_feeds(graph, wrapper, batch, length, seed=length)
        ref = eager.run(feeds)
        got = onnx.run({k: v.numpy() for k, v in feeds.items()})
        err = max_output_error(c, ref, {k: torch.from_numpy(v) for k, v in got.items()})
        results.append(GraphCheck(graph, batch, length, err))
        if not err <= tolerance:
            raise SpeechRTError(
                f"{path}: onnxruntime differs from eager by {err:.3g} of the output scale "
                f"(> {tolerance:g}) "
                f"at batch {batch}, length {length}"
            )
    return results


def max_output_error(c: Contract, a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| / max(1, max |a|) over every contract output; shapes must agree.

    Absolute below magnitude 1, relative above: a float32 graph agrees to ~1e-6 of its values'
    scale, so an output near 1e4 (e.g. a saturated stop-gate logit) may differ by 1e-3.
    """
    worst = 0.0
    for name in c.output_names:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            return float("inf")
        if x.numel():
            x, y = x.double(), y.double()
            scale = max(1.0, float(x.abs().max()))
            worst = max(worst, float((x - y).abs().max()) / scale)
    return worst


def export_dir(
    model_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    graphs: Sequence[str] | None = None,
) -> tuple[list[Path], list[GraphCheck]]:
    """Export the graphs (default: all) of the component in model_dir; returns the files and
    the checks."""
    model, info = load_component(model_dir, "cpu", torch.float32)
    return export_component(model, info, model_dir, opset, check, graphs)


def export_component(
    model: nn.Module,
    info: ComponentInfo,
    out_dir: str | Path,
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    graphs: Sequence[str] | None = None,
) -> tuple[list[Path], list[GraphCheck]]:
    """Export the graphs (default: all) of a loaded (CPU, float32) component into out_dir;
    they read their weights from out_dir/model.safetensors where it exists."""
    files = graphs_of(info.kind)
    unknown = set(graphs or ()) - set(files)
    if unknown:
        raise SpeechRTError(f"a {info.kind} has no graphs {sorted(unknown)}; it has {list(files)}")
    weights = Path(out_dir) / WEIGHTS_FILE
    paths, checks = [], []
    for graph, file in files.items():
        if graphs is not None and graph not in graphs:
            continue
        wrapper = build_graph(graph, model, info)
        c = contract(graph, info.dims)
        path = Path(out_dir) / file
        export_graph(graph, wrapper, c, path, opset)
        if weights.is_file():
            link_weights(path, weights)
        paths.append(path)
        if check:
            checks += check_graph(graph, wrapper, c, path)
    return paths, checks
