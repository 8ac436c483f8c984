"""TTS split over Ray Serve deployments: text front end | acoustic model | vocoder.

    SplitTTS (ingress, HTTP)  text -> sentence pieces (ids)         no model, only the symbols
      -> AcousticModel        ids (B, L) -> mel (B, n_mels, T)      its own replicas
      -> VocoderModel         mel (B, n_mels, T) -> audio (B, S)    its own replicas (+ denoiser)

Each piece is one call to each stage; the ingress passes the acoustic call's response straight
to the vocoder (Ray resolves it on the vocoder's replica: the mel never comes back through the
ingress). Both stages batch with serve.batch and run pieces that ask for the same options
(SynthesisOptions less the seed, as the in-process engine does) together; every piece keeps its
own seed, so its audio does not depend on its batch-mates. The audio equals TTS.synthesize's for
the same texts, options and seeds within float32 rounding (tests/test_ray.py states the bound).

Each stage replica loads the voice (both graphs: speechrt.tts.TTS loads the pair, checking their
mel configs match) and runs one of them. POST /v1/audio/speech takes the OpenAI body (not
streamed); the whole server's other routes are not here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
from fastapi import FastAPI
from fastapi.responses import Response
from ray import serve
from ray.exceptions import RayTaskError

from speechrt.audio import codecs
from speechrt.errors import SpeechRTError
from speechrt.front_end import text_to_pieces
from speechrt.limits import Limits
from speechrt.options import SynthesisOptions
from speechrt.pieces import Piece, join_pieces
from speechrt.repo import read_info
from speechrt.serving.http_errors import HANDLERS, ApiError
from speechrt.serving.openai_api import TTS_ALIASES, SpeechRequest, speech_options
from speechrt.serving.pipelines import SpeechFrontEnd
from speechrt.serving.ray_app import replica_env
from speechrt.serving.voices import Audio

if TYPE_CHECKING:
    from ray.serve import Application
    from ray.serve.handle import DeploymentHandle

    from speechrt.runtime.stages import Array

MAX_BATCH = 8  # items per stage batch (split_tts_app(max_batch_size=...) sets it)
WAIT_S = 0.005  # longest wait for batch-mates
Mel = npt.NDArray[np.float32]  # (n_mels, T) of one piece
P = ParamSpec("P")
R = TypeVar("R")


def _groups(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indices of equal keys, in first-seen order: the batches a stage runs."""
    out: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return list(out.values())


class _Stage:
    """One voice loaded (speechrt.tts.TTS) in a stage replica; batches are run off the
    replica's event loop so that the next batch gathers while one runs."""

    def __init__(
        self, acoustic: str, vocoder: str, backend: str, device: str, precision: str, batch: int
    ) -> None:
        from speechrt.tts import TTS

        self.tts = TTS(acoustic, vocoder, device=device, precision=precision, backend=backend)
        self.run.set_max_batch_size(batch)  # type: ignore[attr-defined]

    def _host(self, x: Array) -> npt.NDArray[np.float32] | npt.NDArray[np.int64]:
        return x if isinstance(x, np.ndarray) else x.float().cpu().numpy()

    def _device(self, x: npt.NDArray[np.float32] | npt.NDArray[np.int64]) -> Array:
        if self.tts.numpy:
            return x
        import torch

        return torch.from_numpy(x).to(self.tts.device)

    def _inference(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        if self.tts.numpy:
            return fn(*args, **kwargs)
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)


class AcousticModel(_Stage):
    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def run(
        self, ids: list[list[int]], seeds: list[int], options: list[SynthesisOptions]
    ) -> list[Mel]:
        """Per piece (serve.batch gathers each argument into a list): its symbol ids, seed and
        options -> its mel (n_mels, T) float32."""
        return await asyncio.to_thread(self._inference, self._mels, ids, seeds, options)

    def _mels(
        self, ids: list[list[int]], seeds: list[int], options: list[SynthesisOptions]
    ) -> list[Mel]:
        out: list[Mel] = [np.empty(0, np.float32)] * len(ids)
        for idx in _groups(options):
            batch = [Piece(0, j, ids[i], seeds[i]) for j, i in enumerate(idx)]
            tokens, lengths, seed_array = self.tts.batch_to_tensors(batch)
            mel, mel_lengths = self.tts.ids_to_mel(tokens, lengths, options[idx[0]], seed_array)
            mel, mel_lengths = self._host(mel), self._host(mel_lengths)  # (B, n_mels, T), (B,)
            for j, i in enumerate(idx):
                out[i] = mel[j, :, : int(mel_lengths[j])].copy()
        return out


