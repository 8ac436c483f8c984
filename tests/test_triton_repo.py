"""`speechrt export --triton-repo`: configs that Triton's ModelConfig parses, self-contained
graphs, and the python-backend models run with a stand-in for Triton's pb_utils."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from runtime_models import exported
from speechrt.audio.features import FeatureConfig, batch_features_numpy
from speechrt.cli import main
from speechrt.contracts import DATATYPES
from speechrt.models.jasper import LABELS
from speechrt.registry import contract
from speechrt.repo import read_info
from speechrt.runtime.buckets import Buckets
from speechrt.text import TextProcessor
from speechrt.triton.writer import RepoOptions, write_repository

OPTIONS = RepoOptions(max_batch_size=4, queue_delay_us=2500)
FEATURES = FeatureConfig(n_mels=12)  # the tiny QuartzNet's inputs


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The exported tiny components; the QuartzNet copied and given labels and features."""
    out = dict(exported())
    asr = tmp_path_factory.mktemp("asr") / "quartznet"
    shutil.copytree(out["quartznet"], asr)
    info = json.loads((asr / "model.json").read_text())
    info["meta"] = {"labels": list(LABELS), "features": FEATURES.to_dict()}
    (asr / "model.json").write_text(json.dumps(info))
    out["quartznet"] = asr
    return out


