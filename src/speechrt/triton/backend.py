"""Triton python-backend models that run speechrt's own front ends. Imports no torch.

Each class is a `TritonPythonModel` (initialize / execute / finalize); the model.py that
`speechrt export --triton-repo` writes imports one of them, so the Python that Triton's python
backend runs must have speechrt installed. Everything a model needs (text settings, labels,
feature config, buckets) is a `parameters` entry of its config.pbtxt, read in `initialize`.

    TextFrontEnd   TEXT (B, 1) bytes -> ids (B, L) int64, lengths (B, 1) int64
    Features       AUDIO (B, N) float32 [+ AUDIO_LENGTHS (B, 1)] -> features (B, F, T), lengths
    CTCGreedy      log_probs (B, T, V), log_prob_lengths (B, 1) -> TEXT (B, 1) bytes

Triton's dynamic batcher joins only requests of equal shapes, so L and T are padded up to the
length buckets (speechrt.runtime.buckets): the requests that follow, to the ONNX models, share a
few shapes and batch together. Per-item scalars travel as (B, 1) (the python backend sees the
config's dims as they are); the ONNX models' configs reshape them to (B,).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from speechrt.asr.ctc import greedy_tokens, tokens_to_words
from speechrt.audio.features import FeatureConfig, batch_features_numpy
from speechrt.errors import SpeechRTError
from speechrt.runtime.buckets import Buckets
from speechrt.text.processor import TextProcessor


def pad_ids(ids: Sequence[Sequence[int]], buckets: Buckets) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> ids (B, L) right-padded with 0 (L: the "symbols" bucket of the longest),
    lengths (B, 1)."""
    lengths = np.array([[len(i)] for i in ids], dtype=np.int64)
    out = np.zeros((len(ids), buckets.size("symbols", int(lengths.max()))), dtype=np.int64)
    for row, i in zip(out, ids, strict=True):
        row[: len(i)] = i
    return out, lengths


def pad_frames(feats: np.ndarray, buckets: Buckets) -> np.ndarray:
    """(B, F, T) -> (B, F, the "feature_frames" bucket of T), zero-padded."""
    T = feats.shape[2]
    return np.pad(feats, ((0, 0), (0, 0), (0, buckets.size("feature_frames", T) - T)))


class _Model:
    """What the three models share: the config's parameters, one response per request."""

    def initialize(self, args: dict[str, str]) -> None:
        self.pb_utils: Any = importlib.import_module("triton_python_backend_utils")
        config = json.loads(args["model_config"])
        self.params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.outputs = [t["name"] for t in config["output"]]
        self.buckets = Buckets.parse(self.params.get("buckets", ""))
        self.setup()

    def setup(self) -> None:
        raise NotImplementedError

    def run(self, request: Any) -> list[np.ndarray]:
        """One request's inputs -> its outputs, in the config's order."""
        raise NotImplementedError

    def input(self, request: Any, name: str) -> np.ndarray | None:
        t = self.pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self.pb_utils
        responses = []
        for request in requests:
            try:
                arrays = self.run(request)
            except SpeechRTError as e:
                responses.append(pb.InferenceResponse(error=pb.TritonError(str(e))))
                continue
            tensors = [pb.Tensor(n, a) for n, a in zip(self.outputs, arrays, strict=True)]
            responses.append(pb.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self) -> None:
        pass


def _texts(values: np.ndarray) -> list[str]:
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
    except UnicodeDecodeError:
        raise SpeechRTError("TEXT must be UTF-8") from None


class TextFrontEnd(_Model):
    """speechrt's text processing of the acoustic model (parameter "text": its model.json
    meta["text"]), ids padded to the "symbols" bucket."""

    def setup(self) -> None:
        self.text = TextProcessor.from_meta(json.loads(self.params["text"]))

    def run(self, request: Any) -> list[np.ndarray]:
        values = self.input(request, "TEXT")
        if values is None:
            raise SpeechRTError("input TEXT is required")
        ids, lengths = pad_ids([self.text.encode(t) for t in _texts(values)], self.buckets)
        return [ids, lengths]


class Features(_Model):
    """speechrt's numpy ASR features (parameter "features": model.json meta["features"];
    "pad_leading": frames of silence the model expects first), frames padded to the
    "feature_frames" bucket."""

    def setup(self) -> None:
        self.cfg = FeatureConfig.from_dict(json.loads(self.params["features"]))
        self.pad_leading = int(self.params.get("pad_leading", "0"))

    def run(self, request: Any) -> list[np.ndarray]:
        audio = self.input(request, "AUDIO")
        if audio is None:
            raise SpeechRTError("input AUDIO is required")
        audio = audio.astype(np.float32, copy=False).reshape(audio.shape[0], -1)  # (B, N)
        given = self.input(request, "AUDIO_LENGTHS")
        n = audio.shape[1]
        counts = [n] * audio.shape[0] if given is None else given.reshape(-1).tolist()
        if not all(0 < c <= n for c in counts):
            raise SpeechRTError(f"AUDIO_LENGTHS must lie within [1, {n}]")
        if not np.isfinite(audio).all():
            raise SpeechRTError("AUDIO contains NaN or infinity")
        audios = [row[: int(c)] for row, c in zip(audio, counts, strict=True)]
        rngs = None
        if self.cfg.dither > 0:  # each item its own noise, the same on every call
            rngs = [np.random.default_rng(0) for _ in audios]
        feats, lengths = batch_features_numpy(audios, self.cfg, rngs)  # (B, F, T), (B,)
        if self.pad_leading:
            feats = np.pad(feats, ((0, 0), (0, 0), (self.pad_leading, 0)))
            lengths = lengths + self.pad_leading
        return [pad_frames(feats, self.buckets), lengths[:, None]]


class CTCGreedy(_Model):
    """Greedy CTC over each item's valid frames (parameter "labels": JSON list, blank last)."""

    def setup(self) -> None:
        self.labels = [str(s) for s in json.loads(self.params["labels"])]

    def run(self, request: Any) -> list[np.ndarray]:
        log_probs = self.input(request, "log_probs")
        lengths = self.input(request, "log_prob_lengths")
        if log_probs is None or lengths is None:
            raise SpeechRTError("inputs log_probs and log_prob_lengths are required")
        blank = len(self.labels)
        texts = [
            tokens_to_words(tokens, self.labels, 1.0).text
            for tokens in greedy_tokens(log_probs, lengths.reshape(-1), blank)
        ]
        return [np.array([[t.encode()] for t in texts], dtype=object)]
