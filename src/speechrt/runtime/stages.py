"""Pipeline stages on top of runners: (ids, options) -> mel -> audio -> denoised audio.

A stage turns what a pipeline has (padded arrays, lengths, SynthesisOptions, per-item seeds) into
a graph's named inputs, runs its runner and returns what the runner returns. The plain stages
(acoustic, vocoder, denoiser) work on torch tensors for the eager and cuda runners and on numpy
arrays for the onnx runner, so a voice on onnxruntime never imports torch. An architecture's own
stage (a decoder loop, noise per item; speechrt.arch.Graph.own_stage) works on torch
tensors: on the onnx backend `TorchOnnx` adapts its runners (one host copy in, one out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias, cast

import numpy as np
import numpy.typing as npt

from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.registry import contract, graphs_of
from speechrt.registry import graph as registry_graph
from speechrt.repo import ComponentInfo
from speechrt.runtime.base import Runner
from speechrt.runtime.buckets import Buckets

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

# An array is a torch Tensor (eager, cuda) or a numpy array (onnx); these helpers make the one
# the stage is handed, on its device: float32 (mel, audio) or int64 (ids, lengths, seeds) on
# numpy. (A string: torch is imported for type checking only.)
Array: TypeAlias = "Tensor | npt.NDArray[np.float32] | npt.NDArray[np.int64]"


def full_like_batch(like: Array, value: float | int, integer: bool = False) -> Array:
    """(B,) filled with `value` (float32, or int64), where `like` (B, ...) lives."""
    B = like.shape[0]
    if isinstance(like, np.ndarray):
        if integer:
            return np.full((B,), value, dtype=np.int64)
        return np.full((B,), value, dtype=np.float32)
    import torch

    dtype = torch.long if integer else torch.float32
    return torch.full((B,), value, dtype=dtype, device=like.device)


def as_float32(x: Array) -> Array:
    return x.astype(np.float32, copy=False) if isinstance(x, np.ndarray) else x.float()


class TorchOnnx:
    """An OnnxRunner seen from torch: tensors in, tensors (on `device`) out."""

    backend = "onnx"

    def __init__(self, runner: Runner, device: torch.device) -> None:
        self.runner = runner
        self.contract = runner.contract
        self.device = device

    def run(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        import torch

        arrays = {k: v.detach().cpu().numpy() for k, v in feeds.items()}
        out = self.runner.run(arrays)
        return {k: torch.from_numpy(v).to(self.device) for k, v in out.items()}


def make_runner(
    graph: str,
    model: nn.Module | None,
    info: ComponentInfo,
    backend: str,
    device: torch.device | str,
    precision: str = "fp32",
    model_dir: str | Path | None = None,
    buckets: Buckets | None = None,
    compile_mode: str | None = "reduce-overhead",
    numpy: bool = False,
) -> Runner:
    """A runner for `graph` of a loaded component (float32; eager keeps the model's own dtype).
    On the onnx backend `model` may be None; `numpy` keeps the onnx runner on numpy arrays,
    else it is adapted to torch tensors on `device`."""
    c = contract(graph, info.dims)
    if backend == "onnx":
        from speechrt.runtime.onnx import OnnxRunner, RegulatedOnnxRunner

        if precision != "fp32":
            raise SpeechRTError("the onnx backend runs the exported float32 graphs: use fp32")
        if model_dir is None:
            raise SpeechRTError("the onnx backend needs the model directory")
        from speechrt.repo import check_weight_dims

        check_weight_dims(model_dir, info)  # the module is never built: no strict load checks
        path = Path(model_dir) / graphs_of(info.kind)[graph]
        kind = device if isinstance(device, str) else device.type
        regulated = registry_graph(graph).regulated
        runner: OnnxRunner = (
            RegulatedOnnxRunner(path, c, regulated, device=kind)
            if regulated is not None
            else OnnxRunner(path, c, device=kind)
        )
        if numpy:
            return runner
        import torch

        return TorchOnnx(runner, torch.device(device))
    from speechrt.runtime.graphs import build_graph

    if model is None:
        raise SpeechRTError(f"the {backend} backend needs the loaded model")
    wrapper = build_graph(graph, model, info)
    if backend == "eager":
        from speechrt.runtime.eager import EagerRunner

        return EagerRunner(wrapper, c)
    if backend == "cuda":
        import torch

        from speechrt.device import PRECISIONS
        from speechrt.runtime.cuda import cuda_runner

        dtype = PRECISIONS[precision]
        return cuda_runner(
            graph,
            wrapper,
            c,
            device=torch.device(device),
            dtype=dtype,
            buckets=buckets,
            mode=compile_mode,
        )
    raise SpeechRTError(f"unknown backend {backend!r}")


def acoustic_feeds(
    names: list[str], ids: Array, lengths: Array, options: SynthesisOptions, seeds: Array
) -> dict[str, Array]:
    """The acoustic graph's inputs from a padded id batch and the call's options (arrays of
    the ids' kind, on their device)."""
    every = {
        "ids": lambda: ids,
        "lengths": lambda: lengths,
        "pace": lambda: full_like_batch(ids, options.pace),
        "pitch_shift": lambda: full_like_batch(ids, options.pitch_shift),
        "pitch_scale": lambda: full_like_batch(
            ids, 0.0 if options.pitch_flatten else options.pitch_scale
        ),
        "speaker": lambda: full_like_batch(ids, options.speaker, integer=True),
    }
    missing = [n for n in names if n not in every]
    if missing:
        raise SpeechRTError(f"no pipeline value for acoustic inputs {missing}")
    return {n: every[n]() for n in names}


class AcousticStage:
    """ids (B, L), lengths (B,) -> mel (B, n_mels, T), mel_lengths (B,) through a runner."""

    def __init__(self, runner: Runner, n_speakers: int = 1) -> None:
        self.runner = runner
        self.n_speakers = n_speakers

    def __call__(
        self, ids: Array, lengths: Array, options: SynthesisOptions, seeds: Array
    ) -> tuple[Array, Array]:
        out = self.outputs(ids, lengths, options, seeds)
        return out["mel"], out["mel_lengths"]

    def outputs(
        self, ids: Array, lengths: Array, options: SynthesisOptions, seeds: Array
    ) -> dict[str, Array]:
        """Every output of the graph by name (FastPitch's durations (B, L) among them)."""
        if options.speaker >= self.n_speakers:
            raise SpeechRTError(f"speaker id {options.speaker} out of range [0, {self.n_speakers})")
        names = self.runner.contract.input_names
        return self.runner.run(acoustic_feeds(names, ids, lengths, options, seeds))

    def runners(self) -> list[Runner]:
        return [self.runner]


# HiFi-GAN's receptive field reaches about 14 mel frames either side of a frame (V1: conv_pre 3,
# the first stage's widest resblock 60 samples at 8 per frame = 7.5, the rest ~3); a chunk
# carries this many frames of real context each side, so its audio equals the whole call's.
CHUNK_CONTEXT = 24
# On the CPU, HiFi-GAN V1 holds ~120 kB per mel frame of a batch: long mels run in chunks
CPU_CHUNK_FRAMES = 512


def vocode_span(
    vocode: Callable[[Array, Array], tuple[Array, Array]],
    mel: Array,
    mel_lengths: Array,
    a: int,
    b: int,
) -> Array:
    """audio (B, (b - a) * hop) of mel frames [a, b) of mel (B, n_mels, T), vocoded with
    CHUNK_CONTEXT frames of real context either side, so that spans join without a seam."""
    T = mel.shape[-1]
    s, e = max(0, a - CHUNK_CONTEXT), min(T, b + CHUNK_CONTEXT)
    # an item that ends before this span gets 1 frame here; its audio is cut by the caller
    audio, _ = vocode(mel[:, :, s:e], (mel_lengths - s).clip(1, e - s))
    hop = audio.shape[1] // (e - s)  # audio samples per mel frame
    return audio[:, (a - s) * hop : (b - s) * hop]


def vocode_in_chunks(
    vocode: Callable[[Array, Array], tuple[Array, Array]],
    mel: Array,
    mel_lengths: Array,
    chunk_frames: int | None,
    head: tuple[int, Callable[[Array], None]] | None = None,
) -> tuple[Array, Array]:
    """vocode(mel (B, n_mels, t), lengths (B,)) -> (audio (B, t * hop), lengths), over chunks.

    A mel longer than chunk_frames (+ CHUNK_CONTEXT) runs as chunks of chunk_frames frames, each
    with CHUNK_CONTEXT frames of real context either side (vocode_span), and their audio is
    joined: peak memory follows the chunk, not the utterance, and the audio equals one call's
    within float rounding (tested). chunk_frames None: one call. Torch tensors or numpy arrays.
    `head` (frames, on_head): where every item is longer than frames + CHUNK_CONTEXT, the first
    chunk is `frames` long and on_head(audio (B, frames * hop)) hears it before the rest is
    vocoded (a stream's first audio); else it is not called."""
    T, c = mel.shape[-1], chunk_frames or mel.shape[-1]
    split = head is not None and int(mel_lengths.min()) > head[0] + CHUNK_CONTEXT
    if not split and c + CHUNK_CONTEXT >= T:
        return vocode(mel, mel_lengths)
    starts = [0, *range(head[0], T, c)] if split and head is not None else [*range(0, T, c)]
    pieces = []
    for a, b in zip(starts, [*starts[1:], T], strict=True):
        pieces.append(vocode_span(vocode, mel, mel_lengths, a, b))
        if split and head is not None and a == 0:
            head[1](pieces[0])
    hop = pieces[0].shape[1] // starts[1] if len(starts) > 1 else pieces[0].shape[1] // T
    # vocode gives back the kind of array it is given: numpy pieces for a numpy mel, else torch
    if isinstance(mel, np.ndarray):
        host = cast("list[npt.NDArray[np.float32]]", pieces)
        audio = np.concatenate(host, 1)  # (B, T * hop)
        audio_lengths = cast("npt.NDArray[np.int64]", mel_lengths) * hop
        keep = np.arange(audio.shape[1])[None, :] < audio_lengths[:, None]
        return audio * keep, audio_lengths
    import torch

    joined = torch.cat(cast("list[Tensor]", pieces), 1)
    joined_lengths = cast("Tensor", mel_lengths).to(joined.device) * hop
    inside = torch.arange(joined.shape[1], device=joined.device)[None, :] < joined_lengths[:, None]
    return joined * inside, joined_lengths


class VocoderStage:
    """mel (B, n_mels, T), mel_lengths (B,) -> audio (B, S) float32, audio_lengths (B,);
    in chunks of `chunk_frames` (vocode_in_chunks) when given."""

    def __init__(self, runner: Runner, chunk_frames: int | None = None) -> None:
        self.runner, self.chunk_frames = runner, chunk_frames

    def __call__(
        self,
        mel: Array,
        mel_lengths: Array,
        options: SynthesisOptions,
        seeds: Array,
        head: tuple[int, Callable[[Array], None]] | None = None,
    ) -> tuple[Array, Array]:
        """`head`: see vocode_in_chunks (a stream's first frames, heard before the rest)."""
        return vocode_in_chunks(self.vocode, mel, mel_lengths, self.chunk_frames, head)

    def vocode(self, mel: Array, mel_lengths: Array) -> tuple[Array, Array]:
        out = self.runner.run({"mel": as_float32(mel), "mel_lengths": mel_lengths})
        return out["audio"], out["audio_lengths"]

    def runners(self) -> list[Runner]:
        return [self.runner]


class DenoiserStage:
    """audio (B, S), audio_lengths (B,), strength -> denoised audio (B, S) float32."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def __call__(self, audio: Array, audio_lengths: Array, strength: float) -> Array:
        feeds = {
            "audio": as_float32(audio),
            "audio_lengths": audio_lengths,
            "strength": full_like_batch(audio, float(strength)),
        }
        return self.runner.run(feeds)["denoised"]

    def runners(self) -> list[Runner]:
        return [self.runner]


class Stage(Protocol):
    """What a voice's acoustic or vocoder stage is: (x, x_lengths, options, seeds) ->
    (y, y_lengths), the plain ones above or an architecture's own (speechrt.arch.Graph.own_stage:
    those take torch tensors only, never the numpy arrays of numpy_stages)."""

    def __call__(
        self, x: Array, x_lengths: Array, options: SynthesisOptions, seeds: Array, /
    ) -> tuple[Array, Array]: ...

    def runners(self) -> list[Runner]: ...


@dataclass(frozen=True)
class StageParts:
    """What a component's pipeline stage is built from. An architecture whose stage is not the
    plain one (a runner per graph call) gives its graph module a `stage(parts)` function."""

    model: nn.Module
    info: ComponentInfo
    graphs: list[str]  # the component's graphs (speechrt.contracts.graphs_of), in order
    runner: Callable[[str], Runner]  # graph name -> its runner on the pipeline's backend
    backend: str
    device: torch.device
    buckets: Buckets | None
    compile_mode: str | None


def numpy_stages(backend: str, kinds: list[str]) -> bool:
    """Whether a voice of these component kinds runs on numpy arrays: on the onnx backend when
    the plain stages serve every component (no architecture's own stage, which works in torch)."""
    mains = [registry_graph(next(iter(graphs_of(kind)))) for kind in kinds]
    return backend == "onnx" and not any(g.own_stage for g in mains)


class TTSStages:
    """The acoustic, vocoder and (built on first use) denoiser stages of one voice; `numpy`
    (onnx backend only, see numpy_stages): they take and return numpy arrays, and the loaded
    modules may be None."""

    def __init__(
        self,
        backend: str,
        device: torch.device | str,
        precision: str,
        acoustic: tuple[nn.Module | None, ComponentInfo, str | Path],
        vocoder: tuple[nn.Module | None, ComponentInfo, str | Path],
        buckets: Buckets | None = None,
        compile_mode: str | None = "reduce-overhead",
        numpy: bool = False,
    ) -> None:
        self.backend, self.device, self.precision = backend, device, precision
        self.buckets, self.compile_mode = buckets, compile_mode
        self.numpy = numpy
        self._vocoder = vocoder
        # an architecture's own stage (Tacotron 2's decoder loop, WaveGlow's noise), else the
        # plain one: one run of the component's graph per call
        a_info, v_info = acoustic[1], vocoder[1]
        self.acoustic: Stage = self._stage(*acoustic) or AcousticStage(
            self._runner(next(iter(graphs_of(a_info.kind))), *acoustic),
            int(a_info.dims.get("n_speakers", 1)),
        )
        device_type = device if isinstance(device, str) else device.type
        chunk = CPU_CHUNK_FRAMES if device_type == "cpu" else None
        self.vocoder: Stage = self._stage(*vocoder) or VocoderStage(
            self._runner(next(iter(graphs_of(v_info.kind))), *vocoder), chunk
        )
        self._denoiser: DenoiserStage | None = None

    def _stage(
        self, model: nn.Module | None, info: ComponentInfo, model_dir: str | Path
    ) -> Stage | None:
        """The architecture's own stage, where its graph module defines one (else None)."""
        from speechrt.runtime.graphs import stage_builder

        graphs = list(graphs_of(info.kind))
        build = stage_builder(graphs[0])
        if build is None:
            return None
        if model is None or isinstance(self.device, str):
            raise SpeechRTError(f"{model_dir}: a {info.kind} stage needs its loaded model")
        parts = StageParts(
            model,
            info,
            graphs,
            lambda graph: self._runner(graph, model, info, model_dir),
            self.backend,
            self.device,
            self.buckets,
            self.compile_mode,
        )
        return build(parts)

    def runners(self) -> dict[str, Runner]:
        """{graph name: runner} of every runner the stages hold (the denoiser's built now, where
        the voice can denoise: see denoiser_missing)."""
        found = [*self.acoustic.runners(), *self.vocoder.runners()]
        if self.denoiser_missing is None:
            found += self.denoiser.runners()
        return {r.contract.name: r for r in found}

    @property
    def denoiser_missing(self) -> str | None:
        """Why this voice cannot denoise, or None when it can: on the onnx backend the denoiser
        runs from its own ONNX graph, which a vocoder directory may not hold (the bundled voice
        does not ship it)."""
        if self.backend != "onnx":
            return None
        _, info, model_dir = self._vocoder
        file = graphs_of(info.kind)["denoiser"]
        if (Path(model_dir) / file).is_file():
            return None
        return (
            f"the voice runs on the onnx backend and {model_dir} holds no denoiser graph "
            f"({file}); export it (speechrt export {model_dir} --graph denoiser) or use the "
            "eager backend (--backend eager)"
        )

    def _runner(
        self, graph: str, model: nn.Module | None, info: ComponentInfo, model_dir: str | Path
    ) -> Runner:
        return make_runner(
            graph,
            model,
            info,
            self.backend,
            self.device,
            self.precision,
            model_dir,
            self.buckets,
            self.compile_mode,
            self.numpy,
        )

    @property
    def denoiser(self) -> DenoiserStage:
        if self._denoiser is None:
            if self.denoiser_missing is not None:
                raise SpeechRTError(f"cannot denoise: {self.denoiser_missing}")
            self._denoiser = DenoiserStage(self._runner("denoiser", *self._vocoder))
        return self._denoiser
