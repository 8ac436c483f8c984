"""What a running server holds: the device thread, one engine per model, services and metrics.

`Server.load(...)` builds it from model directories; tests may build one from any objects that
honour the pipeline interfaces (`TTS.text_to_pieces / ids_to_audio`, `ASR.transcribe`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speechrt.errors import SpeechRTError
from speechrt.serving.engine import BatchConfig, DeviceWorker, Engine
from speechrt.serving.metrics import Metrics
from speechrt.serving.pipelines import ASRAdapter, ASRService, Limits, TTSAdapter, TTSService
from speechrt.serving.v2models import (
    ASRModel,
    ComponentAdapter,
    ComponentModel,
    TTSModel,
    V2Model,
    component_runners,
)

log = logging.getLogger("speechrt.serving")

# Model names the OpenAI API accepts for each pipeline (besides the pipeline's own name).
TTS_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
ASR_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
BACKENDS = ("auto", "eager")


@dataclass
class ServeConfig:
    batch: BatchConfig = field(default_factory=BatchConfig)
    limits: Limits = field(default_factory=Limits)
    components: bool = True  # also serve each component over KServe v2


class Server:
    """Engines and services for whatever pipelines were given; start()/stop() in the loop."""

    def __init__(self, tts: Any = None, asr: Any = None, config: ServeConfig | None = None):
        if tts is None and asr is None:
            raise SpeechRTError("nothing to serve: give a voice (--acoustic, --vocoder) or --asr")
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.worker = DeviceWorker()
        self.engines: dict[str, Engine[Any, Any]] = {}
        self.v2: dict[str, V2Model] = {}
        self.tts: TTSService | None = None
        self.asr: ASRService | None = None
        self.ready = False
        limits = self.config.limits
        if tts is not None:
            self.tts = TTSService(tts, self._engine("tts", TTSAdapter(tts)), limits)
            self.v2["tts"] = TTSModel(self.tts)
        if asr is not None:
            self.asr = ASRService(asr, self._engine("asr", ASRAdapter(asr)), limits)
            self.v2["asr"] = ASRModel(self.asr)
        if self.config.components:
            self._add_components(tts, asr)

    def _engine(self, name: str, adapter: Any) -> Engine[Any, Any]:
        if name in self.engines:
            raise SpeechRTError(f"two models are called {name!r}")
        engine: Engine[Any, Any] = Engine(
            name, adapter, self.worker, self.config.batch, self.metrics.record_batch
        )
        self.engines[name] = engine
        self.metrics.register_engine(name, lambda: engine.pending)
        return engine

    def _add_components(self, tts: Any, asr: Any) -> None:
        for name, runner in component_runners(tts, asr):
            engine = self._engine(name, ComponentAdapter(runner))
            model = ComponentModel(name, runner.contract, engine)
            model.timeout = self.config.limits.request_timeout_s
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
    ) -> Server:
        """Load the pipelines from model directories (see `speechrt convert`)."""
        if backend not in BACKENDS:
            raise SpeechRTError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
        if (acoustic is None) != (vocoder is None):
            raise SpeechRTError("a voice needs both --acoustic DIR and --vocoder DIR")
        tts_pipe = asr_pipe = None
        if acoustic is not None:
            from speechrt.tts import TTS

            tts_pipe = TTS(acoustic, vocoder, device=device, precision=precision)
        if asr is not None:
            from speechrt.asr import ASR

            asr_pipe = ASR(asr, device=device, precision=precision)
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
        for engine in self.engines.values():
            engine.start()
        self.ready = True
        log.info("serving %s", ", ".join(self.v2))

    async def stop(self) -> None:
        """Refuse new work, let every queued and running batch finish, stop the device thread."""
        import asyncio

        self.ready = False
        await asyncio.gather(*(engine.close() for engine in self.engines.values()))
        self.worker.close()
