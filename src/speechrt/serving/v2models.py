"""The models the KServe v2 routes serve: the `tts` and `asr` pipelines and each component graph.

Every model is a `ContractModel`: its contract (speechrt.contracts.Contract) is its
`/v2/models/{name}` metadata, and `check` turns a decoded request into the contract's inputs
(optional inputs filled with their defaults) or a SpeechRTError (HTTP 400). Every dynamic axis of
its inputs has a largest size (`max_sizes`: batch, symbols, and the audio-time axes as
`axis_limits` derives them from the server's Limits), checked before anything runs and shown in
the metadata as each input's `max_shape`.

A component model runs one graph of a loaded component through a runtime runner on its pipeline's
backend (eager, cuda or onnx), exactly as its contract says. One request is one batch item of its
engine: requests whose inputs have the same shapes (apart from the batch) are stacked into one
call, and each gets back its own rows, cropped to what it would get alone. Pipeline requests are
split into texts / waveforms, which the pipelines' engines batch.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np

from speechrt.contracts import B, Contract, TensorSpec
from speechrt.errors import SpeechRTError
from speechrt.limits import Limits
from speechrt.options import SynthesisKeywords, SynthesisOptions
from speechrt.registry import derived_sizes, graphs_of
from speechrt.runtime.base import Runner
from speechrt.runtime.bounds import stack_rows
from speechrt.serving.engine import Engine
from speechrt.serving.pipelines import ASRService, TTSService
from speechrt.serving.v2metadata import (
    ASR,
    KSERVE_DATATYPES,
    TTS,
    HostArray,
    ModelMetadata,
    component_names,
    model_metadata,
)
from speechrt.serving.voices import Voice

if TYPE_CHECKING:
    from torch import nn

    from speechrt.asr import ASR as Recogniser
    from speechrt.repo import ComponentInfo

Arrays = dict[str, HostArray]


def pad_stack(arrays: Sequence[HostArray], axis: int) -> tuple[HostArray, HostArray]:
    """Right-pad arrays along `axis` with zeros and stack -> (B, ...), lengths (B,) int64."""
    axis = axis % arrays[0].ndim
    lengths = np.array([a.shape[axis] for a in arrays], dtype=np.int64)
    shape = list(arrays[0].shape)
    shape[axis] = int(lengths.max())
    out = np.zeros((len(arrays), *shape), dtype=arrays[0].dtype)
    for i, a in enumerate(arrays):
        index = [i] + [slice(None)] * a.ndim
        index[1 + axis] = slice(0, a.shape[axis])
        out[tuple(index)] = a
    return out, lengths


def split_rows(x: HostArray, lengths: HostArray | None, axis: int, name: str) -> list[HostArray]:
    """(B, ...) padded along `axis` (an axis of one row) + lengths (B,) -> B trimmed rows."""
    if lengths is None:
        return [row for row in x]
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != x.shape[0]:
        raise SpeechRTError(f"{name}: {x.shape[0]} rows but {lengths.shape[0]} lengths")
    limit = x.shape[1 + axis]
    if lengths.size and (lengths.min() < 1 or lengths.max() > limit):
        raise SpeechRTError(f"{name}: lengths must lie in [1, {limit}]")
    return [np.take(row, np.arange(int(n)), axis=axis) for row, n in zip(x, lengths, strict=True)]


def axis_limits(info: ComponentInfo, limits: Limits, max_batch: int) -> dict[str, int]:
    """{dynamic axis: largest size a request may give} for a component (its
    speechrt.repo.ComponentInfo): `batch`, `symbols`, and each audio-time axis long enough for
    `limits.max_component_seconds` of audio at the component's own rates: mel `frames` and
    `samples` (and WaveGlow's latent `groups`) from its mel config, `samples` and
    `feature_frames` from an ASR model's feature config."""
    from speechrt.audio.features import FeatureConfig

    out = {"batch": max_batch, "symbols": limits.max_symbols}
    seconds = limits.max_component_seconds
    mel = getattr(info, "mel", None)
    meta = getattr(info, "meta", {}) or {}
    if mel is not None:
        samples = math.ceil(seconds * mel.sampling_rate)
        out["samples"] = samples
        out["frames"] = math.ceil(samples / mel.hop_length)
        # WaveGlow's latent z (B, n_group, groups): frames * hop / n_group
        out["groups"] = math.ceil(out["frames"] * mel.hop_length / info.dims.get("n_group", 8))
    elif "features" in meta:
        fc = FeatureConfig.from_dict(meta["features"])
        samples = math.ceil(seconds * fc.sample_rate)
        frames = samples // fc.hop_length + 1  # centred STFT frames, then padded to pad_align
        out["samples"] = samples
        align = max(fc.pad_align, 1)  # NeMo's features are not padded (pad_align 0)
        out["feature_frames"] = math.ceil(frames / align) * align
    return out


class ContractModel:
    """A v2 model behind a Contract; subclasses define name, platform, contract and infer."""

    name: str
    platform: str
    backend: str = "eager"  # the runtime backend it runs on (its config's `backend`)
    contract: Contract
    optional: frozenset[str] = frozenset()  # inputs a request may leave out, besides defaults
    max_sizes: dict[str, int]  # {dynamic axis: largest size}, one for every axis of the inputs

    def is_optional(self, name: str) -> bool:
        return self.contract.spec(name).optional or name in self.optional

    def set_limits(self, max_sizes: dict[str, int]) -> None:
        """Every dynamic axis of the inputs needs a limit: a model without one is not served."""
        axes = {a for t in self.contract.inputs for a in t.dynamic_axes().values()}
        missing = sorted(axes - set(max_sizes))
        if missing:
            raise SpeechRTError(f"model {self.name!r}: no size limit for axes {missing}")
        self.max_sizes = {a: n for a, n in max_sizes.items() if a in axes}

    def max_shape(self, t: TensorSpec) -> list[int]:
        """The largest shape a request may give for input `t` (with the batch axis)."""
        return [a if isinstance(a, int) else self.max_sizes[a] for a in t.shape]

    def metadata(self) -> ModelMetadata:
        """The `/v2/models/{name}` body: the contract's, each input with its `max_shape`."""
        meta = model_metadata(self.contract, self.name, self.platform)
        for entry, t in zip(meta["inputs"], self.contract.inputs, strict=True):
            entry["max_shape"] = self.max_shape(t)
        return meta

    def _check_size(self, t: TensorSpec, shape: tuple[int, ...]) -> None:
        for dim, axis in t.dynamic_axes().items():
            if shape[dim] > self.max_sizes[axis]:
                raise SpeechRTError(
                    f"model {self.name!r}: axis {axis!r} of input {t.name!r} is {shape[dim]}; "
                    f"the limit is {self.max_sizes[axis]}"
                )

    def check(self, inputs: Arrays, datatypes: dict[str, str]) -> Arrays:
        """The request's inputs checked against the contract, defaults filled in."""
        c, where = self.contract, f"model {self.name!r}"
        for name in inputs:
            if name not in c.input_names:
                raise SpeechRTError(
                    f"{where} has no input {name!r}; inputs: {', '.join(c.input_names)}"
                )
        for t in c.inputs:
            if t.name not in inputs:
                if not self.is_optional(t.name):
                    raise SpeechRTError(f"{where} needs input {t.name!r}")
                continue
            want, got = KSERVE_DATATYPES[t.dtype], datatypes.get(t.name)
            if got != want:
                raise SpeechRTError(f"{where}: input {t.name!r} must be {want}, got {got}")
        sizes: dict[str, int] = {}
        for t in c.inputs:
            if t.name in inputs:
                t.check(inputs[t.name], sizes, self.name)
                self._check_size(t, inputs[t.name].shape)
        batch = sizes["batch"]
        if batch == 0:
            raise SpeechRTError(f"{where}: the batch is empty")
        feeds = dict(inputs)
        for t in c.inputs:
            if t.name not in feeds and t.default is not None:
                feeds[t.name] = np.full((batch,), t.default, dtype=t.dtype)
            value = feeds.get(t.name)
            if value is None:
                continue
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise SpeechRTError(f"{where}: input {t.name!r} holds NaN or infinity")
            t.check_values(value, sizes, self.name)
        return feeds

    async def infer(self, inputs: Arrays, params: dict[str, object]) -> Arrays:
        raise NotImplementedError


# -- components ----------------------------------------------------------------------------------


# KServe v2 `platform` of a component model per runtime backend (Triton's platform names)
PLATFORMS = {"eager": "pytorch_libtorch", "cuda": "pytorch_libtorch", "onnx": "onnxruntime_onnx"}


class Component(NamedTuple):
    """A component graph as the server runs it: v2 name, runner, the axes it derives, and what
    the component is (speechrt.repo.ComponentInfo: its rates bound the audio-time axes)."""

    name: str
    runner: Runner
    derived_sizes: Callable[[dict[str, int]], dict[str, int]] | None
    info: ComponentInfo


def component_runners(
    tts: Voice | None, asr: Recogniser | None
) -> tuple[list[Component], dict[str, str]]:
    """Every graph of the loaded components of a voice (speechrt.tts.TTS) and an ASR model
    (speechrt.asr.ASR), each on its pipeline's backend, running the pipeline's own runners
    (`runners()`): one onnxruntime session, one compiled copy per graph, whatever the route, and
    everything runs on the server's one device thread. Stand-ins without components give none.

    Also {v2 name: why it is not served} for the graphs the onnx backend has no ONNX file for
    (a vocoder's denoiser: the bundled voice ships only its main graphs). Any other graph the
    backend cannot run raises SpeechRTError here, at startup, naming the component.
    """
    from speechrt.asr import ASR as Recogniser
    from speechrt.runtime.stages import make_runner
    from speechrt.tts import TTS

    parts: list[tuple[nn.Module | None, ComponentInfo, TTS | Recogniser, Path | None]] = []
    if isinstance(tts, TTS):
        parts += [
            (tts.acoustic, tts.acoustic_info, tts, tts.acoustic_dir),
            (tts.vocoder, tts.vocoder_info, tts, tts.vocoder_dir),
        ]
    if isinstance(asr, Recogniser):
        parts.append((asr.model, asr.info, asr, asr.model_dir))
    out, unserved = [], {}
    for module, info, owner, model_dir in parts:
        backend = getattr(owner, "backend", "eager")
        precision = getattr(owner, "precision", "fp32")
        buckets = getattr(getattr(owner, "stages", None), "buckets", None)
        # a graph the pipeline holds no runner for (cuda Tacotron 2 compiles its decoder step
        # into its loop) gets its own
        shared = owner.runners()
        for name, graph in component_names(info.kind).items():
            file = Path(model_dir or ".") / graphs_of(info.kind)[graph]
            if backend == "onnx" and model_dir is not None and not file.is_file():
                unserved[name] = (
                    f"the onnx backend runs it from {file}, which does not exist; "
                    f"export it (speechrt export {model_dir} --graph {graph}) or serve with "
                    "--backend eager"
                )
                continue
            try:
                runner = shared.get(graph) or make_runner(
                    graph, module, info, backend, owner.device, precision, model_dir, buckets
                )
            except SpeechRTError as e:
                raise SpeechRTError(f"component {name!r} on the {backend} backend: {e}") from None
            out.append(Component(name, runner, derived_sizes(graph, info.dims), info))
    return out, unserved


def run_arrays(runner: Runner, feeds: Arrays) -> Arrays:
    """numpy arrays in and out, whatever the runner takes: an OnnxRunner (what a pipeline on
    numpy stages holds) runs them as they are; the torch runners (eager, cuda, onnx seen from
    torch) get tensors, and their outputs come back to the host."""
    from speechrt.runtime.onnx import OnnxRunner

    if isinstance(runner, OnnxRunner):
        return runner.run(feeds)
    import torch

    out = runner.run({k: torch.from_numpy(v) for k, v in feeds.items()})
    return {k: v.detach().cpu().numpy() for k, v in out.items()}


def rows_per_call(contract: Contract, feeds: Arrays, max_sizes: dict[str, int]) -> int:
    """How many rows of `feeds` (rows of equal shapes) hold at most one item's worth of every
    limited axis (max_sizes, the batch axis aside): a call's memory and time grow with rows x
    the length of its symbols, frames or samples."""
    rows = per_call = len(feeds[contract.input_names[0]])
    for t in contract.inputs:
        for dim, axis in t.dynamic_axes().items():
            if dim > 0 and axis in max_sizes:
                per_call = min(
                    per_call, max(1, max_sizes[axis] // max(1, feeds[t.name].shape[dim]))
                )
    return max(1, min(rows, per_call))


def row_slices(rows: int, per_call: int) -> list[HostArray]:
    return [np.arange(a, min(a + per_call, rows)) for a in range(0, rows, per_call)]


class ComponentAdapter:
    """Runs batches of whole requests (each a dict of contract inputs) on the device thread.

    Requests are joined along each tensor's batch axis: the first for most, the second for a
    recurrent state (layers, batch, hidden), as parakeet.predict's h and c.
    `derived_sizes`: the graph's sizes -> the output axes it derives from them (default: the
    runner's torch graph's `derived_sizes`, where it has one). `max_sizes`: the inputs' axis
    limits (axis_limits); a batch whose rows hold more than one item at the limit of an axis
    runs in calls of as many rows as fit (rows_per_call: a HiFi-GAN batch of 8 x 30 s mels
    runs as 8 calls of one, ~165 MB each, instead of one of 1.3 GB), joined into its outputs.
    """

    def __init__(
        self,
        runner: Runner,
        derived_sizes: Callable[[dict[str, int]], dict[str, int]] | None = None,
        max_sizes: dict[str, int] | None = None,
    ) -> None:
        self.runner = runner
        self.contract = runner.contract
        self.derived_sizes = derived_sizes or getattr(
            getattr(runner, "graph", None), "derived_sizes", None
        )
        tensors = self.contract.inputs + self.contract.outputs
        self.batch_dim = {t.name: t.shape.index(B) for t in tensors if B in t.shape}
        self.max_sizes = {a: n for a, n in (max_sizes or {}).items() if a != "batch"}

    def length(self, item: Arrays) -> int:
        """What its compute grows with: rows x its longest axis (only items of equal shapes
        share a batch, so nothing is padded; the batcher bounds a batch's predicted time)."""
        first = item[self.contract.input_names[0]]
        return len(first) * max((n for n in first.shape[1:]), default=1)

    def key(self, item: Arrays) -> Hashable:
        shapes = []
        for t in self.contract.inputs:
            shape = list(item[t.name].shape)
            del shape[self.batch_dim[t.name]]
            shapes.append((t.name, tuple(shape)))
        return tuple(shapes)

    def run_batch(self, items: list[Arrays]) -> list[Arrays]:
        c = self.contract
        free = self._free_axes(items[0])
        if len(items) > 1 and None in free.values():  # no way to crop: run each alone
            return [out for item in items for out in self.run_batch([item])]
        dims = self.batch_dim
        feeds = {n: np.concatenate([it[n] for it in items], dims[n]) for n in c.input_names}
        if all(d == 0 for d in dims.values()):
            outs = self._run_rows(feeds)
        else:  # a batch axis past the first (LSTM states): one call
            outs = run_arrays(self.runner, feeds)
        first = c.input_names[0]
        results, start = [], 0
        for item in items:
            rows = slice(start, start + item[first].shape[dims[first]])
            start = rows.stop
            mine = {k: v[(slice(None),) * dims[k] + (rows,)] for k, v in outs.items()}
            # a free axis is as long as the batch's longest item: cut it to this request's own
            ends = {axis: int(mine[n].max(initial=0)) for axis, n in free.items() if n}
            for name, value in mine.items():
                for dim, axis in c.spec(name).dynamic_axes().items():
                    if axis in ends:
                        value = value[(slice(None),) * dim + (slice(0, ends[axis]),)]
                mine[name] = np.ascontiguousarray(value)
            results.append(mine)
        return results

    def _run_rows(self, feeds: Arrays) -> Arrays:
        """The runner's outputs for a batch (rows of equal shapes), in calls of rows_per_call."""
        rows = len(feeds[self.contract.input_names[0]])
        per_call = rows_per_call(self.contract, feeds, self.max_sizes)
        if per_call >= rows:
            return run_arrays(self.runner, feeds)
        groups = row_slices(rows, per_call)
        parts = [run_arrays(self.runner, {k: v[g] for k, v in feeds.items()}) for g in groups]
        return stack_rows(parts, groups)

    def _free_axes(self, item: Arrays) -> dict[str, str | None]:
        """Output axes that neither an input's shape nor the graph fixes (e.g. FastPitch's
        frames) -> the output counting each item's length along them (None: none does)."""
        c = self.contract
        fixed = {a for t in c.inputs for a in t.shape if isinstance(a, str)}
        sizes = {a: item[t.name].shape[i] for t in c.inputs for i, a in t.dynamic_axes().items()}
        fixed |= set(self.derived_sizes(sizes)) if self.derived_sizes else set()
        free: dict[str, str | None] = {}
        for t in c.outputs:
            for axis in t.dynamic_axes().values():
                if axis not in fixed:
                    free[axis] = next((o.name for o in c.outputs if o.counts == axis), None)
        return free


class ComponentModel(ContractModel):
    """One graph of a component behind its shared contract, run on `backend` (its platform:
    onnxruntime_onnx for onnx, pytorch_libtorch for eager and cuda)."""

    def __init__(
        self,
        name: str,
        contract: Contract,
        engine: Engine[Arrays, Arrays],
        backend: str = "eager",
    ) -> None:
        self.name, self.contract, self.engine = name, contract, engine
        self.backend, self.platform = backend, PLATFORMS[backend]
        self.timeout = 60.0

    async def infer(self, inputs: Arrays, params: dict[str, object]) -> Arrays:
        """One batch item per group of rows holding at most one item's worth of every axis
        (rows_per_call): a request of 8 x 30 s mels is 8 items, so that other requests take
        their turns on the device between them."""
        rows = len(inputs[self.contract.input_names[0]])
        limits = {a: n for a, n in self.max_sizes.items() if a != "batch"}
        groups = row_slices(rows, rows_per_call(self.contract, inputs, limits))
        batch_first = all(t.shape.index(B) == 0 for t in self.contract.inputs if B in t.shape)
        if len(groups) == 1 or not batch_first:  # LSTM states (batch second): not split
            (out,) = await self.engine.infer([inputs], self.timeout)
            return out
        items = [{k: v[g] for k, v in inputs.items()} for g in groups]
        return stack_rows(await self.engine.infer(items, self.timeout), groups)


# -- pipelines -----------------------------------------------------------------------------------

_OPTION_FIELDS = {f.name for f in fields(SynthesisOptions)}


def options_from_params(params: Mapping[str, object]) -> SynthesisOptions:
    """Request parameters named like SynthesisOptions fields (pace, speaker, seed, ...)."""
    given: dict[str, float] = {}
    for k, v in params.items():
        if k not in _OPTION_FIELDS:
            continue
        if isinstance(v, bool) != (k == "pitch_flatten") or not isinstance(v, (int, float)):
            raise SpeechRTError(f"parameter {k!r} has the wrong type ({type(v).__name__})")
        given[k] = v
    for k in ("seed", "speaker", "max_decoder_steps"):
        if k in given and not isinstance(given[k], int):
            raise SpeechRTError(f"parameter {k!r} must be an integer")
    # checked above: numbers, bool for pitch_flatten alone, int where the field is one
    return SynthesisOptions(**cast(SynthesisKeywords, given))


class TTSModel(ContractModel):
    """TEXT (BYTES [B], or [B, 1] as Triton clients send it) -> AUDIO (FP32 [B, S],
    zero-padded) + AUDIO_LENGTHS (INT64 [B]).

    Parameters: any SynthesisOptions field; text i uses seed `seed + i` (default seed 0).
    """

    name = "tts"
    platform = "speechrt_pipeline"
    contract = TTS

    def __init__(self, service: TTSService) -> None:
        self.service = service
        self.backend = getattr(service.tts, "backend", "eager")

    def check(self, inputs: Arrays, datatypes: dict[str, str]) -> Arrays:
        text = inputs.get("TEXT")
        if text is not None and text.ndim == 2 and text.shape[1] == 1:
            inputs = {**inputs, "TEXT": text.reshape(-1)}
        return super().check(inputs, datatypes)

    async def infer(self, inputs: Arrays, params: dict[str, object]) -> Arrays:
        texts = []
        for i, t in enumerate(inputs["TEXT"].reshape(-1)):
            try:
                texts.append(t.decode("utf-8") if isinstance(t, bytes) else str(t))
            except UnicodeDecodeError:
                raise SpeechRTError(f"TEXT element {i} is not UTF-8") from None
        if not texts:
            raise SpeechRTError("TEXT holds no texts")
        options = options_from_params(params)
        seeds = [options.seed + i for i in range(len(texts))]
        audio = await self.service.synthesize(texts, options, seeds)
        padded, lengths = pad_stack(audio, axis=0)
        return {"AUDIO": padded.astype(np.float32), "AUDIO_LENGTHS": lengths}


class ASRModel(ContractModel):
    """AUDIO (FP32 [B, S] at the model's rate, or `sample_rate` parameter) + optional
    AUDIO_LENGTHS (INT64 [B]) -> TEXT (BYTES [B])."""

    name = "asr"
    platform = "speechrt_pipeline"
    contract = ASR
    optional = frozenset({"AUDIO_LENGTHS"})

    def __init__(self, service: ASRService) -> None:
        self.service = service
        self.backend = getattr(service.asr, "backend", "eager")

    async def infer(self, inputs: Arrays, params: dict[str, object]) -> Arrays:
        sr = params.get("sample_rate", self.service.sampling_rate)
        if not isinstance(sr, int) or isinstance(sr, bool) or not 1000 <= sr <= 384_000:
            raise SpeechRTError(f"parameter 'sample_rate' must be an integer in Hz, got {sr!r}")
        rows = split_rows(inputs["AUDIO"], inputs.get("AUDIO_LENGTHS"), 0, self.name)
        if not rows:
            raise SpeechRTError("AUDIO holds no rows")
        # FP32 (check): astype is a no-op that names the dtype
        audios = await asyncio.gather(
            *(self.service.prepare(r.astype(np.float32, copy=False), sr) for r in rows)
        )
        transcripts = await self.service.transcribe(audios)
        text = np.array([t.text.encode("utf-8") for t in transcripts], dtype=object)
        return {"TEXT": text}
