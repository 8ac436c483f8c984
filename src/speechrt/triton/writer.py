"""`speechrt export DIR... --triton-repo OUT`: a Triton model repository from exported models.

    OUT/<graph model>/config.pbtxt      onnxruntime backend, dynamic batching
    OUT/<graph model>/1/model.onnx      the graph with its weights inside (self-contained)
    OUT/<kind>.text/                    python backend: text -> ids padded to the symbol buckets
    OUT/<kind>.features/, <kind>.ctc/   python backend: audio -> features; greedy CTC -> text
    OUT/tts/, OUT/asr/                  ensembles: TEXT -> AUDIO, AUDIO_LENGTHS; AUDIO -> TEXT

Graph models are named as the server names them (speechrt.registry.component_names):
fastpitch, hifigan, hifigan.denoiser, quartznet, tacotron2.encoder, ... Each model directory
must have been exported (`speechrt export DIR`) first; nothing here imports torch.

A model directory's graphs read their weights from its model.safetensors through ONNX external
data (speechrt.runtime.onnx_weights). Triton loads a version directory on its own, so the
repository's model.onnx holds its weights (those of its graph only; float16 weights stay float16
behind their Cast). A graph past protobuf's 2 GB limit gets them in model.onnx.data beside it
instead (ONNX's standard external-data file, which the onnxruntime backend reads).

An input with a default (pace, pitch_shift, ...) becomes `optional: true`, and the repository's
graph holds the default as an initializer of shape (1,) under the input's name: onnxruntime uses
it when a request leaves the input out, and it broadcasts over the batch.

Ensembles: `tts` needs one acoustic model that maps ids to a mel (FastPitch, FastSpeech) and one
vocoder fed by the mel alone (HiFi-GAN; WaveGlow takes its latent noise z from the client).
Tacotron 2's decoder is a loop that stops on its gate: an ensemble runs each step once, so
Tacotron 2 is exported as its graphs (encoder, decoder_step, postnet) and its text front end,
without an ensemble. `asr` = features -> acoustic model -> greedy CTC.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speechrt.contracts import B, Contract, TensorSpec, tensor
from speechrt.errors import SpeechRTError
from speechrt.registry import component_names, contract, graphs_of
from speechrt.repo import ComponentInfo, read_info
from speechrt.runtime.buckets import Buckets
from speechrt.triton.config import contract_config, model_config, to_pbtxt

PROTOBUF_LIMIT = 2**31 - 2**24  # bytes; protobuf refuses messages of 2 GB and over
EXTERNAL_DATA = "model.onnx.data"
# what a python-backend model.py holds: speechrt's class under the name Triton looks for
PYTHON_MODEL = '''"""{doc}

Written by `speechrt export --triton-repo`; runs speechrt's own code, so the Python that
Triton's python backend runs must have speechrt installed."""