class VocoderModel(_Stage):
    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
    async def run(
        self, mels: list[Mel], seeds: list[int], options: list[SynthesisOptions]
    ) -> list[Audio]:
        """Per piece: its mel (n_mels, T), seed and options -> its audio (S,) float32."""
        return await asyncio.to_thread(self._inference, self._audio, mels, seeds, options)

    def denoiser_missing(self) -> str | None:
        """Why the voice cannot denoise, or None (the ingress refuses such requests)."""
        return self.tts.denoiser_missing

    def _audio(
        self, mels: list[Mel], seeds: list[int], options: list[SynthesisOptions]
    ) -> list[Audio]:
        out: list[Audio] = [np.empty(0, np.float32)] * len(mels)
        for idx in _groups(options):
            opts = options[idx[0]]
            lengths = np.array([mels[i].shape[1] for i in idx], dtype=np.int64)
            mel = np.zeros((len(idx), mels[idx[0]].shape[0], int(lengths.max())), np.float32)
            for j, i in enumerate(idx):  # zero-padded, as the acoustic stage pads its output
                mel[j, :, : lengths[j]] = mels[i]
            seed_array: Array = np.array([seeds[i] for i in idx], dtype=np.int64)
            if not self.tts.numpy:
                import torch

                seed_array = torch.from_numpy(seed_array)  # seeds stay on the host
            batch = (self._device(mel), self._device(lengths))
            audio, audio_lengths = self.tts.mel_to_audio(*batch, opts, seed_array)
            if opts.denoise > 0:
                audio = self.tts.denoise(audio, audio_lengths, opts.denoise)
            for j, wave in enumerate(self.tts.to_numpy(audio, audio_lengths)):
                out[idx[j]] = wave
        return out


@serve.ingress()  # the app is built per replica (speech_app), with the replica's state
class SplitTTS:
    """The text front end and the HTTP route; the models run in the two stage deployments."""

    def __init__(
        self,
        acoustic: DeploymentHandle,  # AcousticModel's
        vocoder: DeploymentHandle,  # VocoderModel's
        acoustic_dir: str,
        sampling_rate: int,
        limits: Limits,
    ) -> None:
        from speechrt.defaults import voice_name
        from speechrt.text import TextProcessor

        info = read_info(Path(acoustic_dir))
        self.text = TextProcessor.from_meta(info.meta)
        self.name = voice_name(acoustic_dir)  # as TTS names it
        self.n_speakers = int(info.dims.get("n_speakers", 1))
        self.acoustic, self.vocoder = acoustic, vocoder
        self.sampling_rate = sampling_rate
        # the server's front end (pipelines.SpeechFrontEnd): its limits, checks and pieces
        self.front_end = SpeechFrontEnd(functools.partial(text_to_pieces, self.text), limits)
        self.asked_denoiser = False

    async def synthesize(
        self, texts: list[str], options: SynthesisOptions, seeds: list[int]
    ) -> list[Audio]:
        """As TTS.synthesize: one float32 waveform per text, pieces joined by short pauses.
        Texts are checked and split by the server's own front end (pipelines.SpeechFrontEnd:
        characters, symbols after normalisation and SSML, pieces, the denoiser)."""
        if not self.asked_denoiser:  # the vocoder stage's voice knows; it does not change
            missing = await self.vocoder.denoiser_missing.remote()
            self.front_end.denoiser_missing, self.asked_denoiser = missing, True
        base = replace(options, seed=0)  # the seed travels with each piece
        pieces, keys = await self.front_end.read(texts, base, seeds)
        calls = [
            self.vocoder.run.remote(self.acoustic.run.remote(p.ids, p.seed, k), p.seed, k)
            for p, k in zip(pieces, keys, strict=True)
        ]
        try:
            waves = await asyncio.gather(*calls)
        except RayTaskError as e:  # a stage refused the request (e.g. no denoiser graph)
            if isinstance(e.cause, SpeechRTError):
                raise e.cause from None
            raise
        return [
            join_pieces(  # the pauses between pieces, and SSML breaks
                [p for p in pieces if p.item == i],
                [w for p, w in zip(pieces, waves, strict=True) if p.item == i],
                self.sampling_rate,
            )
            for i in range(len(texts))
        ]

    def __serve_build_asgi_app__(self) -> FastAPI:
        return speech_app(self)


