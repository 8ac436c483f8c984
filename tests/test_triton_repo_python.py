"""`speechrt export --triton-repo`: the python-backend models (text front end, ASR features, CTC
decoding) run with a stand-in for Triton's pb_utils, and the TTS and ASR ensembles walked step
by step against the graphs they chain."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format

from speechrt.audio.features import batch_features_numpy
from speechrt.models.jasper import LABELS
from speechrt.repo import read_info
from speechrt.runtime.buckets import Buckets
from speechrt.text import TextProcessor
from triton_harness import FEATURES, config

# -- the python models, with a stand-in for Triton's triton_python_backend_utils -----------------


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceRequest:
    def __init__(self, inputs: list[Tensor]) -> None:
        self.inputs = inputs


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.output_tensors, self.error = output_tensors or [], error

    def has_error(self) -> bool:
        return self.error is not None


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors if t.name() == name), None)


@pytest.fixture
def pb_utils(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")
    for obj in (Tensor, TritonError, InferenceRequest, InferenceResponse):
        setattr(module, obj.__name__, obj)
    module.get_input_tensor_by_name = get_input_tensor_by_name  # type: ignore[attr-defined]
    module.get_output_tensor_by_name = get_output_tensor_by_name  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    return module


def load_python_model(repo: Path, name: str) -> Any:
    """The repository's model.py imported as Triton does, initialised with its config as JSON."""
    spec = importlib.util.spec_from_file_location(f"triton_{name}", repo / name / "1" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    as_json = json_format.MessageToDict(config(repo / name), preserving_proto_field_name=True)
    model.initialize({"model_config": json.dumps(as_json), "model_name": name})
    return model


def infer(model: Any, *requests: dict[str, np.ndarray]) -> list[Any]:
    reqs = [InferenceRequest([Tensor(k, v) for k, v in r.items()]) for r in requests]
    return model.execute(reqs)


def outputs(response: Any) -> dict[str, np.ndarray]:
    assert not response.has_error(), response.error.message()
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def test_text_front_end(repo: Path, dirs: dict[str, Path], pb_utils: Any) -> None:
    model = load_python_model(repo, "fastpitch.text")
    texts = ["Hello world.", "It costs $3.50 on Jan. 5th, said Dr. Who."]
    ok, bad = infer(
        model,
        {"TEXT": np.array([[t.encode()] for t in texts], dtype=object)},
        {"TEXT": np.array([[b"?!"]], dtype=object)},
    )
    out = outputs(ok)
    tp = TextProcessor.from_meta(read_info(dirs["fastpitch"]).meta)
    want = [tp.encode(t) for t in texts]
    bucket = Buckets().size("symbols", max(map(len, want)))
    assert out["ids"].shape == (2, bucket) and out["ids"].dtype == np.int64
    for row, ids in zip(out["ids"], want, strict=True):
        assert row[: len(ids)].tolist() == ids and not row[len(ids) :].any()
    np.testing.assert_array_equal(out["lengths"], [[len(w)] for w in want])
    assert bad.has_error() and "nothing to speak" in bad.error.message()
    model.finalize()


def test_asr_features(repo: Path, pb_utils: Any) -> None:
    model = load_python_model(repo, "quartznet.features")
    rng = np.random.default_rng(2)
    audio = (rng.standard_normal((2, 4000)) * 0.1).astype(np.float32)
    counts = np.array([[4000], [2500]])
    with_lengths, whole, short = infer(
        model,
        {"AUDIO": audio, "AUDIO_LENGTHS": counts},
        {"AUDIO": audio[:1]},
        {"AUDIO": audio[:1, :100]},
    )
    feats, lengths = batch_features_numpy([audio[0], audio[1, :2500]], FEATURES)
    out = outputs(with_lengths)
    assert out["features"].shape == (2, 12, Buckets().size("feature_frames", feats.shape[2]))
    np.testing.assert_array_equal(out["features"][:, :, : feats.shape[2]], feats)
    assert not out["features"][:, :, feats.shape[2] :].any()
    np.testing.assert_array_equal(out["feature_lengths"], lengths[:, None])
    np.testing.assert_array_equal(outputs(whole)["features"], out["features"][:1])
    assert short.has_error() and "too short" in short.error.message()


def test_ctc_decodes_the_best_path(repo: Path, pb_utils: Any) -> None:
    model = load_python_model(repo, "quartznet.ctc")
    blank = len(LABELS)
    path = [blank, "h", "h", blank, "i", " ", " ", "y", "o", blank, "o"]
    frames = [p if p == blank else LABELS.index(p) for p in path]
    log_probs = np.full((2, len(frames) + 3, blank + 1), -5.0, dtype=np.float32)
    log_probs[:, np.arange(len(frames)), frames] = -0.1
    log_probs[:, len(frames) :, LABELS.index("x")] = -0.1  # past the lengths: ignored
    lengths = np.array([[len(frames)], [5]])
    out = outputs(infer(model, {"log_probs": log_probs, "log_prob_lengths": lengths})[0])
    assert out["TEXT"].tolist() == [[b"hi yoo"], [b"hi"]]


# -- the ensembles, walked step by step: python models via the stand-in, graphs in onnxruntime --


def run_model(repo: Path, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    cfg = config(repo / name)
    if cfg.backend == "python":
        return outputs(infer(load_python_model(repo, name), feeds)[0])
    session = ort.InferenceSession(str(repo / name / "1" / "model.onnx"))
    reshaped = {t.name for t in list(cfg.input) + list(cfg.output) if t.HasField("reshape")}
    # Triton's reshape: clients and ensembles see (B, 1), the graph (B,)
    got = session.run(None, {k: v.reshape(-1) if k in reshaped else v for k, v in feeds.items()})
    names = [o.name for o in session.get_outputs()]
    return {n: v[:, None] if n in reshaped else v for n, v in zip(names, got, strict=True)}


def run_ensemble(repo: Path, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    cfg = config(repo / name)
    assert cfg.platform == "ensemble"
    tensors = dict(feeds)
    for step in cfg.ensemble_scheduling.step:
        got = run_model(repo, step.model_name, {k: tensors[v] for k, v in step.input_map.items()})
        tensors |= {v: got[k] for k, v in step.output_map.items()}
    return {t.name: tensors[t.name] for t in cfg.output}


def test_tts_ensemble(repo: Path, dirs: dict[str, Path], pb_utils: Any) -> None:
    """TEXT -> AUDIO equals the two graphs run on the unpadded ids: the bucket padding of the
    text front end changes nothing within each item's length."""
    texts = ["Hello world.", "A longer sentence, to pad the first."]
    out = run_ensemble(repo, "tts", {"TEXT": np.array([[t.encode()] for t in texts], object)})
    tp = TextProcessor.from_meta(read_info(dirs["fastpitch"]).meta)
    fastpitch = ort.InferenceSession(str(dirs["fastpitch"] / "model.onnx"))
    hifigan = ort.InferenceSession(str(dirs["hifigan"] / "model.onnx"))
    assert out["AUDIO_LENGTHS"].shape == (2, 1)
    for i, text in enumerate(texts):
        ids = np.array([tp.encode(text)])
        feeds = {"ids": ids, "lengths": np.array([ids.shape[1]])}
        feeds |= {"pace": np.ones(1, "f4"), "pitch_shift": np.zeros(1, "f4")}
        mel, mel_lengths = fastpitch.run(
            ["mel", "mel_lengths"], feeds | {"pitch_scale": feeds["pace"]}
        )
        audio, n = hifigan.run(None, {"mel": mel, "mel_lengths": mel_lengths})
        assert out["AUDIO_LENGTHS"][i, 0] == n[0]
        np.testing.assert_allclose(out["AUDIO"][i, : n[0]], audio[0, : n[0]], atol=1e-5)


def test_asr_ensemble(repo: Path, dirs: dict[str, Path], pb_utils: Any) -> None:
    rng = np.random.default_rng(3)
    audio = (rng.standard_normal((1, 6000)) * 0.1).astype(np.float32)
    out = run_ensemble(repo, "asr", {"AUDIO": audio})
    feats, lengths = batch_features_numpy([audio[0]], FEATURES)
    session = ort.InferenceSession(str(dirs["quartznet"] / "model.onnx"))
    log_probs, n = session.run(None, {"features": feats, "feature_lengths": lengths})
    best = log_probs[0, : n[0]].argmax(-1).tolist()
    letters = [b for i, b in enumerate(best) if b != len(LABELS) and (i == 0 or b != best[i - 1])]
    want = " ".join("".join(LABELS[b] for b in letters).split())
    assert out["TEXT"].tolist() == [[want.encode()]]
