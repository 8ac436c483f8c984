"""The architecture registry: every module of speechrt.arch, found at import, by kind and graph.

Each `speechrt.arch.<module>` lists its entries in `ARCHITECTURES`; this module collects them, so
adding an architecture never edits it. An `Architecture` gives its Dims, presets, model class,
graphs (contract, ONNX file name, wrapper code) and checkpoint conversion; code that needs torch is
named by import path and imported on first use (`load`, which checks the type of what it finds),
so neither this module nor speechrt.arch imports torch: the ONNX runtime and the server's
metadata read them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import speechrt.arch
from speechrt.arch import Architecture, Conversion, Graph, GraphCode, as_dims
from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError

if TYPE_CHECKING:
    from speechrt.convert import Converted

T = TypeVar("T")


def discover(package: str = "speechrt.arch") -> dict[str, Architecture]:
    """kind -> Architecture, over the `ARCHITECTURES` of every module of `package`."""
    found: dict[str, Architecture] = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        for a in getattr(module, "ARCHITECTURES", ()):
            if a.kind in found:
                raise SpeechRTError(f"model kind {a.kind!r} is registered twice")
            found[a.kind] = a
    return found


def graphs_over(architectures: dict[str, Architecture]) -> dict[str, Graph]:
    """graph name -> Graph; a graph may serve several kinds (denoiser, jasper)."""
    return {g.name: g for a in architectures.values() for g, _ in a.graphs}


ARCHITECTURES: dict[str, Architecture] = discover(speechrt.arch.__name__)
GRAPHS: dict[str, Graph] = graphs_over(ARCHITECTURES)


def architecture(kind: str) -> Architecture:
    try:
        return ARCHITECTURES[kind]
    except KeyError:
        raise SpeechRTError(
            f"unknown model kind {kind!r}; known: {', '.join(sorted(ARCHITECTURES))}"
        ) from None


def graph(name: str) -> Graph:
    try:
        return GRAPHS[name]
    except KeyError:
        raise SpeechRTError(f"no graph {name!r}; known: {', '.join(GRAPHS)}") from None


def contract(graph_name: str, dims: Any) -> Contract:
    """The contract of a graph (e.g. "fastpitch") for a model with these dims: its Dims, or
    the model.json "dims" dict."""
    g = graph(graph_name)
    return g.contract(dims if g.dims is None else as_dims(g.dims, dims))


def derived_sizes(graph_name: str, dims: Any) -> Callable[[dict[str, int]], dict[str, int]] | None:
    """{input axis: size} -> the output axes that follow from them, for a model of the graph
    with these dims (Dims or the model.json dict); None where no output axis follows."""
    g = graph(graph_name)
    if g.derived_sizes is None:
        return None
    return partial(g.derived_sizes, dims if g.dims is None else as_dims(g.dims, dims))


def preset(kind: str, name: str = "default", **overrides: Any) -> Any:
    """The Dims of a kind's named preset ("default", "tiny", "hifigan-v3", ...), overridden."""
    a = architecture(kind)
    if name not in a.presets:
        raise SpeechRTError(f"{kind}: no preset {name!r}; known: {', '.join(a.presets)}")
    return a.dims(**{**a.presets[name], **overrides})


def graphs_of(kind: str) -> dict[str, str]:
    """{graph name: ONNX file name} for a model kind; the first is its main graph."""
    if kind not in ARCHITECTURES:
        raise SpeechRTError(
            f"{kind}: no exportable graphs; known kinds: {', '.join(ARCHITECTURES)}"
        ) from None
    return {g.name: file for g, file in ARCHITECTURES[kind].graphs}


def component_names(kind: str) -> dict[str, str]:
    """{served model name: graph name} for a component kind, shared by the KServe v2 models
    and the Triton repository: `<kind>` for a main graph not named `<kind>.<part>`
    (fastpitch, hifigan, quartznet, parakeet_ctc, ...), `<kind>.<part>` for every other graph
    (hifigan.denoiser, tacotron2.encoder, ...), where a graph named after the main one
    (`parakeet.predict` beside `parakeet`) gives its part (parakeet_transducer.predict)."""
    graphs = list(graphs_of(kind))
    names = {}
    for i, graph in enumerate(graphs):
        if graph.startswith(kind + "."):
            names[graph] = graph
        elif i == 0:
            names[kind] = graph
        else:
            part = graph.removeprefix(graphs[0] + ".")
            names[f"{kind}.{part}"] = graph
    return names


def load(path: str, cls: type[T]) -> T:
    """Import "module:NAME" and return it: an instance of `cls`, or SpeechRTError."""
    module, _, name = path.partition(":")
    found = getattr(importlib.import_module(module), name, None)
    if not isinstance(found, cls):
        raise SpeechRTError(f"{path} is not a {cls.__name__}: {type(found).__name__}")
    return found


def model_class(kind: str) -> type[Any]:
    return load(architecture(kind).model, type)


def graph_code(name: str) -> GraphCode:
    """The wrapper functions of graph `name`, imported now. Its entry's `own_stage` must say
    whether they include a stage: the onnx backend reads it without importing them."""
    g = graph(name)
    code = load(g.code, GraphCode)
    if (code.stage is not None) != g.own_stage:
        has = "has" if code.stage is not None else "has no"
        raise SpeechRTError(f"{name}: its code {has} stage, but own_stage is {g.own_stage}")
    return code


def _conversion(a: Architecture) -> Conversion:
    return load(a.convert, Conversion) if a.convert is not None else Conversion()


def detectors() -> dict[str, Callable[[set[str]], bool]]:
    """kind -> predicate over a checkpoint's state-dict keys, for every kind detected by them."""
    found = {a.kind: _conversion(a).detect for a in ARCHITECTURES.values()}
    return {kind: detect for kind, detect in found.items() if detect is not None}


def file_reader(suffix: str) -> Callable[[str | Path], Converted] | None:
    """The reader of another project's model files with this suffix (".nemo"), or None."""
    for a in ARCHITECTURES.values():
        read = _conversion(a).read if a.reads == suffix else None
        if read is not None:
            return read
    return None


def converter(kind: str) -> Callable[[dict], Converted]:
    """kind -> from_dle(ckpt) -> speechrt.convert.Converted."""
    from_dle = _conversion(architecture(kind)).from_dle
    if from_dle is None:
        raise SpeechRTError(f"{kind}: no checkpoint conversion")
    return from_dle
