"""ONNX export: every component's graphs, checked by onnxruntime (CPU) against eager."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime_models import exported, fastpitch, save
from speechrt.cli import main
from speechrt.errors import SpeechRTError
from speechrt.models.tacotron2 import DECODER_INPUTS, DECODER_OUTPUTS
from speechrt.registry import contract, graphs_of
from speechrt.repo import load_component
from speechrt.runtime.eager import EagerRunner
from speechrt.runtime.graphs import build_graph, example_feeds
from speechrt.runtime.onnx import OnnxRunner

LENGTHS = (4, 13, 31)  # none of them the traced example length (11)
BATCHES = (1, 3)
CASES = [(kind, graph) for kind in exported() for graph in graphs_of(kind)]


def check_against_eager(model_dir: Path, graph: str, tolerance: float = 1e-4) -> None:
    model, info = load_component(model_dir)
    wrapper = build_graph(graph, model, info)
    c = contract(graph, info.dims)
    eager, onnx = EagerRunner(wrapper, c), OnnxRunner.from_dir(model_dir, graph, device="cpu")
    for batch in BATCHES:
        for length in LENGTHS:
            feeds = example_feeds(graph, wrapper, batch, length, seed=batch * 100 + length)
            ref = eager.run(feeds)
            got = onnx.run({k: v.numpy() for k, v in feeds.items()})
            for name in c.output_names:
                assert got[name].shape == tuple(ref[name].shape), (name, batch, length)
                err = (torch.from_numpy(got[name]).double() - ref[name].double()).abs().max()
                assert err <= tolerance, (graph, name, batch, length, float(err))


@pytest.mark.parametrize("kind, graph", CASES)
def test_onnx_matches_eager_at_other_sizes(kind: str, graph: str) -> None:
    check_against_eager(exported()[kind], graph)


def test_every_kind_is_exported() -> None:
    from speechrt.registry import ARCHITECTURES

    assert all(graphs_of(kind) for kind in ARCHITECTURES)
    for kind, d in exported().items():
        for file in graphs_of(kind).values():
            assert (d / file).is_file(), (kind, file)


def test_named_dynamic_axes() -> None:
    runner = OnnxRunner.from_dir(exported()["fastpitch"], device="cpu")
    assert [i.name for i in runner.session.get_inputs()] == runner.contract.input_names
    assert runner.session.get_inputs()[0].shape == ["batch", "symbols"]  # not the example's
    assert runner.session.get_outputs()[0].shape == ["batch", 10, "frames"]
    lstm = OnnxRunner.from_dir(exported()["tacotron2"], "tacotron2.encoder", device="cpu")
    assert lstm.session.get_outputs()[0].shape == ["batch", "symbols", 16]


def test_tacotron2_names_are_dles() -> None:
    c = contract("tacotron2.decoder_step", {})
    assert tuple(c.input_names) == DECODER_INPUTS
    assert tuple(c.output_names) == DECODER_OUTPUTS


def test_multi_speaker_fastpitch_exports(tmp_path: Path) -> None:
    d = save(fastpitch(n_speakers=3, energy_conditioning=False), tmp_path / "fp")
    assert main(["export", str(d), "--opset", "18"]) == 0
    runner = OnnxRunner.from_dir(d, device="cpu")
    assert runner.contract.input_names[-1] == "speaker"
    check_against_eager(d, "fastpitch")


def test_stale_onnx_is_refused(tmp_path: Path) -> None:
    # the vocoder's graph under a FastPitch model.json: names do not match the contract
    d = save(fastpitch(), tmp_path / "fp")
    (d / "model.onnx").write_bytes((exported()["hifigan"] / "model.onnx").read_bytes())
    with pytest.raises(SpeechRTError, match="re-export"):
        OnnxRunner.from_dir(d, device="cpu")


def test_export_errors(tmp_path: Path) -> None:
    assert main(["export", str(tmp_path / "missing")]) == 2
    d = save(fastpitch(), tmp_path / "fp")
    info = json.loads((d / "model.json").read_text())
    info["kind"] = "nonesuch"
    (d / "model.json").write_text(json.dumps(info))
    assert main(["export", str(d)]) == 2
    with pytest.raises(SpeechRTError, match="run `speechrt export` first"):
        OnnxRunner(tmp_path / "none.onnx", contract("hifigan", {}))