def speech_app(tts: SplitTTS) -> FastAPI:
    """POST /v1/audio/speech (the OpenAI body, not streamed) answered by `tts`."""
    app = FastAPI(title="speechrt split TTS", exception_handlers=dict(HANDLERS), docs_url=None)

    @app.post("/v1/audio/speech")
    async def speech(body: SpeechRequest) -> Response:
        # the checks of the server's own route (openai_api), then the split pipeline's
        options = speech_options(body, ["tts", *TTS_ALIASES], tts.name, tts.n_speakers)
        if body.stream_format is not None:
            raise ApiError(
                400, "the split pipeline does not stream", "unsupported_stream", "stream_format"
            )
        fmt = body.response_format
        (audio,) = await tts.synthesize([body.input], options, [body.seed])
        data = await asyncio.to_thread(codecs.encode, audio, tts.sampling_rate, fmt)
        rate = codecs.output_rate(fmt, tts.sampling_rate)
        headers = {"X-Sample-Rate": str(rate)}
        return Response(data, media_type=codecs.MEDIA_TYPES[fmt], headers=headers)

    return app


def split_tts_app(
    acoustic: str,
    vocoder: str,
    *,
    acoustic_replicas: int = 1,
    vocoder_replicas: int = 1,
    max_batch_size: int = MAX_BATCH,
    max_queue_size: int = 256,
    backend: str = "auto",
    device: str = "auto",
    precision: str = "fp32",
    cpus: float = 1.0,
    gpus: float = 0.0,
    limits: Limits | None = None,
) -> Application:
    """The split pipeline as one Serve application (ingress SplitTTS); `cpus`, `gpus`: per
    stage replica; `max_queue_size`: requests a deployment holds beyond one batch;
    `limits`: the text limits apply (max_text_chars, max_text_symbols, max_pieces)."""
    actor = {"num_cpus": cpus, "num_gpus": gpus, "runtime_env": {"env_vars": replica_env()}}
    stage = (acoustic, vocoder, backend, device, precision, max_batch_size)
    # serve.batch needs >= max_batch_size; more wait in the stage's batch queue, not in Ray's
    # router, which retries a full replica with growing back-off
    ongoing = max_batch_size + max_queue_size
    acoustic_model = (
        serve.deployment(AcousticModel)
        .options(
            num_replicas=acoustic_replicas, max_ongoing_requests=ongoing, ray_actor_options=actor
        )
        .bind(*stage)
    )
    vocoder_model = (
        serve.deployment(VocoderModel)
        .options(
            num_replicas=vocoder_replicas, max_ongoing_requests=ongoing, ray_actor_options=actor
        )
        .bind(*stage)
    )
    info = read_info(Path(vocoder))
    assert info.mel is not None
    # The ingress runs the text front end only (milliseconds a sentence) and waits on the
    # stages: it reserves no CPU, as Ray's own proxy does, so A + V replicas fit A + V CPUs.
    ingress = serve.deployment(SplitTTS).options(
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": replica_env()}},
    )
    rate = info.mel.sampling_rate
    return ingress.bind(acoustic_model, vocoder_model, acoustic, rate, limits or Limits())