@pytest.fixture(scope="module")
def repo(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("triton") / "repo"
    written, notes = write_repository(
        out, [dirs["fastpitch"], dirs["hifigan"], dirs["quartznet"]], OPTIONS
    )
    assert sorted(p.name for p in written) == sorted(p.name for p in out.iterdir())
    assert notes == []
    return out


def config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse((path / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


TYPES = {f"TYPE_{v}".replace("BYTES", "STRING"): k for k, v in DATATYPES.items()}


def type_name(data_type: int) -> str:
    return model_config_pb2.DataType.Name(data_type)


def test_layout_and_configs_parse(repo: Path, dirs: dict[str, Path]) -> None:
    models = {p.name for p in repo.iterdir()}
    assert models == {
        "fastpitch",
        "fastpitch.text",
        "hifigan",
        "hifigan.denoiser",
        "quartznet",
        "quartznet.features",
        "quartznet.ctc",
        "tts",
        "asr",
    }
    for name in models:
        cfg = config(repo / name)
        assert cfg.name == name
        assert cfg.max_batch_size == OPTIONS.max_batch_size
        if cfg.platform == "ensemble":
            assert not any((repo / name / "1").iterdir())  # Triton wants the version dir
        elif cfg.backend == "python":
            assert (repo / name / "1" / "model.py").is_file()
        else:
            assert cfg.backend == "onnxruntime"
            assert cfg.dynamic_batching.max_queue_delay_microseconds == 2500
            assert (repo / name / "1" / "model.onnx").is_file()


@pytest.mark.parametrize(
    "model, kind, graph",
    [
        ("fastpitch", "fastpitch", "fastpitch"),
        ("hifigan", "hifigan", "hifigan"),
        ("hifigan.denoiser", "hifigan", "denoiser"),
        ("quartznet", "quartznet", "jasper"),
    ],
)
def test_graph_config_is_the_contract(
    repo: Path, dirs: dict[str, Path], model: str, kind: str, graph: str
) -> None:
    c = contract(graph, read_info(dirs[kind]).dims)
    cfg = config(repo / model)
    for specs, tensors in ((c.inputs, cfg.input), (c.outputs, cfg.output)):
        assert [t.name for t in tensors] == [s.name for s in specs]
        for spec, t in zip(specs, tensors, strict=True):
            assert TYPES[type_name(t.data_type)] == spec.dtype
            want = [-1 if isinstance(a, str) else a for a in spec.shape[1:]]  # no batch axis
            if want:
                assert list(t.dims) == want and not t.HasField("reshape")
            else:  # (batch,): [1] reshaped to a scalar per item
                assert list(t.dims) == [1] and list(t.reshape.shape) == []
            if specs is c.inputs:
                assert t.optional == spec.optional
    if model == "fastpitch":
        assert {t.name for t in cfg.input if t.optional} == {"pace", "pitch_shift", "pitch_scale"}


def test_graphs_are_self_contained(repo: Path, dirs: dict[str, Path], tmp_path: Path) -> None:
    """Each repository graph loads alone (moved away from every model directory) and computes
    what the model directory's graph computes."""
    for model, kind, file in [
        ("fastpitch", "fastpitch", "model.onnx"),
        ("hifigan", "hifigan", "model.onnx"),
        ("hifigan.denoiser", "hifigan", "denoiser.onnx"),
        ("quartznet", "quartznet", "model.onnx"),
    ]:
        alone = tmp_path / model
        shutil.copytree(repo / model / "1", alone)
        assert sorted(p.name for p in alone.iterdir()) == ["model.onnx"]
        graph = onnx.load(str(alone / "model.onnx"), load_external_data=False)
        assert all(i.data_location != onnx.TensorProto.EXTERNAL for i in graph.graph.initializer)
        got = ort.InferenceSession(str(alone / "model.onnx"))
        ref = ort.InferenceSession(str(dirs[kind] / file))
        feeds = random_feeds(ref)
        for a, b in zip(got.run(None, feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def random_feeds(session: ort.InferenceSession, batch: int = 2) -> dict[str, np.ndarray]:
    """Inputs for a tiny graph: ids in range, lengths full, floats small, strengths 0.5."""
    rng = np.random.default_rng(0)
    sizes: dict[str, int] = {"batch": batch}
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else sizes.setdefault(d, 24) for d in i.shape]
        if i.name == "ids":
            feeds[i.name] = rng.integers(1, 40, shape).astype(np.int64)
        elif "lengths" in i.name:
            feeds[i.name] = np.full(shape, max(feeds[next(iter(feeds))].shape[-1], 1))
        elif i.name in ("strength", "pace", "pitch_scale"):
            feeds[i.name] = np.full(shape, 0.5, dtype=np.float32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_optional_inputs_take_their_defaults(repo: Path) -> None:
    session = ort.InferenceSession(str(repo / "fastpitch" / "1" / "model.onnx"))
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 40, (3, 9)).astype(np.int64)
    feeds = {"ids": ids, "lengths": np.array([9, 4, 6])}
    defaults = {
        "pace": np.ones(3, np.float32),
        "pitch_shift": np.zeros(3, np.float32),
        "pitch_scale": np.ones(3, np.float32),
    }
    for a, b in zip(session.run(None, feeds), session.run(None, feeds | defaults), strict=True):
        np.testing.assert_array_equal(a, b)
    slower = session.run(["mel_lengths"], feeds | defaults | {"pace": np.full(3, 0.5, "f4")})
    assert (slower[0] > session.run(["mel_lengths"], feeds)[0]).all()


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


# -- Tacotron 2 and WaveGlow: graphs only ---------------------------------------------------------


def test_tacotron2_gets_its_graphs_and_no_ensemble(dirs: dict[str, Path], tmp_path: Path) -> None:
    written, notes = write_repository(tmp_path / "repo", [dirs["tacotron2"], dirs["waveglow"]])
    names = {p.name for p in written}
    assert names == {
        "tacotron2.encoder",
        "tacotron2.decoder_step",
        "tacotron2.postnet",
        "tacotron2.text",
        "waveglow",
        "waveglow.denoiser",
    }
    assert any("tacotron2" in n and "no ensemble" in n for n in notes)
    for name in names:
        cfg = config(tmp_path / "repo" / name)
        assert cfg.name == name and cfg.max_batch_size == 8
        if cfg.backend == "onnxruntime":
            ort.InferenceSession(str(tmp_path / "repo" / name / "1" / "model.onnx"))
    text = config(tmp_path / "repo" / "tacotron2.text")
    assert [t.name for t in text.output] == ["sequences", "sequence_lengths"]


# -- the command line ---------------------------------------------------------------------------


def test_cli_writes_a_repository(dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    args = ["export", str(dirs["fastpitch"]), str(dirs["hifigan"])]
    args += ["--triton-repo", str(tmp_path / "r"), "--max-batch-size", "16"]
    assert main([*args, "--max-queue-delay-ms", "0.5", "--buckets", "symbols=16,48"]) == 0
    assert "tritonserver --model-repository" in capsys.readouterr().out
    cfg = config(tmp_path / "r" / "fastpitch")
    assert cfg.max_batch_size == 16 and cfg.dynamic_batching.max_queue_delay_microseconds == 500
    text = config(tmp_path / "r" / "fastpitch.text")
    assert text.parameters["buckets"].string_value == "symbols=16,48"


def test_cli_with_no_model_writes_the_bundled_models(tmp_path: Path, capsys) -> None:
    """As every other command, export --triton-repo with no DIR takes the bundled models."""
    from speechrt.defaults import ASR_MODEL, VOICE_ACOUSTIC, VOICE_VOCODER, default_model

    bundled = [default_model(n) for n in (VOICE_ACOUSTIC, VOICE_VOCODER, ASR_MODEL)]
    if None in bundled:
        pytest.skip("needs the bundled voice and recogniser")
    assert main(["export", "--triton-repo", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "note: " in out and "denoiser" in out  # the bundled vocoder ships no denoiser graph
    for name in ("fastpitch", "hifigan", "quartznet", "tts", "asr"):
        assert (tmp_path / "r" / name / "config.pbtxt").is_file(), name
    assert main(["export"]) == 2  # plain export still needs its directories
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give the model directories to export" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "no model.onnx (run `speechrt export"),
        (["--max-batch-size", "0"], "max batch size must be >= 1"),
        (["--buckets", "symbols=x"], "bad bucket list"),
    ],
)
def test_cli_errors_are_one_line(
    dirs: dict[str, Path], tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("model.json", "model.safetensors"):
        shutil.copy(dirs["hifigan"] / f, bare / f)
    source = bare if not extra else dirs["hifigan"]
    assert main(["export", str(source), "--triton-repo", str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r").exists()


def test_repository_and_python_models_import_no_torch(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Writing a repository needs onnx, not torch; Triton's python models need neither."""
    sources = [str(dirs[k]) for k in ("fastpitch", "hifigan", "quartznet")]
    code = (
        "import sys\n"
        "from speechrt.triton.writer import write_repository\n"
        "import speechrt.triton.backend\n"
        f"write_repository({str(tmp_path / 'r')!r}, {sources!r})\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch'], 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "r" / "tts" / "config.pbtxt").is_file()


def test_float16_weights_and_external_data(
    dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float16 weights (read through a Cast) go into the repository as float16; a graph past
    protobuf's limit (here: any) keeps them in model.onnx.data beside it. Both load alone."""
    import dataclasses

    import torch

    from runtime_models import MEL, hifigan
    from speechrt.repo import ComponentInfo, save_component
    from speechrt.triton import writer as triton_repo

    model = hifigan()
    src = tmp_path / "hifigan16"
    info = ComponentInfo("hifigan", dataclasses.asdict(model.dims), MEL)
    save_component(src, info, model.state_dict(), dtype=torch.float16)
    assert main(["export", str(src), "--graph", "hifigan", "--no-check"]) == 0
    ref = ort.InferenceSession(str(src / "model.onnx"))
    feeds = random_feeds(ref)
    for limit, files in ((triton_repo.PROTOBUF_LIMIT, ["model.onnx"]), (0, None)):
        monkeypatch.setattr(triton_repo, "PROTOBUF_LIMIT", limit)
        out = tmp_path / f"repo{limit}"
        write_repository(out, [src])
        alone = tmp_path / f"alone{limit}"
        shutil.copytree(out / "hifigan" / "1", alone)
        listed = sorted(p.name for p in alone.iterdir())
        assert listed == (files or ["model.onnx", "model.onnx.data"])
        graph = onnx.load(str(alone / "model.onnx"))
        assert onnx.TensorProto.FLOAT16 in {i.data_type for i in graph.graph.initializer}
        got = ort.InferenceSession(str(alone / "model.onnx"))
        for a, b in zip(got.run(None, feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_array_equal(a, b)


def test_a_voice_needs_one_mel_config(dirs: dict[str, Path], tmp_path: Path, capsys) -> None:
    vocoder = tmp_path / "hifigan"
    shutil.copytree(dirs["hifigan"], vocoder)
    info = json.loads((vocoder / "model.json").read_text())
    info["mel"]["sampling_rate"] = 16000
    (vocoder / "model.json").write_text(json.dumps(info))
    args = ["export", str(dirs["fastpitch"]), str(vocoder), "--triton-repo", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mel configs" in err and "sampling_rate" in err, err
    assert not (tmp_path / "r").exists()  # checked before anything is written
