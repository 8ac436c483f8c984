"""The registry is the one table: an architecture added there (and in its own modules) is
detected, converted, loaded, run by its graph wrapper and exported, with no other edit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speechrt import registry
from speechrt.convert.checkpoints import convert_checkpoint, detect_kind
from speechrt.errors import SpeechRTError
from speechrt.registry import ARCHITECTURES, GRAPHS, Architecture, Graph
from speechrt.repo import load_component
from speechrt.runtime.graphs import build_graph, example_feeds


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Architecture:
    from toy_arch import toy_contract

    graph = Graph("toy", toy_contract, "toy_arch:")
    entry = Architecture(
        "toy", "toy_arch:Toy", ((graph, "model.onnx"),), "toy_arch:detect", "toy_arch:from_dle"
    )
    monkeypatch.setitem(ARCHITECTURES, "toy", entry)
    monkeypatch.setitem(GRAPHS, "toy", graph)
    return entry


def test_every_entry_resolves() -> None:
    for kind, entry in ARCHITECTURES.items():
        cls = registry.model_class(kind)
        assert cls.kind == kind and entry.kind == kind
        assert callable(registry.converter(kind))
        for graph, file in entry.graphs:
            assert GRAPHS[graph.name] is graph and file.endswith(".onnx")
    assert list(registry.detectors()) == list(ARCHITECTURES)


def test_unknown_kind_and_graph_are_clear_errors() -> None:
    with pytest.raises(SpeechRTError, match="unknown model kind 'nonesuch'; known: fastpitch"):
        registry.model_class("nonesuch")
    with pytest.raises(SpeechRTError, match="no graph 'nonesuch'"):
        registry.contract("nonesuch", {})


def test_an_added_architecture_needs_no_other_table(toy: Architecture, tmp_path: Path) -> None:
    ckpt = {"state_dict": {"module.toy_gain": torch.tensor([1.0, 2.0, -1.0, 0.5])}}
    torch.save(ckpt, tmp_path / "toy.pt")
    assert detect_kind(ckpt) == "toy"

    info = convert_checkpoint(tmp_path / "toy.pt", tmp_path / "toy")
    assert info.kind == "toy" and info.dims.n_channels == 4
    model, info = load_component(tmp_path / "toy")
    wrapper = build_graph("toy", model, info)
    feeds = example_feeds("toy", wrapper, batch=2, length=5)
    c = registry.contract("toy", info.dims)
    assert c.check_feeds(feeds) == {"batch": 2, "frames": 5}
    y, y_lengths = wrapper(*(feeds[n] for n in c.input_names))
    assert torch.equal(y_lengths, feeds["lengths"])
    want = feeds["x"][1, :, :4] * torch.tensor([1.0, 2.0, -1.0, 0.5])[:, None]
    assert torch.allclose(y[1, :, :4], want) and not y[1, :, 4:].any()


def test_an_added_architecture_exports(toy: Architecture, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from speechrt.runtime.export import export_dir

    torch.save({"state_dict": {"toy_gain": torch.tensor([3.0, 1.0])}}, tmp_path / "toy.pt")
    convert_checkpoint(tmp_path / "toy.pt", tmp_path / "toy", kind="toy")
    paths, checks = export_dir(tmp_path / "toy")
    assert [p.name for p in paths] == ["model.onnx"] and all(p.is_file() for p in paths)
    assert checks and all(c.graph == "toy" and c.max_abs_error < 1e-5 for c in checks)
