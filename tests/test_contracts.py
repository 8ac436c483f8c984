"""Contracts: names, dtypes, dynamic axes, KServe metadata, feed checks; no torch import."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import speechrt.arch
from speechrt.errors import SpeechRTError
from speechrt.registry import ARCHITECTURES, GRAPHS, contract, graphs_of, preset
from speechrt.serving.v2metadata import model_metadata


def test_fastpitch_contract_follows_dims() -> None:
    c = contract("fastpitch", {"n_mel_channels": 80, "energy_conditioning": True})
    assert c.input_names == ["ids", "lengths", "pace", "pitch_shift", "pitch_scale"]
    assert c.output_names == ["mel", "mel_lengths", "durations", "pitch", "energy"]
    assert c.spec("mel").shape == ("batch", 80, "frames")
    assert c.dynamic_axes()["ids"] == {0: "batch", 1: "symbols"}
    assert c.dynamic_axes()["mel"] == {0: "batch", 2: "frames"}
    multi = contract("fastpitch", {"n_speakers": 4, "energy_conditioning": False})
    assert multi.input_names[-1] == "speaker" and "energy" not in multi.output_names


def test_kserve_metadata() -> None:
    meta = model_metadata(contract("hifigan", {"n_mels": 80}), "hifigan")
    assert meta["name"] == "hifigan" and meta["versions"] == ["1"]
    assert meta["inputs"] == [
        {"name": "mel", "datatype": "FP32", "shape": [-1, 80, -1]},
        {"name": "mel_lengths", "datatype": "INT64", "shape": [-1]},
    ]
    assert meta["outputs"][0] == {"name": "audio", "datatype": "FP32", "shape": [-1, -1]}


def test_every_graph_of_every_kind_has_a_contract() -> None:
    for kind in ARCHITECTURES:
        files = graphs_of(kind)
        assert files and len(set(files.values())) == len(files)
        for graph, name in itertools.product(files, ARCHITECTURES[kind].presets):
            c = contract(graph, preset(kind, name))
            names = c.input_names + c.output_names
            assert len(set(names)) == len(names), graph  # ONNX names must be unique
            assert GRAPHS[graph].name == c.name == graph


def test_check_feeds() -> None:
    c = contract("hifigan", {"n_mels": 4})
    mel, lengths = np.zeros((2, 4, 7), np.float32), np.array([7, 5])
    assert c.check_feeds({"mel": mel, "mel_lengths": lengths}) == {"batch": 2, "frames": 7}
    with pytest.raises(SpeechRTError, match="missing \\['mel_lengths'\\]"):
        c.check_feeds({"mel": mel})
    with pytest.raises(SpeechRTError, match="must be int64"):
        c.check_feeds({"mel": mel, "mel_lengths": lengths.astype(np.int32)})
    with pytest.raises(SpeechRTError, match="shape \\(batch, 4, frames\\)"):
        c.check_feeds({"mel": np.zeros((2, 5, 7), np.float32), "mel_lengths": lengths})
    with pytest.raises(SpeechRTError, match="axis 'batch' is 3 here, 2 elsewhere"):
        c.check_feeds({"mel": mel, "mel_lengths": np.array([1, 2, 3])})
    with pytest.raises(SpeechRTError, match="no exportable graphs"):
        graphs_of("nonesuch")


def test_defaults_bounds_and_lengths() -> None:
    c = contract("fastpitch", {"n_symbols": 10, "n_speakers": 3})
    assert [t.name for t in c.inputs if t.optional] == [
        "pace",
        "pitch_shift",
        "pitch_scale",
        "speaker",
    ]
    assert c.spec("pace").default == 1.0 and c.spec("speaker").bounds == (0, 2)
    assert c.spec("lengths").counts == "symbols" and c.spec("mel_lengths").counts == "frames"
    feeds = {
        "ids": np.array([[1, 9, 0]]),
        "lengths": np.array([2]),
        "pace": np.ones(1, np.float32),
        "pitch_shift": np.zeros(1, np.float32),
        "pitch_scale": np.ones(1, np.float32),
        "speaker": np.array([2]),
    }
    c.check_values(feeds, c.check_feeds(feeds))
    bad = {
        "ids": (np.array([[1, 10, 0]]), "'ids': values must lie within \\[0, 9\\]"),
        "lengths": (np.array([4]), "lengths must lie within \\[1, 3\\] \\(symbols\\)"),
        "pace": (np.full(1, 0.01, np.float32), "within \\[0.1, 10\\]"),
        "speaker": (np.array([3]), "'speaker': values must lie within \\[0, 2\\]"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(SpeechRTError, match=message):
            c.check_values(feeds | {name: value}, c.check_feeds(feeds | {name: value}))


def test_registry_and_arch_modules_import_no_torch() -> None:
    arch = Path(speechrt.arch.__file__).parent
    modules = sorted(f"speechrt.arch.{p.stem}" for p in arch.glob("*.py") if p.stem != "__init__")
    code = (
        f"import sys, importlib, speechrt.registry\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch'], 'torch imported'\n"
        "assert all(m in sys.modules for m in " + repr(modules) + ")"
    )
    assert len(modules) >= 6
    subprocess.run([sys.executable, "-c", code], check=True)
