"""`speechrt export --triton-repo`: the layout and configs that Triton's ModelConfig parses,
graph configs that are the registry's contracts, self-contained graphs (float16 weights and
external data included), optional inputs' defaults, and Tacotron 2's graphs without an
ensemble."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tritonclient.grpc import model_config_pb2

from speechrt.cli import main
from speechrt.contracts import DATATYPES
from speechrt.registry import contract
from speechrt.repo import read_info
from speechrt.triton.writer import write_repository
from triton_harness import OPTIONS, config

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
