"""The models the KServe v2 routes serve: the `tts` and `asr` pipelines and each component.

A v2 model takes and returns named numpy arrays. Requests are split into rows, and every row is
one batch item of the model's engine, so rows of concurrent requests are batched together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import fields
from typing import Any, Protocol

import numpy as np
import torch

from speechrt.errors import SpeechRTError
from speechrt.options import SynthesisOptions
from speechrt.serving.contracts import ASR_SPEC, TTS_SPEC, ModelSpec, component_spec
from speechrt.serving.engine import Engine
from speechrt.serving.pipelines import ASRService, TTSService

Arrays = dict[str, np.ndarray]


class V2Model(Protocol):
    name: str
    platform: str
    spec: ModelSpec

    async def infer(self, inputs: Arrays, params: dict[str, Any]) -> Arrays: ...


def pad_stack(arrays: list[np.ndarray], axis: int) -> tuple[np.ndarray, np.ndarray]:
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


def split_rows(x: np.ndarray, lengths: np.ndarray | None, axis: int, name: str) -> list[np.ndarray]:
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


# -- components ----------------------------------------------------------------------------------


class ComponentAdapter:
    """One component on a batch of per-item arrays: pad in, run, trim out (device thread)."""

    def __init__(self, role: str, module: torch.nn.Module, device: torch.device, dtype: Any):
        self.role, self.module, self.device, self.dtype = role, module, device, dtype

    def length(self, item: np.ndarray) -> int:
        return int(item.shape[-1])

    def key(self, item: np.ndarray) -> Hashable:
        return None

    @torch.inference_mode()
    def run_batch(self, items: list[np.ndarray]) -> list[np.ndarray]:
        # items: ids (L,) | mel (n_mels, T) | features (F, T), padded along their last axis
        x, lengths = pad_stack(items, axis=-1)
        xt = torch.from_numpy(x).to(self.device)
        lt = torch.from_numpy(lengths).to(self.device)
        if self.role == "acoustic":  # ids (B, L) -> mel (B, n_mels, T)
            seeds = torch.zeros(len(items), dtype=torch.long)
            out, out_lengths = self.module.generate_mel(xt, lt, SynthesisOptions(), seeds)
        elif self.role == "vocoder":  # mel (B, n_mels, T) -> audio (B, S)
            out, out_lengths = self.module.mel_to_audio(xt.to(self.dtype), lt, SynthesisOptions())
        else:  # features (B, F, T) -> log-probs (B, T', V)
            out, out_lengths = self.module(xt.to(self.dtype), lt)
        out = out.float().cpu().numpy()
        n = out_lengths.tolist()
        if self.role == "asr":
            return [o[: n[i]].copy() for i, o in enumerate(out)]  # (T'_i, V)
        return [o[..., : n[i]].copy() for i, o in enumerate(out)]  # (n_mels, T_i) | (S_i,)


class ComponentModel:
    """A component behind its contract (contracts.component_spec)."""

    platform = "pytorch_libtorch"

    def __init__(
        self, name: str, role: str, engine: Engine[np.ndarray, np.ndarray], spec: ModelSpec
    ):
        self.name, self.role, self.engine, self.spec = name, role, engine, spec
        self.timeout = 60.0

    async def infer(self, inputs: Arrays, params: dict[str, Any]) -> Arrays:
        (x_spec, len_spec), (y_spec, ylen_spec) = self.spec.inputs, self.spec.outputs
        x, lengths = inputs[x_spec.name], inputs[len_spec.name]
        if self.role == "acoustic":
            rows = [r.astype(np.int64) for r in split_rows(x, lengths, 0, self.name)]
        else:
            rows = [r.astype(np.float32) for r in split_rows(x, lengths, 1, self.name)]
            if not all(np.isfinite(r).all() for r in rows):
                raise SpeechRTError(f"{self.name}: input {x_spec.name!r} holds NaN or infinity")
        if not rows:
            raise SpeechRTError(f"{self.name}: empty batch")
        outs = await self.engine.infer(rows, self.timeout)
        y, ylen = pad_stack(outs, axis=0 if self.role == "asr" else -1)
        return {y_spec.name: y.astype(np.float32), ylen_spec.name: ylen}


def component_model(
    name: str, role: str, engine: Engine[np.ndarray, np.ndarray], channels: int, classes: int = -1
) -> ComponentModel:
    return ComponentModel(name, role, engine, component_spec(role, channels, classes))


# -- pipelines -----------------------------------------------------------------------------------

_OPTION_FIELDS = {f.name for f in fields(SynthesisOptions)}


def options_from_params(params: dict[str, Any]) -> SynthesisOptions:
    """Request parameters named like SynthesisOptions fields (pace, speaker, seed, ...)."""
    given = {k: v for k, v in params.items() if k in _OPTION_FIELDS}
    for k, v in given.items():
        if isinstance(v, bool) != (k == "pitch_flatten") or not isinstance(v, (int, float)):
            raise SpeechRTError(f"parameter {k!r} has the wrong type ({type(v).__name__})")
    for k in ("seed", "speaker", "max_decoder_steps"):
        if k in given and not isinstance(given[k], int):
            raise SpeechRTError(f"parameter {k!r} must be an integer")
    return SynthesisOptions(**given)


class TTSModel:
    """TEXT (BYTES, any shape: [B] or [B, 1]) -> AUDIO (FP32 [B, S], zero-padded) + lengths.

    Parameters: any SynthesisOptions field; text i uses seed `seed + i` (default seed 0).
    """

    name = "tts"
    platform = "speechrt_pipeline"
    spec = TTS_SPEC

    def __init__(self, service: TTSService) -> None:
        self.service = service

    async def infer(self, inputs: Arrays, params: dict[str, Any]) -> Arrays:
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


class ASRModel:
    """AUDIO (FP32 [B, S] at the model's rate, or `sample_rate` parameter) + optional
    AUDIO_LENGTHS (INT64 [B]) -> TEXT (BYTES [B])."""

    name = "asr"
    platform = "speechrt_pipeline"
    spec = ASR_SPEC

    def __init__(self, service: ASRService) -> None:
        self.service = service

    async def infer(self, inputs: Arrays, params: dict[str, Any]) -> Arrays:
        sr = params.get("sample_rate", self.service.sampling_rate)
        if not isinstance(sr, int) or isinstance(sr, bool) or not 1000 <= sr <= 384_000:
            raise SpeechRTError(f"parameter 'sample_rate' must be an integer in Hz, got {sr!r}")
        rows = split_rows(inputs["AUDIO"], inputs.get("AUDIO_LENGTHS"), 0, self.name)
        if not rows:
            raise SpeechRTError("AUDIO holds no rows")
        audios = await asyncio.gather(
            *(asyncio.to_thread(self.service.check_audio, r, sr) for r in rows)
        )
        transcripts = await self.service.transcribe(audios)
        text = np.array([t.text.encode("utf-8") for t in transcripts], dtype=object)
        return {"TEXT": text}
