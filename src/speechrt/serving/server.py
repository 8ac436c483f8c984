"""What a running server holds: the device thread, one engine per model, services and metrics.

`Server.load(...)` builds it from model directories; tests may build one from any objects that
honour the pipeline interfaces (`TTS.text_to_pieces / ids_to_audio`, `ASR.transcribe`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from speechrt.errors import SpeechRTError
from speechrt.runtime.base import BACKENDS as RUNTIME_BACKENDS
from speechrt.serving.engine import Adapter, BatchConfig, Batcher, DeviceWorker, Engine
from speechrt.serving.metrics import Metrics
from speechrt.serving.openai_api import ASR_ALIASES, TTS_ALIASES
from speechrt.serving.pipelines import (
    ASRAdapter,
    ASRService,
    Limits,
    TTSAdapter,
    TTSItem,
    TTSService,
)
from speechrt.serving.v2models import (
    ASRModel,
    ComponentAdapter,
    ComponentModel,
    ContractModel,
    TTSModel,
    axis_limits,
    component_runners,
)
from speechrt.serving.voices import Voice, loaded

if TYPE_CHECKING:
    from speechrt.asr import ASR
    from speechrt.asr.decoding import DecoderOptions

log = logging.getLogger("speechrt.serving")
In = TypeVar("In")  # an engine's batch item
Out = TypeVar("Out")  # its output
T = TypeVar("T")

BACKENDS = ("auto", *RUNTIME_BACKENDS)


@dataclass
class ServeConfig:
    batch: BatchConfig = field(default_factory=BatchConfig)
    limits: Limits = field(default_factory=Limits)
    components: bool = True  # also serve each component over KServe v2
    # ASR decoding processes (speechrt.asr.decoding); 0: one decoding thread; None: as many as
    # the cores beside the device thread on a GPU (at most 8), none on a CPU
    decode_workers: int | None = None
    # warm-up texts: before the server is ready, every batch size it can form runs once on each
    # (and on 7 s of speech-like audio for the recogniser), see Server.warm_up; None: none
    warmup: tuple[str, ...] | None = None
    # other protocols and access (speechrt.serving.grpc_app, speechrt.serving.auth)
    grpc_address: str | None = None  # "host:port" of Riva's and Triton's gRPC; None: none
    api_keys: tuple[str, ...] = ()  # the keys every request needs; none: no key needed
    rate_limit: float | None = None  # requests per second per key; None: no limit


# Any: a runner of any backend, its length-regulated parts probed (runtime/graphs wiring)
def bound_frames(runner: Any, limit: int) -> None:  # type: ignore[explicit-any]
    """Bound a length-regulated runner's frames per item (and so per batch: see
    speechrt.runtime.bounds) on every backend; FastPitch's and FastSpeech's frames are known
    only once they are encoded. Other runners are left as they are."""
    inner = getattr(runner, "runner", runner)  # an OnnxRunner seen from torch (TorchOnnx)
    regulated = getattr(inner, "regulated", None) is not None or hasattr(
        getattr(inner, "graph", None), "assemble"
    )
    if regulated and inner.backend in ("eager", "onnx", "cuda"):
        inner.max_frames = limit
        if hasattr(inner, "durations_session"):  # built now, not by the first long request
            inner.durations_session()


def return_freed_memory() -> None:
    """Have glibc's malloc give large freed blocks back to the system: blocks of 1 MiB and up
    are mapped on their own, instead of from heaps whose freed space stays resident (glibc
    raises its threshold to 32 MiB as large blocks are freed). After the same slow sentence
    three times the bundled voice's process kept +59 MB of RSS, with this +11 MB, at the same
    CPU time. Elsewhere than glibc, nothing."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        return
    if mallopt is not None:
        mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: fixed, so no longer raised as blocks are freed


