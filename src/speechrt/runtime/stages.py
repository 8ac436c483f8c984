"""Pipeline stages on top of runners: (ids, options) -> mel -> audio -> denoised audio.

A stage turns what a pipeline has (padded tensors, lengths, SynthesisOptions, per-item seeds) into
a graph's named inputs, runs its runner and returns torch tensors on the pipeline's device. The
onnx runner works on numpy; `TorchOnnx` adapts it (one host copy in, one out, per stage).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from speechrt.device import PRECISIONS
from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.registry import contract, graphs_of
from speechrt.repo import ComponentInfo
from speechrt.runtime.base import Runner
from speechrt.runtime.buckets import Buckets

if TYPE_CHECKING:
    from speechrt.models.waveglow import WaveGlow


class TorchOnnx:
    """An OnnxRunner seen from torch: tensors in, tensors (on `device`) out."""

    backend = "onnx"

    def __init__(self, runner: Any, device: torch.device) -> None:
        self.runner = runner
        self.contract = runner.contract
        self.device = device

    def run(self, feeds: Mapping[str, Tensor]) -> dict[str, Tensor]:
        arrays = {k: v.detach().cpu().numpy() for k, v in feeds.items()}
        out = self.runner.run(arrays)
        return {k: torch.from_numpy(v).to(self.device) for k, v in out.items()}


def make_runner(
    graph: str,
    model: nn.Module,
    info: ComponentInfo,
    backend: str,
    device: torch.device,
    precision: str = "fp32",
    model_dir: str | Path | None = None,
    buckets: Buckets | None = None,
    compile_mode: str | None = "reduce-overhead",
) -> Runner:
    """A runner for `graph` of a loaded component (float32; eager keeps the model's own dtype)."""
    from speechrt.runtime.graphs import build_graph

    c = contract(graph, info.dims)
    if backend == "onnx":
        from speechrt.runtime.onnx import OnnxRunner

        if precision != "fp32":
            raise SpeechRTError("the onnx backend runs the exported float32 graphs: use fp32")
        if model_dir is None:
            raise SpeechRTError("the onnx backend needs the model directory")
        path = Path(model_dir) / graphs_of(info.kind)[graph]
        return TorchOnnx(OnnxRunner(path, c, device=device.type), device)
    wrapper = build_graph(graph, model, info)
    if backend == "eager":
        from speechrt.runtime.eager import EagerRunner

        return EagerRunner(wrapper, c)
    if backend == "cuda":
        from speechrt.runtime.cuda import cuda_runner

        dtype = PRECISIONS[precision]
        return cuda_runner(
            graph, wrapper, c, device=device, dtype=dtype, buckets=buckets, mode=compile_mode
        )
    raise SpeechRTError(f"unknown backend {backend!r}")


def acoustic_feeds(
    names: list[str], ids: Tensor, lengths: Tensor, options: SynthesisOptions, seeds: Tensor
) -> dict[str, Tensor]:
    """The acoustic graph's inputs from a padded id batch and the call's options."""
    B = ids.shape[0]
    every = {
        "ids": lambda: ids,
        "lengths": lambda: lengths,
        "pace": lambda: torch.full((B,), options.pace),
        "pitch_shift": lambda: torch.full((B,), options.pitch_shift),
        "pitch_scale": lambda: torch.full(
            (B,), 0.0 if options.pitch_flatten else options.pitch_scale
        ),
        "speaker": lambda: torch.full((B,), options.speaker, dtype=torch.long),
    }
    missing = [n for n in names if n not in every]
    if missing:
        raise SpeechRTError(f"no pipeline value for acoustic inputs {missing}")
    return {n: every[n]().to(ids.device) for n in names}


class AcousticStage:
    """ids (B, L), lengths (B,) -> mel (B, n_mels, T), mel_lengths (B,) through a runner."""

    def __init__(self, runner: Runner, n_speakers: int = 1) -> None:
        self.runner = runner
        self.n_speakers = n_speakers

    def __call__(
        self, ids: Tensor, lengths: Tensor, options: SynthesisOptions, seeds: Tensor
    ) -> tuple[Tensor, Tensor]:
        if options.speaker >= self.n_speakers:
            raise SpeechRTError(f"speaker id {options.speaker} out of range [0, {self.n_speakers})")
        names = self.runner.contract.input_names
        out = self.runner.run(acoustic_feeds(names, ids, lengths, options, seeds))
        return out["mel"], out["mel_lengths"]


# HiFi-GAN's receptive field reaches about 14 mel frames either side of a frame (V1: conv_pre 3,
# the first stage's widest resblock 60 samples at 8 per frame = 7.5, the rest ~3); a chunk
# carries this many frames of real context each side, so its audio equals the whole call's.
CHUNK_CONTEXT = 24
# On the CPU, HiFi-GAN V1 holds ~120 kB per mel frame of a batch: long mels run in chunks
CPU_CHUNK_FRAMES = 512


def vocode_in_chunks(
    vocode: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
    mel: Tensor,
    mel_lengths: Tensor,
    hop: int,
    chunk_frames: int | None,
) -> tuple[Tensor, Tensor]:
    """vocode(mel (B, n_mels, t), lengths (B,)) -> (audio (B, t * hop), lengths), over chunks.

    A mel longer than chunk_frames (+ CHUNK_CONTEXT) runs as chunks of chunk_frames frames, each
    with CHUNK_CONTEXT frames of real context either side, and their audio is joined: peak memory
    follows the chunk, not the utterance, and the audio equals one call's within float rounding
    (tested). chunk_frames None: one call."""
    T, c = mel.shape[-1], chunk_frames
    if c is None or c + CHUNK_CONTEXT >= T:
        return vocode(mel, mel_lengths)
    pieces = []
    for a in range(0, T, c):
        b = min(a + c, T)
        s, e = max(0, a - CHUNK_CONTEXT), min(T, b + CHUNK_CONTEXT)
        # an item that ends before this chunk gets 1 frame here; its audio is cut below
        audio, _ = vocode(mel[:, :, s:e], (mel_lengths - s).clamp(1, e - s))
        pieces.append(audio[:, (a - s) * hop : (b - s) * hop])
    audio = torch.cat(pieces, 1)  # (B, T * hop)
    audio_lengths = mel_lengths.to(audio.device) * hop
    keep = torch.arange(audio.shape[1], device=audio.device)[None, :] < audio_lengths[:, None]
    return audio * keep, audio_lengths


class VocoderStage:
    """mel (B, n_mels, T), mel_lengths (B,) -> audio (B, S) float32, audio_lengths (B,);
    in chunks of `chunk_frames` (vocode_in_chunks) when given."""

    def __init__(self, runner: Runner, hop: int, chunk_frames: int | None = None) -> None:
        self.runner, self.hop, self.chunk_frames = runner, hop, chunk_frames

    def __call__(
        self, mel: Tensor, mel_lengths: Tensor, options: SynthesisOptions, seeds: Tensor
    ) -> tuple[Tensor, Tensor]:
        return vocode_in_chunks(self.vocode, mel, mel_lengths, self.hop, self.chunk_frames)

    def vocode(self, mel: Tensor, mel_lengths: Tensor) -> tuple[Tensor, Tensor]:
        out = self.runner.run({"mel": mel.float(), "mel_lengths": mel_lengths})
        return out["audio"], out["audio_lengths"]


class WaveGlowStage:
    """WaveGlow: the latent noise is drawn per item from its seed on the CPU, as
    WaveGlow.mel_to_audio draws it, and handed to the graph as `z`."""

    def __init__(self, runner: Runner, model: WaveGlow) -> None:
        self.runner, self.model = runner, model

    def __call__(
        self, mel: Tensor, mel_lengths: Tensor, options: SynthesisOptions, seeds: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        from speechrt.runtime.graphs.waveglow import noise

        B, _, T = mel.shape
        seed_list = [options.seed + i for i in range(B)] if seeds is None else seeds.tolist()
        sigma = self.model.default_sigma if options.sigma is None else options.sigma
        z = noise(self.model, mel_lengths.cpu(), T, seed_list, sigma).to(mel.device)
        feeds = {"mel": mel.float(), "mel_lengths": mel_lengths, "z": z}
        out = self.runner.run(feeds | {"sigma": torch.full((B,), sigma, device=mel.device)})
        return out["audio"], out["audio_lengths"]


class DenoiserStage:
    """audio (B, S), audio_lengths (B,), strength -> denoised audio (B, S) float32."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def __call__(self, audio: Tensor, audio_lengths: Tensor, strength: float) -> Tensor:
        B = audio.shape[0]
        feeds = {
            "audio": audio.float(),
            "audio_lengths": audio_lengths,
            "strength": torch.full((B,), float(strength), device=audio.device),
        }
        return self.runner.run(feeds)["denoised"]


class TTSStages:
    """The acoustic, vocoder and (built on first use) denoiser stages of one voice."""

    def __init__(
        self,
        backend: str,
        device: torch.device,
        precision: str,
        acoustic: tuple[nn.Module, ComponentInfo, str | Path],
        vocoder: tuple[nn.Module, ComponentInfo, str | Path],
        buckets: Buckets | None = None,
        compile_mode: str | None = "reduce-overhead",
    ) -> None:
        self.backend, self.device, self.precision = backend, device, precision
        self.buckets, self.compile_mode = buckets, compile_mode
        self._vocoder = vocoder
        a_model, a_info, _ = acoustic
        a_graphs = list(graphs_of(a_info.kind))
        if a_info.kind == "tacotron2":
            from speechrt.models.tacotron2 import Tacotron2
            from speechrt.runtime.tacotron2 import tacotron2_stage

            assert isinstance(a_model, Tacotron2)

            on_cuda = backend == "cuda"  # its loop compiles the decoder step itself
            runners = [None if on_cuda and "decoder" in g else self._runner(g, *acoustic)
                       for g in a_graphs]  # fmt: skip
            self.acoustic: Any = tacotron2_stage(
                a_model.dims, runners, backend, a_model.decoder, device, buckets, compile_mode
            )
        else:
            runner = self._runner(a_graphs[0], *acoustic)
            self.acoustic = AcousticStage(runner, int(a_info.dims.get("n_speakers", 1)))
        v_model, v_info, _ = vocoder
        v_runner = self._runner(next(iter(graphs_of(v_info.kind))), *vocoder)
        if v_info.kind == "waveglow":
            from speechrt.models.waveglow import WaveGlow

            assert isinstance(v_model, WaveGlow)
            self.vocoder: Any = WaveGlowStage(v_runner, v_model)
        else:
            from speechrt.models.hifigan import HiFiGAN

            assert isinstance(v_model, HiFiGAN)
            chunk = CPU_CHUNK_FRAMES if device.type == "cpu" else None
            self.vocoder = VocoderStage(v_runner, v_model.dims.hop_length, chunk)
        self._denoiser: DenoiserStage | None = None

    def _runner(
        self, graph: str, model: nn.Module, info: ComponentInfo, model_dir: str | Path
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
        )

    @property
    def denoiser(self) -> DenoiserStage:
        if self._denoiser is None:
            self._denoiser = DenoiserStage(self._runner("denoiser", *self._vocoder))
        return self._denoiser
