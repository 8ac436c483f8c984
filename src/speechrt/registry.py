"""One entry per architecture: what it is called, where its code lives, which graphs it exports.

An `Architecture` names its model class, its graphs (contract builder, ONNX file name, graph
wrapper) and its checkpoint conversion module. Code is named by import path and imported on first
use, so this module imports no torch: the ONNX runtime and the server's metadata read it.

    kind         model class                         graphs (ONNX file)
    fastpitch    speechrt.models.fastpitch.FastPitch fastpitch (model.onnx)
    fastspeech   speechrt.models.fastspeech...       fastspeech (model.onnx)
    tacotron2    speechrt.models.tacotron2...        tacotron2.encoder (encoder.onnx),
                                                     tacotron2.decoder_step (decoder_step.onnx),
                                                     tacotron2.postnet (postnet.onnx)
    hifigan      speechrt.models.hifigan.HiFiGAN     hifigan (model.onnx), denoiser (denoiser.onnx)
    waveglow     speechrt.models.waveglow.WaveGlow   waveglow (model.onnx), denoiser (denoiser.onnx)
    jasper       speechrt.models.jasper.Jasper       jasper (model.onnx)
    quartznet    speechrt.models.jasper.QuartzNet    jasper (model.onnx): same architecture

Checkpoint conversion (speechrt.convert) lives apart from the models: an entry names its
detector (over the prefix-stripped keys of a checkpoint's main state dict) and its converter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speechrt import contracts
from speechrt.contracts import Contract
from speechrt.errors import SpeechRTError


@dataclass(frozen=True)
class Graph:
    """A component graph: its contract and the wrapper module the runners and export use."""

    name: str  # e.g. "fastpitch", "tacotron2.decoder_step"
    contract: Callable[[Mapping[str, Any]], Contract]  # model.json dims -> Contract
    wrapper: str  # "module:suffix": the module defines build<suffix>() and example<suffix>()
    exporter: str = "torchscript"  # which torch.onnx exporter writes it (runtime.export)


@dataclass(frozen=True)
class Architecture:
    kind: str  # registry name, stored as model.json "kind"
    model: str  # "module:Class"; the class has .Dims and is built as Class(dims)
    graphs: tuple[tuple[Graph, str], ...]  # (graph, ONNX file name); the first is the main one
    # "module:function" of the checkpoint conversion (None: no foreign checkpoints to read):
    detect: str | None  # detect(keys: set[str]) -> bool, over the checkpoint's state-dict keys
    convert: str | None  # from_dle(ckpt: dict) -> speechrt.convert.Converted


def _graph(name: str, contract: Callable[[Mapping[str, Any]], Contract], wrapper: str) -> Graph:
    return Graph(name, contract, "speechrt.runtime.graphs." + wrapper)


DENOISER = _graph("denoiser", contracts.denoiser, "denoiser:")
JASPER = _graph("jasper", contracts.jasper, "jasper:")

ARCHITECTURES: dict[str, Architecture] = {
    a.kind: a
    for a in (
        Architecture(
            "fastpitch",
            "speechrt.models.fastpitch:FastPitch",
            ((_graph("fastpitch", contracts.fastpitch, "fastpitch:"), "model.onnx"),),
            "speechrt.convert.fastpitch:detect",
            "speechrt.convert.fastpitch:from_dle",
        ),
        Architecture(
            "hifigan",
            "speechrt.models.hifigan:HiFiGAN",
            (
                (_graph("hifigan", contracts.hifigan, "hifigan:"), "model.onnx"),
                (DENOISER, "denoiser.onnx"),
            ),
            "speechrt.convert.hifigan:detect",
            "speechrt.convert.hifigan:from_dle",
        ),
        Architecture(
            "tacotron2",
            "speechrt.models.tacotron2:Tacotron2",
            (
                (
                    _graph("tacotron2.encoder", contracts.tacotron2_encoder, "tacotron2:_encoder"),
                    "encoder.onnx",
                ),
                (
                    _graph(
                        "tacotron2.decoder_step",
                        contracts.tacotron2_decoder_step,
                        "tacotron2:_decoder_step",
                    ),
                    "decoder_step.onnx",
                ),
                (
                    _graph("tacotron2.postnet", contracts.tacotron2_postnet, "tacotron2:_postnet"),
                    "postnet.onnx",
                ),
            ),
            "speechrt.convert.tacotron2:detect",
            "speechrt.convert.tacotron2:from_dle",
        ),
        Architecture(
            "waveglow",
            "speechrt.models.waveglow:WaveGlow",
            (
                (_graph("waveglow", contracts.waveglow, "waveglow:"), "model.onnx"),
                (DENOISER, "denoiser.onnx"),
            ),
            "speechrt.convert.waveglow:detect",
            "speechrt.convert.waveglow:from_dle",
        ),
        Architecture(
            "fastspeech",
            "speechrt.models.fastspeech:FastSpeech",
            ((_graph("fastspeech", contracts.fastspeech, "fastspeech:"), "model.onnx"),),
            "speechrt.convert.fastspeech:detect",
            "speechrt.convert.fastspeech:from_dle",
        ),
        Architecture(
            "jasper",
            "speechrt.models.jasper:Jasper",
            ((JASPER, "model.onnx"),),
            "speechrt.convert.jasper:detect",
            "speechrt.convert.jasper:from_dle",
        ),
        Architecture(
            "quartznet",
            "speechrt.models.jasper:QuartzNet",
            ((JASPER, "model.onnx"),),
            "speechrt.convert.jasper:detect_quartznet",
            "speechrt.convert.jasper:from_dle_quartznet",
        ),
    )
}

# graph name -> Graph, over every architecture (a graph may serve several: denoiser, jasper)
GRAPHS: dict[str, Graph] = {g.name: g for a in ARCHITECTURES.values() for g, _ in a.graphs}


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


def contract(graph_name: str, dims: Mapping[str, Any]) -> Contract:
    """The contract of a graph (e.g. "fastpitch") for a model with these dims."""
    return graph(graph_name).contract(dims)


def graphs_of(kind: str) -> dict[str, str]:
    """{graph name: ONNX file name} for a model kind; the first is its main graph."""
    if kind not in ARCHITECTURES:
        raise SpeechRTError(
            f"{kind}: no exportable graphs; known kinds: {', '.join(ARCHITECTURES)}"
        ) from None
    return {g.name: file for g, file in ARCHITECTURES[kind].graphs}


def load(path: str) -> Any:
    """Import "module:attribute" (or a bare module path) and return it."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def model_class(kind: str) -> type[Any]:
    return load(architecture(kind).model)


def detectors() -> dict[str, Callable[[set[str]], bool]]:
    """kind -> predicate over a checkpoint's state-dict keys, for every convertible kind."""
    return {a.kind: load(a.detect) for a in ARCHITECTURES.values() if a.detect}


def converter(kind: str) -> Callable[[dict], Any]:
    """kind -> from_dle(ckpt) -> speechrt.convert.Converted."""
    path = architecture(kind).convert
    if path is None:
        raise SpeechRTError(f"{kind}: no checkpoint conversion")
    return load(path)