class Server:
    """Engines and services for whatever pipelines were given; start()/stop() in the loop."""

    def __init__(
        self, tts: Voice | None = None, asr: ASR | None = None, config: ServeConfig | None = None
    ) -> None:
        if tts is None and asr is None:
            raise SpeechRTError("nothing to serve: give a voice (--acoustic, --vocoder) or --asr")
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.worker = DeviceWorker()
        self.engines: dict[str, Batcher] = {}  # their items differ: pieces, windows, tensors
        self.v2: dict[str, ContractModel] = {}
        self.unserved: dict[str, str] = {}  # component graph -> why it is not served
        self.tts: TTSService | None = None
        self.asr: ASRService | None = None
        self.ready = False
        limits = self.config.limits
        if tts is not None:
            voice = loaded(tts)
            if voice is not None:  # (a stand-in for a voice has no components)
                # the acoustic model's frames per item and per batch, whatever the route
                frames = axis_limits(voice.acoustic_info, limits, 1)["frames"]
                for runner in voice.runners().values():
                    bound_frames(runner, frames)
            self.tts = TTSService(tts, self._engine("tts", TTSAdapter(tts)), limits)
            self.v2["tts"] = TTSModel(self.tts)
            self.v2["tts"].set_limits({"batch": self.config.batch.max_batch_size})
        if asr is not None:
            pool, workers = None, self.config.decode_workers
            if workers is None:  # the GPU is idle behind the search; a CPU has no cores spare
                on_gpu = asr.backend == "cuda"
                workers = min(8, (os.cpu_count() or 1) - 1) if on_gpu else 0
            if workers > 0:
                from speechrt.asr.decoding import DecodePool

                pool = DecodePool(asr.decoding, workers)
            self.asr = ASRService(asr, self._engine("asr", ASRAdapter(asr)), limits, pool)
            self.v2["asr"] = ASRModel(self.asr)
            # AUDIO at the model's rate, as long as a transcription may be
            samples = math.ceil(limits.max_audio_seconds * self.asr.sampling_rate)
            self.v2["asr"].set_limits(
                {"batch": self.config.batch.max_batch_size, "samples": samples}
            )
        if self.config.components:
            self._add_components(tts, asr)

    def _engine(self, name: str, adapter: Adapter[In, Out]) -> Engine[In, Out]:
        if name in self.engines:
            raise SpeechRTError(f"two models are called {name!r}")
        engine: Engine[In, Out] = Engine(
            name,
            adapter,
            self.worker,
            self.config.batch,
            on_batch=self.metrics.record_batch,
            on_drop=lambda n: self.metrics.record_dropped(name, n),
        )
        self.engines[name] = engine
        self.metrics.register_engine(name, lambda: engine.pending)
        return engine

    def _add_components(self, tts: Voice | None, asr: ASR | None) -> None:
        components, self.unserved = component_runners(tts, asr)
        for name, runner, derived_sizes, info in components:
            sizes = axis_limits(info, self.config.limits, self.config.batch.max_batch_size)
            engine = self._engine(name, ComponentAdapter(runner, derived_sizes, sizes))
            model = ComponentModel(name, runner.contract, engine, runner.backend)
            model.timeout = self.config.limits.request_timeout_s
            model.set_limits(sizes)
            self.v2[name] = model

    @classmethod
    def load(
        cls,
        acoustic: str | Path | None = None,
        vocoder: str | Path | None = None,
        asr: str | Path | None = None,
        device: str = "auto",
        precision: str = "fp32",
        backend: str = "auto",
        config: ServeConfig | None = None,
        batch_invariant: bool = False,
        decoding: DecoderOptions | None = None,
    ) -> Server:
        """Load the pipelines from model directories (see `speechrt convert`).

        `backend` (auto, eager, cuda, onnx) is resolved per pipeline as the CLI's synthesize
        does (speechrt.runtime.resolve_backend: auto -> cuda on a GPU, else onnx when the
        pipeline's model dirs hold their main ONNX graphs, else eager); every component graph
        runs on its pipeline's backend. On onnx a graph without its ONNX file (a vocoder's
        denoiser) is not served (`unserved` says why) and a voice asked to denoise refuses the
        request; any other graph a backend cannot serve fails here. With every pipeline on
        onnx, torch is never imported.
        `batch_invariant` turns on speechrt.device.set_batch_invariant before anything runs;
        it needs the eager backend on the CPU in fp32. `decoding`: the recogniser's decoder
        keywords (speechrt.asr.ASR: decoder, lm, beam_size, alpha, beta; vad, absent: the
        model's own setting). Uploads, streamed transcriptions and realtime sessions all go
        through that one recogniser, so they share its voice activity detection.
        """
        from speechrt.runtime import device_kind, has_onnx, resolve_backend

        if backend not in BACKENDS:
            raise SpeechRTError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
        if (acoustic is None) != (vocoder is None):
            raise SpeechRTError("a voice needs both --acoustic DIR and --vocoder DIR")
        kind = device_kind(device)
        given = {"tts": [acoustic, vocoder], "asr": [asr]}
        dirs = {name: [d for d in ds if d is not None] for name, ds in given.items()}
        backends = {
            name: resolve_backend(backend, kind, ds, main_only=True)
            for name, ds in dirs.items()
            if ds
        }
        for name, resolved in backends.items():
            for d in dirs[name] if resolved == "onnx" else ():
                if (Path(d) / "model.json").is_file() and not has_onnx(d, main_only=True):
                    raise SpeechRTError(
                        f"--backend onnx: {d} lacks its main ONNX graph "
                        "(run `speechrt export DIR` on it first)"
                    )
        if set(backends.values()) <= {"onnx"}:
            dev = kind if device == "auto" else device  # torch is not asked (nor imported)
        else:
            from speechrt.device import resolve_device

            dev = str(resolve_device(device))
        if batch_invariant:
            used = sorted(set(backends.values()))
            if used != ["eager"] or kind != "cpu" or precision != "fp32":
                raise SpeechRTError(
                    "--batch-invariant needs the eager backend on the CPU in fp32 "
                    f"(got {'/'.join(used) or 'none'} on {kind} in {precision}); "
                    "use --backend eager --device cpu --precision fp32"
                )
            from speechrt.device import set_batch_invariant

            set_batch_invariant(True)  # before anything runs: MKL reads its setting once
        tts_pipe = asr_pipe = None
        if acoustic is not None:
            from speechrt.tts import TTS

            tts_pipe = TTS(
                acoustic, vocoder, device=dev, precision=precision, backend=backends["tts"]
            )
        if asr is not None:
            from speechrt.asr import ASR

            asr_pipe = ASR(
                asr,
                device=dev,
                precision=precision,
                backend=backends["asr"],
                **(decoding or {}),
            )
        return cls(tts_pipe, asr_pipe, config)

    # -- names ---------------------------------------------------------------------------------

    def openai_models(self) -> list[str]:
        names = []
        if self.tts is not None:
            names += ["tts", *TTS_ALIASES]
        if self.asr is not None:
            names += ["asr", *ASR_ALIASES]
        return names

    def pipeline_of(self, model: str) -> str | None:
        """'tts' / 'asr' for an OpenAI model name this server serves, else None."""
        if self.tts is not None and model in ("tts", *TTS_ALIASES):
            return "tts"
        if self.asr is not None and model in ("asr", *ASR_ALIASES):
            return "asr"
        return None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        import asyncio

        if self.asr is not None and self.asr.pool is not None:
            await asyncio.to_thread(self.asr.pool.warm)  # ready means the decoders are up
        if self.config.warmup is not None:
            await self.warm_up(self.config.warmup)
        for engine in self.engines.values():
            engine.start()
        # What start-up built (models, dictionaries, compiled graphs) lives as long as the
        # server: out of the cyclic collector's sight, a full collection under load scans only
        # what requests allocate. The bundled voice and recogniser hold ~160,000 objects: a
        # full collection took 47 ms with them, ~0 ms frozen (2-core CPU).
        gc.collect()
        gc.freeze()
        return_freed_memory()
        self.ready = True
        # e.g. "serving tts [onnx], asr [onnx], fastpitch [onnx], ...": each model's backend
        log.info("serving %s", ", ".join(f"{n} [{m.backend}]" for n, m in self.v2.items()))
        for name, why in self.unserved.items():
            log.warning("not serving %s: %s", name, why)

    async def warm_up(self, texts: Sequence[str]) -> None:
        """Run each batch size the engines can form (the runtime's batch buckets up to
        --max-batch-size) once, on the device thread: TTS on the first sentence of each text
        (and a stream's first chunk), ASR on 7 s of speech-like audio. A compiled backend (cuda)
        builds its graphs for those shapes here instead of in the first requests, which would
        otherwise wait seconds."""
        import asyncio
        import time

        from speechrt.bench.inputs import synthetic_speechlike
        from speechrt.options import SynthesisOptions
        from speechrt.runtime.buckets import DEFAULT_BUCKETS

        if not texts or not all(t.strip() for t in texts):
            raise SpeechRTError("a warm-up text is empty")
        top = self.config.batch.max_batch_size
        sizes = sorted({b for b in DEFAULT_BUCKETS["batch"] if b < top} | {top})
        steps = len(texts) * (len(sizes) + 1) * (self.tts is not None)
        steps += len(sizes) * (self.asr is not None)
        t0, done = time.perf_counter(), 0

        async def step(what: str, fn: Callable[[list[T]], object], batch: list[T]) -> None:
            nonlocal done
            await self.worker.run(partial(fn, batch))
            done += 1  # a compiled backend takes tens of seconds for a new shape: say so
            log.info("warm-up %d/%d: %s (%.1f s)", done, steps, what, time.perf_counter() - t0)

        if self.tts is not None:
            tts, adapter = self.tts.tts, TTSAdapter(self.tts.tts)
            for i, text in enumerate(texts):
                piece = (await asyncio.to_thread(tts.text_to_pieces, [text], [0]))[0]
                item = TTSItem(piece, piece.options(SynthesisOptions()))
                for b in sizes:
                    await step(f"tts text {i + 1}, batch {b}", adapter.run_batch, [item] * b)
                lead = TTSItem(piece, item.options, on_head=lambda audio: None)
                await step(f"tts text {i + 1}, a stream's lead", adapter.run_batch, [lead])
        if self.asr is not None:
            audio = synthetic_speechlike(7.0, self.asr.sampling_rate)
            (window,) = self.asr.asr.segments(0, audio)  # 7 s: one window
            heard = ASRAdapter(self.asr.asr)
            for b in sizes:
                await step(f"asr, batch {b}", heard.run_batch, [window] * b)
        log.info("warmed up batch sizes %s in %.1f s", sizes, time.perf_counter() - t0)

    async def stop(self) -> None:
        """Refuse new work, let every queued and running batch finish, stop the device thread."""
        import asyncio

        self.ready = False
        await asyncio.gather(*(engine.close() for engine in self.engines.values()))
        self.worker.close()
        gc.unfreeze()  # what start-up froze can be collected once the server is gone
        if self.asr is not None:
            self.asr.decoder.shutdown(wait=False)
            self.asr.uploads.shutdown(wait=False)
            if self.asr.pool is not None:
                await asyncio.to_thread(self.asr.pool.close)