from speechrt.triton.backend import {cls} as TritonPythonModel  # noqa: F401
'''


@dataclass(frozen=True)
class RepoOptions:
    max_batch_size: int = 8  # every model's; as `speechrt serve --max-batch-size`
    queue_delay_us: int = 5000  # dynamic batching's max_queue_delay_microseconds
    buckets: Buckets = field(default_factory=Buckets)  # symbols and feature_frames padding

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SpeechRTError(f"max batch size must be >= 1, got {self.max_batch_size}")
        if self.queue_delay_us < 0:
            raise SpeechRTError(f"queue delay must be >= 0, got {self.queue_delay_us}")


@dataclass
class Component:
    model_dir: Path
    info: ComponentInfo
    main: Contract  # its main graph's contract
    names: dict[str, str]  # {model name in the repository: graph name}

    @property
    def role(self) -> str:
        inputs, outputs = self.main.input_names, self.main.output_names
        if "log_probs" in outputs:
            return "asr"
        if "audio" in outputs and "mel" in inputs:
            return "vocoder"
        if "mel" in outputs:
            return "acoustic"
        return "parts"  # Tacotron 2: a loop over its graphs


def _component(model_dir: Path) -> Component:
    info = read_info(model_dir)
    main = contract(next(iter(graphs_of(info.kind))), info.dims)
    return Component(model_dir, info, main, component_names(info.kind))


def write_repository(
    out: str | Path, model_dirs: Sequence[str | Path], options: RepoOptions | None = None
) -> tuple[list[Path], list[str]]:
    """Write the repository; returns the model directories written and notes on what was left
    out (a denoiser not exported, an ensemble that cannot be built)."""
    options = options or RepoOptions()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SpeechRTError(f"{out}: not a directory")
    components = [_component(Path(d)) for d in model_dirs]
    for comp in components:  # every check before anything is written
        main_file = graphs_of(comp.info.kind)[comp.main.name]
        if not (comp.model_dir / main_file).is_file():
            raise SpeechRTError(
                f"{comp.model_dir}: no {main_file} (run `speechrt export {comp.model_dir}` first)"
            )
    notes: list[str] = []
    ensemble_configs = ensembles(components, options, notes)
    written: dict[str, Path] = {}

    def claim(name: str, source: Path) -> Path:
        if name in written:
            raise SpeechRTError(f"{source}: a second model named {name!r} in one repository")
        written[name] = out / name
        if written[name].exists():
            shutil.rmtree(written[name])
        (written[name] / "1").mkdir(parents=True)
        return written[name]

    for comp in components:
        files = graphs_of(comp.info.kind)
        for name, graph in comp.names.items():
            src = comp.model_dir / files[graph]
            if not src.is_file():  # a denoiser not exported
                notes.append(f"{name}: not exported in {comp.model_dir}, left out")
                continue
            c = contract(graph, comp.info.dims)
            dest = claim(name, comp.model_dir)
            copy_graph(src, dest / "1" / "model.onnx", c)
            config = contract_config(name, c, options.max_batch_size, options.queue_delay_us)
            (dest / "config.pbtxt").write_text(to_pbtxt(config))
        if "text" in comp.info.meta and comp.main.inputs[0].dtype == "int64":
            name = f"{comp.info.kind}.text"
            _python_model(claim(name, comp.model_dir), text_config(name, comp, options))
        if comp.role == "asr":
            for name, config in asr_configs(comp, options).items():
                _python_model(claim(name, comp.model_dir), config)

    for name, config in ensemble_configs.items():
        dest = claim(name, out)
        (dest / "config.pbtxt").write_text(to_pbtxt(config))
    return list(written.values()), notes


def copy_graph(src: Path, dest: Path, c: Contract) -> None:
    """The graph at `src` with its weights (read through its external data) inside, and the
    defaults of its optional inputs as initializers, saved at `dest`."""
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import numpy_helper

    try:
        model = onnx.load(str(src))  # reads the external weights into the graph
    except (OSError, ValueError, DecodeError, onnx.checker.ValidationError) as e:
        raise SpeechRTError(f"{src}: cannot read the graph or its weights ({e})") from None
    names = {i.name for i in model.graph.initializer}
    for t in c.inputs:
        if t.default is not None and t.name not in names:
            value = np.full((1,), t.default, dtype=t.dtype)
            model.graph.initializer.append(numpy_helper.from_array(value, t.name))
    external = model.ByteSize() > PROTOBUF_LIMIT
    onnx.save_model(
        model,
        str(dest),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=EXTERNAL_DATA,
    )


def _python_model(dest: Path, config: dict[str, Any]) -> None:
    cls = config.pop("_class")
    doc = config.pop("_doc")
    (dest / "config.pbtxt").write_text(to_pbtxt(config))
    (dest / "1" / "model.py").write_text(PYTHON_MODEL.format(doc=doc, cls=cls))


def _buckets_param(buckets: Buckets, axis: str) -> str:
    return f"{axis}=" + ",".join(str(s) for s in buckets.sizes.get(axis, ()))


TEXT_IN = tensor("TEXT", "object", B, 1, doc="UTF-8 text, one per item")


def text_config(name: str, comp: Component, options: RepoOptions) -> dict[str, Any]:
    ids, ids_lengths = comp.main.inputs[:2]  # e.g. ids, lengths; sequences, sequence_lengths
    config = model_config(
        name,
        [TEXT_IN],
        [ids, tensor(ids_lengths.name, "int64", B, 1)],
        options.max_batch_size,
        backend="python",
        reshape=False,
        parameters={
            "text": json.dumps(comp.info.meta["text"]),
            "buckets": _buckets_param(options.buckets, "symbols"),
        },
    )
    doc = f"The text front end of {comp.model_dir.name} ({comp.info.kind}): text -> ids."
    return {**config, "_class": "TextFrontEnd", "_doc": doc}


def asr_configs(comp: Component, options: RepoOptions) -> dict[str, dict[str, Any]]:
    feats, feat_lengths = comp.main.inputs[:2]
    log_probs, lp_lengths = comp.main.outputs[:2]
    meta, kind = comp.info.meta, comp.info.kind
    if "features" not in meta or "labels" not in meta:
        raise SpeechRTError(f"{comp.model_dir}: model.json lacks labels/features")
    audio = tensor("AUDIO", "float32", B, "samples", doc="at the model's sample rate")
    audio_lengths = tensor("AUDIO_LENGTHS", "int64", B, 1, default=0)  # absent: whole rows
    features = model_config(
        f"{kind}.features",
        [audio, audio_lengths],
        [feats, tensor(feat_lengths.name, "int64", B, 1)],
        options.max_batch_size,
        backend="python",
        reshape=False,
        parameters={
            "features": json.dumps(meta["features"]),
            "pad_leading": str(int(meta.get("pad_leading", 0))),
            "buckets": _buckets_param(options.buckets, "feature_frames"),
        },
    )
    ctc = model_config(
        f"{kind}.ctc",
        [log_probs, tensor(lp_lengths.name, "int64", B, 1)],
        [tensor("TEXT", "object", B, 1)],
        options.max_batch_size,
        backend="python",
        reshape=False,
        parameters={"labels": json.dumps(list(meta["labels"]))},
    )
    where = f"{comp.model_dir.name} ({kind})"
    return {
        f"{kind}.features": {
            **features,
            "_class": "Features",
            "_doc": f"The ASR features of {where}: audio -> log-mel.",
        },
        f"{kind}.ctc": {
            **ctc,
            "_class": "CTCGreedy",
            "_doc": f"Greedy CTC decoding of {where}: log-probs -> text.",
        },
    }


def ensembles(
    components: Sequence[Component], options: RepoOptions, notes: list[str]
) -> dict[str, dict[str, Any]]:
    """`tts` for one acoustic model and one vocoder fed by the mel alone, `asr` for one ASR
    model; `notes` says why one is missing."""
    by_role: dict[str, list[Component]] = {}
    for comp in components:
        by_role.setdefault(comp.role, []).append(comp)
    out = {}
    for comp in by_role.get("parts", []):
        notes.append(f"{comp.info.kind}: its decoder loops until its stop gate, no ensemble")
    acoustic, vocoders = by_role.get("acoustic", []), by_role.get("vocoder", [])
    if len(acoustic) == 1 and len(vocoders) == 1:
        a, v = acoustic[0], vocoders[0]
        required = [t.name for t in v.main.inputs if not t.optional]
        if required != ["mel", "mel_lengths"]:
            notes.append(f"tts: {v.info.kind} takes {required} (no ensemble)")
        else:
            if a.info.mel is None or v.info.mel is None:
                raise SpeechRTError("acoustic model or vocoder lacks a mel config")
            a.info.mel.check_matches(v.info.mel)
            out["tts"] = tts_ensemble(a, v, options)
    elif acoustic or vocoders:
        notes.append("tts: needs one acoustic model and one vocoder (no ensemble)")
    asr = by_role.get("asr", [])
    if len(asr) == 1:
        out["asr"] = asr_ensemble(asr[0], options)
    elif asr:
        notes.append("asr: more than one ASR model (no ensemble)")
    return out


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, Any]:
    """One ensemble step; maps are {model's tensor name: ensemble tensor name}."""
    return {
        "model_name": model,
        "model_version": -1,
        "input_map": [{"key": k, "value": v} for k, v in inputs.items()],
        "output_map": [{"key": k, "value": v} for k, v in outputs.items()],
    }


def _ensemble(
    name: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    steps: list[dict[str, Any]],
    options: RepoOptions,
) -> dict[str, Any]:
    return model_config(
        name,
        inputs,
        outputs,
        options.max_batch_size,
        platform="ensemble",
        reshape=False,
        extra={"ensemble_scheduling": {"step": steps}},
    )


def tts_ensemble(a: Component, v: Component, options: RepoOptions) -> dict[str, Any]:
    ids, ids_lengths = a.main.inputs[:2]
    acoustic = next(iter(a.names))
    vocoder = next(iter(v.names))
    steps = [
        _step(
            f"{a.info.kind}.text", {"TEXT": "TEXT"}, {n: n for n in (ids.name, ids_lengths.name)}
        ),
        _step(
            acoustic,
            {n: n for n in (ids.name, ids_lengths.name)},
            {"mel": "mel", "mel_lengths": "mel_lengths"},
        ),
        _step(
            vocoder,
            {"mel": "mel", "mel_lengths": "mel_lengths"},
            {"audio": "AUDIO", "audio_lengths": "AUDIO_LENGTHS"},
        ),
    ]
    outputs = [tensor("AUDIO", "float32", B, "samples"), tensor("AUDIO_LENGTHS", "int64", B, 1)]
    return _ensemble("tts", [TEXT_IN], outputs, steps, options)


def asr_ensemble(comp: Component, options: RepoOptions) -> dict[str, Any]:
    kind = comp.info.kind
    feats, feat_lengths = comp.main.input_names[:2]
    log_probs, lp_lengths = comp.main.output_names[:2]
    steps = [
        _step(f"{kind}.features", {"AUDIO": "AUDIO"}, {feats: feats, feat_lengths: feat_lengths}),
        _step(
            next(iter(comp.names)),
            {feats: feats, feat_lengths: feat_lengths},
            {log_probs: log_probs, lp_lengths: lp_lengths},
        ),
        _step(f"{kind}.ctc", {log_probs: log_probs, lp_lengths: lp_lengths}, {"TEXT": "TEXT"}),
    ]
    audio = tensor("AUDIO", "float32", B, "samples", doc="one clip per row, whole rows")
    return _ensemble("asr", [audio], [tensor("TEXT", "object", B, 1)], steps, options)
